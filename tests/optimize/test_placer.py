"""The window placer on the twin: every answer feasible on the real state, pods that fit
nowhere named as such, a joint answer better than the profile's own when one exists,
and the ``anneal:`` scheduler driving fill mode window by window."""

from __future__ import annotations

import numpy as np
import pytest

from smartsched.model.errors import ValidationError
from smartsched.optimize.candidates import Pruning, build_problem
from smartsched.optimize.placer import AnnealOptions, WindowPlacer, place_window
from smartsched.scheduling.base import make_scheduler
from smartsched.scheduling.run import build_run
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node, pod

GPU_TAINT = ("nvidia.com/gpu=present:NoSchedule",)


def _gpu(pid: str, gpus: int = 1, milli: int = 1000, cpu: int = 1000):
    return pod(pid, cpu=cpu, num_gpu=gpus, gpu_milli=milli, tolerations=GPU_TAINT)


def _spec():
    return cluster(node("a", cpu=32000, mem=131072, gpus=4),
                   node("b", cpu=32000, mem=131072, gpus=2),
                   node("c", cpu=16000, mem=65536))


def _apply(st: ClusterState, reqs, decisions) -> int:
    """Allocate every placed pod on the real state (raises on any over-allocation)."""
    placed = 0
    for r, d in zip(reqs, decisions, strict=True):
        if d.node is not None:
            st.allocate(d.node, r, d.devices if d.devices is not None
                        else st.pick_devices(d.node, r))
            placed += 1
    return placed


def test_a_joint_answer_beats_the_profiles_own_when_one_exists() -> None:
    """first-fit puts the 1-GPU pod on the 4-GPU node, and the 4-GPU pod after it then
    fits nowhere; placed jointly, both fit (the small one on the 2-GPU node)."""
    spec = _spec()
    base = make_scheduler("first-fit")
    st = ClusterState(spec)
    reqs = [st.compile(_gpu("small", 1)), st.compile(_gpu("big", 4))]
    seq = st.fork()
    alone = 0
    for r in reqs:
        d = base.decide(seq, r)
        if d.node is not None:
            seq.allocate(d.node, r, seq.pick_devices(d.node, r))
            alone += 1
    assert alone == 1
    res = place_window(base, st, reqs, AnnealOptions(homes="profile", value="count",
                                                     sweeps=40))
    assert res.unplaced == []
    assert [d.node for d in res.decisions] == [1, 0]
    assert res.stats["placed_by_model"] == 2
    assert _apply(st, reqs, res.decisions) == 2


@pytest.mark.parametrize("homes", ["shapes", "profile"])
def test_every_answer_is_feasible_on_the_real_state(homes: str) -> None:
    spec = _spec()
    st = ClusterState(spec)
    rng = np.random.default_rng(0)
    pods = []
    for i in range(40):
        kind = rng.integers(3)
        if kind == 0:
            pods.append(pod(f"cpu{i}", cpu=int(rng.integers(500, 6000)),
                            mem=int(rng.integers(512, 16000))))
        elif kind == 1:
            pods.append(_gpu(f"frac{i}", 1, int(rng.choice([250, 500, 700]))))
        else:
            pods.append(_gpu(f"whole{i}", int(rng.integers(1, 3))))
    reqs = [st.compile(p) for p in pods]
    base = make_scheduler("fgd")
    base.prepare(pods)
    res = place_window(base, st, reqs, AnnealOptions(homes=homes, sweeps=10, k=3), seed=3)
    assert len(res.decisions) == len(reqs)
    placed = _apply(st, reqs, res.decisions)
    assert placed == res.stats["placed_by_model"] + res.stats["placed_by_profile"]
    assert np.all(st.allocated <= st.capacity)
    assert np.all(st.gpu_free >= 0)
    for i in res.unplaced:  # each pod left out says why
        assert res.decisions[i].rejections
    again = place_window(base, ClusterState(spec), reqs, AnnealOptions(homes=homes, sweeps=10,
                                                                       k=3), seed=3)
    assert [(d.node, d.devices) for d in again.decisions] == \
        [(d.node, d.devices) for d in res.decisions]


def test_a_pod_that_fits_nowhere_is_listed_unplaced_with_the_reason() -> None:
    st = ClusterState(_spec())
    reqs = [st.compile(_gpu("huge", 8)), st.compile(pod("ok"))]
    base = make_scheduler("bestfit")
    problem, why = build_problem(base, st, reqs)
    assert problem.nslots[0] == 1 and 0 in why and "0/3 nodes are available" in why[0]
    res = place_window(base, st, reqs)
    assert res.unplaced == [0]
    assert res.decisions[1].node is not None
    assert "Insufficient gpu" in " ".join(res.decisions[0].reasons)



def test_a_window_where_no_pod_fits_anywhere_leaves_them_all_unplaced() -> None:
    # Every pod has only slot 0 (a full cluster in fill mode): the annealer's soft slope
    # took a max over no candidates and raised ValueError.
    st = ClusterState(_spec())
    reqs = [st.compile(_gpu("huge", 8)), st.compile(_gpu("huge2", 8))]
    res = place_window(make_scheduler("bestfit"), st, reqs)
    assert res.unplaced == [0, 1]
    assert all(d.node is None for d in res.decisions)

def test_bad_input_is_named() -> None:
    st = ClusterState(_spec())
    base = make_scheduler("bestfit")
    with pytest.raises(ValidationError, match="k"):
        Pruning(k=0)
    with pytest.raises(ValidationError, match="d"):
        Pruning(d=-1)
    with pytest.raises(ValidationError, match="window"):
        place_window(base, st, [])
    with pytest.raises(ValidationError, match="window"):
        build_problem(base, st, [])
    with pytest.raises(ValidationError, match="score_weight"):
        AnnealOptions(score_weight=1.0)
    with pytest.raises(ValidationError, match="homes"):
        AnnealOptions(homes="elsewhere")
    with pytest.raises(ValidationError, match=r"scheduler\.sweeps"):
        make_scheduler("anneal:fgd?sweeps=many")
    with pytest.raises(ValidationError, match=r"scheduler\.colour"):
        make_scheduler("anneal:fgd?colour=blue")
    with pytest.raises(ValidationError, match="scheduler"):
        make_scheduler("anneal:lookahead:fgd")
    with pytest.raises(ValidationError, match="window"):
        make_scheduler("anneal:fgd?window=0")
    # Absurd sizes were accepted and then exhausted memory: named, with the bound.
    for spec, field in (("replicas=100000", "replicas"), ("window=100000000000", "window"),
                        ("k=100000", "k"), ("lns=10000000000", "lns")):
        with pytest.raises(ValidationError, match=r"\[\d, [\d,]+\]") as e:
            make_scheduler(f"anneal:fgd?{spec}")
        assert e.value.field.endswith(field)


def test_fill_mode_hands_the_scheduler_one_window_at_a_time() -> None:
    """Pods arrive in windows of 4: the placer solves each window once, before its first
    pod, and never sees a pod of a later window; every pod is decided."""
    spec = _spec()
    pods = [_gpu(f"g{i}", 1 + i % 2, cpu=2000) for i in range(10)]
    run = build_run(spec, pods, "anneal:bestfit?window=4&sweeps=5", mode="fill", seed=1,
                    inflate=1.0)
    sched = run.scheduler
    assert isinstance(sched, WindowPlacer)
    seen: list[list[str]] = []
    plan = sched.plan_window

    def spy(state, requests):
        seen.append([r.pod.id for r in requests])
        plan(state, requests)

    sched.plan_window = spy
    run.drive()
    order = [p.id for p in run.engine.table.pods]
    offered = [i for w in seen for i in w]
    assert [len(w) for w in seen] == [4] * (len(order) // 4) + ([len(order) % 4]
                                                                 if len(order) % 4 else [])
    assert sorted(offered) == sorted(order)
    report = run.report()
    assert report["pods"]["arrived"] == len(order)
    assert np.all(run.engine.state.allocated <= run.engine.state.capacity)


def test_a_service_site_places_a_batch_jointly_with_an_anneal_profile() -> None:
    """The service's batch option: a site whose profile is ``anneal:first-fit`` books
    both pods of the batch that first-fit alone could only half place; single requests
    are decided by the profile."""
    from smartsched.serving.site import SitePlacer

    def batch():
        return [_gpu("small", 1), _gpu("big", 4)]

    alone = SitePlacer(_spec(), "first-fit").place(batch(), ttl_s=60)
    assert [r.placed for r in alone] == [True, False]
    site = SitePlacer(_spec(), "anneal:first-fit?homes=profile&value=count&sweeps=40")
    joint = site.place(batch(), ttl_s=60)
    assert [r.placed for r in joint] == [True, True]
    assert [r.node for r in joint] == ["b", "a"]
    assert np.all(site.state.allocated <= site.state.capacity)
    one = site.place([_gpu("third", 1)], ttl_s=60)  # nothing planned: the profile decides
    assert one[0].placed and one[0].node == "b"


def test_a_service_batch_with_a_gang_is_one_window() -> None:
    """A batch of three single GPU pods and a 2 x 2-GPU gang on 6 GPUs: bestfit alone
    books the singles and refuses the gang; ``anneal:bestfit`` books the gang whole and
    two singles, and the journal-backed state holds exactly what was answered."""
    from smartsched.serving.site import SitePlacer

    def batch():
        return [_gpu("s0"), _gpu("s1"), _gpu("s2")] + [
            pod(f"g{i}", num_gpu=2, gpu_milli=1000, tolerations=GPU_TAINT, gang_id="g",
                gang_size=2) for i in range(2)]

    alone = SitePlacer(_spec(), "bestfit").place(batch(), ttl_s=60)
    assert [r.placed for r in alone] == [True, True, True, False, False]
    site = SitePlacer(_spec(), "anneal:bestfit?homes=profile&value=gpu&sweeps=20")
    joint = {r.pod_id: r for r in site.place(batch(), ttl_s=60)}
    assert joint["g0"].placed and joint["g1"].placed
    assert sum(r.placed for r in joint.values()) == 4
    st = site.state
    assert np.all(st.allocated <= st.capacity)
    assert int((st.gpu_free[st.gpu_exists] == 0).sum()) == 6  # every GPU busy


def test_windows_are_fill_modes_and_sized_sensibly() -> None:
    spec = _spec()
    pods = [pod(f"p{i}") for i in range(3)]
    replay = build_run(spec, pods, "bestfit", mode="replay")
    assert replay.next_decision() is not None
    with pytest.raises(ValidationError, match="mode"):
        replay.engine.fill_window(2)
    fill = build_run(spec, pods, "bestfit", mode="fill", inflate=1.0)
    with pytest.raises(ValidationError, match="mode"):  # nothing offered yet
        fill.engine.fill_window(2)
    first = fill.next_decision()
    with pytest.raises(ValidationError, match="window"):
        fill.engine.fill_window(0)
    win = fill.engine.fill_window(10)  # never past the last arrival
    assert win[0] is first.request and len(win) == 3


def test_a_split_profile_routes_each_pod_to_its_own_profile() -> None:
    spec = _spec()
    st = ClusterState(spec)
    pods = [pod(f"web{i}", cpu=1500, pod_class="online") for i in range(6)] + \
        [_gpu(f"train{i}", 1 + i % 2) for i in range(3)] + \
        [pod(f"be{i}", cpu=500, best_effort=True) for i in range(2)]
    reqs = [st.compile(p) for p in pods]
    base = make_scheduler("composite")
    res = place_window(base, st, reqs, AnnealOptions(sweeps=5))
    assert res.stats["modelled"] == 9  # the best-effort pods go to the profile after
    assert _apply(st, reqs, res.decisions) == len(pods) - len(res.unplaced)
    assert not res.unplaced
    assert isinstance(make_scheduler("anneal:composite?sweeps=3"), WindowPlacer)


def test_gangs_are_kept_only_whole() -> None:
    st = ClusterState(_spec())  # 6 GPUs in all
    too_big = [pod(f"g{i}", num_gpu=2, gpu_milli=1000, tolerations=GPU_TAINT, gang_id="g",
                   gang_size=4) for i in range(4)]  # 8 GPUs: never whole
    half = [pod(f"h{i}", num_gpu=1, gpu_milli=1000, tolerations=GPU_TAINT, gang_id="h",
                gang_size=3) for i in range(2)]  # 2 of 3 members in the window
    fits = [pod(f"f{i}", num_gpu=1, gpu_milli=1000, tolerations=GPU_TAINT, gang_id="f",
                gang_size=2) for i in range(2)]
    reqs = [st.compile(p) for p in too_big + half + fits]
    res = place_window(make_scheduler("bestfit"), st, reqs, AnnealOptions(sweeps=3))
    placed = [reqs[i].pod.id for i, d in enumerate(res.decisions) if d.node is not None]
    assert placed == ["f0", "f1"]
    assert all("not placed whole" in " ".join(res.decisions[i].reasons) for i in range(4))
    assert all("2 of 3 members" in " ".join(res.decisions[i].reasons) for i in (4, 5))
    assert _apply(st, reqs, res.decisions) == 2


@pytest.mark.parametrize("homes", ["shapes", "profile"])
def test_the_model_makes_room_for_a_gang_the_profile_alone_splits(homes: str) -> None:
    # 6 GPUs: a (4) and b (2). In window order bestfit puts the three single GPU pods
    # on b, b and a, and the 2 x 2-GPU gang then finds room for one member only. Placed
    # jointly, the gang and two singles fill all 6 GPUs (instead of 3).
    st = ClusterState(_spec())
    singles = [_gpu(f"s{i}") for i in range(3)]
    gang = [pod(f"g{i}", num_gpu=2, gpu_milli=1000, tolerations=GPU_TAINT, gang_id="g",
                gang_size=2) for i in range(2)]
    reqs = [st.compile(p) for p in singles + gang]
    alone = make_scheduler("bestfit")
    seq = st.fork()
    for r in reqs[:3]:
        d = alone.decide(seq, r)
        seq.allocate(d.node, r, d.devices if d.devices is not None
                     else seq.pick_devices(d.node, r))
    first = alone.decide(seq, reqs[3])  # one member fits, the other then does not
    seq.allocate(first.node, reqs[3], first.devices if first.devices is not None
                 else seq.pick_devices(first.node, reqs[3]))
    assert alone.decide(seq, reqs[4]).node is None
    res = place_window(alone, st, reqs, AnnealOptions(sweeps=20, value="gpu", homes=homes))
    placed = {reqs[i].pod.id for i, d in enumerate(res.decisions) if d.node is not None}
    assert {"g0", "g1"} <= placed and len(placed) == 4
    assert res.stats["placed_by_model"] == 4 and res.stats["problem_gangs"] == 1
    assert _apply(st, reqs, res.decisions) == 4


@pytest.mark.parametrize("profile", ["k8s-default", "composite", "green"])
def test_the_mixed_day_on_medium_every_answer_feasible(profile: str) -> None:
    """Every class at once (online, batch, training gangs, inference, edge pods with an
    origin and a latency SLO, best-effort pods) through profiles, a split one and a
    deferring one included: each answer allocates on the real state, each pod left out
    says why, gangs are whole or absent."""
    run = build_run("medium", "mixed", profile, mode="replay", seed=3, hours=2)
    st = run.engine.state
    reqs = [st.compile(p) for p in run.engine.table.pods[:300]]
    res = place_window(run.scheduler, st, reqs, AnnealOptions(homes="profile", sweeps=3))
    assert _apply(st, reqs, res.decisions) == len(reqs) - len(res.unplaced)
    assert all(res.decisions[i].reasons for i in res.unplaced)
    gangs: dict[str, set[bool]] = {}
    for r, d in zip(reqs, res.decisions, strict=True):
        if r.pod.gang_id:
            gangs.setdefault(r.pod.gang_id, set()).add(d.node is not None)
    assert all(len(v) == 1 for v in gangs.values())
