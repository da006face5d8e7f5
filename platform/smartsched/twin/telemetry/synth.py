"""Synthesize the per-node telemetry vector from the twin's state: deterministic, plausible.

Owns the model that turns an engine's state (pods running where, with what
actual use) into the catalogue's ~270 columns per node, the running totals of
counters, and the lagged thermal state. Must not change the engine, and must
not import scheduling. One synthesizer follows one engine (or one exported
twin): it keeps counters, load averages and temperatures between samples.

Inputs per sample: running pods with their use at ``engine.now`` (the same
``usage_factor`` and best-effort rule as the twin's metrics tick, so node
totals equal ``state.usage`` at a tick), per-device GPU allocation, power
state, and the twin's per-node power figures (``engine.metrics``).

Physics (simple, monotone; constants are module-level here and in ``physics``):
  CPU      Pods run on a socket: GPU pods on their GPUs' sockets (by allocated
           GPU share), others by a seeded hash. Socket utilization = its pods'
           use over its share of capacity; overflow spills to free sockets.
           Run queue = cores*u + 2*u/(1-u) (+ cores*(d-1) past capacity): it
           grows sharply above ~90 %. Load averages are exponential averages
           (60/300/900 s of simulated time) of running + blocked tasks. CFS
           throttling: a pod using more than its request runs into its limit
           (the twin's use is what it got; CFS withheld a further 25 % of the
           excess), and best-effort pods lose what the node's slack lacks.
           Cache hit ratios fall with pressure = 0.6 * share of CPU use by
           memory-heavy pods (memory/CPU request of 2 -> 6 GiB per core) +
           0.4 * memory-bandwidth utilization (L1 > L2 > L3 always); IPC =
           (0.5 + 1.8 * L3 hit) * (1 - 0.2 u); clock 3.4 GHz idle -> 2.6 GHz
           all-core; LLC misses = instructions * 0.3 * product of miss ratios.
  Memory   Used = pods + 1.5 GiB + 1 % of the node. Pressure starts at 85 %
           use: major faults, then swap (8 GiB per node, LimitedSwap) past
           90 %, and PSI. Bandwidth per socket = cores used * (0.5 GB/s + 4.5
           GB/s * heaviness), capped at 150 GB/s. NUMA-remote ratio (2+
           sockets) = 3 % + 25 % * the node's memory use beyond one socket's
           share (0 at 1/S, 1 when full) + 90 % of the socket's own pods'
           memory beyond its local share, at most 95 %.
  Network  Each pod sends and receives traffic_mbps * (use / mean use), split
           by class (services send more than they receive) onto one NIC
           chosen by a seeded hash; plus a node baseline. One NIC per socket
           (the node topology), 100 Gb/s, 10 Gb/s at edge sites. Packets =
           bytes / 900 B. Latency quantiles = base (20 us p50, 150 us p99) *
           (1 + u/(1-u)) * (1 + 0.5 u_cpu^2), u capped at 0.98. Drops rise
           quadratically from 85 % link use, retransmits follow drops.
  Disk     Small I/O per pod (logs, images), dataset reads of training pods,
           major faults and swap; 65 % on nvme0n1, large reads 90 % on
           nvme1n1. NVMe service time 80 us read / 20 us write + size /
           bandwidth; await = service * (1 + rho/(1-rho)); queue = Little's law.
  GPU      SM utilization per device = allocated share (1000 - gpu_free)/1000
           * node GPU use / node GPU allocation, clipped to 1. SM activity,
           occupancy, tensor and memory-copy activity scale it by the node's
           training / inference mix. Power = idle + (max - idle) * SM
           utilization (the device model's figures); temperature follows
           power with a 60 s lag (full power = inlet + 55 C); PCIe follows SM
           utilization (inference moves more), NVLink only on NVLink models
           with 2+ GPUs (training all-reduce). ECC errors and PCIe replays are
           rare events drawn from the seeded noise.
  Power    Node power is the twin's energy model (``MetricsRecorder``: idle
           + host dynamic * CPU use + GPU dynamic * GPU use; 0 W powered off),
           without noise; the energy counter integrates it. RAPL package = 60 %
           of the host's share per socket, DRAM = 4 W + 20 W * bandwidth use.
           Inlet air = 20 C + up to 4 C per node + 3 C * rack power share;
           package temperature = inlet + 0.35 C/W (20 s lag); outlet = inlet
           + 20 C * power / full-load power; fans follow the hottest package
           or GPU.
  Off      A powered-off node: counters hold, capacities and free memory
           stay, temperatures relax to the inlet air, every other gauge is 0.
           Booting and failed nodes report as idle nodes.

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
from smartsched.model.topology import NIC_GBPS
from smartsched.twin.podtable import RUNNING, PodTable
from smartsched.twin.state import POWER_OFF, ClusterState
from smartsched.twin.telemetry import physics as ph
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
from smartsched.twin.usage import _hash01, usage_factor

if TYPE_CHECKING:
    from smartsched.twin.engine import Engine

NOISE_BUCKET_S: Final = 15.0
NOISE_SIGMA: Final = 0.01
TEMP_NOISE_SIGMA: Final = 0.005
MIB: Final = 1 << 20
KIB: Final = 1 << 10

SYSTEM_MEMORY_MIB: Final = 1536.0
SYSTEM_MEMORY_SHARE: Final = 0.01
SWAP_BYTES: Final = 8.0 * (1 << 30)
SOCKET_BW_PEAK: Final = 150e9
BW_PER_CORE_LIGHT: Final = 0.5e9
BW_PER_CORE_HEAVY: Final = 5e9
BASE_BW_PER_SOCKET: Final = 0.5e9
THROTTLE_SHARE: Final = 0.25
CPU_TURBO_HZ: Final = 3.4e9
CPU_ALLCORE_HZ: Final = 2.6e9
LOAD_TAUS_S: Final = (60.0, 300.0, 900.0)

CLOUD_NIC_BPS: Final = NIC_GBPS * 1e9
EDGE_NIC_BPS: Final = 1.25e9
MEAN_PACKET_BYTES: Final = 900.0
NODE_BASE_TRAFFIC_BPS: Final = 50e3
POD_BASE_TRAFFIC_BPS: Final = 20e3
PACKET_LATENCY_BASE_S: Final = np.array([20e-6, 150e-6])  # QUANTILES
RUNQ_LATENCY_BASE_S: Final = np.array([2e-6, 50e-6])  # QUANTILES
DROP_MAX: Final = 0.02
ERRORS_PER_PACKET: Final = 1e-9
# Share of a pod's traffic it sends, by class (services answer more than they are asked).
TX_SHARE: Final = {PodClass.ONLINE: 0.6, PodClass.BATCH: 0.3, PodClass.AI_TRAIN: 0.5,
                   PodClass.AI_INFER: 0.6, PodClass.EDGE_RT: 0.6}

DISK_SPLIT_SMALL: Final = np.array([0.65, 0.35])  # logs, images, swap: mostly the OS disk
DISK_SPLIT_LARGE: Final = np.array([0.1, 0.9])  # dataset reads: mostly the scratch disk
TRAIN_READ_IOPS: Final = 150.0
NVME_READ_S: Final = 80e-6
NVME_WRITE_S: Final = 20e-6
NVME_READ_BPS: Final = 3e9
NVME_WRITE_BPS: Final = 2e9

PCIE_BPS: Final = 25e9
NVLINK_BPS: Final = 300e9
GPU_TEMP_RISE_C: Final = 55.0  # above inlet at full board power
GPU_CONTEXT_MIB: Final = 300.0
SM_IDLE_MHZ: Final = 210.0
SM_BOOST_MHZ: Final = {"T4": 1590.0, "P100": 1480.0, "V100M16": 1530.0, "V100M32": 1530.0,
                       "A10": 1695.0, "A100": 1410.0, "H100": 1980.0, "L4": 2040.0}
SM_BOOST_DEFAULT_MHZ: Final = 1500.0
ECC_SBE_PER_S: Final = 3e-6
ECC_DBE_PER_S: Final = 3e-9
PCIE_REPLAY_PER_S: Final = 1e-4

INLET_BASE_C: Final = 20.0
PKG_SHARE: Final = 0.6
PKG_C_PER_W: Final = 0.35
OUTLET_RISE_C: Final = 20.0  # exhaust over inlet at full load
THROTTLE_C: Final = 90.0
TAU_CPU_S: Final = 20.0
TAU_GPU_S: Final = 60.0

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

_CLS = {c: POD_CLASS_IDS[c] for c in PodClass}


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

        self.host_idle_w = np.array([x.host_idle_watts for x in nodes])
        self.host_dyn_w = np.array([x.host_max_watts for x in nodes]) - self.host_idle_w
        models = [DEVICE_MODELS[x.gpu_model] if x.num_gpu else None for x in nodes]
        self.g_idle_w = np.array([m.idle_watts if m else 0.0 for m in models])
        self.g_max_w = np.array([m.max_watts if m else 0.0 for m in models])
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
        self.num_racks = len(racks)
        idx = np.arange(n)
        self.inlet_offset = 4.0 * _hash01(idx, np.full(n, 3), self.seed)
        self.tx_share = np.zeros(len(_CLS))
        for c, share in TX_SHARE.items():
            self.tx_share[_CLS[c]] = share

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
        self._load = np.zeros((n, len(LOAD_TAUS_S)))
        self._t_pkg = np.zeros((n, self.s_int))
        self._t_gpu = np.zeros((n, self.g_int))
        self._t_hbm = np.zeros((n, self.g_int))

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
        first = self._last_now is None
        elapsed = 0.0 if self._last_now is None else max(now - self._last_now, 0.0)
        if dt_s is None:
            dt_s = elapsed
        if not dt_s >= 0:
            raise ValueError(f"dt_s must be >= 0, got {dt_s}")
        self._last_now = now
        with np.errstate(divide="ignore", invalid="ignore"):
            vals = self._values(engine, now, elapsed, first)
        return self._assemble(vals, st.power, now, float(dt_s))

    def _values(self, engine: Engine, now: float, elapsed: float,
                first: bool) -> dict[str, np.ndarray]:
        st, tb = engine.state, engine.table
        n = st.num_nodes
        v: dict[str, np.ndarray] = {}
        powered = st.power != POWER_OFF
        pw = powered.astype(np.float64)
        cap_cpu = st.capacity[:, CPU].astype(np.float64)
        cap_mem = st.capacity[:, MEM].astype(np.float64)
        cores = cap_cpu / 1000.0
        s_node = self.sockets
        sock_present = np.arange(self.s_int)[None, :] < s_node[:, None]

        # ---- pods: use at `now`, exactly as the twin's metrics tick computes it
        run = np.flatnonzero(tb.status == RUNNING)
        nd = tb.node[run].astype(np.int64)
        f = usage_factor(now, run, tb.usage_kind[run], tb.usage_mean[run],
                         tb.usage_amplitude[run], tb.usage_peak[run], tb.usage_burst[run],
                         tb.usage_burst_p[run], engine.config.seed)
        req = tb.requests[run]
        be = tb.best_effort[run]
        hp = ~be
        dem_cpu, dem_mem = req[:, CPU] * f, req[:, MEM] * f
        gpu_use = np.where(be, 0.0, req[:, GPU] * f)
        hp_cpu = np.bincount(nd[hp], dem_cpu[hp], minlength=n)
        hp_mem = np.bincount(nd[hp], dem_mem[hp], minlength=n)
        node_gpu = np.bincount(nd[hp], gpu_use[hp], minlength=n)
        be_cpu = np.bincount(nd[be], dem_cpu[be], minlength=n)
        be_mem = np.bincount(nd[be], dem_mem[be], minlength=n)
        got_cpu = np.minimum(be_cpu, np.maximum(cap_cpu - hp_cpu, 0.0))
        got_mem = np.minimum(be_mem, np.maximum(cap_mem - hp_mem, 0.0))
        node_cpu, node_mem = hp_cpu + got_cpu, hp_mem + got_mem
        sc_cpu = np.where(be_cpu > 0, got_cpu / be_cpu, 1.0)
        sc_mem = np.where(be_mem > 0, got_mem / be_mem, 1.0)
        pod_cpu = np.where(be, dem_cpu * sc_cpu[nd], dem_cpu)
        pod_mem = np.where(be, dem_mem * sc_mem[nd], dem_mem)
        pod_cores = pod_cpu / 1000.0
        thr = (THROTTLE_SHARE * np.maximum(dem_cpu - req[:, CPU], 0.0) + (dem_cpu - pod_cpu))
        cls = tb.cls[run].astype(np.int64)
        nc = len(CLASS_NAMES)
        key = nd * nc + cls

        def by_class(w: np.ndarray | None) -> np.ndarray:
            return np.bincount(key, w, minlength=n * nc).reshape(n, nc)

        pods_cls = by_class(None).astype(np.float64)
        pods_n = pods_cls.sum(axis=1)
        v["smartsched_node_pods"] = pods_cls
        v["smartsched_node_pod_cpu_seconds_total"] = by_class(pod_cores)
        v["smartsched_node_pod_cpu_throttled_seconds_total"] = by_class(thr / 1000.0)
        v["smartsched_node_pod_memory_working_set_bytes"] = by_class(pod_mem * MIB)
        gpu_cls = by_class(gpu_use / 1000.0)
        v["smartsched_node_pod_gpu_used_devices"] = gpu_cls
        throttled_frac = np.clip(5.0 * thr / np.maximum(dem_cpu, 1.0), 0.0, 1.0)
        v["smartsched_node_cpu_cfs_throttled_periods_total"] = 10.0 * np.bincount(
            nd, throttled_frac, minlength=n)

        # ---- sockets: where each pod's threads and memory live
        heavy = ph.memory_heaviness(req[:, MEM].astype(np.float64), req[:, CPU].astype(np.float64))
        cores_used = node_cpu / 1000.0
        heavy_share = np.where(
            cores_used > 0, np.bincount(nd, heavy * pod_cores, minlength=n) / cores_used, 0.0)
        bw_pod = pod_cores * (BW_PER_CORE_LIGHT + (BW_PER_CORE_HEAVY - BW_PER_CORE_LIGHT) * heavy)
        gpu_pod = req[:, GPU] > 0
        gw = self._gpu_socket_weights(st, sock_present)
        sock = np.minimum((_hash01(run, np.full(run.size, 1), self.seed) * s_node[nd]).astype(
            np.int64), s_node[nd] - 1)

        def per_socket(w: np.ndarray) -> np.ndarray:
            cpu_only = ~gpu_pod
            out = np.bincount(nd[cpu_only] * self.s_int + sock[cpu_only], w[cpu_only],
                              minlength=n * self.s_int).reshape(n, self.s_int)
            return out + np.bincount(nd[gpu_pod], w[gpu_pod], minlength=n)[:, None] * gw

        local_cpu = cap_cpu / s_node
        u_sock = ph.spill_to_free_sockets(per_socket(pod_cpu) / local_cpu[:, None], sock_present)
        mem_sock = per_socket(pod_mem)
        bw_sock = np.where(sock_present, np.minimum(
            per_socket(bw_pod) + BASE_BW_PER_SOCKET * pw[:, None], SOCKET_BW_PEAK), 0.0)
        bw_util = bw_sock.sum(axis=1) / (s_node * SOCKET_BW_PEAK)

        # ---- memory pressure, then disk, then the rest of memory
        sys_mem = pw * (SYSTEM_MEMORY_MIB + SYSTEM_MEMORY_SHARE * cap_mem)
        mem_frac = (node_mem + sys_mem) / cap_mem
        press = ph.saturation_loss(mem_frac, 0.85)
        swap_press = ph.saturation_loss(mem_frac, 0.9)
        majflt = pw * (0.2 + 3000.0 * press)
        pswpin, pswpout = 2000.0 * swap_press, 3000.0 * swap_press
        train = pods_cls[:, _CLS[PodClass.AI_TRAIN]]
        self._disk(v, pw, pods_n, train, majflt, pswpin, pswpout, press)
        read_bps = v["node_disk_read_bytes_total"].sum(axis=1)
        write_bps = v["node_disk_written_bytes_total"].sum(axis=1)

        used_mib = np.minimum(node_mem + sys_mem, cap_mem)
        room = cap_mem - used_mib
        cached = pw * room * (0.2 + 0.5 * np.minimum(read_bps / 200e6, 1.0))
        v["node_memory_MemTotal_bytes"] = cap_mem * MIB
        v["smartsched_node_memory_used_bytes"] = used_mib * MIB
        v["node_memory_Cached_bytes"] = cached * MIB
        v["node_memory_Dirty_bytes"] = np.minimum(write_bps * 5.0, 0.2 * cached * MIB)
        v["node_memory_MemFree_bytes"] = (room - cached) * MIB
        v["node_memory_MemAvailable_bytes"] = (room - 0.2 * cached) * MIB
        v["node_memory_SwapTotal_bytes"] = np.full(n, SWAP_BYTES)
        v["node_memory_SwapFree_bytes"] = SWAP_BYTES * (1.0 - 0.8 * swap_press)
        v["node_vmstat_pgfault"] = pw * (500.0 + 100.0 * pods_n + 2000.0 * cores_used) + majflt
        v["node_vmstat_pgmajfault"] = majflt
        v["node_vmstat_pswpin"] = pswpin
        v["node_vmstat_pswpout"] = pswpout
        psi_mem = pw * np.clip(0.6 * press, 0.0, 1.0)
        v["node_pressure_memory_waiting_seconds_total"] = psi_mem
        v["node_pressure_memory_stalled_seconds_total"] = 0.35 * psi_mem
        v["smartsched_node_memory_bandwidth_bytes_per_second"] = bw_sock
        local_mem = (cap_mem / s_node)[:, None]
        one = 1.0 / s_node
        beyond = np.clip((mem_frac - one) / np.maximum(1.0 - one, 1e-9), 0.0, 1.0)[:, None]
        own = np.maximum(mem_sock - local_mem, 0.0) / np.maximum(mem_sock, 1.0)
        remote = np.minimum(0.03 + 0.25 * beyond + 0.9 * own, 0.95)
        v["smartsched_node_memory_numa_remote_ratio"] = np.where(
            (s_node[:, None] > 1) & sock_present, remote * pw[:, None], 0.0)

        # ---- network
        u_raw = node_cpu / cap_cpu
        u = np.minimum(u_raw, 1.0)
        pkts = self._network(v, tb, run, nd, f, cls, pw, pods_n, pods_cls, u)

        # ---- cpu
        v["smartsched_node_cpu_utilization_ratio"] = u_sock
        running = pw * np.rint(1.0 + ph.run_queue_length(cores, u_raw))
        io_now = v["node_disk_io_now"].sum(axis=1)
        blocked = pw * np.rint(0.5 * io_now + 10.0 * press)
        v["node_procs_running"], v["node_procs_blocked"] = running, blocked
        target = running + blocked
        for j, tau in enumerate(LOAD_TAUS_S):
            self._load[:, j] = target if first else ph.first_order_lag(
                self._load[:, j], target, elapsed, tau)
        v["node_load1"], v["node_load5"], v["node_load15"] = (self._load[:, j].copy()
                                                              for j in range(3))
        disk_iops = (v["node_disk_reads_completed_total"]
                     + v["node_disk_writes_completed_total"]).sum(axis=1)
        v["node_context_switches_total"] = pw * (800.0 + 600.0 * pods_n + 4000.0 * cores_used
                                                 + 0.2 * pkts)
        v["node_intr_total"] = pw * (1500.0 + 1500.0 * cores_used + pkts / 32.0 + disk_iops)
        v["node_forks_total"] = pw * (0.3 + 0.15 * pods_n)
        qf = ph.queueing_factor(u_raw)
        v["node_pressure_cpu_waiting_seconds_total"] = pw * np.clip(
            0.02 * (qf - 1.0) + np.maximum(u_raw - 1.0, 0.0), 0.0, 1.0)
        over = 1.0 + 4.0 * np.maximum(u_raw - 1.0, 0.0)
        v["smartsched_node_cpu_runqueue_latency_seconds"] = (
            RUNQ_LATENCY_BASE_S[None, :] * (qf * over)[:, None])
        hit = ph.cache_hit_ratios(heavy_share, bw_util)
        v["smartsched_node_cpu_cache_hit_ratio"] = hit
        ipc = ph.instructions_per_cycle(hit[:, 2:3], u_sock)
        freq = CPU_TURBO_HZ - (CPU_TURBO_HZ - CPU_ALLCORE_HZ) * u_sock
        v["smartsched_node_cpu_instructions_per_cycle"] = ipc
        v["smartsched_node_cpu_frequency_hertz"] = freq
        miss = 0.3 * (1 - hit[:, 0]) * (1 - hit[:, 1]) * (1 - hit[:, 2])
        instr = ipc * freq * u_sock * (cores / s_node)[:, None]
        v["smartsched_node_cpu_llc_misses_total"] = instr * miss[:, None]
        busy_disk = v["node_disk_io_time_seconds_total"].mean(axis=1)
        psi_io = v["node_pressure_io_waiting_seconds_total"]
        v["smartsched_node_cpu_iowait_ratio"] = (1.0 - u) * np.minimum(
            0.5, 0.5 * busy_disk + 0.3 * psi_io)
        v["smartsched_node_cpu_system_ratio"] = pw * (
            0.005 + u * (0.08 + 0.1 * np.minimum(pkts / 1e6, 1.0)))

        # ---- gpu, then power and thermal
        gpu_rise, hbm_rise = self._gpu(v, st, node_gpu, gpu_cls, pw)
        self._power(v, engine, u, node_gpu, u_sock, bw_sock, sock_present, pw, gpu_rise,
                    hbm_rise, elapsed, first)
        return v

    def _gpu_socket_weights(self, st: ClusterState, sock_present: np.ndarray) -> np.ndarray:
        """[N, S] share of the node's allocated GPU milli on each socket (uniform if none)."""
        gpu_free, gpu_socket, exists = st.gpu_free, st.gpu_socket, st.gpu_exists
        alloc = np.where(exists, 1000 - gpu_free, 0).astype(np.float64)
        w = np.zeros((gpu_free.shape[0], self.s_int))
        for s in range(self.s_int):
            w[:, s] = (alloc * (gpu_socket == s)).sum(axis=1)
        tot = w.sum(axis=1, keepdims=True)
        uniform = sock_present / sock_present.sum(axis=1, keepdims=True)
        return np.where(tot > 0, w / np.where(tot > 0, tot, 1.0), uniform)

    def _disk(self, v: dict[str, np.ndarray], pw: np.ndarray, pods_n: np.ndarray,
              train: np.ndarray, majflt: np.ndarray, pswpin: np.ndarray, pswpout: np.ndarray,
              press: np.ndarray) -> None:
        small_r = pw * (5.0 + 8.0 * pods_n) + majflt + pswpin / 8.0
        large_r = pw * TRAIN_READ_IOPS * train
        small_w = pw * (10.0 + 12.0 * pods_n) + pswpout / 8.0
        split_s = _pad(DISK_SPLIT_SMALL, self.disk_int)[None, :]
        split_l = _pad(DISK_SPLIT_LARGE, self.disk_int)[None, :]
        rd = small_r[:, None] * split_s + large_r[:, None] * split_l
        rd_bytes = (small_r[:, None] * split_s * 16 * KIB
                    + large_r[:, None] * split_l * 256 * KIB)
        wr = small_w[:, None] * split_s
        wr_bytes = wr * 32 * KIB
        s_r = NVME_READ_S + np.where(rd > 0, rd_bytes / rd, 0.0) / NVME_READ_BPS
        s_w = NVME_WRITE_S + 32 * KIB / NVME_WRITE_BPS
        rho = np.minimum(rd * s_r + wr * s_w, ph.U_CAP)
        qf = ph.queueing_factor(rho)
        await_r, await_w = s_r * qf, s_w * qf
        v["node_disk_reads_completed_total"] = rd
        v["node_disk_writes_completed_total"] = wr
        v["node_disk_read_bytes_total"] = rd_bytes
        v["node_disk_written_bytes_total"] = wr_bytes
        v["node_disk_io_time_seconds_total"] = rho
        v["node_disk_read_time_seconds_total"] = rd * await_r
        v["node_disk_write_time_seconds_total"] = wr * await_w
        depth = rd * await_r + wr * await_w
        v["node_disk_io_time_weighted_seconds_total"] = depth
        v["node_disk_io_now"] = depth
        psi = pw * np.clip(0.5 * rho.max(axis=1) + 0.3 * press, 0.0, 1.0)
        v["node_pressure_io_waiting_seconds_total"] = psi
        v["node_pressure_io_stalled_seconds_total"] = 0.3 * psi

    def _network(self, v: dict[str, np.ndarray], tb: PodTable, run: np.ndarray, nd: np.ndarray,
                 f: np.ndarray, cls: np.ndarray, pw: np.ndarray, pods_n: np.ndarray,
                 pods_cls: np.ndarray, u_cpu: np.ndarray) -> np.ndarray:
        """Fill the network family; return packets per second per node (both ways)."""
        n, k = pw.size, self.k_int
        mean = tb.usage_mean[run]
        traffic = tb.traffic_mbps[run] * 1e6 / 8.0 * f / np.maximum(mean, 0.05)
        tx_pod = traffic * self.tx_share[cls]
        nic = np.minimum((_hash01(run, np.full(run.size, 2), self.seed) * self.nics[nd]).astype(
            np.int64), self.nics[nd] - 1)
        key = nd * k + nic
        nic_present = np.arange(k)[None, :] < self.nics[:, None]
        base = (pw * (NODE_BASE_TRAFFIC_BPS + POD_BASE_TRAFFIC_BPS * pods_n) / self.nics)[:, None]
        base = np.where(nic_present, base, 0.0)
        tx = np.bincount(key, tx_pod, minlength=n * k).reshape(n, k) + base
        rx = np.bincount(key, traffic - tx_pod, minlength=n * k).reshape(n, k) + base
        speed = self.nic_bps[:, None]
        rx_ok, tx_ok = np.minimum(rx, speed), np.minimum(tx, speed)
        u_rx, u_tx = rx / speed, tx / speed
        prx, ptx = rx_ok / MEAN_PACKET_BYTES, tx_ok / MEAN_PACKET_BYTES
        drx = prx * DROP_MAX * ph.saturation_loss(u_rx) + (rx - rx_ok) / MEAN_PACKET_BYTES
        dtx = ptx * DROP_MAX * ph.saturation_loss(u_tx) + (tx - tx_ok) / MEAN_PACKET_BYTES
        v["node_network_receive_bytes_total"] = rx_ok
        v["node_network_transmit_bytes_total"] = tx_ok
        v["node_network_receive_packets_total"] = prx
        v["node_network_transmit_packets_total"] = ptx
        v["node_network_receive_drop_total"] = drx
        v["node_network_transmit_drop_total"] = dtx
        v["node_network_receive_errs_total"] = ERRORS_PER_PACKET * prx
        v["node_network_transmit_errs_total"] = ERRORS_PER_PACKET * ptx
        v["node_network_speed_bytes"] = np.broadcast_to(speed, (n, k))
        u_nic = np.maximum(u_rx, u_tx)
        lat = PACKET_LATENCY_BASE_S[None, None, :] * (
            ph.queueing_factor(u_nic) * (1.0 + 0.5 * u_cpu[:, None] ** 2))[:, :, None]
        v["smartsched_node_network_packet_latency_seconds"] = lat
        pkts_tx, pkts = ptx.sum(axis=1), (prx + ptx).sum(axis=1)
        drop_frac = np.where(pkts > 0, (drx + dtx).sum(axis=1) / pkts, 0.0)
        out_segs = 0.95 * pkts_tx
        v["node_netstat_Tcp_OutSegs"] = out_segs
        v["node_netstat_Tcp_RetransSegs"] = out_segs * (2e-4 + drop_frac)
        chatty = pods_cls[:, _CLS[PodClass.ONLINE]] + pods_cls[:, _CLS[PodClass.EDGE_RT]]
        v["node_netstat_Tcp_CurrEstab"] = pw * (30.0 + 40.0 * chatty + 4.0 * (pods_n - chatty))
        return pkts

    def _gpu(self, v: dict[str, np.ndarray], st: ClusterState, node_gpu: np.ndarray,
             gpu_cls: np.ndarray, pw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Fill the GPU family; return the steady-state die and HBM rise over inlet air."""
        n, g = pw.size, self.g_int
        free = np.zeros((n, g))
        gf = st.gpu_free
        free[:, : gf.shape[1]] = gf
        exists = np.arange(g)[None, :] < self.gpu_count[:, None]
        alloc_share = np.where(exists, (1000.0 - free) / 1000.0, 0.0)
        alloc = st.allocated[:, GPU].astype(np.float64)
        rho = np.where(alloc > 0, node_gpu / np.maximum(alloc, 1.0), 0.0)
        sm = np.clip(alloc_share * rho[:, None], 0.0, 1.0)
        used = np.maximum(gpu_cls.sum(axis=1), 1e-9)
        train = (gpu_cls[:, _CLS[PodClass.AI_TRAIN]] / used)[:, None]
        infer = (gpu_cls[:, _CLS[PodClass.AI_INFER]] / used)[:, None]
        active = sm * (0.55 + 0.35 * train)
        v["DCGM_FI_DEV_GPU_UTIL"] = 100.0 * sm
        v["DCGM_FI_PROF_SM_ACTIVE"] = active
        v["DCGM_FI_PROF_SM_OCCUPANCY"] = active * (0.35 + 0.25 * train)
        v["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] = active * (0.2 + 0.4 * train)
        copy = sm * (0.3 + 0.2 * infer)
        v["DCGM_FI_DEV_MEM_COPY_UTIL"] = 100.0 * copy
        total = self.g_mem_mib[:, None]
        reserved = np.maximum(0.01 * total, 256.0)
        fb_used = np.where(alloc_share > 0, GPU_CONTEXT_MIB + alloc_share * (
            total - reserved - GPU_CONTEXT_MIB) * (0.55 + 0.4 * np.minimum(rho, 1.0))[:, None],
            0.0)
        v["DCGM_FI_DEV_FB_USED"] = fb_used
        v["DCGM_FI_DEV_FB_FREE"] = total - reserved - fb_used
        idle, peak = self.g_idle_w[:, None], self.g_max_w[:, None]
        power = pw[:, None] * (idle + (peak - idle) * sm)
        v["DCGM_FI_DEV_POWER_USAGE"] = power
        temp_rise = GPU_TEMP_RISE_C * np.where(peak > 0, power / np.maximum(peak, 1e-9), 0.0)
        boost = self.g_boost_mhz[:, None]
        v["DCGM_FI_DEV_SM_CLOCK"] = pw[:, None] * (
            SM_IDLE_MHZ + (boost - SM_IDLE_MHZ) * np.minimum(sm / 0.05, 1.0) * (1 - 0.12 * sm))
        rx = PCIE_BPS * sm * (0.04 + 0.25 * infer + 0.06 * train)
        v["DCGM_FI_PROF_PCIE_RX_BYTES"] = rx
        v["DCGM_FI_PROF_PCIE_TX_BYTES"] = rx * (0.3 + 0.3 * infer)
        nv = NVLINK_BPS * sm * train * 0.4 * self.g_nvlink[:, None]
        v["DCGM_FI_PROF_NVLINK_TX_BYTES"] = nv
        v["DCGM_FI_PROF_NVLINK_RX_BYTES"] = nv
        v["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] = ECC_SBE_PER_S * (0.5 + sm)
        v["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] = np.broadcast_to(ECC_DBE_PER_S * pw[:, None], sm.shape)
        v["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] = PCIE_REPLAY_PER_S * rx / PCIE_BPS
        hbm_rise = 5.0 + 0.6 * temp_rise + 15.0 * copy
        return temp_rise, hbm_rise

    def _power(self, v: dict[str, np.ndarray], engine: Engine, u: np.ndarray,
               node_gpu: np.ndarray, u_sock: np.ndarray, bw_sock: np.ndarray,
               sock_present: np.ndarray, pw: np.ndarray, gpu_rise: np.ndarray,
               hbm_rise: np.ndarray, elapsed: float, first: bool) -> None:
        st, mt = engine.state, engine.metrics
        gpu_util = np.minimum(node_gpu / np.maximum(st.capacity[:, GPU], 1), 1.0)
        node_w = mt.power_model.node_w(st.power, u, gpu_util)
        v["smartsched_node_power_watts"] = node_w
        v["smartsched_node_energy_joules_total"] = node_w
        s_node = self.sockets[:, None]
        host_s = np.where(sock_present, pw[:, None] * (
            self.host_idle_w[:, None] + self.host_dyn_w[:, None] * u_sock) / s_node, 0.0)
        pkg = PKG_SHARE * host_s
        v["node_rapl_package_joules_total"] = pkg
        v["node_rapl_dram_joules_total"] = np.where(
            sock_present, pw[:, None] * 4.0 + 20.0 * bw_sock / SOCKET_BW_PEAK, 0.0)
        max_w = mt.power_model.max_w
        rack_w = np.bincount(self.rack, node_w, minlength=self.num_racks)
        rack_max = np.bincount(self.rack, max_w, minlength=self.num_racks)
        inlet = INLET_BASE_C + self.inlet_offset + 3.0 * (rack_w / rack_max)[self.rack]
        v["smartsched_node_inlet_temp_celsius"] = inlet
        v["smartsched_node_outlet_temp_celsius"] = inlet + OUTLET_RISE_C * node_w / max_w
        t_pkg_ss = inlet[:, None] + PKG_C_PER_W * pkg
        t_gpu_ss = inlet[:, None] + gpu_rise
        t_hbm_ss = inlet[:, None] + hbm_rise * pw[:, None]
        if first:
            self._t_pkg, self._t_gpu, self._t_hbm = t_pkg_ss, t_gpu_ss, t_hbm_ss
        else:
            self._t_pkg = ph.first_order_lag(self._t_pkg, t_pkg_ss, elapsed, TAU_CPU_S)
            self._t_gpu = ph.first_order_lag(self._t_gpu, t_gpu_ss, elapsed, TAU_GPU_S)
            self._t_hbm = ph.first_order_lag(self._t_hbm, t_hbm_ss, elapsed, TAU_GPU_S)
        v["node_hwmon_temp_celsius"] = self._t_pkg.copy()
        v["DCGM_FI_DEV_GPU_TEMP"] = self._t_gpu.copy()
        v["DCGM_FI_DEV_MEMORY_TEMP"] = self._t_hbm.copy()
        v["node_cpu_package_throttles_total"] = 2.0 * np.maximum(self._t_pkg - THROTTLE_C, 0.0)
        gpu_present = np.arange(self.g_int)[None, :] < self.gpu_count[:, None]
        hottest = np.maximum(np.where(sock_present, self._t_pkg, -np.inf).max(axis=1),
                             np.where(gpu_present, self._t_gpu, -np.inf).max(axis=1))
        v["smartsched_node_fan_duty_ratio"] = pw * np.clip(
            0.25 + 0.75 * (hottest - 45.0) / 40.0, 0.25, 1.0)

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


def _pad(x: np.ndarray, width: int) -> np.ndarray:
    out = np.zeros(width)
    out[: min(width, x.size)] = x[:width]
    return out


__all__ = ["Layout", "TelemetrySynth", "column_names", "labels_of"]
