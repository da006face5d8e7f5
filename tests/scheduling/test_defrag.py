"""GpuDefrag: a descheduling pass moves inference and batch pods off big accelerator nodes
when that lets a waiting pod that needs them whole start, and does nothing otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod, PodClass
from smartsched.scheduling.framework import ProfileScheduler
from smartsched.scheduling.registry import profile_from_dict
from smartsched.scheduling.run import build_run
from smartsched.twin.podtable import DONE
from tests.builders import cluster, node, pod

BIG, SMALL = 0, 2  # node indices: a100-a, a100-b, t4


def _doc(args: dict[str, Any] | None) -> dict[str, Any]:
    """The profile, with GpuDefrag given ``args`` (None: no descheduling pass)."""
    return {"name": "defrag", "filters": ["NodeUnschedulable", "NodeResourcesFit"],
            "score": [{"name": "NodeResourcesFit", "args": {"strategy": "MostAllocated"}}],
            "deschedule": [{"name": "GpuDefrag", "args": args}] if args is not None else [],
            "tie_break": "first"}


def _spec(t4_gpus: int = 4) -> Any:
    return cluster(node("a100-a", cpu=32000, gpus=8), node("a100-b", cpu=32000, gpus=8),
                   node("t4", cpu=32000, gpus=t4_gpus, model="T4"))


def _share(pid: str, cls: PodClass = PodClass.AI_INFER, **kw: Any) -> Pod:
    return pod(pid, cpu=1000, num_gpu=1, gpu_milli=500, arrival=0.0, duration=20000.0,
               pod_class=cls, priority=800 if cls == PodClass.AI_INFER else 500, **kw)


def _gang(size: int = 2) -> list[Pod]:
    return [pod(f"gang-{m}", cpu=1000, num_gpu=8, gpu_milli=1000, arrival=10.0,
                duration=600.0, pod_class=PodClass.AI_TRAIN, priority=500,
                gang_id="g", gang_size=size) for m in range(size)]


def _run(pods: list[Pod], spec: Any = None, args: dict[str, Any] | None = None) -> Any:
    # MostAllocated packs both shares onto a100-a (the first, then the fullest); the gang
    # arrives at 10 s and lacks one whole node. The pass runs at the 300 s tick.
    run = build_run(spec or _spec(), pods, ProfileScheduler(profile_from_dict(_doc(args))),
                    engine_overrides={"power_management": False, "container_start_s": 0.0})
    run.drive()
    return run.engine


def _where(e: Any) -> dict[str, int]:
    return {p.id: int(e.table.node[i]) for i, p in enumerate(e.table.pods)}


def test_moves_the_shares_to_the_small_node_and_the_gang_starts() -> None:
    e = _run([_share("infer-1"), _share("infer-2"), *_gang()], args={"interval_s": 300.0})
    m = e.run_report()
    started = {p.id: float(e.table.started_at[i]) for i, p in enumerate(e.table.pods)}
    assert started["gang-0"] == started["gang-1"] == 300.0  # right after the first pass
    assert m["pods"]["migrations"] == 2 and m["classes"]["ai-infer"]["migrations"] == 2
    assert m["pods"]["preemptions"] == 0
    assert m["pods"]["lost_pod_hours"] == 0.0  # inference carries on where it restarts
    assert (e.table.status[-2:] == DONE).all()
    where = _where(e)
    assert where["infer-1"] == where["infer-2"] == SMALL  # consolidated on the small tier
    assert {where["gang-0"], where["gang-1"]} == {BIG, 1}


def test_without_the_pass_the_gang_waits_for_the_shares() -> None:
    e = _run([_share("infer-1"), _share("infer-2"), *_gang()])
    started = {p.id: float(e.table.started_at[i]) for i, p in enumerate(e.table.pods)}
    assert started["gang-0"] >= 20000.0 and e.run_report()["pods"]["migrations"] == 0


def test_a_profile_without_a_pass_is_not_attached() -> None:
    run = build_run(_spec(), [_share("x")], ProfileScheduler(profile_from_dict(_doc(None))))
    assert run.engine.descheduler is None


@pytest.mark.parametrize(("pods", "t4_gpus", "why"), [
    # Training is not movable by default: nothing to clear.
    ([_share("t1", PodClass.AI_TRAIN), _share("t2", PodClass.AI_TRAIN), *_gang()], 4,
     "not movable"),
    # No smaller node to take the shares: moving them to the other big node helps nobody.
    ([_share("infer-1"), _share("infer-2"), *_gang()], 0, "no destination"),
    # Training that takes all of a100-b's cpu stays: clearing a100-a alone starts nobody.
    ([_share("infer-1"), pod("hog", cpu=32000, arrival=0.0, duration=20000.0,
                             pod_class=PodClass.AI_TRAIN, priority=500), *_gang()], 4,
     "cannot clear enough nodes"),
])
def test_moves_nothing_when_it_cannot_let_the_pod_start(pods: list[Pod], t4_gpus: int,
                                                         why: str) -> None:
    spec = _spec(t4_gpus) if t4_gpus else cluster(node("a100-a", cpu=32000, gpus=8),
                                                  node("a100-b", cpu=32000, gpus=8),
                                                  node("cpu", cpu=32000))
    e = _run(pods, spec=spec, args={"interval_s": 300.0})
    assert e.run_report()["pods"]["migrations"] == 0, why


def test_the_pass_respects_max_moves() -> None:
    pods = [_share(f"infer-{k}") for k in range(3)] + _gang()
    assert _run(pods, args={"max_moves": 2}).run_report()["pods"]["migrations"] == 0
    assert _run(pods, args={"max_moves": 3}).run_report()["pods"]["migrations"] == 3


@pytest.mark.parametrize(("args", "field"), [
    ({"interval_s": 0}, "defrag.deschedule[0].args.interval_s"),
    ({"max_moves": 0}, "defrag.deschedule[0].args.max_moves"),
    ({"movable": ["gpu-hog"]}, "defrag.deschedule[0].args.movable[0]"),
])
def test_bad_settings_name_the_field(args: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        profile_from_dict(_doc(args))
    assert e.value.field == field


def test_a_filter_is_not_a_descheduler() -> None:
    with pytest.raises(ValidationError, match="not a descheduling plugin"):
        profile_from_dict({**_doc(None), "deschedule": ["NodeAffinity"]})


@pytest.mark.parametrize(("small_gpus", "moves"), [(2, 0), (3, 6)])
def test_never_moves_onto_a_node_it_clears_and_only_when_the_gang_then_fits(
        small_gpus: int, moves: int) -> None:
    # big (8 GPUs) holds five half-GPU shares, one per device; mid (4) holds one. A gang of
    # 2 x 4 whole GPUs needs both cleared. Their shares may only go to small: with 2 GPUs it
    # takes 3 more shares, too few, so nothing moves (mid is never a destination for big's
    # shares, though it has fewer GPUs: it is being cleared); with 3 GPUs all six move.
    from smartsched.twin.state import ClusterState

    spec = cluster(node("big", cpu=32000, gpus=8), node("mid", cpu=32000, gpus=4, model="T4"),
                   node("small", cpu=32000, gpus=small_gpus, model="T4"))
    st = ClusterState(spec)
    for k, (n, dev) in enumerate([(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 0)]):
        st.allocate(n, st.compile(_share(f"s{k}")), (dev,))
    sched = ProfileScheduler(profile_from_dict(_doc({})))
    member = st.compile(pod("g0", cpu=1000, num_gpu=4, gpu_milli=1000, gang_id="g",
                            gang_size=2, pod_class=PodClass.AI_TRAIN))
    plan = sched.deschedule(st, [member])
    assert len(plan) == moves
    assert all(spec.nodes[m.node].name == "small" for m in plan)


def _spread_doc(plugin: str) -> dict[str, Any]:
    return {"name": "defrag", "filters": ["NodeUnschedulable", "NodeResourcesFit"],
            "score": [{"name": "NodeResourcesFit", "args": {"strategy": "LeastAllocated"}}],
            "deschedule": [{"name": plugin, "args": {"interval_s": 300.0}}],
            "tie_break": "first"}


@pytest.mark.parametrize("plugin", ["GpuDefrag", "AnnealDefrag"])
def test_consolidating_across_big_nodes_takes_the_joint_plan(plugin: str) -> None:
    """Three 8-GPU nodes and no smaller one; spreading put one inference share on each,
    so a 2 x 8-GPU gang finds no whole node. The greedy pass only moves pods to smaller
    nodes and finds no plan; the annealed plan (optimize.defrag, found through the
    smartsched.plugins entry point) moves two shares next to the third and the gang
    starts at the first pass."""
    spec = cluster(node("a", cpu=32000, gpus=8), node("b", cpu=32000, gpus=8),
                   node("c", cpu=32000, gpus=8))
    pods = [_share("infer-1"), _share("infer-2"), _share("infer-3"), *_gang()]
    run = build_run(spec, pods, ProfileScheduler(profile_from_dict(_spread_doc(plugin))),
                    engine_overrides={"power_management": False, "container_start_s": 0.0})
    run.drive()
    e = run.engine
    where = _where(e)
    started = {p.id: float(e.table.started_at[i]) for i, p in enumerate(e.table.pods)}
    migrations = e.run_report()["pods"]["migrations"]
    if plugin == "GpuDefrag":
        assert migrations == 0 and started["gang-0"] >= 20000.0
        return
    assert started["gang-0"] == started["gang-1"] == 300.0
    assert migrations == 2
    shares = {where[f"infer-{i}"] for i in (1, 2, 3)}
    assert len(shares) == 1 and shares.isdisjoint({where["gang-0"], where["gang-1"]})
    assert e.run_report()["pods"]["preemptions"] == 0


def test_the_annealed_plan_never_drops_a_running_pod_or_exceeds_the_budget() -> None:
    """With a budget of one move the gang would need two: no plan, nothing moves."""
    spec = cluster(node("a", cpu=32000, gpus=8), node("b", cpu=32000, gpus=8),
                   node("c", cpu=32000, gpus=8))
    doc = _spread_doc("AnnealDefrag")
    doc["deschedule"][0]["args"]["max_moves"] = 1
    run = build_run(spec, [_share("infer-1"), _share("infer-2"), _share("infer-3"), *_gang()],
                    ProfileScheduler(profile_from_dict(doc)),
                    engine_overrides={"power_management": False, "container_start_s": 0.0})
    run.drive()
    assert run.engine.run_report()["pods"]["migrations"] == 0
    with pytest.raises(ValidationError):
        profile_from_dict({**doc, "deschedule": [{"name": "AnnealDefrag",
                                                  "args": {"sweeps": 0}}]})
