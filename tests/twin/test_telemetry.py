"""Node telemetry: the catalogue, the vector layout, determinism, counters and the physics."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest

from smartsched.model.pod import POD_CLASSES, PodClass, UsageProfile
from smartsched.model.presets import load_cluster
from smartsched.scheduling.base import make_scheduler
from smartsched.twin.engine import Decision, Engine, EngineConfig
from smartsched.twin.state import POWER_OFF
from smartsched.twin.telemetry import (
    METRICS,
    Layout,
    TelemetrySynth,
    catalogue_markdown,
    column_names,
    dimensions,
    labels_of,
)
from smartsched.twin.telemetry import physics as ph
from smartsched.twin.telemetry.catalogue import (
    FAMILIES,
    METRIC_BY_NAME,
    UNITS,
    counter_name_ok,
    metric_slices,
)
from smartsched.workloads.resolve import load_workload
from tests.builders import cluster, node, pod

HOUR = 3600.0
DOC = Path(__file__).resolve().parents[2] / "docs" / "telemetry.md"


# ------------------------------------------------------------------ catalogue
def test_standard_layout_has_at_least_200_distinct_dimensions() -> None:
    dims = dimensions(Layout.STANDARD)
    assert len(dims) >= 200
    keys = [(d.metric.name, d.labels) for d in dims]
    assert len(set(keys)) == len(keys)
    names = column_names(Layout.STANDARD)
    assert len(set(names)) == len(names) == len(dims)
    assert 'DCGM_FI_DEV_GPU_UTIL{gpu="3"}' in names
    assert 'node_network_receive_bytes_total{device="eth1"}' in names
    assert 'node_disk_io_time_seconds_total{device="nvme0n1"}' in names
    assert 'smartsched_node_cpu_cache_hit_ratio{level="L3"}' in names
    assert ('smartsched_node_network_packet_latency_seconds{device="eth0",quantile="0.99"}'
            in names)
    assert f'smartsched_node_pods{{class="{POD_CLASSES[0].value}"}}' in names
    gpu3 = dims[names.index('DCGM_FI_DEV_GPU_UTIL{gpu="3"}')]
    assert labels_of(gpu3) == {"gpu": "3"}


def test_every_metric_is_documented_and_named_by_convention() -> None:
    for m in METRICS:
        assert m.unit in UNITS, m.name
        assert m.family in FAMILIES, m.name
        assert m.help.strip().endswith(".") and not m.help[0].islower(), m.name
        assert counter_name_ok(m), m.name
        if m.name.startswith("DCGM_"):
            assert m.source == "dcgm-exporter" and m.family == "gpu"
        elif m.name.startswith("node_"):
            assert m.source == "node-exporter"
        else:
            assert m.name.startswith("smartsched_node_") and m.source == "smartsched"
    per_family = {f: sum(m.family == f for m in METRICS) for f in FAMILIES}
    assert all(n >= 3 for n in per_family.values()), per_family


@pytest.mark.parametrize("name", [
    "node_memory_MemAvailable_bytes", "node_network_receive_bytes_total",
    "node_disk_io_time_seconds_total", "node_hwmon_temp_celsius",
    "node_pressure_cpu_waiting_seconds_total", "node_load1", "node_context_switches_total",
    "node_vmstat_pgmajfault", "node_netstat_Tcp_RetransSegs", "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_SM_CLOCK",
])
def test_standard_exporter_names_are_used(name: str) -> None:
    assert name in METRIC_BY_NAME


def test_counter_naming_rule() -> None:
    assert METRIC_BY_NAME["node_vmstat_pgmajfault"].kind == "counter"
    assert METRIC_BY_NAME["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"].kind == "counter"
    assert METRIC_BY_NAME["node_netstat_Tcp_CurrEstab"].kind == "gauge"
    gauges_total = [m.name for m in METRICS if m.kind == "gauge" and m.name.endswith("_total")]
    assert gauges_total == []


def test_layout_for_cluster() -> None:
    assert Layout(sockets=2, gpus=8, nics=2, disks=2) == Layout.STANDARD
    assert Layout.for_cluster(load_cluster("small")) == Layout.STANDARD
    cpu_only = cluster(node("a", sockets=1), node("b", sockets=1))
    lay = Layout.for_cluster(cpu_only)
    assert (lay.sockets, lay.gpus, lay.nics, lay.disks) == (1, 0, 2, 2)
    assert not any(d.metric.family == "gpu" for d in dimensions(lay))
    slices = metric_slices(lay)
    assert sum(s.stop - s.start for s in slices.values()) == len(dimensions(lay))


def test_doc_is_up_to_date() -> None:
    assert DOC.read_text() == catalogue_markdown(), (
        "docs/telemetry.md is stale: regenerate it with python -c \"from smartsched.twin."
        "telemetry import catalogue_markdown as m; print(m(), end='')\" > docs/telemetry.md"
    )


# -------------------------------------------------------- engines and samples
def _sampled_run(seed: int, synth_seed: int, every_s: float = HOUR,
                 other: tuple[Engine, TelemetrySynth] | None = None) -> list[np.ndarray]:
    """Run the small cluster under the mixed workload, sampling every ``every_s``."""
    spec = load_cluster("small")
    e = Engine(spec, load_workload("mixed", spec, 4, seed), EngineConfig(horizon_s=4 * HOUR,
                                                                         seed=seed))
    syn = TelemetrySynth(spec, synth_seed)
    sched = make_scheduler("k8s-default", seed)
    out, next_t = [], 0.0
    while (req := e.next_decision()) is not None:
        if e.now >= next_t:
            out.append(syn.sample(e))
            next_t = e.now + every_s
            if other is not None:  # an unrelated synthesizer sampled in between
                other[1].sample(other[0])
        e.apply(sched.decide(e.state, req.request))
    out.append(syn.sample(e))
    return out


def _engine(spec, pods, place: dict[str, int], horizon_s: float = 600.0, **cfg) -> Engine:
    """An engine run to ``horizon_s`` with each pod on the node ``place`` names."""
    e = Engine(spec, pods, EngineConfig(horizon_s=horizon_s, power_management=False, **cfg))
    while (req := e.next_decision()) is not None:
        e.apply(Decision(place[req.pod.id]))
    return e


def _col(synth: TelemetrySynth, name: str, **labels: str) -> int:
    want = tuple(labels.items())
    for j, d in enumerate(synth.dims):
        if d.metric.name == name and all(p in d.labels for p in want):
            return j
    raise KeyError(name)


def _absent(lab: dict[str, str], sockets: int, gpus: int) -> bool:
    """Whether a column with labels ``lab`` names an instance the node lacks."""
    if "gpu" in lab:
        return int(lab["gpu"]) >= gpus
    if "socket" in lab:
        return int(lab["socket"]) >= sockets
    if lab.get("device", "").startswith("eth"):  # one NIC per socket
        return int(lab["device"][3:]) >= sockets
    return False


def test_same_seed_same_vectors_different_seed_differs() -> None:
    a = _sampled_run(1, 7)
    spec = load_cluster("small")
    noise = Engine(spec, load_workload("mixed", spec, 1, 9), EngineConfig(horizon_s=HOUR))
    b = _sampled_run(1, 7, other=(noise, TelemetrySynth(spec, 7)))
    assert len(a) == len(b) >= 3
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    c = _sampled_run(1, 8)
    assert not np.array_equal(a[-1], c[-1], equal_nan=True)


def test_shapes_nan_only_for_absent_instances_and_counters_monotonic() -> None:
    xs = _sampled_run(2, 2, every_s=HOUR / 2)
    spec = load_cluster("small")
    lay = Layout.for_cluster(spec)
    dims = dimensions(lay)
    expect_nan = np.array([[_absent(labels_of(d), x.sockets, x.num_gpu) for d in dims]
                           for x in spec.nodes])
    counters = np.array([d.metric.kind == "counter" for d in dims])
    for x in xs:
        assert x.shape == (len(spec.nodes), len(dims)) and x.dtype == np.float64
        np.testing.assert_array_equal(np.isnan(x), expect_nan)
        assert np.isfinite(x[~expect_nan]).all()
        assert (x[~expect_nan] >= 0).all()
    for prev, cur in itertools.pairwise(xs):
        ok = ~expect_nan[:, counters]
        assert (cur[:, counters][ok] >= prev[:, counters][ok]).all()
    energy = dims.index(next(d for d in dims if d.metric.name ==
                             "smartsched_node_energy_joules_total"))
    assert xs[-1][:, energy].sum() > xs[1][:, energy].sum() > 0


@pytest.mark.parametrize("layout", [None, Layout.STANDARD])
def test_absent_sockets_nics_and_gpus_are_nan(layout: Layout | None) -> None:
    spec = cluster(node("one", sockets=1), node("two"), node("g2", gpus=2))
    e = _engine(spec, [pod("p", cpu=2000), pod("q", num_gpu=1, gpu_milli=500)],
                {"p": 0, "q": 2})
    syn = TelemetrySynth(spec, 3, layout)
    x = syn.sample(e)
    names = column_names(syn.layout)
    assert x.shape == (3, len(names))
    for j, d in enumerate(syn.dims):
        want = [_absent(labels_of(d), s, g) for s, g in ((1, 0), (2, 0), (2, 2))]
        np.testing.assert_array_equal(np.isnan(x[:, j]), want, err_msg=names[j])
    if layout is None:  # the cluster's own layout: 2 sockets, 2 GPUs
        assert syn.layout == Layout(sockets=2, gpus=2, nics=2, disks=2)


def test_node_totals_match_the_twin_usage_at_a_tick() -> None:
    spec = load_cluster("small")
    e = Engine(spec, load_workload("mixed", spec, 3, 4), EngineConfig(horizon_s=3 * HOUR,
                                                                      seed=4))
    sched = make_scheduler("k8s-default")
    while (req := e.next_decision()) is not None:
        e.apply(sched.decide(e.state, req.request))
    assert e.now == 3 * HOUR  # the last tick sampled state.usage at this instant
    syn = TelemetrySynth(spec, 0)
    x = syn.sample(e)
    mem = x[:, syn.slices["smartsched_node_pod_memory_working_set_bytes"]].sum(axis=1)
    gpu = x[:, syn.slices["smartsched_node_pod_gpu_used_devices"]].sum(axis=1)
    np.testing.assert_allclose(mem / 2**20, e.state.usage[:, 1], rtol=0.011)
    np.testing.assert_allclose(gpu * 1000, e.state.usage[:, 2], rtol=0.011, atol=1e-9)
    util = np.nanmean(x[:, syn.slices["smartsched_node_cpu_utilization_ratio"]], axis=1)
    cap = e.state.capacity[:, 0]
    np.testing.assert_allclose(util, np.minimum(e.state.usage[:, 0] / cap, 1), rtol=0.011,
                               atol=1e-9)


def test_counters_integrate_dt_and_power_follows_the_energy_model() -> None:
    spec = cluster(node("a", cpu=16000, mem=65536, gpus=2))
    e = _engine(spec, [pod("p", cpu=8000, mem=8192, num_gpu=1, gpu_milli=1000,
                           usage=UsageProfile(mean=0.5))], {"p": 0})
    syn = TelemetrySynth(spec, 0)
    x0 = syn.sample(e)
    x1 = syn.sample(e, dt_s=30.0)  # same engine time: a live exporter's wall-clock step
    power = x1[0, _col(syn, "smartsched_node_power_watts")]
    pm = e.metrics.power_model
    expect = pm.idle_w[0] + pm.host_dyn_w[0] * 0.25 + pm.gpu_dyn_w[0] * 0.25
    assert power == pytest.approx(expect)
    energy = _col(syn, "smartsched_node_energy_joules_total")
    assert x0[0, energy] == 0.0
    assert x1[0, energy] == pytest.approx(30.0 * power)
    dev = np.array([x1[0, _col(syn, "DCGM_FI_DEV_POWER_USAGE", gpu=str(g))] for g in (0, 1)])
    assert dev[0] > dev[1]  # the pod's device works, the other idles


def test_watts_come_from_the_engines_power_model() -> None:
    spec = cluster(node("a", cpu=16000, mem=65536, gpus=2))
    e = _engine(spec, [pod("p", cpu=2000)], {"p": 0})  # both GPUs idle
    pm = e.metrics.power_model
    syn = TelemetrySynth(spec, 0)
    gpu1, power = _col(syn, "DCGM_FI_DEV_POWER_USAGE", gpu="1"), _col(
        syn, "smartsched_node_power_watts")
    x = syn.sample(e)
    idle_gpu = x[0, gpu1]
    assert idle_gpu == pytest.approx(pm.gpu_idle_w[0], rel=0.011)
    e.metrics.power_model = dataclasses.replace(pm, gpu_idle_w=pm.gpu_idle_w * 2,
                                                host_idle_w=pm.host_idle_w + 100.0)
    y = TelemetrySynth(spec, 0).sample(e)
    assert y[0, gpu1] == pytest.approx(2 * idle_gpu)
    assert y[0, power] == pytest.approx(x[0, power] + 100.0 + 2 * pm.gpu_idle_w[0])


def test_powered_off_node_reads_zero_and_its_counters_hold() -> None:
    spec = cluster(node("a"), node("b"))
    pods = [pod("p", cpu=4000, duration=None)]
    e = Engine(spec, pods, EngineConfig(horizon_s=1800.0, idle_power_down_s=300.0))
    syn = TelemetrySynth(spec, 0)
    while e.next_decision() is not None:
        e.apply(Decision(0))
    assert e.state.power[1] == POWER_OFF
    xs = [syn.sample(e), syn.sample(e, dt_s=60.0)]
    off = xs[1][1]
    assert off[_col(syn, "smartsched_node_power_watts")] == 0.0
    assert off[_col(syn, "smartsched_node_cpu_utilization_ratio", socket="0")] == 0.0
    assert off[_col(syn, "node_load1")] == 0.0
    assert off[_col(syn, "node_memory_MemAvailable_bytes")] == 32768 * 2**20
    assert off[_col(syn, "node_context_switches_total")] == xs[0][1][
        _col(syn, "node_context_switches_total")]
    assert xs[1][0][_col(syn, "node_context_switches_total")] > 0


# -------------------------------------------------------------------- physics
def test_memory_heavy_neighbours_lower_the_l3_hit_ratio_and_ipc() -> None:
    spec = cluster(node("a", cpu=32000, mem=262144), node("b", cpu=32000, mem=262144))
    light = [pod(f"l{i}", cpu=2000, mem=2048, usage=UsageProfile(mean=0.8)) for i in range(4)]
    heavy = [pod(f"h{i}", cpu=2000, mem=16384, usage=UsageProfile(mean=0.8)) for i in range(4)]
    place = {p.id: 0 for p in light[:2]} | {p.id: 1 for p in light[2:] + heavy}
    e = _engine(spec, light + heavy, place)
    syn = TelemetrySynth(spec, 0)
    x = syn.sample(e)
    l3 = x[:, _col(syn, "smartsched_node_cpu_cache_hit_ratio", level="L3")]
    assert l3[1] < l3[0] - 0.05
    bw = x[:, syn.slices["smartsched_node_memory_bandwidth_bytes_per_second"]].sum(axis=1)
    assert bw[1] > bw[0]
    ipc = x[:, syn.slices["smartsched_node_cpu_instructions_per_cycle"]]
    assert ipc[1].max() < ipc[0].min()
    hits = x[:, syn.slices["smartsched_node_cpu_cache_hit_ratio"]]
    assert (hits[:, 0] > hits[:, 1]).all() and (hits[:, 1] > hits[:, 2]).all()


def test_network_load_raises_p99_packet_latency() -> None:
    spec = cluster(node("a", sockets=1), node("b", sockets=1))
    # Batch pods receive 70 % of their traffic: 2 x 80 Gb/s puts 112 Gb/s on a 100 Gb/s link.
    pods = [pod("quiet", traffic_mbps=100.0), pod("loud0", traffic_mbps=80_000.0),
            pod("loud1", traffic_mbps=80_000.0)]
    e = _engine(spec, pods, {"quiet": 0, "loud0": 1, "loud1": 1})
    syn = TelemetrySynth(spec, 0)
    x = syn.sample(e)
    p99 = x[:, _col(syn, "smartsched_node_network_packet_latency_seconds", device="eth0",
                    quantile="0.99")]
    p50 = x[:, _col(syn, "smartsched_node_network_packet_latency_seconds", device="eth0",
                    quantile="0.5")]
    assert p99[1] > 2 * p99[0]
    assert (p99 > p50).all()
    x2 = syn.sample(e, dt_s=10.0)
    drops = x2[:, _col(syn, "node_network_receive_drop_total", device="eth0")]
    retrans = x2[:, _col(syn, "node_netstat_Tcp_RetransSegs")]
    assert drops[1] > 0 == drops[0]
    assert retrans[1] > retrans[0]


def test_gpu_power_and_temperature_follow_sm_utilization() -> None:
    spec = cluster(node("a", cpu=32000, mem=131072, gpus=1),
                   node("b", cpu=32000, mem=131072, gpus=1))
    pods = [pod("small", num_gpu=1, gpu_milli=200, pod_class=PodClass.AI_INFER),
            pod("big", num_gpu=1, gpu_milli=1000, pod_class=PodClass.AI_TRAIN)]
    e = _engine(spec, pods, {"small": 0, "big": 1})
    syn = TelemetrySynth(spec, 0)
    x = syn.sample(e)
    sm = x[:, _col(syn, "DCGM_FI_DEV_GPU_UTIL", gpu="0")]
    watts = x[:, _col(syn, "DCGM_FI_DEV_POWER_USAGE", gpu="0")]
    temp = x[:, _col(syn, "DCGM_FI_DEV_GPU_TEMP", gpu="0")]
    pcie = x[:, _col(syn, "DCGM_FI_PROF_PCIE_RX_BYTES", gpu="0")]
    assert sm[1] > sm[0] > 0
    assert watts[1] > watts[0] and pcie[1] > pcie[0]
    assert temp[1] > temp[0]


def test_thermal_lag_and_load_average_move_towards_the_new_level() -> None:
    spec = cluster(node("a", cpu=8000, mem=32768, gpus=1))
    pods = [pod("g", cpu=8000, num_gpu=1, gpu_milli=1000, arrival=600.0, duration=None,
                usage=UsageProfile(mean=1.0))]
    e = Engine(spec, pods, EngineConfig(horizon_s=1200.0, power_management=False))
    syn = TelemetrySynth(spec, 0)
    first = syn.sample(e)  # idle at t=0
    while e.next_decision() is not None:
        e.apply(Decision(0))
    later = syn.sample(e)  # one 1200 s step: past every time constant but load15's
    t, load1, load15 = (_col(syn, n, **k) for n, k in (
        ("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0"}), ("node_load1", {}), ("node_load15", {})))
    assert later[0, t] > first[0, t] + 20
    assert later[0, load1] > later[0, load15] > first[0, load15]


def test_physics_curves_are_monotone() -> None:
    u = np.linspace(0, 1.2, 50)
    q = ph.queueing_factor(u)
    assert (np.diff(q) >= 0).all() and q[0] == 1.0 and np.isfinite(q).all()
    rq = ph.run_queue_length(np.full(u.size, 32.0), u)
    assert (np.diff(rq) > 0).all()
    assert rq[u.searchsorted(0.97)] - rq[u.searchsorted(0.9)] > \
        rq[u.searchsorted(0.5)] - rq[u.searchsorted(0.43)]
    h = ph.cache_hit_ratios(np.linspace(0, 1, 11), np.zeros(11))
    assert (np.diff(h, axis=0) < 0).all() and (h[:, 0] > h[:, 1]).all()
    ipc = ph.instructions_per_cycle(h[:, 2], np.full(11, 0.5))
    assert (np.diff(ipc) < 0).all()
    assert ph.memory_heaviness(np.array([2048.0, 16384.0]), np.array([1000.0, 1000.0])).tolist() \
        == [0.0, 1.0]
    sp = ph.spill_to_free_sockets(np.array([[1.6, 0.2]]), np.ones((1, 2), dtype=bool))
    np.testing.assert_allclose(sp, [[1.0, 0.8]])
