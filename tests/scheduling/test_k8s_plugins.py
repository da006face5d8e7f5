"""kube-scheduler plugins against hand-computed upstream scores."""

from __future__ import annotations

import math

import numpy as np

from smartsched.scheduling.framework import CycleContext
from smartsched.scheduling.plugins.k8s import (
    AppZoneAffinity,
    NodeResourcesBalancedAllocation,
    NodeResourcesFit,
    NodeResourcesFitArgs,
    PodTopologySpread,
    TaintToleration,
)
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node, pod

ALL = np.ones(3, dtype=bool)


def _two_nodes() -> ClusterState:
    st = ClusterState(cluster(node("a", cpu=4000, mem=8192), node("b", cpu=8000, mem=8192),
                              node("c", cpu=8000, mem=8192)))
    r = st.compile(pod("existing", cpu=1000, mem=2048))
    st.allocate(0, r, ())
    return st


def test_least_allocated_matches_upstream() -> None:
    st = _two_nodes()
    ctx = CycleContext(st, st.compile(pod("p", cpu=1000, mem=2048)))
    s = NodeResourcesFit().score(ctx, ALL)
    # a: cpu (4000-2000)*100//4000 = 50, mem (8192-4096)*100//8192 = 50 -> 50
    # b: cpu (8000-1000)*100//8000 = 87, mem (8192-2048)*100//8192 = 75 -> (87+75)//2 = 81
    assert s.tolist() == [50, 81, 81]


def test_most_allocated_and_zero_request_defaults() -> None:
    st = _two_nodes()
    ctx = CycleContext(st, st.compile(pod("p", cpu=0, mem=2048)))
    s = NodeResourcesFit(NodeResourcesFitArgs(strategy="MostAllocated")).score(ctx, ALL)
    # cpu request 0 counts as 100m: a: (1000+100)*100//4000 = 27, mem 4096*100//8192 = 50 -> 38
    # b: 100*100//8000 = 1, mem 2048*100//8192 = 25 -> 13
    assert s.tolist() == [38, 13, 13]


def test_balanced_allocation_matches_upstream() -> None:
    st = _two_nodes()
    ctx = CycleContext(st, st.compile(pod("p", cpu=1000, mem=2048)))
    s = NodeResourcesBalancedAllocation().score(ctx, ALL)
    # a: 0.5 and 0.5 -> 100; b: 0.125 and 0.25 -> std 0.0625 -> int(93.75) = 93
    assert s.tolist() == [100, 93, 93]


def test_pod_topology_spread_default_constraints() -> None:
    st = ClusterState(cluster(node("a", zone="z1"), node("b", zone="z2"), node("c", zone="z1")))
    for n, count in ((0, 2), (2, 1)):
        for i in range(count):
            r = st.compile(pod(f"w{n}{i}", app="web"))
            st.allocate(n, r, ())
    ctx = CycleContext(st, st.compile(pod("new", app="web")))
    s = PodTopologySpread().score(ctx, ALL)
    zw, hw = math.log(2 + 2), math.log(3 + 2)
    raw = [round(3 * zw + 4 + 2 * hw + 2), 4 + 2, round(3 * zw + 4 + hw + 2)]
    assert raw == [13, 6, 12]
    assert s.tolist() == [100 * (13 + 6 - 13) // 13, 100, 100 * (13 + 6 - 12) // 13]
    # A pod without an app has no default constraints: 0 everywhere.
    assert PodTopologySpread().score(CycleContext(st, st.compile(pod("x"))), ALL) == 0.0


def test_app_zone_affinity_prefers_the_zone_running_most_of_the_app() -> None:
    st = ClusterState(cluster(node("a", zone="z1"), node("b", zone="z2"), node("c", zone="z1"),
                              node("d", zone="z3"), zones=("z1", "z2", "z3")))
    for n, count in ((0, 2), (2, 1), (1, 1)):  # web: 3 pods in z1, 1 in z2, none in z3
        for i in range(count):
            st.allocate(n, st.compile(pod(f"w{n}{i}", app="web")), ())
    every = np.ones(4, dtype=bool)
    ctx = CycleContext(st, st.compile(pod("new", app="web")))
    # raw = the app's pods in the node's zone: 3, 1, 3, 0 -> min-max over feasible nodes
    assert AppZoneAffinity().score(ctx, every).tolist() == [100, 33, 100, 0]
    # Scaled over the feasible nodes only (d infeasible: z2 is now the least).
    some = np.array([True, True, True, False])
    assert AppZoneAffinity().score(ctx, some).tolist()[:3] == [100, 0, 100]
    # No app, or an app running nowhere yet: no preference.
    assert AppZoneAffinity().score(CycleContext(st, st.compile(pod("x"))), every) == 0.0
    assert AppZoneAffinity().score(CycleContext(st, st.compile(pod("y", app="db"))),
                                   every) == 0.0


def test_taint_toleration_prefer_no_schedule() -> None:
    st = ClusterState(cluster(
        node("a", taints=("k1=v:PreferNoSchedule",)),
        node("b"),
        node("c", taints=("k1=v:PreferNoSchedule", "k2:PreferNoSchedule")),
    ))
    ctx = CycleContext(st, st.compile(pod("p")))
    t = TaintToleration()
    assert t.filter(ctx).passing.all()  # PreferNoSchedule never filters
    assert t.score(ctx, ALL).tolist() == [50, 100, 0]
    tolerant = CycleContext(st, st.compile(pod("q", tolerations=("k1", "k2"))))
    assert t.score(tolerant, ALL).tolist() == [100, 100, 100]


def test_balanced_allocation_v120_formula() -> None:
    from smartsched.scheduling.plugins.k8s import BalancedArgs

    st = _two_nodes()
    ctx = CycleContext(st, st.compile(pod("p", cpu=1000, mem=2048)))
    s = NodeResourcesBalancedAllocation(BalancedArgs(formula="v1.20")).score(ctx, ALL)
    # b: |0.125 - 0.25| = 0.125 -> int(87.5) = 87; a: equal fractions -> 100
    assert s.tolist() == [100, 87, 87]
    full = CycleContext(st, st.compile(pod("q", cpu=3000, mem=1024)))
    assert NodeResourcesBalancedAllocation(BalancedArgs(formula="v1.20")).score(
        full, ALL)[0] == 0  # cpu fraction reaches 1 on node a
