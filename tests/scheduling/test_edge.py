"""LatencySLO keeps latency-bound pods within their SLO, own MEC site first; reports split
violations into "placed too far" and "no room within the SLO"."""

from __future__ import annotations

import numpy as np

from smartsched.model.cluster import ClusterSpec, NodeSpec, Site, Zone
from smartsched.model.pod import Pod, PodClass
from smartsched.scheduling.framework import CycleContext, ProfileScheduler
from smartsched.scheduling.plugins.edge import LatencySLO
from smartsched.scheduling.registry import profile_from_dict
from smartsched.twin.engine import Engine, EngineConfig
from smartsched.twin.state import ClusterState


def _cluster() -> ClusterSpec:
    # mec-0 at 400 km east of region-near (6 ms away), region-far 1,800 km west (>10 ms).
    sites = (Site("region-near", "cloud", (600.0, 0.0), 5.0),
             Site("region-far", "cloud", (-1500.0, 0.0), 5.0),
             Site("mec-0", "edge", (400.0, 0.0), 1.0))
    zones = tuple(Zone(f"{s.name}-1", s.name) for s in sites)
    nodes = (NodeSpec("near", 32000, 65536, zone="region-near-1"),
             NodeSpec("far", 32000, 65536, zone="region-far-1"),
             NodeSpec("mec", 4000, 16384, zone="mec-0-1"))
    return ClusterSpec("edge-test", sites, zones, nodes)


def _edge_pod(i: int, cpu: int = 2000, **kw: object) -> Pod:
    return Pod(id=f"e{i}", cpu_milli=cpu, memory_mib=1024, pod_class=PodClass.EDGE_RT,
               origin_site="mec-0", latency_slo_ms=10.0, **kw)


def test_filter_and_score_follow_latency() -> None:
    st = ClusterState(_cluster())
    lat = st.site_latency_ms[st.site_ids["mec-0"]][st.site_id]
    assert lat[2] < lat[0] <= 10.0 < lat[1]  # the set-up: mec, near region, far region
    plug = LatencySLO()
    ctx = CycleContext(st, st.compile(_edge_pod(0)))
    assert plug.filter(ctx).passing.tolist() == [True, False, True]
    score = plug.score(ctx, np.array([True, False, True]))
    assert score[2] == 100.0 and 0.0 <= score[0] < 100.0  # own MEC site first
    plain = CycleContext(st, st.compile(Pod(id="x", cpu_milli=1000, memory_mib=1024)))
    assert plug.filter(plain).passing.all() and plug.score(plain, np.ones(3, bool)) == 0.0


def _profile(with_slo: bool) -> ProfileScheduler:
    filters = ["NodeUnschedulable", "NodeResourcesFit"] + (["LatencySLO"] if with_slo else [])
    score = [{"name": "NodeResourcesFit", "args": {"strategy": "LeastAllocated"}}]
    if with_slo:
        score.append({"name": "LatencySLO", "weight": 10})
    return ProfileScheduler(profile_from_dict({"name": "p", "filters": filters, "score": score,
                                               "tie_break": "first"}))


def _run(sched: ProfileScheduler, pods: list[Pod], horizon_s: float | None = None) -> dict:
    e = Engine(_cluster(), pods, EngineConfig(power_management=False, horizon_s=horizon_s))
    while (req := e.next_decision()) is not None:
        e.apply(sched.decide(e.state, req.request))
    return e.run_report()["slo"]


def test_violations_are_split_by_cause() -> None:
    pods = [_edge_pod(i, arrival=float(i), duration=1000.0) for i in range(3)]
    # Spreading without the filter sends them to the emptiest node, the far region: room
    # existed within the SLO each time -- placed too far.
    slo = _run(_profile(False), pods)
    assert slo["latency_violations"] == slo["latency_violations_placed_too_far"] >= 1
    assert slo["latency_violations_no_room"] == 0
    # With the filter nobody is placed beyond the SLO.
    assert _run(_profile(True), pods)["latency_violations"] == 0
    # A pod too big for every node within the SLO (mec 4 cores, near 32 but taken)
    # lands far only when nothing near has room: "no room".
    big = [Pod(id="filler", cpu_milli=32000, memory_mib=1024, arrival=0.0, duration=1000.0),
           _edge_pod(9, cpu=8000, arrival=1.0, duration=10.0)]
    far_first = ProfileScheduler(profile_from_dict({
        "name": "ff", "filters": ["NodeResourcesFit"], "tie_break": "first"}))
    slo = _run(far_first, big)
    assert slo["latency_violations"] == slo["latency_violations_no_room"] == 1


def test_the_share_within_slo_counts_every_latency_bound_arrival() -> None:
    """``latency_within_slo_pct``: of the latency-bound pods that arrived, those started
    within their SLO; a pod that never starts counts as missed, a pod without an SLO not
    at all."""
    pods = [_edge_pod(i, arrival=float(i), duration=1000.0) for i in range(3)]
    pods.append(Pod(id="plain", cpu_milli=1000, memory_mib=1024, arrival=0.5, duration=5.0))
    slo = _run(_profile(True), pods)
    assert slo["latency_pods_arrived"] == 3 and slo["latency_within_slo_pct"] == 100.0
    spread = _run(_profile(False), pods)
    assert spread["latency_within_slo_pct"] == 100.0 * (3 - spread["latency_violations"]) / 3
    # No node within its SLO has room before the run ends (the far region has, beyond
    # it): it is still waiting, and that is a miss, not an absence.
    never = _edge_pod(7, cpu=31000, arrival=2.5, duration=10.0)
    slo = _run(_profile(True), [*pods, never], horizon_s=500.0)
    assert slo["latency_pods_arrived"] == 4 and slo["latency_within_slo_pct"] == 75.0


def test_the_iiot_profile_is_mixed_with_8_ms_control_loops(tmp_path) -> None:
    import pytest

    from smartsched.model.errors import ValidationError
    from smartsched.model.presets import load_cluster
    from smartsched.workloads.mixed import load_profile
    from smartsched.workloads.resolve import load_workload

    iiot, mixed = load_profile("iiot"), load_profile()
    assert iiot["edge-rt"]["latency_slo_ms"] == 8.0 and "extends" not in iiot
    assert iiot["online"] == mixed["online"] and iiot["images"] == mixed["images"]
    assert iiot["tenants"]["online"] == mixed["tenants"]["online"]
    assert iiot["tenants"]["edge-rt"] != mixed["tenants"]["edge-rt"]
    pods = load_workload("mixed:iiot", load_cluster("large"), hours=1.0, seed=0)
    edge = [p for p in pods if p.pod_class == PodClass.EDGE_RT]
    assert edge and all(p.latency_slo_ms == 8.0 for p in edge)
    assert {p.origin_site for p in edge} == {"mec-0", "mec-1", "mec-2", "mec-3"}
    # A user's own file may extend a packaged profile; only packaged names are bases.
    own = tmp_path / "mine.yaml"
    own.write_text("extends: iiot\nedge-rt: {latency_slo_ms: 5.0}\n")
    doc = load_profile(own)
    assert doc["edge-rt"]["latency_slo_ms"] == 5.0 and doc["edge-rt"]["load"] == 0.8
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"extends: {own}\n")
    with pytest.raises(ValidationError) as e:
        load_profile(bad)
    assert e.value.field == "workload.extends"
