"""Synthesize the per-node telemetry vector from the twin's state: deterministic, plausible.

Owns turning an engine's state (pods running where, with what actual use)
into the catalogue's ~270 columns per node: it gathers the inputs, calls the
metric families (``telemetry.families``: one pure function each, with its
formulas), and assembles the vector (noise, counters, powered-off nodes). It
keeps the running totals of counters, the load averages and the temperatures
between samples. Must not change the engine, and must not import scheduling.
One synthesizer follows one engine (or one exported twin).

Inputs per sample: the running pods' use at ``engine.now``
(``twin.sampling.running_use``, the usage sample the twin's metrics tick takes,
so node totals equal ``state.usage`` at a tick), per-device GPU allocation,
power state, and the twin's one power model (``engine.metrics.power_model``).

Families (``families/``): pods by class (``pods``), socket placement
(``sockets``), memory pressure then disk (``disk``) then the rest of memory
(``memory``), network (``network``), CPU (``cpu``), GPU (``gpu``), power and
thermal (``thermal``); each module's docstring gives its model.

Off: a powered-off node's counters hold, capacities and free memory stay,
temperatures relax to the inlet air, every other gauge is 0. Booting and
failed nodes report as idle nodes.

Noise: every gauge and counter rate is multiplied by 1 + 1 % * (2h - 1)
(temperatures 0.5 %), h a counter-based hash of (seed, node, column,
15-second time bucket); node power, capacities, swap and pod counts, and
every value of a powered-off node, are exact.
Rare-event counters add floor(rate * dt + h'). Same seed and same engine
history give bit-identical vectors, whatever else was sampled in between.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import numpy as np

from smartsched.model.cluster import ClusterSpec
from smartsched.model.pod import POD_CLASS_IDS, PodClass
from smartsched.model.resources import CPU, DEVICE_MODELS, GPU, MEM
from smartsched.twin.sampling import running_use
from smartsched.twin.state import POWER_OFF
from smartsched.twin.telemetry.catalogue import (
    CACHE_LEVELS,
    CLASS_NAMES,
    DISKS_PER_NODE,
    METRICS,
    QUANTILES,
    Layout,
    column_names,
    dimensions,
    labels_of,
    metric_slices,
)
from smartsched.twin.telemetry.families import (
    Columns,
    Temperatures,
    cpu_family,
    disk_family,
    gpu_family,
    gpu_socket_weights,
    memory_family,
    memory_pressure,
    network_family,
    packets_per_second,
    pod_family,
    pod_use,
    power_thermal_family,
    socket_use,
)
from smartsched.twin.telemetry.families.base import slot_mask
from smartsched.twin.telemetry.families.gpu import SM_BOOST_DEFAULT_MHZ, SM_BOOST_MHZ
from smartsched.twin.telemetry.families.network import CLOUD_NIC_BPS, EDGE_NIC_BPS, pod_traffic_bps
from smartsched.twin.telemetry.families.thermal import INLET_SPREAD_C
from smartsched.twin.usage import _hash01

if TYPE_CHECKING:
    from smartsched.twin.engine import Engine

NOISE_BUCKET_S: Final = 15.0
NOISE_SIGMA: Final = 0.01
TEMP_NOISE_SIGMA: Final = 0.005
INLET_HASH_SALT: Final = 3

_EVENT_COUNTERS: Final = frozenset({
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "node_network_receive_errs_total",
    "node_network_transmit_errs_total", "node_cpu_package_throttles_total",
})
_INTEGER_GAUGES: Final = frozenset({
    "node_procs_running", "node_procs_blocked", "node_disk_io_now", "node_netstat_Tcp_CurrEstab",
})
_EXACT: Final = frozenset({
    "smartsched_node_power_watts", "smartsched_node_energy_joules_total",
    "node_memory_MemTotal_bytes", "node_memory_SwapTotal_bytes", "node_memory_SwapFree_bytes",
    "node_network_speed_bytes", "smartsched_node_pods",
})
# Gauges of unit "ratio" that can exceed 1 (the rest are clipped to 1 after noise).
_UNBOUNDED_RATIOS: Final = frozenset({"smartsched_node_cpu_instructions_per_cycle"})
_TEMPERATURES: Final = frozenset({
    "node_hwmon_temp_celsius", "smartsched_node_inlet_temp_celsius",
    "smartsched_node_outlet_temp_celsius", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP",
})
# Gauges a powered-off node still reports (the rest read 0).
_KEPT_WHEN_OFF: Final = _TEMPERATURES | {
    "node_memory_MemTotal_bytes", "node_memory_MemAvailable_bytes", "node_memory_MemFree_bytes",
    "node_memory_SwapTotal_bytes", "node_memory_SwapFree_bytes", "node_network_speed_bytes",
    "DCGM_FI_DEV_FB_FREE",
}
_TRAIN: Final = POD_CLASS_IDS[PodClass.AI_TRAIN]


class TelemetrySynth:
    """Per-node telemetry vectors of one twin, sample after sample.

    ``sample(engine)`` returns ``[num_nodes, D]`` float64 with columns in the
    order of ``catalogue.dimensions(layout)``; NaN marks instances a node does
    not have.
    """

    def __init__(self, spec: ClusterSpec, seed: int, layout: Layout | None = None) -> None:
        self.spec = spec
        self.seed = int(seed)
        self.layout = layout if layout is not None else Layout.for_cluster(spec)
        lay = self.layout
        nodes = spec.nodes
        n = len(nodes)
        self.dims = dimensions(lay)
        self.slices = metric_slices(lay)
        d = len(self.dims)
        self.sockets = np.array([max(1, x.sockets) for x in nodes], dtype=np.int64)
        self.nics = self.sockets.copy()  # one NIC per socket, as model.topology builds nodes
        self.gpu_count = np.array([x.num_gpu for x in nodes], dtype=np.int64)
        # Internal slot counts: wide enough for every node and for the layout.
        self.s_int = max(lay.sockets, int(self.sockets.max()))
        self.k_int = max(lay.nics, int(self.nics.max()))
        self.g_int = max(lay.gpus, int(self.gpu_count.max()), 1)
        self.disk_int = max(lay.disks, DISKS_PER_NODE)

        self.socket_present = slot_mask(self.sockets, self.s_int)
        self.gpu_present = slot_mask(self.gpu_count, self.g_int)
        # Device figures other than watts (those come from the twin's power model).
        models = [DEVICE_MODELS[x.gpu_model] if x.num_gpu else None for x in nodes]
        self.g_mem_mib = np.array([m.memory_gib * 1024.0 if m else 0.0 for m in models])
        self.g_boost_mhz = np.array([
            SM_BOOST_MHZ.get(m.name, SM_BOOST_DEFAULT_MHZ) if m else 0.0 for m in models
        ])
        self.g_nvlink = np.array([bool(m and m.nvlink) for m in models]) & (self.gpu_count > 1)
        site_kind = {s.name: s.kind for s in spec.sites}
        zone_site = spec.zone_site()
        edge = np.array([site_kind[zone_site[x.zone]] == "edge" for x in nodes])
        self.nic_bps = np.where(edge, EDGE_NIC_BPS, CLOUD_NIC_BPS)
        racks: dict[str, int] = {}
        self.rack = np.array([racks.setdefault(x.rack, len(racks)) for x in nodes], np.int64)
        idx = np.arange(n)
        self.inlet_offset = INLET_SPREAD_C * _hash01(idx, np.full(n, INLET_HASH_SALT), self.seed)

        # Per-column metadata.
        self.present = np.ones((n, d), dtype=bool)
        sigma = np.full(d, NOISE_SIGMA)
        self.counter_cols = np.zeros(d, dtype=bool)
        self.event_cols = np.zeros(d, dtype=bool)
        self.int_cols = np.zeros(d, dtype=bool)
        off_zero = np.zeros(d, dtype=bool)
        self.upper = np.full(d, np.inf)
        for m in METRICS:
            sl = self.slices[m.name]
            self.present[:, sl] = self._presence(m.instance_label, m.family, len(m.quantiles))
            if m.name in _EXACT:
                sigma[sl] = 0.0
            elif m.name in _TEMPERATURES:
                sigma[sl] = TEMP_NOISE_SIGMA
            self.counter_cols[sl] = m.kind == "counter"
            self.event_cols[sl] = m.name in _EVENT_COUNTERS
            self.int_cols[sl] = m.name in _INTEGER_GAUGES
            off_zero[sl] = m.kind == "gauge" and m.name not in _KEPT_WHEN_OFF
            if m.unit == "ratio" and m.name not in _UNBOUNDED_RATIOS:
                self.upper[sl] = 1.0
            elif m.unit == "percent":
                self.upper[sl] = 100.0
        self.sigma = sigma
        self.off_zero = off_zero
        self._absent = ~self.present
        self._counting = self.present & self.counter_cols
        self._int_idx = np.flatnonzero(self.int_cols)
        self._event_idx = np.flatnonzero(self.event_cols)
        self._inst = {m.name: len(lay.instances(m)) for m in METRICS}
        self._keys = (idx[:, None].astype(np.uint64) << np.uint64(16)) | np.arange(
            d, dtype=np.uint64)[None, :]
        self.reset()

    def reset(self) -> None:
        """Forget counters, load averages and temperatures (as after a reboot of every node)."""
        n, d = len(self.spec.nodes), len(self.dims)
        self._totals = np.zeros((n, d))
        self._last_now: float | None = None
        self._load: np.ndarray | None = None
        self._temps: Temperatures | None = None

    @property
    def num_dimensions(self) -> int:
        return len(self.dims)

    def _presence(self, label: str | None, family: str, quantiles: int) -> np.ndarray:
        lay, n = self.layout, len(self.spec.nodes)
        if label == "socket":
            mask = np.arange(lay.sockets)[None, :] < self.sockets[:, None]
        elif label == "gpu":
            mask = np.arange(lay.gpus)[None, :] < self.gpu_count[:, None]
        elif label == "device" and family == "network":
            mask = np.arange(lay.nics)[None, :] < self.nics[:, None]
        elif label == "device":
            mask = np.broadcast_to(np.arange(lay.disks)[None, :] < DISKS_PER_NODE,
                                   (n, lay.disks))
        else:
            width = {None: 1, "level": len(CACHE_LEVELS), "class": len(CLASS_NAMES),
                     "quantile": len(QUANTILES)}[label]
            mask = np.ones((n, width), dtype=bool)
        return np.repeat(mask, max(1, quantiles), axis=1)

    # ------------------------------------------------------------------ sample
    def sample(self, engine: Engine, dt_s: float | None = None) -> np.ndarray:
        """The vector of every node now: ``[num_nodes, D]`` float64.

        ``dt_s``: seconds to integrate counters over (default: simulated seconds
        since the previous sample, 0 on the first). Lags and load averages always
        follow simulated time.
        """
        st = engine.state
        n = st.num_nodes
        if n != len(self.spec.nodes):
            raise ValueError(f"engine has {n} nodes, the synthesizer {len(self.spec.nodes)}")
        now = float(engine.now)
        elapsed = 0.0 if self._last_now is None else max(now - self._last_now, 0.0)
        if dt_s is None:
            dt_s = elapsed
        if not dt_s >= 0:
            raise ValueError(f"dt_s must be >= 0, got {dt_s}")
        self._last_now = now
        with np.errstate(divide="ignore", invalid="ignore"):
            vals = self._values(engine, now, elapsed)
        return self._assemble(vals, st.power, now, float(dt_s))

    def _values(self, engine: Engine, now: float, elapsed: float) -> Columns:
        """Every family's columns at ``now``; moves the load averages and temperatures."""
        st, tb = engine.state, engine.table
        n = st.num_nodes
        pw = (st.power != POWER_OFF).astype(np.float64)
        cap_cpu = st.capacity[:, CPU].astype(np.float64)
        cap_mem = st.capacity[:, MEM].astype(np.float64)
        use = running_use(tb, st.capacity, now, engine.config.seed)
        pods = pod_use(use, tb.requests[use.pods], tb.cls[use.pods])
        node_cpu, node_mem, node_gpu = use.usage[:, 0], use.usage[:, 1], use.usage[:, 2]
        cores_used = node_cpu / 1000.0
        demand = node_cpu / cap_cpu
        cpu_util = np.minimum(demand, 1.0)

        pod_cols = pod_family(pods, n)
        pods_cls = pod_cols["smartsched_node_pods"]
        pods_n = pods_cls.sum(axis=1)
        sock = socket_use(
            pods, cores_used=cores_used, cap_cpu=cap_cpu, sockets=self.sockets,
            present=self.socket_present, powered=pw, seed=self.seed,
            gpu_weights=gpu_socket_weights(st.gpu_free, st.gpu_socket, st.gpu_exists,
                                           self.socket_present))
        press = memory_pressure(node_mem, cap_mem, pw)
        disk = disk_family(
            powered=pw, pods_n=pods_n, train_pods=pods_cls[:, _TRAIN],
            major_faults=press.major_faults, swap_in=press.swap_in, swap_out=press.swap_out,
            mem_pressure=press.pressure, slots=self.disk_int)
        mem = memory_family(
            press, cap_mem=cap_mem, powered=pw, pods_n=pods_n, cores_used=cores_used,
            disk_read_bps=disk["node_disk_read_bytes_total"].sum(axis=1),
            disk_write_bps=disk["node_disk_written_bytes_total"].sum(axis=1),
            bandwidth_bps=sock.bandwidth_bps, socket_mib=sock.memory_mib, sockets=self.sockets,
            present=self.socket_present)
        net = network_family(
            index=pods.index, node=pods.node, cls=pods.cls,
            traffic_bps=pod_traffic_bps(tb.traffic_mbps[pods.index], pods.factor,
                                        tb.usage_mean[pods.index]),
            nics=self.nics, nic_bps=self.nic_bps, powered=pw, pods_n=pods_n,
            pods_cls=pods_cls, cpu_util=cpu_util, slots=self.k_int, seed=self.seed)
        packets = packets_per_second(net)
        cpu, self._load = cpu_family(
            cores=cap_cpu / 1000.0, demand=demand, socket_util=sock.util, sockets=self.sockets,
            heavy_share=sock.heavy_share, bandwidth_util=sock.bandwidth_util,
            mem_pressure=press.pressure, powered=pw, pods_n=pods_n, cores_used=cores_used,
            packets=packets, disk_queue=disk["node_disk_io_now"].sum(axis=1),
            disk_iops=(disk["node_disk_reads_completed_total"]
                       + disk["node_disk_writes_completed_total"]).sum(axis=1),
            disk_busy=disk["node_disk_io_time_seconds_total"].mean(axis=1),
            io_pressure=disk["node_pressure_io_waiting_seconds_total"],
            load=self._load, elapsed_s=elapsed)
        pm = engine.metrics.power_model
        gpu, heat = gpu_family(
            gpu_free=st.gpu_free, gpu_count=self.gpu_count,
            gpu_alloc=st.allocated[:, GPU].astype(np.float64), node_gpu=node_gpu,
            gpu_cls=pod_cols["smartsched_node_pod_gpu_used_devices"], powered=pw,
            idle_w=pm.gpu_idle_w, max_w=pm.gpu_max_w, memory_mib=self.g_mem_mib,
            boost_mhz=self.g_boost_mhz, nvlink=self.g_nvlink, slots=self.g_int)
        thermal, self._temps = power_thermal_family(
            model=pm, power_state=st.power, cpu_util=cpu_util,
            gpu_util=np.minimum(node_gpu / np.maximum(st.capacity[:, GPU], 1), 1.0),
            socket_util=sock.util, bandwidth_bps=sock.bandwidth_bps, sockets=self.sockets,
            socket_present=self.socket_present, gpu_present=self.gpu_present, heat=heat,
            rack=self.rack, inlet_offset_c=self.inlet_offset, temps=self._temps,
            elapsed_s=elapsed)
        return pod_cols | disk | mem | net | cpu | gpu | thermal

    # ---------------------------------------------------------------- assemble
    def _assemble(self, vals: dict[str, np.ndarray], power: np.ndarray, now: float,
                  dt_s: float) -> np.ndarray:
        """Columns in layout order; noise; counters integrated; off nodes and absent slots."""
        n, d = self.present.shape
        out = np.empty((n, d))
        for m in METRICS:
            sl, k = self.slices[m.name], self._inst[m.name]
            x = np.asarray(vals[m.name], dtype=np.float64)
            out[:, sl] = x[:, None] if x.ndim == 1 else x[:, :k].reshape(n, -1)
        bucket = np.array([[int(now // NOISE_BUCKET_S) * 2]], dtype=np.int64)
        powered = power != POWER_OFF
        sigma = self.sigma * powered[:, None]  # a powered-off node reads exact values
        out *= 1.0 + sigma * (2.0 * _hash01(self._keys, bucket, self.seed) - 1.0)
        np.minimum(out, self.upper, out=out)
        out[:, self._int_idx] = np.rint(out[:, self._int_idx])
        inc = out * dt_s
        ev = self._event_idx
        if ev.size:
            inc[:, ev] = np.floor(inc[:, ev] + _hash01(self._keys[:, ev], bucket + 1, self.seed))
        self._totals += np.where(self._counting & powered[:, None], inc, 0.0)
        out = np.where(self.counter_cols, self._totals, out)
        if not powered.all():
            out[np.ix_(~powered, self.off_zero)] = 0.0
        np.copyto(out, np.nan, where=self._absent)
        return out


__all__ = ["Layout", "TelemetrySynth", "column_names", "labels_of"]
