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


def _run(sched: ProfileScheduler, pods: list[Pod]) -> dict:
    e = Engine(_cluster(), pods, EngineConfig(power_management=False))
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
