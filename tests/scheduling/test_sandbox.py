"""Sandbox validation refuses what breaks a hard constraint or an SLO figure, with reasons,
and accepts what the default would have done."""

from __future__ import annotations

import numpy as np
import pytest

from smartsched.model.cluster import ClusterSpec, NodeSpec, Site, Zone
from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod, PodClass, UsageProfile
from smartsched.scheduling.base import make_scheduler
from smartsched.scheduling.sandbox import Placement, Proposal, Sandbox, validate_config
from smartsched.scheduling.sandboxed import SandboxedScheduler
from smartsched.twin.decision import Decision
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node, pod


def _state(*nodes: NodeSpec) -> ClusterState:
    return ClusterState(cluster(*nodes))


def _history(sb: Sandbox, pods: list[Pod], every_s: float = 10.0) -> None:
    for i, p in enumerate(pods):
        sb.observe(p, i * every_s)


def test_a_placement_the_filters_refuse_is_refused_naming_the_plugin() -> None:
    st = _state(node("cpu"), node("gpu", gpus=8, taints=("nvidia.com/gpu=present:NoSchedule",)))
    sb = Sandbox()
    req = st.compile(pod("p"))
    v = sb.validate(st, Proposal((Placement(req, 1),)))
    assert not v.accepted and not v.figures
    assert "TaintToleration" in v.reasons[0] and "gpu" in v.reasons[0], v.reasons
    assert st.bound.used.sum() == 0  # the live state is untouched


def test_an_over_commit_is_refused() -> None:
    st = _state(node("a", cpu=4000))
    reqs = [st.compile(pod(f"p{i}", cpu=3000)) for i in range(2)]
    v = Sandbox().validate(st, Proposal(tuple(Placement(r, 0) for r in reqs), kind="batch"))
    assert not v.accepted
    assert any("p1" in r for r in v.reasons), v.reasons


def test_evicting_more_of_an_app_than_its_budget_is_refused() -> None:
    st = _state(node("a"), node("b"))
    web = [pod(f"w{i}", app="web", pod_class=PodClass.ONLINE, priority=1000) for i in range(2)]
    for i, p in enumerate(web):
        st.allocate(i, st.compile(p), ())
    big = st.compile(pod("big", cpu=8000, priority=2000))
    v = Sandbox().validate(st, Proposal((Placement(big, 0),), evictions=tuple(web),
                                        kind="preemption"))
    assert not v.accepted
    assert any("disruption budget of app web: 2" in r for r in v.reasons), v.reasons
    # A victim that is not bound is named too.
    v = Sandbox().validate(st, Proposal((), evictions=(pod("ghost"),)))
    assert not v.accepted and "ghost" in v.reasons[0]


def test_a_gang_proposal_missing_members_is_refused() -> None:
    st = _state(node("a", gpus=8), node("b", gpus=8))
    members = [st.compile(pod(f"g{i}", num_gpu=8, gpu_milli=1000, gang_id="g", gang_size=3))
               for i in range(2)]
    v = Sandbox().validate(st, Proposal(tuple(Placement(r, i) for i, r in enumerate(members)),
                                        kind="gang", whole_gangs=True))
    assert not v.accepted and "gang g: 2 of 3 members" in v.reasons[0]


def test_preempting_online_pods_that_cannot_go_anywhere_is_refused_by_its_figures() -> None:
    st = _state(node("a", cpu=4000), node("b", cpu=4000))
    web = pod("w0", cpu=4000, app="web", pod_class=PodClass.ONLINE, priority=1000)
    st.allocate(0, st.compile(web), ())
    st.allocate(1, st.compile(pod("filler", cpu=4000)), ())
    batch = st.compile(pod("big-batch", cpu=4000, priority=2000))
    sb = Sandbox({"horizon_s": 600, "max_arrivals": 0})
    v = sb.validate(st, Proposal((Placement(batch, 0),), evictions=(web,), kind="preemption"))
    assert not v.accepted
    on = v.figures["online_pending_s"]
    assert on == (600.0, 0.0)  # the evicted online pod waits the whole horizon
    assert any(f.figure == "online_pending_s" and f.delta == 600.0 for f in v.findings)
    assert v.figures["pending_s"] == (600.0, 600.0)  # without it, the batch pod waits
    assert v.figures["lost_work_s"][0] >= 0.0
    assert "online_pending_s +600.0" in v.reasons[0]


def test_packing_a_hot_node_is_refused_for_contention_spreading_is_not() -> None:
    st = _state(node("hot"), node("cold"))
    st.allocate(0, st.compile(pod("web", cpu=2000, app="web", pod_class=PodClass.ONLINE)), ())
    st.usage[0] = (7000.0, 4096.0, 0.0)  # measured: nearly all its cpu is in use
    hungry = st.compile(pod("hungry", cpu=2000, usage=UsageProfile(mean=1.0)))
    sb = Sandbox({"max_arrivals": 0})
    v = sb.validate(st, Proposal((Placement(hungry, 0),)))
    assert not v.accepted and v.figures["online_contended"] == (1.0, 0.0), v.figures
    assert sb.validate(st, Proposal((Placement(hungry, 1),))).accepted


def test_what_the_default_would_do_is_accepted_with_equal_figures() -> None:
    spec = cluster(*(node(f"n{i}", gpus=4 if i % 2 else 0) for i in range(8)))
    st = ClusterState(spec)
    rng = np.random.default_rng(0)
    history = [pod(f"h{i}", cpu=int(rng.choice([500, 1000, 4000])),
                   pod_class=PodClass.ONLINE if i % 3 == 0 else PodClass.BATCH,
                   duration=float(rng.integers(60, 900))) for i in range(50)]
    for p in history[:12]:  # some load already
        req = st.compile(p)
        d = make_scheduler("k8s-default").decide(st, req)
        st.allocate(d.node, req, ())
    sb = Sandbox({"samples": 3, "max_arrivals": 20})
    _history(sb, history)
    req = st.compile(pod("new", cpu=1000))
    chosen = make_scheduler("k8s-default").decide(st, req).node
    v = sb.validate(st, Proposal((Placement(req, chosen),)))
    assert v.accepted, v.reasons
    assert all(w == wo for w, wo in v.figures.values()), v.figures
    assert v.arrivals > 0 and 0 < v.horizon_s <= 600


def test_the_same_seed_gives_the_same_verdict() -> None:
    def verdict() -> tuple:
        st = _state(*(node(f"n{i}", cpu=4000) for i in range(4)))
        sb = Sandbox({"seed": 7, "max_arrivals": 16})
        _history(sb, [pod(f"h{i}", cpu=1000 + 500 * (i % 4), duration=300.0,
                          pod_class=PodClass.ONLINE if i % 2 else PodClass.BATCH)
                      for i in range(40)], every_s=5.0)
        reqs = [st.compile(pod(f"b{i}", cpu=4000)) for i in range(3)]
        v = sb.validate(st, Proposal(tuple(Placement(r, i) for i, r in enumerate(reqs)),
                                     kind="batch"))
        return v.accepted, v.figures, v.reasons, v.arrivals

    first = verdict()
    assert first == verdict()
    assert first[3] > 0  # arrivals were drawn and rolled
    # The default also fills three of the four nodes with the three big pods: the figures
    # of both branches agree, whichever nodes they took.
    assert first[1]["pending_s"][0] == pytest.approx(first[1]["pending_s"][1])


def test_a_pod_placed_beyond_its_latency_slo_counts_against_it() -> None:
    sites = (Site("region", "cloud", (600.0, 0.0), 5.0), Site("far", "cloud", (-1500.0, 0.0)),
             Site("mec-0", "edge", (400.0, 0.0), 1.0))
    spec = ClusterSpec("edge", sites, tuple(Zone(f"{s.name}-1", s.name) for s in sites),
                       (NodeSpec("near", 32000, 65536, zone="region-1"),
                        NodeSpec("far", 32000, 65536, zone="far-1"),
                        NodeSpec("mec", 4000, 16384, zone="mec-0-1")))
    st = ClusterState(spec)
    edge = st.compile(Pod(id="e", cpu_milli=1000, memory_mib=512, pod_class=PodClass.EDGE_RT,
                          origin_site="mec-0", latency_slo_ms=10.0))
    sb = Sandbox({"rollout": "composite", "max_arrivals": 0})
    v = sb.validate(st, Proposal((Placement(edge, 1),)))
    assert not v.accepted and v.figures["latency_violations"] == (1.0, 0.0)
    assert sb.validate(st, Proposal((Placement(edge, 2),))).accepted


@pytest.mark.parametrize(("doc", "field"), [
    ({"horizon_s": -5}, "sandbox.horizon_s"),
    ({"samples": 0}, "sandbox.samples"),
    ({"margins": {"gpu_frag_pct": 150}}, "sandbox.margins.gpu_frag_pct"),
    ({"margins": {"online_pending_s": -1}}, "sandbox.margins.online_pending_s"),
    ({"margins": {"nonsense": 1}}, "sandbox.margins.nonsense"),
    ({"horizon": 5}, "sandbox.horizon"),
])
def test_bad_settings_are_refused_naming_the_field(doc: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        validate_config(doc)
    assert e.value.field == field


def test_an_unknown_rollout_profile_is_refused() -> None:
    with pytest.raises(ValidationError):
        Sandbox({"rollout": "no-such-profile"})


class _Reckless:
    """A broken policy: every pod on node 0, whatever its taints or room."""

    name = "reckless"

    def decide(self, state: ClusterState, request: object) -> Decision:
        return Decision(0)


def test_sandboxed_replaces_a_broken_policys_choices_with_the_default() -> None:
    st = _state(node("gpu", gpus=8, taints=("nvidia.com/gpu=present:NoSchedule",)),
                node("a"), node("b"))
    wrapped = SandboxedScheduler(_Reckless(), Sandbox({"max_arrivals": 0}), kinds=("all",))
    for i in range(6):
        req = st.compile(pod(f"p{i}", cpu=2000))
        d = wrapped.decide(st, req)
        assert d.node in (1, 2)  # never the tainted node
        st.allocate(d.node, req, ())
    assert wrapped.validated == {"placement": 6} and wrapped.refused == {"placement": 6}
    assert "TaintToleration" in wrapped.refusals[0]["reasons"][0]


def test_sandboxed_validates_only_risky_kinds_and_runs_in_the_twin() -> None:
    from smartsched.scheduling.run import build_run

    sched = make_scheduler("sandboxed:composite?validate=preemption,gangs,unusual&top=1"
                           "&max_arrivals=8&samples=1&rollout=k8s-default")
    assert isinstance(sched, SandboxedScheduler) and sched.name == "sandboxed:composite"
    run = build_run("small", "mixed", sched, seed=3, hours=2.0)
    run.drive()
    assert len(run.engine.metrics.decision_seconds) > 20
    # composite's choices differ from k8s-default's best node often: "unusual" is validated
    # (by default a profile is its own rollout, and its choices are not unusual)
    assert make_scheduler("sandboxed:composite").sandbox.config.rollout == "composite"
    assert make_scheduler("sandboxed:random?rollout=fgd").sandbox.config.rollout == "fgd"
    assert sched.validated.get("unusual", 0) > 0, sched.validated
    assert sum(sched.refused.values()) <= sum(sched.validated.values())
    assert all(r["reasons"] for r in sched.refusals)


@pytest.mark.parametrize(("spec", "field"), [
    ("sandboxed:fgd?validate=sometimes", "scheduler.validate"),
    ("sandboxed:fgd?horizon_s=-1", "scheduler.horizon_s"),
    ("sandboxed:fgd?samples=two", "scheduler.samples"),
    ("sandboxed:fgd?top=0", "scheduler.top"),
    # an option neither the wrapper nor a profile takes (it went to the base and came
    # back as "unknown scheduler 'fgd?bogus=1'")
    ("sandboxed:fgd?bogus=1", "scheduler.bogus"),
])
def test_bad_wrapper_options_name_the_field(spec: str, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        make_scheduler(spec)
    assert e.value.field == field


def test_a_migration_moves_the_pod_without_counting_it_twice() -> None:
    st = _state(node("a"), node("b"))
    web = pod("w", cpu=2000, app="web", pod_class=PodClass.ONLINE)
    st.allocate(0, st.compile(web), ())
    v = Sandbox({"max_arrivals": 0}).validate(st, Proposal(
        (Placement(st.compile(web), 1),), evictions=(web,), kind="migration"))
    assert v.accepted, v.reasons
    assert v.figures["pending_s"] == (0.0, 0.0) and v.figures["online_pending_s"] == (0.0, 0.0)
    twice = Sandbox().validate(st, Proposal((), evictions=(web, web)))
    assert not twice.accepted and "evicted twice" in twice.reasons[0]
