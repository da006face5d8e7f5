"""Gang reservation and backfill: when a gang's room frees, that other pods keep off it unless
they would not delay the gang, and that reservations never break the twin's books."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod, PodClass
from smartsched.scheduling.framework import ProfileScheduler
from smartsched.scheduling.plugins.gangs import earliest_room
from smartsched.scheduling.registry import profile_from_dict
from smartsched.twin.engine import Engine, EngineConfig
from smartsched.twin.podtable import DONE, PENDING, RUNNING
from smartsched.twin.reservations import SINGLE
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node, pod

BASE = ["NodeUnschedulable", "NodeResourcesFit", "TaintToleration"]


def _sched(reserve: bool = True, backfill: bool = True, **args: Any) -> ProfileScheduler:
    doc: dict[str, Any] = {
        "name": "gangs", "filters": BASE + (["Reservations"] if backfill else []),
        "score": [{"name": "NodeResourcesFit", "args": {"strategy": "MostAllocated"}}],
        "post_filter": ([{"name": "GangReservation", "args": args}] if reserve else []),
        "tie_break": "first",
    }
    return ProfileScheduler(profile_from_dict(doc), seed=0)


def _gpu_pod(pid: str, gpus: int, arrival: float, duration: float, **kw: Any) -> Pod:
    kw.setdefault("priority", 500)
    return pod(pid, cpu=1000, num_gpu=gpus, gpu_milli=1000, arrival=arrival,
               duration=duration, pod_class=PodClass.AI_TRAIN, **kw)


def _earliest_room_by_loop(state: ClusterState, req: Any, nodes: np.ndarray) -> np.ndarray:
    """The first version, a loop per node and per bound pod: the reference the vectorized
    earliest_room must agree with."""
    from smartsched.model.resources import MILLI_PER_DEVICE
    from smartsched.scheduling.plugins.gangs import member_gpus

    b, now = state.bound, state.now
    need, gpus = ClusterState.charged(req), member_gpus(req)
    out = np.full(nodes.size, np.inf)
    live = np.flatnonzero(b.used & np.isin(b.node, nodes))
    own = b.gang_index(req.pod.gang_id)
    mine = live[b.gang[live] == own] if own is not None else live[:0]
    live = np.setdiff1d(live, mine)
    back, _, back_dev = b.room(mine)
    rows_by_node: dict[int, list[int]] = {}
    for r, n in zip(live.tolist(), b.node[live].tolist(), strict=True):
        rows_by_node.setdefault(n, []).append(r)
    for k, n in enumerate(nodes.tolist()):
        free = state.free_res[n] + back[n]
        dev = state.gpu_free[n].astype(np.int64) + back_dev[n]
        exists = state.gpu_exists[n]

        def ok(free: np.ndarray = free, dev: np.ndarray = dev,
               exists: np.ndarray = exists) -> bool:
            whole = int(((dev == MILLI_PER_DEVICE) & exists).sum())
            return bool((free >= need).all()) and whole >= gpus

        if ok():
            out[k] = now
            continue
        for r in sorted(rows_by_node.get(n, []), key=lambda r: b.until[r]):
            if not np.isfinite(b.until[r]):
                break
            free, dev = free + b.charged[r], dev + b.devices[r]
            if ok(free, dev):
                out[k] = max(float(b.until[r]), now)
                break
    return out


def test_earliest_room_reads_when_bound_pods_leave() -> None:
    st_ = ClusterState(cluster(node("a", cpu=32000, gpus=8), node("b", cpu=32000, gpus=8),
                               node("c", cpu=32000, gpus=8)))
    for n, pid, until in ((0, "a1", 100.0), (0, "a2", 300.0), (2, "c1", np.inf)):
        req = st_.compile(_gpu_pod(pid, 4, 0.0, min(until, 1e6)))
        st_.allocate(n, req, st_.pick_devices(n, req), until=until)
    member = st_.compile(_gpu_pod("m", 8, 0.0, 50.0, gang_id="g", gang_size=2))
    t = earliest_room(st_, member, np.arange(3))
    # a: whole at 300 (both pods gone); b: now; c: its pod never says when it ends.
    assert t.tolist() == [300.0, 0.0, np.inf]
    small = st_.compile(_gpu_pod("s", 4, 0.0, 50.0))
    assert earliest_room(st_, small, np.arange(3)).tolist() == [100.0, 0.0, 0.0]


def _run(pods: list[Pod], sched: ProfileScheduler, **cfg: Any) -> Engine:
    e = Engine(cluster(node("a", cpu=32000, gpus=8), node("b", cpu=32000, gpus=8)), pods,
               EngineConfig(power_management=False, container_start_s=0.0, **cfg))
    while (req := e.next_decision()) is not None:
        e.apply(sched.decide(e.state, req.request))
    return e


def _scenario() -> list[Pod]:
    # Both 4-GPU blockers pack onto a (MostAllocated), which is whole again at 2000 s; b is
    # empty. The 2 x 8-GPU gang arrives at 10 s and can start at 2000 s on a and b. A long
    # 4-GPU pod (20 s, 5000 s) would take b and hold the gang until 5020 s; a short one
    # (30 s, 500 s) ends well before 2000 s and may backfill.
    return [
        _gpu_pod("blocker-1", 4, 0.0, 1000.0),
        _gpu_pod("blocker-2", 4, 0.0, 2000.0),
        _gpu_pod("gang-0", 8, 10.0, 600.0, gang_id="g", gang_size=2),
        _gpu_pod("gang-1", 8, 10.0, 600.0, gang_id="g", gang_size=2),
        _gpu_pod("long", 4, 20.0, 5000.0),
        _gpu_pod("short", 4, 30.0, 500.0),
    ]


def _started(e: Engine) -> dict[str, float]:
    return {p.id: float(e.table.started_at[i]) for i, p in enumerate(e.table.pods)}


def test_a_reservation_keeps_room_for_the_gang_and_lets_short_pods_backfill() -> None:
    e = _run(_scenario(), _sched())
    t = _started(e)
    assert (e.table.status == DONE).all()
    assert t["gang-0"] == t["gang-1"] == 2000.0  # due as soon as both nodes are whole
    assert t["short"] == 30.0  # ends by 530 s: it delays nobody
    assert t["long"] >= 2600.0  # waited for the gang to finish
    assert len(e.state.reservations) == 0  # the gang started: its promise is kept


def test_without_the_backfill_rule_the_long_pod_delays_the_gang() -> None:
    # The same day without the Reservations filter: the reservation is made but nothing
    # honours it, so the gang waits for the long pod. This is what the filter prevents.
    t = _started(_run(_scenario(), _sched(backfill=False)))
    assert t["long"] == 20.0 and t["gang-0"] >= 5020.0


def test_lower_priority_pods_may_use_reserved_room_the_gang_then_preempts() -> None:
    pods = _scenario()
    pods[4] = _gpu_pod("long", 4, 20.0, 5000.0, priority=100)
    doc = {
        "name": "gangs", "filters": [*BASE, "Reservations"],
        "score": [{"name": "NodeResourcesFit", "args": {"strategy": "MostAllocated"}}],
        "post_filter": ["DefaultPreemption", "GangReservation"], "tie_break": "first",
    }
    e = _run(pods, ProfileScheduler(profile_from_dict(doc), seed=0))
    t = _started(e)
    assert t["long"] == 20.0  # below the gang: it may use the room
    assert t["gang-0"] == t["gang-1"] == 2000.0  # and is preempted when the gang is due
    assert e.run_report()["pods"]["preemptions"] == 1


def test_the_backfill_depth_limits_how_many_gangs_hold_room() -> None:
    st_ = ClusterState(cluster(*(node(f"n{k}", cpu=32000, gpus=8) for k in range(4))))
    for n in range(4):
        req = st_.compile(_gpu_pod(f"b{n}", 4, 0.0, 100.0 * (n + 1)))
        st_.allocate(n, req, st_.pick_devices(n, req), until=100.0 * (n + 1))
    sched = _sched(max_reservations=1)
    first = sched.decide(st_, st_.compile(_gpu_pod("g0", 8, 0.0, 9.0, gang_id="g", gang_size=2)))
    assert first.node is None and first.reserve is not None
    assert first.reserve.nodes == (0, 1) and first.reserve.due == 200.0
    st_.reservations.add(first.reserve)
    other = st_.compile(_gpu_pod("h0", 8, 0.0, 9.0, gang_id="h", gang_size=2))
    assert sched.decide(st_, other).reserve is None  # the depth is taken
    assert _sched(max_reservations=2).decide(st_, other).reserve.nodes == (2, 3)


def _single_scenario() -> list[Pod]:
    # a and b fill with 4-GPU pods; a single 8-GPU pod arrives at 10 s; three long 4-GPU
    # pods arrive after it and would take each half node as it frees (a at 1,000 s, b at
    # 1,200 s and 1,300 s), so the 8-GPU pod never finds a whole node until 6,000 s.
    return [
        _gpu_pod("x1", 4, 0.0, 1000.0), _gpu_pod("x2", 4, 0.0, 1500.0),
        _gpu_pod("y1", 4, 0.0, 1200.0), _gpu_pod("y2", 4, 0.0, 1300.0),
        _gpu_pod("big", 8, 10.0, 600.0),
        _gpu_pod("s1", 4, 20.0, 5000.0), _gpu_pod("s2", 4, 30.0, 5000.0),
        _gpu_pod("s3", 4, 40.0, 5000.0),
    ]


def test_a_single_whole_node_pod_holds_room_only_when_asked() -> None:
    """``singles_from_gpus``: a pod outside a gang asking that many whole GPUs reserves
    the node that frees whole soonest (Slurm's head job, whatever its size); without it,
    later pods take every half node as it frees and the big pod waits for hours."""
    t = _started(_run(_single_scenario(), _sched()))
    assert t["big"] >= 6000.0  # gangs only: nothing holds a node for it
    e = _run(_single_scenario(), _sched(singles_from_gpus=8))
    t = _started(e)
    assert (e.table.status == DONE).all()
    assert t["big"] == 1300.0  # b, whole at 1,300 s: held for it
    assert t["s1"] == 1000.0  # a's half at 1,000 s is not held: used at once
    assert t["s2"] >= 1300.0 and t["s3"] >= 1300.0  # would have run past the due time
    assert len(e.state.reservations) == 0  # started: its promise is kept
    # Smaller singles do not reserve.
    st_ = ClusterState(cluster(node("a", cpu=32000, gpus=8)))
    req = st_.compile(_gpu_pod("f", 8, 0.0, 100.0))
    st_.allocate(0, req, st_.pick_devices(0, req), until=100.0)
    sched = _sched(singles_from_gpus=8)
    assert sched.decide(st_, st_.compile(_gpu_pod("q", 4, 0.0, 9.0))).reserve is None
    got = sched.decide(st_, st_.compile(_gpu_pod("w", 8, 0.0, 9.0))).reserve
    assert got is not None and got.nodes == (0,) and got.due == 100.0


def test_bad_reservation_settings_name_the_field() -> None:
    with pytest.raises(ValidationError) as e:
        _sched(max_reservations=0)
    assert e.value.field == "gangs.post_filter[0].args.max_reservations"
    with pytest.raises(ValidationError) as e:
        _sched(singles_from_gpus=0)
    assert e.value.field == "gangs.post_filter[0].args.singles_from_gpus"


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 3]),
                          st.sampled_from([100, 500, 1000]), st.floats(0, 3000),
                          st.floats(50, 2000)),
                min_size=2, max_size=20),
       st.integers(0, 2**16), st.sampled_from([None, 4, 8]))
def test_reservations_preemption_migrations_and_failures_keep_the_books(jobs, seed,
                                                                        singles) -> None:
    spec = cluster(*(node(f"n{k}", cpu=32000, gpus=8) for k in range(3)),
                   node("t4", cpu=32000, gpus=4, model="T4"), node("cpu", cpu=16000))
    pods: list[Pod] = []
    for j, (gpus, size, prio, arr, dur) in enumerate(jobs):
        for m in range(size):
            extra = {"gang_id": f"g{j}", "gang_size": size} if size > 1 else {}
            pods.append(Pod(id=f"j{j}-{m}", cpu_milli=1000, memory_mib=1024, num_gpu=gpus,
                            gpu_milli=1000, priority=prio, arrival=arr, duration=dur,
                            pod_class=PodClass.AI_TRAIN, checkpoint_interval_s=300.0,
                            **extra))
    doc = {"name": "gangs", "filters": [*BASE, "Reservations"],
           "score": [{"name": "NodeResourcesFit", "args": {"strategy": "MostAllocated"}}],
           "post_filter": ["DefaultPreemption",
                           {"name": "GangReservation",
                            "args": {"max_reservations": 2, "singles_from_gpus": singles}}],
           "deschedule": [{"name": "GpuDefrag",
                           "args": {"interval_s": 60, "movable": ["ai-train"]}}],
           "tie_break": "first"}
    s = ProfileScheduler(profile_from_dict(doc), seed=seed)
    e = Engine(spec, pods, EngineConfig(seed=seed, power_management=False,
                                        node_mtbf_hours=0.5, repair_s=300.0, tick_s=60.0))
    e.descheduler = s  # what build_run attaches for a profile with a pass
    st_ = e.state
    while (req := e.next_decision()) is not None:
        everywhere = np.arange(st_.num_nodes)
        assert np.array_equal(earliest_room(st_, req.request, everywhere),
                              _earliest_room_by_loop(st_, req.request, everywhere))
        d = s.decide(st_, req.request)
        e.apply(d)
        for v in d.victims:
            k = next(i for i, p in enumerate(e.table.pods) if p.id == v.id)
            assert e.table.status[k] == PENDING
        assert (st_.allocated <= st_.capacity).all() and (st_.allocated >= 0).all()
        assert (st_.gpu_free >= 0).all() and (st_.gpu_free <= 1000).all()
        used = np.where(st_.gpu_exists, 1000, 0).sum(1) - st_.gpu_free.sum(1)
        assert np.array_equal(used, st_.allocated[:, 2])
        res = st_.reservations
        held = [n for r in res.by_gang.values() for n in r.nodes]
        assert len(held) == len(set(held))  # one reservation per node
        assert np.array_equal(np.flatnonzero(res.owner >= 0), np.sort(held))
        assert st_.up[held].all()  # a node that failed holds nobody's room
        assert len(res) <= 2
        for key in res.by_gang:  # a single pod's room is held only while it waits
            if key.startswith(SINGLE):
                pid = key[len(SINGLE):]
                k = next(i for i, p in enumerate(e.table.pods) if p.id == pid)
                assert singles is not None and e.table.status[k] == PENDING
        # Bound rows: running or bound pods, plus gang members placed tentatively.
        placed = int(((e.table.status == RUNNING) | (e.table.status == 2)).sum())
        assert len(st_.bound) == placed + len(e._gang_placed)
        # A gang runs whole or not at all: no member bound while another waits. (Members
        # that finished may sit beside one still bound: a member stalled on a failed node
        # stays bound until its eviction, while its mates end.)
        for j in range(len(jobs)):
            idx = [i for i, p in enumerate(e.table.pods) if p.id.startswith(f"j{j}-")]
            on = [e.table.status[i] in (RUNNING, 2) for i in idx]
            waiting = [e.table.status[i] == PENDING for i in idx]
            assert not (any(on) and any(waiting))


def test_members_placed_tentatively_do_not_delay_their_own_reservation() -> None:
    # a is free, b is busy until 1000 s. The gang (2 x 8 GPUs, 5000 s) places member 0 on a
    # tentatively, member 1 fits nowhere: the reservation is due at 1000 s (when b is
    # whole), not at 5010 s (when member 0's tentative run would end). A 3000 s pod arriving
    # at 20 s must not backfill onto a.
    pods = [_gpu_pod("busy", 8, 0.0, 1000.0), *(
        _gpu_pod(f"gang-{m}", 8, 10.0, 5000.0, gang_id="g", gang_size=2) for m in range(2)),
        _gpu_pod("long", 8, 20.0, 3000.0)]
    t = _started(_run(pods, _sched()))
    assert t["gang-0"] == t["gang-1"] == 1000.0 and t["long"] >= 6000.0


def test_a_higher_priority_gang_displaces_a_lower_reservation() -> None:
    st_ = ClusterState(cluster(*(node(f"n{k}", cpu=32000, gpus=8) for k in range(4))))
    for n in range(4):
        req = st_.compile(_gpu_pod(f"b{n}", 4, 0.0, 100.0 * (n + 1), priority=1000))
        st_.allocate(n, req, st_.pick_devices(n, req), until=100.0 * (n + 1))
    sched = _sched(max_reservations=1)
    low = sched.decide(st_, st_.compile(_gpu_pod("l0", 8, 0.0, 9.0, gang_id="low",
                                                 gang_size=2, priority=100)))
    st_.reservations.add(low.reserve)
    same = sched.decide(st_, st_.compile(_gpu_pod("s0", 8, 0.0, 9.0, gang_id="same",
                                                  gang_size=2, priority=100)))
    assert same.reserve is None  # equal priority: it came later, it waits for the slot
    high = sched.decide(st_, st_.compile(_gpu_pod("h0", 8, 0.0, 9.0, gang_id="high",
                                                  gang_size=2, priority=500)))
    assert high.reserve is not None and high.reserve.displaces == ("low",)
    assert high.reserve.nodes == (0, 1)  # the soonest nodes, the displaced gang's included
    st_.reservations.add(high.reserve)
    assert set(st_.reservations.by_gang) == {"high"}


def test_a_due_reservation_not_renewed_is_dropped() -> None:
    # The gang reserves a and b, due at 1000 s. A lower-priority service with no end takes
    # a at 20 s (below the gang, it may), and this profile cannot preempt it: at 1000 s the
    # gang still cannot start and gets no new reservation. The old one must not keep b from
    # a pod of the gang's priority that arrives at 1100 s.
    pods = [_gpu_pod("busy", 8, 0.0, 1000.0),
            *(_gpu_pod(f"gang-{m}", 8, 10.0, 500.0, gang_id="g", gang_size=2) for m in range(2)),
            _gpu_pod("service", 8, 20.0, None, priority=100),
            _gpu_pod("later", 8, 1100.0, 100.0)]
    e = _run(pods, _sched())
    t = _started(e)
    assert t["service"] == 20.0 and t["later"] == 1100.0
    assert not np.isfinite(t["gang-0"]) and len(e.state.reservations) == 0
