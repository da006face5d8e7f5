"""The event engine: determinism, queue order, gangs, completions, power, failures, fill."""

from __future__ import annotations

import numpy as np
import pytest

from smartsched.model.errors import InfeasibleDecisionError, ValidationError
from smartsched.model.presets import load_cluster
from smartsched.scheduling.base import make_scheduler
from smartsched.scheduling.runner import run
from smartsched.twin.engine import Decision, Engine, EngineConfig
from smartsched.twin.podtable import DONE, FAILED, PENDING, RUNNING
from smartsched.workloads.mixed import generate_mixed
from tests.builders import cluster, node, pod


def _run(spec, pods, scheduler="first-fit", **cfg):
    e = Engine(spec, pods, EngineConfig(**cfg))
    return e, run(e, make_scheduler(scheduler, cfg.get("seed", 0)))


def test_same_seed_same_report() -> None:
    spec = load_cluster("small")
    pods = generate_mixed(spec, hours=6, seed=3)
    _, a = _run(spec, pods, "random", seed=3, horizon_s=6 * 3600)
    _, b = _run(spec, generate_mixed(spec, hours=6, seed=3), "random", seed=3,
                horizon_s=6 * 3600)
    for m in (a, b):
        m.pop("decision_latency_us")
        m.pop("decisions_per_second")
    assert a == b
    _, c = _run(spec, generate_mixed(spec, hours=6, seed=4), "random", seed=4,
                horizon_s=6 * 3600)
    assert c["pods"]["total"] != a["pods"]["total"] or c["energy_kwh"] != a["energy_kwh"]


def test_queue_order_priority_then_arrival() -> None:
    spec = cluster(node("a", cpu=1000, mem=4096))
    pods = [
        pod("blocker", cpu=1000, arrival=0.0, duration=100.0),
        pod("low-early", cpu=1000, arrival=1.0, duration=10.0, priority=0),
        pod("high-late", cpu=1000, arrival=2.0, duration=10.0, priority=5),
        pod("low-late", cpu=1000, arrival=3.0, duration=10.0, priority=0),
    ]
    e, _ = _run(spec, pods, power_management=False)
    started = {p.id: e.table.started_at[i] for i, p in enumerate(e.table.pods)}
    assert started["blocker"] == 0.0
    assert started["high-late"] == 100.0
    assert started["low-early"] == 110.0
    assert started["low-late"] == 120.0


def test_gang_is_all_or_nothing() -> None:
    spec = cluster(node("g0", cpu=16000, mem=65536, gpus=2), node("g1", cpu=16000, mem=65536,
                   gpus=2))
    pods = [
        pod("other", num_gpu=1, gpu_milli=1000, arrival=0.0, duration=50.0),
        *[pod(f"m{i}", num_gpu=2, gpu_milli=1000, arrival=1.0, duration=10.0, gang_id="g",
              gang_size=2) for i in range(2)],
    ]
    e = Engine(spec, pods, EngineConfig(power_management=False))
    sched = make_scheduler("first-fit")
    seen_partial = False
    while (req := e.next_decision()) is not None:
        e.apply(sched.decide(e.state, req.request))
        st = e.table.status[[1, 2]]
        if ((st == RUNNING).sum() == 1):
            seen_partial = True
    assert not seen_partial
    # The gang could only start once "other" left at t=50, both members together.
    assert e.table.started_at[1] == e.table.started_at[2] == 50.0
    assert e.table.node[1] != e.table.node[2]


def test_rejected_gang_rolls_back_tentative_members() -> None:
    spec = cluster(node("g0", cpu=16000, mem=65536, gpus=2),
                   node("g1", cpu=16000, mem=65536, gpus=2))
    gang = [pod(f"m{i}", num_gpu=1, gpu_milli=1000, gang_id="g", gang_size=3, arrival=0.0,
                duration=5.0) for i in range(3)]
    e = Engine(spec, gang, EngineConfig(power_management=False, horizon_s=100))
    first = e.next_decision()
    assert first is not None and first.gang_remaining == 2
    e.apply(Decision(0))
    e.next_decision()
    e.apply(Decision(0))
    assert e.state.allocated[0, 2] == 2000
    e.next_decision()
    e.apply(Decision.reject("insufficient gpu"))
    assert e.state.allocated.sum() == 0 and e.state.gpu_free.sum() == 4000
    assert (e.table.status == PENDING).all()


def test_completions_free_exactly_what_was_taken() -> None:
    spec = load_cluster("small")
    pods = generate_mixed(spec, hours=4, seed=1)
    e, m = _run(spec, pods, "random", seed=1)  # no horizon: runs until every pod is done
    assert m["pods"]["completed"] + m["pods"]["pending_at_end"] == len(pods)
    if m["pods"]["pending_at_end"] == 0:
        assert e.state.allocated.sum() == 0
        assert np.array_equal(e.state.gpu_free, np.where(e.state.gpu_exists, 1000, 0))
    assert (e.table.status[e.table.status == DONE].size) == m["pods"]["completed"]


def test_infeasible_decision_is_refused() -> None:
    spec = cluster(node("a", cpu=1000))
    e = Engine(spec, [pod("p", cpu=800), pod("q", cpu=800)], EngineConfig())
    e.next_decision()
    e.apply(Decision(0))
    e.next_decision()
    with pytest.raises(InfeasibleDecisionError):
        e.apply(Decision(0))
    e.apply(Decision.reject("insufficient cpu"))  # the same pod can still be answered


def test_power_down_and_boot_delay() -> None:
    spec = cluster(node("a"), node("b"))
    pods = [pod("early", arrival=0.0, duration=10.0), pod("late", arrival=5000.0, duration=10.0)]
    e, m = _run(spec, pods, power_management=True, idle_power_down_s=600, power_up_s=120)
    # Both nodes power down after the idle period; "late" waits for a boot.
    assert e.table.started_at[1] - e.table.arrival[1] == 120.0
    assert e.table.scheduled_at[1] == 5000.0
    assert m["powered_on_nodes_avg"] < 2


def test_node_failure_evicts_and_requeues() -> None:
    spec = cluster(node("a"), node("b"))
    pods = [pod(f"p{i}", arrival=float(i), duration=20000.0) for i in range(4)]
    e, m = _run(spec, pods, node_mtbf_hours=1.0, repair_s=600, seed=1, horizon_s=8 * 3600)
    assert m["pods"]["evictions"] > 0
    assert (e.state.allocated >= 0).all()


def test_fill_mode_inflates_to_target_and_fails_instead_of_queueing() -> None:
    spec = cluster(node("g0", cpu=64000, mem=262144, gpus=4), node("g1", cpu=64000, mem=262144,
                   gpus=4))
    base = [pod("a", num_gpu=1, gpu_milli=500), pod("b", num_gpu=2, gpu_milli=1000)]
    e, m = _run(spec, base, mode="fill", inflate=1.3, seed=7)
    total = e.table.requests[:, 2].sum()
    assert 8000 * 1.3 - 2000 < total <= 8000 * 1.3
    assert m["gpu_allocation_rate"] <= 100.0
    assert (e.table.status == FAILED).sum() > 0
    curve = m["gpu_allocation_curve"]
    assert curve[0] == {"arrived_gpu_pct": 0.0, "gpu_allocation_pct": 0.0}
    assert curve[-1]["arrived_gpu_pct"] > 100
    assert all(b["gpu_allocation_pct"] <= b["arrived_gpu_pct"] + 1e-9 for b in curve)


def test_engine_config_validation() -> None:
    with pytest.raises(ValidationError) as e:
        EngineConfig(mode="warp")
    assert e.value.field == "mode"
    with pytest.raises(ValidationError) as e:
        EngineConfig(tick_s=0)
    assert e.value.field == "tick_s"
    # A run steps through every tick and flush to its horizon: these never finished.
    for kw, field in (({"horizon_s": 1e308}, "horizon_s"), ({"tick_s": 1e-6}, "tick_s"),
                      ({"flush_s": 0.001}, "flush_s")):
        with pytest.raises(ValidationError) as e:
            EngineConfig(**kw)
        assert e.value.field == field
    # Switches are booleans: a string "false" would have read as true.
    for name, bad in (("power_management", "false"), ("frag_include_cpu_pods", 1),
                      ("power_management", None)):
        with pytest.raises(ValidationError) as e:
            EngineConfig(**{name: bad})
        assert e.value.field == name


def test_warmup_evictions_and_rejections_are_not_counted() -> None:
    # "high" preempts "low" at 100 s, and "low" is refused until "high" ends at 200 s: all
    # inside the warm-up. The window counts no preemption, so no eviction or rejection.
    pods = [pod("low", cpu=8000, priority=0, duration=5000.0),
            pod("high", cpu=8000, priority=1000, arrival=100.0, duration=100.0)]
    counts = {}
    for warm in (0.0, 1000.0):
        _, m = _run(cluster(node("a")), pods, "k8s-default", power_management=False,
                    warmup_s=warm, horizon_s=3000.0)
        counts[warm] = (m["pods"]["preemptions"], m["pods"]["evictions"],
                        sum(m["rejections_by_reason"].values()))
    assert counts[0.0][:2] == (1, 1) and counts[0.0][2] > 0  # measured without a warm-up
    assert counts[1000.0] == (0, 0, 0)


def test_usage_never_passes_capacity() -> None:
    from smartsched.model.pod import UsageProfile

    # A pod bursting to twice its (whole-node) request: the node delivers its capacity.
    hot = [pod("hot", cpu=8000, duration=3000.0, usage=UsageProfile(mean=2.0))]
    _, m = _run(cluster(node("a")), hot, power_management=False, horizon_s=3000.0)
    assert m["usage_pct"]["cpu"] == pytest.approx(100.0)
    assert m["usage_on_pct"]["cpu"] == pytest.approx(100.0)
    # A pod using its whole node leaves just after the 300 s tick and the node powers down
    # 30 s later: the sample held to 600 s is set against the capacity on at that sample,
    # not the exact powered-on time (it read 181 %).
    busy = [pod("busy", cpu=8000, duration=301.0, usage=UsageProfile(mean=1.0))]
    _, m = _run(cluster(node("a")), busy, idle_power_down_s=30.0, horizon_s=3000.0)
    assert m["usage_on_pct"]["cpu"] == pytest.approx(100.0)
    assert 0.0 <= m["usage_pct"]["cpu"] <= 100.0


def test_warmup_is_not_measured() -> None:
    spec = cluster(node("a"), node("b"))
    pods = [pod("early", arrival=0.0, duration=7200.0), pod("late", arrival=4000.0,
                                                              duration=100.0)]
    e, m = _run(spec, pods, power_management=False, warmup_s=3600.0, horizon_s=7200.0)
    assert m["pods"]["arrived"] == 1  # only "late" arrived in the measured window
    assert m["simulated_hours"] == pytest.approx(1.0)
    # "early" runs through the whole window: 1000m of 16000m, time-weighted.
    assert m["allocation_pct"]["cpu"] > 1000 / 16000 * 100 - 1e-6
    assert all(r["time_s"] >= 3600.0 for r in e.timeseries)


def test_failures_without_horizon_terminate() -> None:
    spec = cluster(node("a"), node("b"))
    pods = [pod("p0", arrival=0.0, duration=100.0), pod("p1", arrival=50000.0, duration=100.0)]
    e, m = _run(spec, pods, node_mtbf_hours=1.0, repair_s=60, seed=2)
    assert m["pods"]["completed"] == 2 and e.now < 10 * 86400


def test_fill_curve_ends_at_final_allocation() -> None:
    spec = cluster(node("g0", cpu=64000, mem=262144, gpus=8))
    pods = [pod(f"p{i}", num_gpu=1, gpu_milli=1000) for i in range(8)]
    _, m = _run(spec, pods, mode="fill", inflate=1.0)
    assert m["gpu_allocation_curve"][-1]["gpu_allocation_pct"] == m["gpu_allocation_final"] == 100


def test_evicted_gang_restarts_members_not_done() -> None:
    spec = cluster(node("a"), node("b"), node("c"))
    gang = [pod("m0", arrival=0.0, duration=10.0, gang_id="g", gang_size=2),
            pod("m1", arrival=0.0, duration=1000.0, gang_id="g", gang_size=2),
            pod("filler", arrival=200.0, duration=10.0)]  # gives the loop a step at t=200
    e = Engine(spec, gang, EngineConfig(power_management=False, horizon_s=5000))
    sched = make_scheduler("first-fit")
    failed = False
    while (req := e.next_decision()) is not None:
        e.apply(sched.decide(e.state, req.request))
        if not failed and e.now >= 100 and e.table.status[1] == RUNNING:
            e._fail(int(e.table.node[1]))
            failed = True
    assert failed and e.metrics.evictions >= 1
    assert e.table.status[0] == DONE and e.table.status[1] == DONE
    assert e.table.last_start[1] >= 100  # m1 restarted alone; m0 was not re-run
    assert e.table.started_at[1] < 100  # start latency counts the first start


def test_deferred_pod_is_retried_without_horizon() -> None:
    spec = cluster(node("a"))
    e = Engine(spec, [pod("p", duration=10.0)], EngineConfig(power_management=False))
    first = True
    while e.next_decision() is not None:
        e.apply(Decision(None, defer=True) if first else Decision(0))
        first = False
    assert e.table.status[0] == DONE


def test_gang_size_must_match_members_and_seed_is_validated() -> None:
    spec = cluster(node("a"), node("b"))
    with pytest.raises(ValidationError) as err:
        Engine(spec, [pod("m0", gang_id="g", gang_size=3)], EngineConfig())
    assert err.value.field == "gang_size"
    for bad in (None, -1, 1.5):
        with pytest.raises(ValidationError) as err:
            EngineConfig(seed=bad)  # type: ignore[arg-type]
        assert err.value.field == "seed"


def test_pending_counter_matches_the_queue() -> None:
    spec = load_cluster("small")
    e = Engine(spec, generate_mixed(spec, hours=3, seed=2),
               EngineConfig(seed=2, horizon_s=3 * 3600, node_mtbf_hours=2.0, repair_s=600))
    sched = make_scheduler("k8s-default", 2)
    steps = 0
    while (req := e.next_decision()) is not None:
        e.apply(sched.decide(e.state, req.request))
        steps += 1
        if steps % 50 == 0:
            assert e.metrics.pending == e.queue_length
    assert e.metrics.pending == e.queue_length
    waiting = e.table.status == PENDING
    assert e.metrics.pending_gpu == pytest.approx(float(e.table.requests[waiting, 2].sum()))


def test_deferred_pod_waits_for_the_periodic_retry() -> None:
    from smartsched.twin.engine import can_defer

    spec = cluster(node("a", cpu=2000), node("b", cpu=2000))
    pods = [pod("short", cpu=1000, arrival=0.0, duration=10.0),
            pod("batch", cpu=1000, arrival=0.0, duration=100.0, deadline=5000.0)]
    e = Engine(spec, pods, EngineConfig(power_management=False, flush_s=300.0, tick_s=300.0,
                                        horizon_s=2000.0))
    offers = []
    while (req := e.next_decision()) is not None:
        offers.append((req.pod.id, req.time))
        if req.pod.id == "batch" and sum(p == "batch" for p, _ in offers) < 3:
            e.apply(Decision(None, defer=True))
        else:
            e.apply(Decision(0))
    batch_offers = [t for p, t in offers if p == "batch"]
    # Not re-offered when "short" completed at t=10; only at the 300 s and 600 s retries.
    assert batch_offers == [0.0, 300.0, 600.0]
    assert can_defer(pods[1], 0.0) and not can_defer(pods[1], 4950.0)
    assert not can_defer(pods[0], 0.0)


def test_a_descheduling_pass_with_a_bad_move_changes_nothing() -> None:
    # The first move is good, the second names a pod the twin does not have: the pass
    # was carried out up to the bad move (the first pod moved) before it raised.
    from smartsched.twin.decision import Migration

    spec = cluster(node("a"), node("b"))
    pods = [pod(f"p{i}", arrival=0.0, duration=5000.0) for i in range(2)]
    e = Engine(spec, pods, EngineConfig(power_management=False))
    for _ in range(2):
        e.next_decision()
        e.apply(Decision(0))
    before = (e.table.node.copy(), e.state.allocated.copy(), e.metrics.evictions)
    with pytest.raises(InfeasibleDecisionError, match="not a bound pod"):
        e.migrate([Migration(e.table.pods[0], 1), Migration(pod("stranger"), 1)])
    with pytest.raises(InfeasibleDecisionError, match="moved twice"):
        e.migrate([Migration(e.table.pods[0], 1), Migration(e.table.pods[0], 0)])
    assert np.array_equal(e.table.node, before[0])
    assert np.array_equal(e.state.allocated, before[1]) and e.metrics.evictions == before[2]
    e.migrate([Migration(e.table.pods[0], 1)])  # a good pass still moves
    assert int(e.table.node[0]) == 1
