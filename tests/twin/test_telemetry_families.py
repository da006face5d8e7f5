"""The telemetry families, called directly: one pure function per metric family."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest

from smartsched.model.pod import POD_CLASS_IDS, PodClass, UsageProfile
from smartsched.twin.podtable import RUNNING, PodTable
from smartsched.twin.power import PowerModel
from smartsched.twin.sampling import running_use
from smartsched.twin.state import POWER_BOOTING, POWER_OFF, POWER_ON
from smartsched.twin.telemetry import METRICS
from smartsched.twin.telemetry import physics as ph
from smartsched.twin.telemetry.families import (
    GpuHeat,
    MemoryPressure,
    PodUse,
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
from smartsched.twin.telemetry.families.memory import numa_remote_ratio
from smartsched.twin.telemetry.families.network import CLOUD_NIC_BPS, pod_traffic_bps
from smartsched.twin.telemetry.families.pods import throttled_milli
from tests.builders import pod

TRAIN, INFER = POD_CLASS_IDS[PodClass.AI_TRAIN], POD_CLASS_IDS[PodClass.AI_INFER]
BATCH = POD_CLASS_IDS[PodClass.BATCH]
ONES = np.ones(1)


def _frozen(x: Any) -> Any:
    """A deep copy of a family's inputs, to check it mutated none."""
    return copy.deepcopy(x)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b, equal_nan=True)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "__dataclass_fields__"):
        return all(_same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return a == b


# ------------------------------------------------------------------- pods
def _table(pods: list, nodes: list[int]) -> PodTable:
    tb = PodTable(pods)
    tb.status[:] = RUNNING
    tb.node[:] = nodes
    return tb


def test_best_effort_pods_get_the_slack_and_are_throttled_by_what_it_lacks() -> None:
    full = UsageProfile(mean=1.0)
    tb = _table([pod("hp", cpu=3000, mem=1000, usage=full),
                 pod("be", cpu=2000, mem=500, best_effort=True, usage=full),
                 pod("g", cpu=1000, mem=1000, num_gpu=1, gpu_milli=500, usage=full,
                     pod_class=PodClass.AI_TRAIN)], [0, 0, 1])
    cap = np.array([[4000, 8192, 0, 0], [4000, 8192, 1000, 0]])
    use = running_use(tb, cap, 0.0, 0)
    pods = pod_use(use, tb.requests[use.pods], tb.cls[use.pods])
    np.testing.assert_array_equal(pods.cpu, [3000.0, 1000.0, 1000.0])  # be: half its demand
    np.testing.assert_array_equal(pods.mem, [1000.0, 500.0, 1000.0])
    np.testing.assert_array_equal(pods.gpu, [0.0, 0.0, 500.0])
    cols = pod_family(pods, 2)
    np.testing.assert_allclose(cols["smartsched_node_pod_cpu_seconds_total"].sum(axis=1),
                               use.usage[:, 0] / 1000.0)
    np.testing.assert_array_equal(cols["smartsched_node_pods"].sum(axis=1), [2.0, 1.0])
    assert cols["smartsched_node_pod_gpu_used_devices"][1, TRAIN] == 0.5
    thr = cols["smartsched_node_pod_cpu_throttled_seconds_total"]
    assert thr[0, BATCH] == pytest.approx(1.0)  # the 1000 milli the slack lacked
    assert cols["smartsched_node_cpu_cfs_throttled_periods_total"].tolist() == [10.0, 0.0]


@pytest.mark.parametrize(("demand", "req", "got", "expect"), [
    (1000.0, 1000.0, 1000.0, 0.0),  # within its request
    (2000.0, 1000.0, 2000.0, 250.0),  # bursting: CFS withholds a quarter of the excess
    (2000.0, 2000.0, 500.0, 1500.0),  # best-effort: what the slack lacked
    (500.0, 1000.0, 500.0, 0.0),
])
def test_throttled_milli(demand: float, req: float, got: float, expect: float) -> None:
    assert throttled_milli(np.array([demand]), np.array([req]),
                           np.array([got]))[0] == expect


# ---------------------------------------------------------------- sockets
@pytest.mark.parametrize(("free", "socket", "present", "expect"), [
    ([[1000, 0]], [[0, 1]], [[True, True]], [[0.0, 1.0]]),  # GPU 1 (socket 1) in use
    ([[500, 500]], [[0, 1]], [[True, True]], [[0.5, 0.5]]),
    ([[1000, 1000]], [[0, 1]], [[True, True]], [[0.5, 0.5]]),  # none: uniform
    ([[1000, 1000]], [[0, 0]], [[True, False]], [[1.0, 0.0]]),  # one socket
])
def test_gpu_socket_weights(free: list, socket: list, present: list, expect: list) -> None:
    free_a = np.array(free)
    w = gpu_socket_weights(free_a, np.array(socket), np.ones_like(free_a, dtype=bool),
                           np.array(present))
    np.testing.assert_allclose(w, expect)


def _pods(node: list[int], cpu: list[float], mem: list[float] | None = None,
          request_mem: list[float] | None = None, request_gpu: list[float] | None = None,
          cls: list[int] | None = None) -> PodUse:
    p = len(node)
    a = np.asarray
    cpu_a = a(cpu, dtype=float)
    mem_a = a(mem if mem is not None else [1024.0] * p, dtype=float)
    return PodUse(index=np.arange(p), node=a(node, dtype=np.int64),
                  cls=a(cls if cls is not None else [BATCH] * p, dtype=np.int64),
                  factor=np.ones(p), request_cpu=cpu_a,
                  request_mem=a(request_mem, dtype=float) if request_mem is not None else mem_a,
                  request_gpu=a(request_gpu if request_gpu is not None else [0.0] * p, dtype=float),
                  demand_cpu=cpu_a, cpu=cpu_a, mem=mem_a, gpu=np.zeros(p))


def test_socket_use_spills_and_weighs_memory_heavy_pods() -> None:
    # Node 0: 2 sockets x 4 cores, 12 cores of demand; node 1: light pods; node 2: heavy pods.
    pods = _pods([0, 0, 0, 1, 2], [4000, 4000, 4000, 2000, 2000],
                 request_mem=[1024, 1024, 1024, 2048, 12288])
    node_cpu = np.bincount(pods.node, pods.cpu, minlength=3)
    cap = np.full(3, 8000.0)
    present = np.ones((3, 2), dtype=bool)
    s = socket_use(pods, cores_used=node_cpu / 1000.0, cap_cpu=cap, sockets=np.full(3, 2),
                   present=present, gpu_weights=np.full((3, 2), 0.5), powered=np.ones(3),
                   seed=0)
    np.testing.assert_allclose(s.util.mean(axis=1), np.minimum(node_cpu / cap, 1.0))
    assert (s.util <= 1.0).all()
    np.testing.assert_allclose(s.heavy_share, [0.0, 0.0, 1.0])
    assert s.bandwidth_bps[2].sum() > s.bandwidth_bps[1].sum()
    assert (s.bandwidth_util <= 1.0).all()
    np.testing.assert_allclose(s.memory_mib.sum(axis=1),
                               np.bincount(pods.node, pods.mem, minlength=3))


# ----------------------------------------------------------------- memory
@pytest.mark.parametrize(("used", "powered", "pressure", "swap"), [
    (0.5, 1.0, 0.0, 0.0),
    (0.84, 1.0, 0.0, 0.0),
    (0.88, 1.0, "+", 0.0),
    (0.95, 1.0, "+", "+"),
    (1.0, 1.0, 1.0, 1.0),
    (0.0, 0.0, 0.0, 0.0),  # powered off: no system memory either
])
def test_memory_pressure_starts_at_85_and_swap_at_90_percent(
        used: float, powered: float, pressure: Any, swap: Any) -> None:
    cap = np.array([65536.0])
    sys_mib = powered * (1536.0 + 0.01 * cap)
    p = memory_pressure(used * cap - sys_mib, cap, np.array([powered]))
    for got, want in ((p.pressure[0], pressure), (p.swap_pressure[0], swap)):
        assert got > 0 if want == "+" else got == pytest.approx(want)
    assert p.swap_in[0] == 2000.0 * p.swap_pressure[0]
    assert p.major_faults[0] == powered * (0.2 + 3000.0 * p.pressure[0])


def test_numa_remote_ratio_bounds() -> None:
    frac = np.linspace(0.0, 1.2, 13)
    n = frac.size
    cap = np.full(n, 65536.0)
    cases = [  # sockets, socket_mib split, powered
        (2, (frac * cap)[:, None] * np.array([[0.5, 0.5]]), 1.0),
        (2, (frac * cap)[:, None] * np.array([[1.0, 0.0]]), 1.0),
        (1, (frac * cap)[:, None] * np.array([[1.0, 0.0]]), 1.0),
        (2, (frac * cap)[:, None] * np.array([[0.5, 0.5]]), 0.0),
    ]
    for sockets, mib, powered in cases:
        s = np.full(n, sockets)
        present = np.arange(2)[None, :] < s[:, None]
        r = numa_remote_ratio(frac, mib, cap, s, present, np.full(n, powered))
        if sockets == 1 or powered == 0.0:
            assert (r == 0.0).all()
            continue
        assert (r[:, 0] >= 0.03).all() and (r <= 0.95).all()
        assert (np.diff(r[:, 0]) >= 0).all()  # more memory in use, more remote accesses
    balanced = numa_remote_ratio(np.array([0.25]), np.array([[8192.0, 8192.0]]),
                                 np.array([65536.0]), np.array([2]), np.ones((1, 2), bool), ONES)
    assert balanced.tolist() == [[0.03, 0.03]]  # within one socket's share: only the floor


def test_memory_family_levels_add_up() -> None:
    cap = np.array([65536.0, 65536.0])
    pw = np.array([1.0, 0.0])
    p = memory_pressure(np.array([30000.0, 0.0]), cap, pw)
    cols = memory_family(p, cap_mem=cap, powered=pw, pods_n=np.array([3.0, 0.0]),
                         cores_used=np.array([4.0, 0.0]), disk_read_bps=np.array([1e8, 0.0]),
                         disk_write_bps=np.array([1e7, 0.0]),
                         bandwidth_bps=np.zeros((2, 2)), socket_mib=np.zeros((2, 2)),
                         sockets=np.array([2, 2]), present=np.ones((2, 2), bool))
    total = cols["node_memory_MemTotal_bytes"]
    used = cols["smartsched_node_memory_used_bytes"]
    free, avail = cols["node_memory_MemFree_bytes"], cols["node_memory_MemAvailable_bytes"]
    assert (used + free <= total).all() and (free <= avail).all() and (avail <= total).all()
    np.testing.assert_allclose(used[0] + free[0] + cols["node_memory_Cached_bytes"][0],
                               total[0])
    assert free[1] == avail[1] == total[1]  # powered off: all of it free
    assert (cols["node_memory_Dirty_bytes"] <= 0.2 * cols["node_memory_Cached_bytes"]).all()


# ------------------------------------------------------------------- disk
def _disk(pods_n: float, train: float = 0.0, faults: float = 0.0) -> dict[str, np.ndarray]:
    return disk_family(powered=ONES, pods_n=np.array([pods_n]), train_pods=np.array([train]),
                       major_faults=np.array([faults]), swap_in=np.zeros(1),
                       swap_out=np.zeros(1), mem_pressure=np.zeros(1), slots=2)


def test_disk_await_rises_with_utilization() -> None:
    rows = [_disk(n) for n in (0, 10, 100, 400, 1000)]
    rho = np.array([r["node_disk_io_time_seconds_total"][0, 0] for r in rows])
    wait = np.array([r["node_disk_write_time_seconds_total"][0, 0]
                     / r["node_disk_writes_completed_total"][0, 0] for r in rows])
    assert (np.diff(rho) > 0).all() and rho.max() <= ph.U_CAP
    assert (np.diff(wait) > 0).all()
    np.testing.assert_allclose(wait, (20e-6 + 32 * 1024 / 2e9) * ph.queueing_factor(rho))
    for r in rows:  # Little's law
        depth = (r["node_disk_read_time_seconds_total"]
                 + r["node_disk_write_time_seconds_total"])
        np.testing.assert_allclose(r["node_disk_io_now"], depth)


def test_training_reads_go_to_the_scratch_disk_and_faults_to_the_os_disk() -> None:
    train = _disk(1, train=4)["node_disk_read_bytes_total"][0]
    assert train[1] > train[0]
    faults = _disk(1, faults=1000)["node_disk_reads_completed_total"][0]
    assert faults[0] > faults[1]


# ---------------------------------------------------------------- network
def _network(rx_util: float, cpu_util: float = 0.0) -> dict[str, np.ndarray]:
    """One batch pod (70 % received) on a one-NIC node, offering ``rx_util`` of the link."""
    traffic = rx_util * CLOUD_NIC_BPS / 0.7
    return network_family(index=np.zeros(1, np.int64), node=np.zeros(1, np.int64),
                          cls=np.array([BATCH]), traffic_bps=np.array([traffic]),
                          nics=np.array([1]), nic_bps=np.array([CLOUD_NIC_BPS]), powered=ONES,
                          pods_n=ONES, pods_cls=np.eye(5)[[BATCH]], cpu_util=np.array([cpu_util]),
                          slots=2, seed=0)


@pytest.mark.parametrize(("util", "drops"), [
    (0.1, False), (0.5, False), (0.84, False), (0.9, True), (1.0, True), (1.3, True),
])
def test_nic_drops_only_above_85_percent_link_use(util: float, drops: bool) -> None:
    c = _network(util)
    d = c["node_network_receive_drop_total"][0, 0]
    assert bool(d > 0) == drops
    assert c["node_network_receive_bytes_total"][0, 0] <= CLOUD_NIC_BPS
    assert c["node_network_receive_bytes_total"][0, 1] == 0.0  # no second NIC


def test_packet_latency_and_retransmits_grow_with_link_load() -> None:
    rows = [_network(u) for u in (0.1, 0.5, 0.9, 1.2)]
    lat = np.array([r["smartsched_node_network_packet_latency_seconds"][0, 0] for r in rows])
    assert (np.diff(lat, axis=0) >= 0).all() and (lat[:, 1] > lat[:, 0]).all()
    retrans = [r["node_netstat_Tcp_RetransSegs"][0] / r["node_netstat_Tcp_OutSegs"][0]
               for r in rows]
    assert retrans[0] == pytest.approx(2e-4) and retrans[-1] > retrans[1]
    busy = _network(0.1, cpu_util=1.0)["smartsched_node_network_packet_latency_seconds"]
    np.testing.assert_allclose(busy[0, 0], 1.5 * lat[0])  # a busy CPU adds half
    pkts = packets_per_second(rows[0])
    assert pkts[0] == pytest.approx((rows[0]["node_network_receive_packets_total"]
                                     + rows[0]["node_network_transmit_packets_total"]).sum())


def test_pod_traffic_follows_use_over_mean_use() -> None:
    bps = pod_traffic_bps(np.array([80.0, 80.0]), np.array([0.6, 0.3]), np.array([0.6, 0.6]))
    np.testing.assert_allclose(bps, [10e6, 5e6])


# -------------------------------------------------------------------- cpu
def _cpu(demand: list[float], **kw: Any) -> tuple[dict[str, np.ndarray], np.ndarray]:
    d = np.asarray(demand, dtype=float)
    n = d.size
    args: dict[str, Any] = dict(
        cores=np.full(n, 32.0), demand=d, socket_util=np.repeat(np.minimum(d, 1)[:, None], 2, 1),
        sockets=np.full(n, 2), heavy_share=np.zeros(n), bandwidth_util=np.zeros(n),
        mem_pressure=np.zeros(n), powered=np.ones(n), pods_n=np.full(n, 4.0),
        cores_used=32.0 * np.minimum(d, 1), packets=np.zeros(n), disk_queue=np.zeros(n),
        disk_iops=np.zeros(n), disk_busy=np.zeros(n), io_pressure=np.zeros(n), load=None,
        elapsed_s=0.0)
    args.update(kw)
    return cpu_family(**args)


def test_run_queue_grows_sharply_past_90_percent() -> None:
    demand = [0.43, 0.5, 0.9, 0.97, 1.2]
    cols, _ = _cpu(demand)
    run = dict(zip(demand, cols["node_procs_running"], strict=True))
    assert run[0.5] - run[0.43] < 4 < run[0.97] - run[0.9]
    assert run[0.5] == 19.0  # 1 + 32 * 0.5 + 2 * 0.5 / 0.5
    assert run[1.2] > run[0.97]
    lat = cols["smartsched_node_cpu_runqueue_latency_seconds"]
    assert (np.diff(lat[:, 1]) > 0).all() and (lat[:, 1] > lat[:, 0]).all()
    psi = cols["node_pressure_cpu_waiting_seconds_total"]
    assert (np.diff(psi) >= 0).all() and psi.max() <= 1.0


@pytest.mark.parametrize(("heavy", "bandwidth"), [(0.0, 0.0), (0.5, 0.2), (1.0, 1.0)])
def test_cache_hits_ordered_and_falling_with_memory_heavy_pressure(heavy: float,
                                                                   bandwidth: float) -> None:
    cols, _ = _cpu([0.6, 0.6], heavy_share=np.array([0.0, heavy]),
                   bandwidth_util=np.array([0.0, bandwidth]))
    hit = cols["smartsched_node_cpu_cache_hit_ratio"]
    assert (hit[:, 0] > hit[:, 1]).all() and (hit[:, 1] > hit[:, 2]).all()
    if heavy > 0:
        assert (hit[1] < hit[0]).all()
        ipc = cols["smartsched_node_cpu_instructions_per_cycle"]
        assert (ipc[1] < ipc[0]).all()
    else:
        np.testing.assert_array_equal(hit[0], hit[1])


def test_load_averages_start_at_the_target_then_lag() -> None:
    cols, load = _cpu([0.5])
    assert cols["node_load1"][0] == cols["node_load15"][0] == cols["node_procs_running"][0]
    before = load.copy()
    cols2, load2 = _cpu([0.97], load=load, elapsed_s=60.0)
    np.testing.assert_array_equal(load, before)  # the old state is not touched
    target = cols2["node_procs_running"][0]
    a = 1 - math.exp(-1)
    assert load2[0, 0] == pytest.approx(before[0, 0] + (target - before[0, 0]) * a)
    assert before[0, 0] < load2[0, 2] < load2[0, 1] < load2[0, 0] < target


def test_powered_off_cpu_counts_nothing() -> None:
    cols, _ = _cpu([0.0], powered=np.zeros(1), pods_n=np.zeros(1))
    for name in ("node_procs_running", "node_procs_blocked", "node_context_switches_total",
                 "node_intr_total", "node_forks_total", "smartsched_node_cpu_system_ratio"):
        assert cols[name][0] == 0.0, name


# -------------------------------------------------------------------- gpu
def _gpu(free: list[list[int]], node_gpu: list[float], cls: list[list[float]] | None = None,
         powered: list[float] | None = None, nvlink: bool = False) -> tuple[dict, GpuHeat]:
    f = np.array(free)
    n, g = f.shape
    return gpu_family(
        gpu_free=f, gpu_count=np.full(n, g), gpu_alloc=(1000.0 - f).sum(axis=1),
        node_gpu=np.array(node_gpu, dtype=float),
        gpu_cls=np.array(cls) if cls is not None else np.zeros((n, 5)),
        powered=np.array(powered) if powered is not None else np.ones(n),
        idle_w=np.full(n, 50.0), max_w=np.full(n, 400.0), memory_mib=np.full(n, 40960.0),
        boost_mhz=np.full(n, 1410.0), nvlink=np.full(n, nvlink), slots=g)


@pytest.mark.parametrize(("free", "node_gpu", "sm"), [
    ([[1000, 1000]], [0.0], [0.0, 0.0]),  # idle node
    ([[0, 1000]], [500.0], [0.5, 0.0]),  # one device allocated, half used
    ([[0, 1000]], [1000.0], [1.0, 0.0]),
    ([[500, 0]], [1500.0], [0.5, 1.0]),  # fractional + whole device, fully used
    ([[500, 0]], [750.0], [0.25, 0.5]),
])
def test_gpu_power_is_idle_plus_span_times_sm_util(free: list, node_gpu: list,
                                                   sm: list) -> None:
    cols, heat = _gpu(free, node_gpu)
    util = np.array([sm])
    np.testing.assert_allclose(cols["DCGM_FI_DEV_GPU_UTIL"], 100.0 * util)
    np.testing.assert_allclose(cols["DCGM_FI_DEV_POWER_USAGE"], 50.0 + 350.0 * util)
    np.testing.assert_allclose(heat.die, 55.0 * (50.0 + 350.0 * util) / 400.0)
    assert (cols["DCGM_FI_DEV_FB_USED"] + cols["DCGM_FI_DEV_FB_FREE"] <= 40960.0).all()
    assert ((cols["DCGM_FI_DEV_FB_USED"] > 0) == (np.array(free) < 1000)).all()


def test_gpu_mix_shapes_activity_and_links() -> None:
    free = [[0, 0], [0, 0]]
    cls = np.zeros((2, 5))
    cls[0, TRAIN], cls[1, INFER] = 2.0, 2.0
    train, _ = _gpu(free, [2000.0, 2000.0], cls=cls.tolist(), nvlink=True)
    assert (train["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"][0] > train[
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"][1]).all()
    assert (train["DCGM_FI_PROF_PCIE_RX_BYTES"][1] > train["DCGM_FI_PROF_PCIE_RX_BYTES"][0]).all()
    assert (train["DCGM_FI_PROF_NVLINK_TX_BYTES"][0] > 0).all()
    assert (train["DCGM_FI_PROF_NVLINK_TX_BYTES"][1] == 0).all()  # inference: no all-reduce
    no_link, _ = _gpu(free, [2000.0, 2000.0], cls=cls.tolist(), nvlink=False)
    assert (no_link["DCGM_FI_PROF_NVLINK_TX_BYTES"] == 0).all()


def test_powered_off_gpu_draws_nothing() -> None:
    cols, heat = _gpu([[1000]], [0.0], powered=[0.0])
    assert cols["DCGM_FI_DEV_POWER_USAGE"][0, 0] == 0.0 == cols["DCGM_FI_DEV_SM_CLOCK"][0, 0]
    assert heat.die[0, 0] == 0.0


# ---------------------------------------------------------- power, thermal
def _model(n: int) -> PowerModel:
    return PowerModel(host_idle_w=np.full(n, 200.0), host_dyn_w=np.full(n, 300.0),
                      gpu_idle_w=np.full(n, 50.0), gpu_max_w=np.full(n, 400.0),
                      gpu_count=np.full(n, 2))


def _thermal(power: list[int], cpu: list[float], temps: Temperatures | None = None,
             elapsed: float = 0.0, gpu_rise: float = 10.0) -> tuple[dict, Temperatures]:
    n = len(power)
    u = np.array(cpu)
    return power_thermal_family(
        model=_model(n), power_state=np.array(power, dtype=np.int8), cpu_util=u,
        gpu_util=np.zeros(n), socket_util=np.repeat(u[:, None], 2, 1),
        bandwidth_bps=np.zeros((n, 2)), sockets=np.full(n, 2),
        socket_present=np.ones((n, 2), bool), gpu_present=np.ones((n, 2), bool),
        heat=GpuHeat(die=np.full((n, 2), gpu_rise), hbm=np.full((n, 2), 5.0)),
        rack=np.zeros(n, np.int64), inlet_offset_c=np.zeros(n), temps=temps, elapsed_s=elapsed)


def test_node_power_is_the_twin_power_model() -> None:
    power = [POWER_ON, POWER_BOOTING, POWER_OFF]
    cols, _ = _thermal(power, [0.5, 0.0, 0.0])
    expect = _model(3).node_w(np.array(power, dtype=np.int8), np.array([0.5, 0.0, 0.0]),
                              np.zeros(3))
    np.testing.assert_array_equal(cols["smartsched_node_power_watts"], expect)
    assert expect.tolist() == [200 + 100 + 150, 300.0, 0.0]
    np.testing.assert_allclose(cols["node_rapl_package_joules_total"][0],
                               0.6 * (200 + 300 * 0.5) / 2)
    inlet = cols["smartsched_node_inlet_temp_celsius"]
    np.testing.assert_allclose(inlet, 20.0 + 3.0 * expect.sum() / (3 * 1300.0))
    np.testing.assert_allclose(cols["node_hwmon_temp_celsius"][0],
                               inlet[0] + 0.35 * 0.6 * 175.0)  # first sample: steady state


def test_powered_off_node_relaxes_to_the_inlet_air() -> None:
    hot = Temperatures(package=np.full((1, 2), 80.0), gpu=np.full((1, 2), 85.0),
                       hbm=np.full((1, 2), 90.0))
    frozen = _frozen(hot)
    cols, new = _thermal([POWER_OFF], [0.0], temps=hot, elapsed=20.0, gpu_rise=0.0)
    assert _same(hot, frozen)
    inlet = cols["smartsched_node_inlet_temp_celsius"][0]
    a = 1 - math.exp(-1)  # one package time constant
    np.testing.assert_allclose(new.package, 80.0 + (inlet - 80.0) * a)
    assert (new.gpu > inlet).all() and (new.gpu < 85.0).all()
    cols, later = _thermal([POWER_OFF], [0.0], temps=new, elapsed=3600.0, gpu_rise=0.0)
    np.testing.assert_allclose(later.package, inlet)
    np.testing.assert_allclose(later.hbm, inlet)
    assert cols["smartsched_node_power_watts"][0] == 0.0
    assert cols["smartsched_node_fan_duty_ratio"][0] == 0.0
    assert cols["smartsched_node_outlet_temp_celsius"][0] == inlet


def test_fans_and_throttling_follow_the_hottest_part() -> None:
    cold, _ = _thermal([POWER_ON], [0.0], gpu_rise=0.0)
    hot, _ = _thermal([POWER_ON], [0.0], gpu_rise=75.0)
    assert cold["smartsched_node_fan_duty_ratio"][0] == 0.25
    assert hot["smartsched_node_fan_duty_ratio"][0] == 1.0
    assert (cold["node_cpu_package_throttles_total"] == 0).all()


# ------------------------------------------------- the families together
def _all_families() -> tuple[dict[str, dict], list[Any]]:
    """Every family on one consistent 3-node scene; also returns the inputs it passed."""
    n = 3
    pods = _pods([0, 0, 1], [4000.0, 2000.0, 1000.0], request_gpu=[1000.0, 0.0, 0.0],
                 cls=[TRAIN, POD_CLASS_IDS[PodClass.ONLINE], BATCH])
    power = np.array([POWER_ON, POWER_ON, POWER_OFF], dtype=np.int8)
    pw = (power != POWER_OFF).astype(float)
    cap_cpu, cap_mem = np.full(n, 16000.0), np.full(n, 65536.0)
    node_cpu = np.bincount(pods.node, pods.cpu, minlength=n)
    node_mem = np.bincount(pods.node, pods.mem, minlength=n)
    sockets = np.array([2, 1, 2])
    present = np.arange(2)[None, :] < sockets[:, None]
    gpu_free = np.array([[0, 1000], [0, 0], [1000, 1000]])
    gpu_count = np.array([2, 0, 2])
    inputs: list[Any] = [pods, power, cap_cpu, cap_mem, gpu_free]
    frozen = _frozen(inputs)
    out: dict[str, dict] = {"pods": pod_family(pods, n)}
    pods_cls = out["pods"]["smartsched_node_pods"]
    gw = gpu_socket_weights(gpu_free, np.array([[0, 1], [0, 0], [0, 1]]),
                            gpu_free >= 0, present)
    sock = socket_use(pods, cores_used=node_cpu / 1000, cap_cpu=cap_cpu, sockets=sockets,
                      present=present, gpu_weights=gw, powered=pw, seed=1)
    press = memory_pressure(node_mem, cap_mem, pw)
    assert isinstance(press, MemoryPressure)
    out["disk"] = disk_family(powered=pw, pods_n=pods_cls.sum(1), train_pods=pods_cls[:, TRAIN],
                              major_faults=press.major_faults, swap_in=press.swap_in,
                              swap_out=press.swap_out, mem_pressure=press.pressure, slots=2)
    out["memory"] = memory_family(
        press, cap_mem=cap_mem, powered=pw, pods_n=pods_cls.sum(1), cores_used=node_cpu / 1000,
        disk_read_bps=np.zeros(n), disk_write_bps=np.zeros(n), bandwidth_bps=sock.bandwidth_bps,
        socket_mib=sock.memory_mib, sockets=sockets, present=present)
    out["network"] = network_family(
        index=pods.index, node=pods.node, cls=pods.cls, traffic_bps=np.full(3, 1e6),
        nics=sockets, nic_bps=np.full(n, CLOUD_NIC_BPS), powered=pw, pods_n=pods_cls.sum(1),
        pods_cls=pods_cls, cpu_util=node_cpu / cap_cpu, slots=2, seed=1)
    out["cpu"], _ = _cpu((node_cpu / cap_cpu).tolist(), socket_util=sock.util,
                         sockets=sockets, powered=pw)
    out["gpu"], heat = gpu_family(
        gpu_free=gpu_free, gpu_count=gpu_count, gpu_alloc=np.array([1000.0, 0, 0]),
        node_gpu=np.array([1000.0, 0, 0]),
        gpu_cls=out["pods"]["smartsched_node_pod_gpu_used_devices"], powered=pw,
        idle_w=np.full(n, 50.0), max_w=np.full(n, 400.0), memory_mib=np.full(n, 40960.0),
        boost_mhz=np.full(n, 1410.0), nvlink=np.zeros(n, bool), slots=2)
    out["thermal"], _ = power_thermal_family(
        model=_model(n), power_state=power, cpu_util=node_cpu / cap_cpu, gpu_util=np.zeros(n),
        socket_util=sock.util, bandwidth_bps=sock.bandwidth_bps, sockets=sockets,
        socket_present=present, gpu_present=np.arange(2)[None, :] < gpu_count[:, None],
        heat=heat, rack=np.array([0, 0, 1]), inlet_offset_c=np.zeros(n), temps=None,
        elapsed_s=0.0)
    assert _same(inputs, frozen), "a family mutated its inputs"
    return out, inputs


def test_families_own_disjoint_columns_that_cover_the_catalogue() -> None:
    out, _ = _all_families()
    seen: dict[str, str] = {}
    for fam, cols in out.items():
        for name, x in cols.items():
            assert name not in seen, f"{name} in {fam} and {seen[name]}"
            seen[name] = fam
            assert x.shape[0] == 3 and np.isfinite(x).all(), name
            assert (x >= 0).all(), name
    assert set(seen) == {m.name for m in METRICS}
