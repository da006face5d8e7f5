"""DefaultPreemption: minimal victims, upstream's node order, gangs whole, budgets, and the
twin evicting, requeueing and counting what was lost."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod, PodClass
from smartsched.model.priority import NEVER
from smartsched.scheduling.framework import ProfileScheduler
from smartsched.scheduling.registry import profile_from_dict
from smartsched.twin.engine import Decision, Engine, EngineConfig
from smartsched.twin.podtable import DONE, PENDING, RUNNING
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node, pod

PROFILE = {"name": "preempting", "filters": ["NodeUnschedulable", "NodeResourcesFit",
                                             "TaintToleration"],
           "score": [{"name": "NodeResourcesFit", "args": {"strategy": "MostAllocated"}}],
           "post_filter": ["DefaultPreemption"], "tie_break": "first"}


def _sched(**args: Any) -> ProfileScheduler:
    doc = dict(PROFILE)
    if args:
        doc["post_filter"] = [{"name": "DefaultPreemption", "args": args}]
    return ProfileScheduler(profile_from_dict(doc), seed=0)


def _bind(st_: ClusterState, n: int, p: Pod) -> None:
    req = st_.compile(p)
    st_.allocate(n, req, st_.pick_devices(n, req))


def _victim_ids(d: Decision) -> set[str]:
    return {v.id for v in d.victims}


def test_minimal_victims_on_one_node() -> None:
    # 8 cores: pods of 3, 3 and 2 cores at priorities 100, 200, 50. A 4-core pod at 500
    # needs 4 cores: evicting the 2-core (50) alone gives 2; the greedy reprieve gives back
    # the most important first (200), then 100 if it still fits -- it does not, so the
    # victims are the 100 and the 50 (5 cores), not the 200.
    st_ = ClusterState(cluster(node("a", cpu=8000, mem=65536)))
    _bind(st_, 0, pod("p100", cpu=3000, priority=100))
    _bind(st_, 0, pod("p200", cpu=3000, priority=200))
    _bind(st_, 0, pod("p50", cpu=2000, priority=50))
    d = _sched().decide(st_, st_.compile(pod("big", cpu=4000, priority=500)))
    assert d.node == 0 and _victim_ids(d) == {"p100", "p50"}


def test_never_evicts_equal_or_higher_priority() -> None:
    st_ = ClusterState(cluster(node("a", cpu=4000, mem=65536)))
    _bind(st_, 0, pod("same", cpu=2000, priority=500))
    _bind(st_, 0, pod("higher", cpu=2000, priority=900))
    d = _sched().decide(st_, st_.compile(pod("p", cpu=2000, priority=500)))
    assert d.node is None and d.victims == ()
    assert d.rejected_by() == ("NodeResourcesFit",)


def test_node_with_the_least_important_victims_wins() -> None:
    # Either node can host the pod after one eviction: a (victim at 400) or b (at 100).
    st_ = ClusterState(cluster(node("a", cpu=4000, mem=65536), node("b", cpu=4000, mem=65536)))
    _bind(st_, 0, pod("a-400", cpu=4000, priority=400))
    _bind(st_, 1, pod("b-100", cpu=4000, priority=100))
    d = _sched().decide(st_, st_.compile(pod("p", cpu=2000, priority=500)))
    assert d.node == 1 and _victim_ids(d) == {"b-100"}


def test_fewer_victims_break_a_tie_on_priority() -> None:
    st_ = ClusterState(cluster(node("a", cpu=4000, mem=65536), node("b", cpu=4000, mem=65536)))
    for k in range(4):
        _bind(st_, 0, pod(f"a{k}", cpu=1000, priority=100))
    _bind(st_, 1, pod("b-big", cpu=4000, priority=100))
    d = _sched().decide(st_, st_.compile(pod("p", cpu=3000, priority=500)))
    # a: three victims (sum 300); b: one (sum 100): the smaller priority sum wins first.
    assert d.node == 1 and _victim_ids(d) == {"b-big"}


def test_a_victim_takes_its_whole_gang() -> None:
    st_ = ClusterState(cluster(node("a", cpu=4000, mem=65536), node("b", cpu=4000, mem=65536)))
    _bind(st_, 0, pod("g0", cpu=4000, priority=100, gang_id="g", gang_size=2))
    _bind(st_, 1, pod("g1", cpu=4000, priority=100, gang_id="g", gang_size=2))
    d = _sched().decide(st_, st_.compile(pod("p", cpu=2000, priority=500)))
    assert d.node in (0, 1) and _victim_ids(d) == {"g0", "g1"}


def test_gpu_devices_count_in_the_room() -> None:
    # Two 1-GPU shares on device 0 and 1; a whole-GPU pod needs one device emptied: the
    # lower-priority share's device.
    st_ = ClusterState(cluster(node("g", cpu=32000, mem=65536, gpus=2)))
    for name, prio, dev in (("s-low", 100, 0), ("s-high", 800, 1)):
        req = st_.compile(pod(name, num_gpu=1, gpu_milli=500, priority=prio))
        st_.allocate(0, req, (dev,))
    d = _sched().decide(st_, st_.compile(pod("w", num_gpu=1, gpu_milli=1000, priority=500)))
    assert d.node == 0 and _victim_ids(d) == {"s-low"}


def test_a_pod_with_policy_never_and_gang_members_do_not_preempt() -> None:
    st_ = ClusterState(cluster(node("a", cpu=2000, mem=65536)))
    _bind(st_, 0, pod("low", cpu=2000, priority=0))
    never = pod("n", cpu=1000, priority=900, preemption_policy=NEVER)
    assert _sched().decide(st_, st_.compile(never)).node is None
    member = pod("m", cpu=1000, priority=900, gang_id="x", gang_size=2)
    assert _sched().decide(st_, st_.compile(member)).node is None


def test_disruption_budget_soft_ranks_and_strict_refuses() -> None:
    online = {"pod_class": PodClass.ONLINE, "app": "shop", "priority": 300}
    st_ = ClusterState(cluster(node("a", cpu=4000, mem=65536), node("b", cpu=4000, mem=65536)))
    _bind(st_, 0, pod("o1", cpu=2000, **online))
    _bind(st_, 0, pod("o2", cpu=2000, **online))  # both must go on a: 2 of one app
    _bind(st_, 1, pod("batch", cpu=4000, priority=400))
    p = st_.compile(pod("p", cpu=4000, priority=500))
    soft = _sched().decide(st_, p)
    # a breaks the budget (2 > 1) even though its victims are less important: b wins.
    assert soft.node == 1 and _victim_ids(soft) == {"batch"}
    st_.release(1, st_.bound.requests[st_.bound.rows_on(1)[0]], ())
    _bind(st_, 1, pod("o3", cpu=2000, **online))
    _bind(st_, 1, pod("o4", cpu=2000, **online))
    assert _sched(pdb="strict").decide(st_, p).node is None
    assert _sched(pdb="soft").decide(st_, p).node in (0, 1)


@pytest.mark.parametrize(("args", "field"), [
    ({"pdb": "maybe"}, "preempting.post_filter[0].args.pdb"),
    ({"min_candidate_nodes_absolute": 0},
     "preempting.post_filter[0].args.min_candidate_nodes_absolute"),
    ({"victims": "random"}, "preempting.post_filter[0].args.victims"),
])
def test_bad_preemption_settings_name_the_field(args: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        _sched(**args)
    assert e.value.field == field


def test_a_filter_plugin_is_not_a_post_filter() -> None:
    with pytest.raises(ValidationError, match="not a post-filter"):
        profile_from_dict({**PROFILE, "post_filter": ["NodeAffinity"]})


# ------------------------------------------------------------------ in the twin
def _run(pods: list[Pod], **cfg: Any) -> tuple[Engine, ProfileScheduler]:
    e = Engine(cluster(node("a", cpu=8000, mem=65536)), pods,
               EngineConfig(power_management=False, **cfg))
    s = _sched()
    while (req := e.next_decision()) is not None:
        e.apply(s.decide(e.state, req.request))
    return e, s


def test_the_twin_evicts_requeues_and_counts_lost_work() -> None:
    # Training (checkpoint every 600 s) holds the node from 0 s; online arrives at 1000 s and
    # preempts it: 400 s since the last checkpoint (600 s) are lost; training resumes at
    # 1500 s when the online pod ends, with 600 s done of its 3000.
    train = pod("train", cpu=8000, priority=500, arrival=0.0, duration=3000.0,
                pod_class=PodClass.AI_TRAIN, checkpoint_interval_s=600.0)
    online = pod("web", cpu=4000, priority=1000, arrival=1000.0, duration=500.0,
                 pod_class=PodClass.ONLINE)
    e, _ = _run([train, online])
    m = e.run_report()
    assert m["pods"]["preemptions"] == 1 and m["pods"]["evictions"] == 1
    assert m["pods"]["lost_pod_hours"] == pytest.approx(400 / 3600)
    assert m["classes"]["ai-train"]["lost_pod_hours"] == pytest.approx(400 / 3600)
    tb = e.table
    assert (tb.status == DONE).all()
    assert tb.started_at[0] == 0.0 and tb.last_start[0] == 1500.0  # resumed once
    assert tb.finished_at[0] == pytest.approx(1500.0 + 3000.0 - 600.0)


@pytest.mark.parametrize(("cls", "ckpt", "lost", "end"), [
    (PodClass.BATCH, None, 1000.0, 1500.0 + 3000.0),  # restarts from scratch
    (PodClass.AI_INFER, None, 0.0, 1500.0 + 2000.0),  # a service carries on
])
def test_what_an_evicted_pod_keeps_depends_on_its_class(cls: PodClass, ckpt: float | None,
                                                        lost: float, end: float) -> None:
    low = pod("low", cpu=8000, priority=100, arrival=0.0, duration=3000.0, pod_class=cls,
              checkpoint_interval_s=ckpt)
    high = pod("high", cpu=4000, priority=1000, arrival=1000.0, duration=500.0)
    e, _ = _run([low, high])
    assert e.run_report()["pods"]["lost_pod_hours"] == pytest.approx(lost / 3600)
    assert e.table.finished_at[0] == pytest.approx(end)


def test_a_decision_cannot_evict_an_equal_priority_pod() -> None:
    e = Engine(cluster(node("a", cpu=4000, mem=65536)),
               [pod("x", cpu=4000, priority=5, arrival=0.0, duration=100.0),
                pod("y", cpu=4000, priority=5, arrival=1.0, duration=100.0)],
               EngineConfig(power_management=False))
    e.apply(Decision(0)) if e.next_decision() else None
    e.next_decision()
    from smartsched.model.errors import InfeasibleDecisionError

    with pytest.raises(InfeasibleDecisionError, match="cannot preempt"):
        e.apply(Decision(0, victims=(e.table.pods[0],)))
    assert e.table.status[0] == RUNNING  # unchanged


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(500, 8000), st.sampled_from([0, 100, 500, 800, 1000]),
                          st.floats(0, 2000), st.floats(50, 1500), st.booleans()),
                min_size=2, max_size=30),
       st.integers(0, 2**16))
def test_preemption_and_failures_never_over_allocate_and_requeue_once(pods, seed) -> None:
    spec = cluster(node("a", cpu=8000, mem=65536), node("b", cpu=8000, mem=65536, gpus=2),
                   node("c", cpu=4000, mem=65536))
    pod_list = [Pod(id=f"p{i}", cpu_milli=c, memory_mib=1024, priority=pr, arrival=arr,
                    duration=dur, num_gpu=1 if g else 0, gpu_milli=500 if g else 0,
                    pod_class=PodClass.AI_TRAIN, checkpoint_interval_s=300.0)
                for i, (c, pr, arr, dur, g) in enumerate(pods)]
    e = Engine(spec, pod_list, EngineConfig(seed=seed, power_management=False,
                                            node_mtbf_hours=0.5, repair_s=300.0))
    s = _sched()
    st_ = e.state
    requeues = {p.id: 0 for p in pod_list}
    seen_pending: set[str] = set()
    while (req := e.next_decision()) is not None:
        d = s.decide(st_, req.request)
        before = {v.id for v in d.victims}
        e.apply(d)
        for vid in before:
            requeues[vid] += 1
            k = next(i for i, p in enumerate(e.table.pods) if p.id == vid)
            assert e.table.status[k] == PENDING  # back in the queue, not lost
            seen_pending.add(vid)
        assert (st_.allocated <= st_.capacity).all() and (st_.allocated >= 0).all()
        assert (st_.gpu_free >= 0).all() and (st_.gpu_free <= 1000).all()
        assert len(st_.bound) == int(((e.table.status == RUNNING)
                                      | (e.table.status == 2)).sum())
        used = np.where(st_.gpu_exists, 1000, 0).sum(1) - st_.gpu_free.sum(1)
        assert np.array_equal(used, st_.allocated[:, 2])
    m = e.run_report()
    assert m["pods"]["preemptions"] == sum(requeues.values())


def test_a_pod_short_of_a_pod_slot_preempts_one() -> None:
    # Room is there but the node admits one pod (max_pods): the victim gives the slot back.
    # The reprieve ignored slots, gave every victim back and the pod never preempted.
    st_ = ClusterState(cluster(node("a", cpu=8000, mem=65536, max_pods=2)))
    _bind(st_, 0, pod("p100", cpu=1000, priority=100))
    _bind(st_, 0, pod("p50", cpu=1000, priority=50))
    d = _sched().decide(st_, st_.compile(pod("p", cpu=1000, priority=500)))
    assert d.node == 0 and _victim_ids(d) == {"p50"}


def test_fill_mode_counts_a_preempted_then_refused_pod_once() -> None:
    # Fill mode with two priorities: "high" preempts "low", whose re-offer finds no room.
    # It arrived once (GPU arrived 200 %, not 300 %) and ends failed, not also placed.
    spec = cluster(node("g0", cpu=64000, mem=262144, gpus=1))
    pods = [pod("low", num_gpu=1, gpu_milli=1000, priority=100),
            pod("high", num_gpu=1, gpu_milli=1000, priority=1000)]
    e = Engine(spec, pods, EngineConfig(mode="fill", inflate=2.0, power_management=False))
    s = _sched()
    offered = []
    while (req := e.next_decision()) is not None:
        offered.append(req.pod.id)
        e.apply(s.decide(e.state, req.request))
    assert offered == ["low", "high", "low"]  # the victim was offered again
    m = e.run_report()
    assert m["pods"]["preemptions"] == 1
    assert (m["pods"]["placed"], m["pods"]["failed"], m["pods"]["arrived"]) == (1, 1, 2)
    assert m["gpu_allocation_curve"][-1] == {"arrived_gpu_pct": 200.0,
                                             "gpu_allocation_pct": 100.0}


def test_a_pod_preempted_again_before_it_ran_counts_once_in_its_budget() -> None:
    # "o" (online, app shop) is preempted at 10 s while running, re-placed at 30 s, and
    # preempted again at 35 s while its image is still coming (bound, not running). Once it
    # runs again no shop pod is down: the budget must count none (it kept one for ever).
    img = {"image": "shop", "image_layers": (("shop/app", 5000),)}
    pods = [pod("o", cpu=4000, pod_class=PodClass.ONLINE, app="shop", priority=100,
                duration=100.0, **img),
            pod("p1", cpu=4000, priority=500, arrival=10.0, duration=20.0),
            pod("p2", cpu=4000, priority=500, arrival=35.0, duration=20.0)]
    e = Engine(cluster(node("a", cpu=4000, image_disk_mib=100)), pods,
               EngineConfig(power_management=False))
    sched = _sched()
    counts = []
    while (req := e.next_decision()) is not None:
        e.apply(sched.decide(e.state, req.request))
        counts.append(e.state.disrupted.get("shop", 0))
    assert e.run_report()["pods"]["preemptions"] == 2
    assert max(counts) == 1  # one pod down at a time
    assert (e.table.status == DONE).all() and e.state.disrupted.get("shop", 0) == 0


def test_a_refused_preemption_changes_nothing() -> None:
    # The first victim is valid, the second is not (higher priority); then valid victims
    # that leave too little room. Either way apply raises before evicting anyone.
    from smartsched.model.errors import InfeasibleDecisionError

    for cpu, victims in ((2000, ("low", "high")), (3000, ("low",))):
        pods = [pod("low", cpu=2000, priority=0, duration=100.0),
                pod("high", cpu=2000, priority=900, duration=100.0),
                pod("p", cpu=cpu, priority=500, arrival=10.0, duration=10.0)]
        e = Engine(cluster(node("a", cpu=4000, mem=65536)), pods,
                   EngineConfig(power_management=False))
        for _ in range(2):
            e.next_decision()
            e.apply(Decision(0))
        assert e.next_decision().pod.id == "p"
        before = e.state.allocated.copy(), e.table.status.copy()
        by_id = {x.id: x for x in pods}
        with pytest.raises(InfeasibleDecisionError):
            e.apply(Decision(0, victims=tuple(by_id[v] for v in victims)))
        assert np.array_equal(e.state.allocated, before[0])
        assert np.array_equal(e.table.status, before[1])
        assert e.metrics.evictions == 0 and e.metrics.preemptions_cls.sum() == 0
        e.apply(Decision.reject("no room"))  # the offer still stands: a driver may refuse it


def test_fill_mode_a_preempted_then_refused_edge_pod_is_no_slo_success() -> None:
    # As above, with "low" a latency-bound edge pod: failed, it is no latency pod placed
    # and counts as missed (it counted as placed within its SLO: 100 % for 0 served).
    spec = cluster(node("g0", cpu=64000, mem=262144, gpus=1))
    edge = {"pod_class": PodClass.EDGE_RT, "origin_site": "r1", "latency_slo_ms": 100.0}
    pods = [pod("low", num_gpu=1, gpu_milli=1000, priority=100, **edge),
            pod("high", num_gpu=1, gpu_milli=1000, priority=1000)]
    e = Engine(spec, pods, EngineConfig(mode="fill", inflate=2.0, power_management=False))
    s = _sched()
    while (req := e.next_decision()) is not None:
        e.apply(s.decide(e.state, req.request))
    m = e.run_report()
    assert (m["pods"]["preemptions"], m["pods"]["failed"]) == (1, 1)
    slo = m["slo"]
    assert (slo["latency_pods"], slo["latency_pods_arrived"]) == (0, 1)
    assert slo["latency_within_slo_pct"] == 0.0
