"""The telemetry catalogue: every per-node metric the twin synthesizes, and the vector layout.

Owns the metric definitions (Prometheus name, family, unit, type, help, the
label that tells a node's instances apart, the exporter that would publish
it) and the fixed column order of the per-node vector built from them. Names
follow node-exporter and DCGM-exporter where those exporters define the
signal; signals no standard exporter has are named ``smartsched_node_*``.

Column order (stable): metrics in the order of :data:`METRICS`; within a
metric, instances in ascending order (socket 0.., cache level L1, L2, L3,
gpu 0.., NIC eth0.., disk nvme0n1.., pod classes in ``POD_CLASSES`` order),
and for summaries quantiles ascending inside each instance.

Pure data: the values are computed by :mod:`smartsched.twin.telemetry.synth`.
Regenerate the documentation with ``python -c "from smartsched.twin.telemetry import
catalogue_markdown as m; print(m(), end='')" > docs/telemetry.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final, NamedTuple

from smartsched.model.cluster import ClusterSpec
from smartsched.model.pod import POD_CLASSES

FAMILIES: Final = ("cpu", "memory", "network", "disk", "gpu", "power", "pods")
# DCGM reports clocks in MHz; "megahertz" keeps its field's native unit.
UNITS: Final = frozenset({
    "ratio", "percent", "seconds", "bytes", "bytes_per_second", "count", "per_second",
    "celsius", "watts", "hertz", "megahertz", "joules", "mib",
})
KINDS: Final = ("gauge", "counter")
INSTANCE_LABELS: Final = ("socket", "level", "gpu", "device", "class", "quantile")
SOURCES: Final = ("node-exporter", "dcgm-exporter", "smartsched")

CACHE_LEVELS: Final = ("L1", "L2", "L3")
QUANTILES: Final = ("0.5", "0.99")
CLASS_NAMES: Final = tuple(c.value for c in POD_CLASSES)
DISKS_PER_NODE: Final = 2  # the twin assumes two local NVMe devices on every node
# Counters whose standard exporter name has no ``_total`` suffix.
_UNSUFFIXED_COUNTER_PREFIXES: Final = ("node_vmstat_", "node_netstat_", "DCGM_FI_")


def nic_name(i: int) -> str:
    return f"eth{i}"


def disk_name(i: int) -> str:
    return f"nvme{i}n1"


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric of the catalogue.

    ``instance_label`` is None for one value per node, else the label that tells
    a node's instances apart ("device" means NICs for the network family and
    disks for the disk family). ``quantiles`` turns the metric into a summary:
    each instance gets one column per quantile, labelled ``quantile``.
    """

    name: str
    family: str
    unit: str
    kind: str
    help: str
    instance_label: str | None = None
    source: str = "smartsched"
    quantiles: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        checks = (
            (self.family in FAMILIES, "family"), (self.unit in UNITS, "unit"),
            (self.kind in KINDS, "kind"), (self.source in SOURCES, "source"),
            (self.instance_label in (None, *INSTANCE_LABELS), "instance_label"),
            (bool(self.help.strip()), "help"),
        )
        for ok, field in checks:
            if not ok:
                raise ValueError(f"metric {self.name}: bad {field} {getattr(self, field)!r}")


def counter_name_ok(m: Metric) -> bool:
    """Counters end in ``_total`` (any case) unless their exporter's name does not;
    gauges never do."""
    total = m.name.lower().endswith("_total")
    if m.kind == "gauge":
        return not total
    return total or m.name.startswith(_UNSUFFIXED_COUNTER_PREFIXES)


def _m(name: str, family: str, unit: str, kind: str, help: str, inst: str | None = None,
       quantiles: tuple[str, ...] = ()) -> Metric:
    source = ("dcgm-exporter" if name.startswith("DCGM_") else
              "node-exporter" if name.startswith("node_") else "smartsched")
    return Metric(name, family, unit, kind, help, inst, source, quantiles)


_G, _C = "gauge", "counter"
METRICS: Final[tuple[Metric, ...]] = (
    # ---------------------------------------------------------------- cpu
    _m("smartsched_node_cpu_utilization_ratio", "cpu", "ratio", _G,
       "Share of the socket's cores busy running pods and the system.", "socket"),
    _m("node_load1", "cpu", "count", _G, "1-minute load average (runnable plus blocked tasks)."),
    _m("node_load5", "cpu", "count", _G, "5-minute load average."),
    _m("node_load15", "cpu", "count", _G, "15-minute load average."),
    _m("node_procs_running", "cpu", "count", _G, "Tasks runnable now (the run-queue length)."),
    _m("node_procs_blocked", "cpu", "count", _G, "Tasks blocked waiting for I/O."),
    _m("node_context_switches_total", "cpu", "count", _C, "Context switches."),
    _m("node_intr_total", "cpu", "count", _C, "Interrupts serviced."),
    _m("node_forks_total", "cpu", "count", _C, "Processes and threads created."),
    _m("smartsched_node_cpu_cfs_throttled_periods_total", "cpu", "count", _C,
       "CFS periods (100 ms) in which some pod cgroup hit its CPU quota."),
    _m("node_pressure_cpu_waiting_seconds_total", "cpu", "seconds", _C,
       "PSI: time some runnable task waited for a CPU."),
    _m("smartsched_node_cpu_runqueue_latency_seconds", "cpu", "seconds", _G,
       "Time a task waits in the run queue before it runs (runqlat), by quantile.",
       "quantile"),
    _m("smartsched_node_cpu_cache_hit_ratio", "cpu", "ratio", _G,
       "Hit ratio of the cache level (hits over lookups that reach that level).", "level"),
    _m("smartsched_node_cpu_llc_misses_total", "cpu", "count", _C,
       "Last-level cache misses on the socket (perf LLC-load-misses).", "socket"),
    _m("smartsched_node_cpu_instructions_per_cycle", "cpu", "ratio", _G,
       "Instructions retired per core cycle on the socket's busy cores.", "socket"),
    _m("smartsched_node_cpu_frequency_hertz", "cpu", "hertz", _G,
       "Mean core clock of the socket (turbo headroom shrinks with load).", "socket"),
    _m("smartsched_node_cpu_iowait_ratio", "cpu", "ratio", _G,
       "Share of CPU time idle while I/O is outstanding."),
    _m("smartsched_node_cpu_system_ratio", "cpu", "ratio", _G,
       "Share of CPU time spent in the kernel (syscalls, softirq, interrupts)."),
    # ------------------------------------------------------------- memory
    _m("node_memory_MemTotal_bytes", "memory", "bytes", _G, "Physical memory of the node."),
    _m("node_memory_MemAvailable_bytes", "memory", "bytes", _G,
       "Memory available for new work without swapping (free plus reclaimable cache)."),
    _m("node_memory_MemFree_bytes", "memory", "bytes", _G, "Memory not used for anything."),
    _m("node_memory_Cached_bytes", "memory", "bytes", _G, "Page cache."),
    _m("node_memory_Dirty_bytes", "memory", "bytes", _G, "Page cache waiting to be written."),
    _m("smartsched_node_memory_used_bytes", "memory", "bytes", _G,
       "Memory used by pods and the system, page cache excluded."),
    _m("node_memory_SwapTotal_bytes", "memory", "bytes", _G, "Swap space of the node."),
    _m("node_memory_SwapFree_bytes", "memory", "bytes", _G, "Unused swap space."),
    _m("node_vmstat_pgfault", "memory", "count", _C, "Page faults, minor and major."),
    _m("node_vmstat_pgmajfault", "memory", "count", _C, "Major page faults (needing I/O)."),
    _m("node_vmstat_pswpin", "memory", "count", _C, "Pages swapped in."),
    _m("node_vmstat_pswpout", "memory", "count", _C, "Pages swapped out."),
    _m("node_pressure_memory_waiting_seconds_total", "memory", "seconds", _C,
       "PSI: time some task stalled on memory (reclaim, swap-in, refault)."),
    _m("node_pressure_memory_stalled_seconds_total", "memory", "seconds", _C,
       "PSI: time all non-idle tasks stalled on memory at once."),
    _m("smartsched_node_memory_bandwidth_bytes_per_second", "memory", "bytes_per_second", _G,
       "DRAM read plus write bandwidth of the socket's memory controllers.", "socket"),
    _m("smartsched_node_memory_numa_remote_ratio", "memory", "ratio", _G,
       "Share of the socket's memory accesses served by another socket's memory.", "socket"),
    # ------------------------------------------------------------ network
    _m("node_network_receive_bytes_total", "network", "bytes", _C, "Bytes received.", "device"),
    _m("node_network_transmit_bytes_total", "network", "bytes", _C, "Bytes sent.", "device"),
    _m("node_network_receive_packets_total", "network", "count", _C, "Packets received.",
       "device"),
    _m("node_network_transmit_packets_total", "network", "count", _C, "Packets sent.",
       "device"),
    _m("node_network_receive_drop_total", "network", "count", _C,
       "Received packets dropped (ring or backlog full).", "device"),
    _m("node_network_transmit_drop_total", "network", "count", _C,
       "Packets dropped before sending (queue full).", "device"),
    _m("node_network_receive_errs_total", "network", "count", _C,
       "Receive errors (CRC, framing).", "device"),
    _m("node_network_transmit_errs_total", "network", "count", _C, "Transmit errors.", "device"),
    _m("node_network_speed_bytes", "network", "bytes_per_second", _G,
       "Link speed of the NIC.", "device"),
    _m("smartsched_node_network_packet_latency_seconds", "network", "seconds", _G,
       "Time a packet spends in the NIC's queues and the kernel stack, by quantile.",
       "device", QUANTILES),
    _m("node_netstat_Tcp_OutSegs", "network", "count", _C, "TCP segments sent."),
    _m("node_netstat_Tcp_RetransSegs", "network", "count", _C, "TCP segments retransmitted."),
    _m("node_netstat_Tcp_CurrEstab", "network", "count", _G, "TCP connections established now."),
    # --------------------------------------------------------------- disk
    _m("node_disk_reads_completed_total", "disk", "count", _C, "Reads completed.", "device"),
    _m("node_disk_writes_completed_total", "disk", "count", _C, "Writes completed.", "device"),
    _m("node_disk_read_bytes_total", "disk", "bytes", _C, "Bytes read.", "device"),
    _m("node_disk_written_bytes_total", "disk", "bytes", _C, "Bytes written.", "device"),
    _m("node_disk_io_time_seconds_total", "disk", "seconds", _C,
       "Time the device had I/O in flight (its rate is the busy ratio).", "device"),
    _m("node_disk_io_time_weighted_seconds_total", "disk", "seconds", _C,
       "I/O time weighted by requests in flight (its rate is the mean queue depth).",
       "device"),
    _m("node_disk_read_time_seconds_total", "disk", "seconds", _C,
       "Time reads took, summed (over reads completed: read await).", "device"),
    _m("node_disk_write_time_seconds_total", "disk", "seconds", _C,
       "Time writes took, summed (over writes completed: write await).", "device"),
    _m("node_disk_io_now", "disk", "count", _G, "Requests in flight now (queue depth).",
       "device"),
    _m("node_pressure_io_waiting_seconds_total", "disk", "seconds", _C,
       "PSI: time some task waited for I/O."),
    _m("node_pressure_io_stalled_seconds_total", "disk", "seconds", _C,
       "PSI: time all non-idle tasks waited for I/O at once."),
    # ---------------------------------------------------------------- gpu
    _m("DCGM_FI_DEV_GPU_UTIL", "gpu", "percent", _G,
       "Share of time a kernel ran on the GPU (SM utilization).", "gpu"),
    _m("DCGM_FI_PROF_SM_ACTIVE", "gpu", "ratio", _G,
       "Share of SMs with at least one warp resident, averaged over time.", "gpu"),
    _m("DCGM_FI_PROF_SM_OCCUPANCY", "gpu", "ratio", _G,
       "Resident warps over the SMs' maximum, averaged over time.", "gpu"),
    _m("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gpu", "ratio", _G,
       "Share of cycles the tensor pipes were busy.", "gpu"),
    _m("DCGM_FI_DEV_MEM_COPY_UTIL", "gpu", "percent", _G,
       "Share of time device memory was being read or written.", "gpu"),
    _m("DCGM_FI_DEV_FB_USED", "gpu", "mib", _G, "Framebuffer (device) memory used.", "gpu"),
    _m("DCGM_FI_DEV_FB_FREE", "gpu", "mib", _G, "Framebuffer (device) memory free.", "gpu"),
    _m("DCGM_FI_DEV_POWER_USAGE", "gpu", "watts", _G, "Board power draw.", "gpu"),
    _m("DCGM_FI_DEV_GPU_TEMP", "gpu", "celsius", _G, "GPU die temperature.", "gpu"),
    _m("DCGM_FI_DEV_MEMORY_TEMP", "gpu", "celsius", _G, "Device memory (HBM) temperature.",
       "gpu"),
    _m("DCGM_FI_DEV_SM_CLOCK", "gpu", "megahertz", _G, "SM clock.", "gpu"),
    _m("DCGM_FI_PROF_PCIE_TX_BYTES", "gpu", "bytes_per_second", _G,
       "PCIe bytes the GPU sent (headers and payload).", "gpu"),
    _m("DCGM_FI_PROF_PCIE_RX_BYTES", "gpu", "bytes_per_second", _G,
       "PCIe bytes the GPU received (headers and payload).", "gpu"),
    _m("DCGM_FI_PROF_NVLINK_TX_BYTES", "gpu", "bytes_per_second", _G,
       "NVLink bytes the GPU sent (0 on models without NVLink).", "gpu"),
    _m("DCGM_FI_PROF_NVLINK_RX_BYTES", "gpu", "bytes_per_second", _G,
       "NVLink bytes the GPU received (0 on models without NVLink).", "gpu"),
    _m("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "gpu", "count", _C,
       "Single-bit ECC errors corrected since the driver loaded.", "gpu"),
    _m("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "gpu", "count", _C,
       "Double-bit (uncorrectable) ECC errors since the driver loaded.", "gpu"),
    _m("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "gpu", "count", _C,
       "PCIe packets replayed after link errors.", "gpu"),
    # ------------------------------------------------------ power, thermal
    _m("smartsched_node_power_watts", "power", "watts", _G,
       "IT power of the node, GPUs included (the twin's energy model, before PUE)."),
    _m("smartsched_node_energy_joules_total", "power", "joules", _C,
       "IT energy of the node (the integral of smartsched_node_power_watts)."),
    _m("node_rapl_package_joules_total", "power", "joules", _C,
       "RAPL energy of the CPU package.", "socket"),
    _m("node_rapl_dram_joules_total", "power", "joules", _C,
       "RAPL energy of the socket's DRAM.", "socket"),
    _m("node_hwmon_temp_celsius", "power", "celsius", _G, "CPU package temperature.", "socket"),
    _m("node_cpu_package_throttles_total", "power", "count", _C,
       "Thermal throttling events of the CPU package.", "socket"),
    _m("smartsched_node_inlet_temp_celsius", "power", "celsius", _G,
       "Air temperature at the node's inlet (BMC sensor)."),
    _m("smartsched_node_outlet_temp_celsius", "power", "celsius", _G,
       "Air temperature at the node's exhaust (BMC sensor)."),
    _m("smartsched_node_fan_duty_ratio", "power", "ratio", _G,
       "Fan PWM duty cycle, as a share of full speed."),
    # --------------------------------------------------------------- pods
    _m("smartsched_node_pods", "pods", "count", _G, "Pods of the class running on the node.",
       "class"),
    _m("smartsched_node_pod_cpu_seconds_total", "pods", "seconds", _C,
       "CPU time used by the class's pods.", "class"),
    _m("smartsched_node_pod_cpu_throttled_seconds_total", "pods", "seconds", _C,
       "CPU time the class's pods wanted beyond their quota or the node's slack.", "class"),
    _m("smartsched_node_pod_memory_working_set_bytes", "pods", "bytes", _G,
       "Working-set memory of the class's pods.", "class"),
    _m("smartsched_node_pod_gpu_used_devices", "pods", "count", _G,
       "GPU use of the class's pods in whole-device equivalents.", "class"),
)
METRIC_BY_NAME: Final = {m.name: m for m in METRICS}


@dataclass(frozen=True, slots=True)
class Layout:
    """Slots per node for instance-labelled metrics: the width of the vector.

    A node's instances beyond its slots are not exported; slots beyond its
    instances are NaN. Cache levels, pod classes and quantiles are fixed.
    """

    sockets: int = 2
    gpus: int = 8
    nics: int = 2
    disks: int = 2

    STANDARD: ClassVar[Layout]

    def __post_init__(self) -> None:
        for f in ("sockets", "gpus", "nics", "disks"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 64:
                raise ValueError(f"Layout.{f} must be an integer in 0..64, got {v!r}")
        if self.sockets < 1:
            raise ValueError("Layout.sockets must be at least 1")

    @classmethod
    def for_cluster(cls, spec: ClusterSpec) -> Layout:
        """The most sockets and GPUs of any node (at least 1 socket), 2 NICs, 2 disks."""
        return cls(
            sockets=max(1, max(n.sockets for n in spec.nodes)),
            gpus=max(n.num_gpu for n in spec.nodes),
            nics=2,
            disks=DISKS_PER_NODE,
        )

    def instances(self, m: Metric) -> tuple[str, ...]:
        """Label values of ``m``'s instances in column order (``("",)`` for a node metric)."""
        lab = m.instance_label
        if lab is None:
            return ("",)
        if lab == "socket":
            return tuple(str(i) for i in range(self.sockets))
        if lab == "gpu":
            return tuple(str(i) for i in range(self.gpus))
        if lab == "level":
            return CACHE_LEVELS
        if lab == "class":
            return CLASS_NAMES
        if lab == "quantile":
            return QUANTILES
        if m.family == "network":
            return tuple(nic_name(i) for i in range(self.nics))
        return tuple(disk_name(i) for i in range(self.disks))

    def width(self, m: Metric) -> int:
        """Columns of ``m``: instances x quantiles."""
        return len(self.instances(m)) * max(1, len(m.quantiles))


Layout.STANDARD = Layout(sockets=2, gpus=8, nics=2, disks=2)


class Dimension(NamedTuple):
    """One column of the per-node vector: a metric and its labels (besides the node's)."""

    metric: Metric
    labels: tuple[tuple[str, str], ...]


def dimensions(layout: Layout) -> list[Dimension]:
    """Every column of the per-node vector under ``layout``, in the documented order."""
    out: list[Dimension] = []
    for m in METRICS:
        for inst in layout.instances(m):
            base = () if m.instance_label is None else ((m.instance_label, inst),)
            if m.quantiles:
                out += [Dimension(m, (*base, ("quantile", q))) for q in m.quantiles]
            else:
                out.append(Dimension(m, base))
    return out


def metric_slices(layout: Layout) -> dict[str, slice]:
    """Columns of each metric under ``layout`` (contiguous, in catalogue order)."""
    out: dict[str, slice] = {}
    start = 0
    for m in METRICS:
        w = layout.width(m)
        out[m.name] = slice(start, start + w)
        start += w
    return out


def labels_of(dim: Dimension) -> dict[str, str]:
    """The labels of a column as a dict (the node's own labels are not included)."""
    return dict(dim.labels)


def column_name(dim: Dimension) -> str:
    """Prometheus exposition form: ``DCGM_FI_DEV_GPU_UTIL{gpu="3"}``."""
    if not dim.labels:
        return dim.metric.name
    inner = ",".join(f'{k}="{v}"' for k, v in dim.labels)
    return f"{dim.metric.name}{{{inner}}}"


def column_names(layout: Layout) -> list[str]:
    """Names of every column under ``layout``, for docs and debugging."""
    return [column_name(d) for d in dimensions(layout)]


_INTRO = """\
# Node telemetry of the digital twin

The twin synthesizes one wide vector per node from its own state
(`smartsched.twin.telemetry.TelemetrySynth.sample(engine)` returns
`[num_nodes, D]` float64). Each column is one Prometheus series of the node:
a metric below with, for per-instance metrics, its instance label (and, for
summaries, a `quantile` label). Names follow
node-exporter and DCGM-exporter where those exporters define the signal;
`smartsched_node_*` names are signals no standard exporter has. The physics
behind every value is written out in `platform/smartsched/twin/telemetry/families/`
(one module per metric family).

**Layout.** The width is fixed per cluster by a `Layout`: slots for sockets,
GPUs, NICs (`eth0`, `eth1`, ...) and disks (`nvme0n1`, ...); cache levels
(L1, L2, L3), pod classes and quantiles are fixed. `Layout.for_cluster(spec)`
takes the most sockets and GPUs of any node, 2 NICs and 2 disks;
`Layout.STANDARD` is 2 sockets, 8 GPUs, 2 NICs, 2 disks. Columns go metric by
metric in the table's order, instances ascending inside a metric, quantiles
ascending inside an instance. Every node has one NIC per socket (the twin's
node topology) and two disks.

**Absent instances.** A slot a node does not have (GPU 5 of a 4-GPU node, any
GPU column of a CPU node, socket 1 of a one-socket node) is NaN in the vector
and is not exported to Prometheus. Instances beyond the layout's slots are
dropped.

**Counters** are cumulative and monotonic. At each sample the synthesizer
integrates each counter's current rate over the seconds since the previous
sample (by default the twin's simulated seconds; a live exporter running the
twin on an accelerated clock passes wall-clock seconds, so that PromQL
`rate()` gives the modelled rate). They start at 0 at the first sample.
Gauges are instantaneous.

**Powered-off nodes** keep their counters still, report their static
capacities and free memory, temperatures that relax to the inlet air, and 0
for every other gauge (power 0 W: the twin's energy model counts no standby
draw). Booting and failed nodes report as idle nodes.

The CPU package temperature uses node-exporter's `node_hwmon_temp_celsius`
name with a `socket` label (the real collector labels it by `chip` and
`sensor`); RAPL and thermal-throttle counters likewise use `socket` where
node-exporter says `index` / `package`. DCGM clocks are in MHz, DCGM memory
in MiB, as DCGM-exporter reports them.
"""


def catalogue_markdown() -> str:
    """The whole ``docs/telemetry.md``: the intro, the metric table and the dimension count."""
    std = Layout.STANDARD
    rows = [
        "| Metric | Family | Type | Unit | Instances | Source | Help |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in METRICS:
        if m.instance_label is None:
            inst = "node"
        else:
            inst = f"`{m.instance_label}` x {len(std.instances(m))}"
        if m.quantiles:
            inst += f", `quantile` {'/'.join(m.quantiles)}"
        rows.append(f"| `{m.name}` | {m.family} | {m.kind} | {m.unit} | {inst} | {m.source} "
                    f"| {m.help} |")
    per_family = {f: 0 for f in FAMILIES}
    for d in dimensions(std):
        per_family[d.metric.family] += 1
    counts = ", ".join(f"{f} {n}" for f, n in per_family.items())
    total = sum(per_family.values())
    return (
        f"{_INTRO}\n## Metrics\n\n{len(METRICS)} metrics; under `Layout.STANDARD` the vector "
        f"has **{total} dimensions** ({counts}).\n\n" + "\n".join(rows) + "\n"
    )
