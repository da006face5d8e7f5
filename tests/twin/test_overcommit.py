"""Class-aware overcommit: best-effort pods use unused requests, never hurting online pods."""

from __future__ import annotations

import pytest

from smartsched.model.errors import InfeasibleDecisionError
from smartsched.model.pod import PodClass, UsageKind, UsageProfile
from smartsched.scheduling.base import make_scheduler
from smartsched.twin.engine import Decision, Engine, EngineConfig
from tests.builders import cluster, node, pod

HOUR = 3600.0


def _engine(online_usage: UsageProfile) -> Engine:
    spec = cluster(node("a", cpu=10000, mem=10000))
    pods = [
        pod("online", cpu=8000, mem=4000, pod_class=PodClass.ONLINE, duration=20 * HOUR,
            usage=online_usage),
        pod("be", cpu=4000, mem=2000, pod_class=PodClass.BATCH, best_effort=True,
            arrival=600.0, duration=20 * HOUR, usage=UsageProfile(mean=1.0)),
    ]
    return Engine(spec, pods, EngineConfig(power_management=False, horizon_s=14 * HOUR,
                                           tick_s=300, best_effort_threshold=0.9))


def test_best_effort_uses_slack_and_never_pushes_online_over_capacity() -> None:
    # Online pod uses 20 % of its 8 cores at first and 100 % at its peak (hour 12).
    online_usage = UsageProfile(UsageKind.DIURNAL, mean=0.6, amplitude=0.4, peak_hour=12.0)
    e = _engine(online_usage)
    sched = make_scheduler("k8s-default")
    while (req := e.next_decision()) is not None:
        e.apply(sched.decide(e.state, req.request))
    st, tb = e.state, e.table
    # The best-effort pod was placed although requests now exceed capacity (8 + 4 > 10 cores).
    assert tb.node[1] == 0
    assert st.allocated[0, 0] == 8000 and st.be_allocated[0, 0] == 4000
    m = e.run_report()
    # At the online peak the node's real use stays within capacity: BE is throttled instead.
    assert m["slo"]["online_contended_time_pct"] == 0.0
    assert m["best_effort"]["cpu_throttled_pct"] > 0
    for row in e.timeseries:
        assert row["usage_cpu_pct"] <= 100.0 + 1e-9


def test_best_effort_cannot_exceed_slack() -> None:
    e = _engine(UsageProfile(mean=1.0))
    sched = make_scheduler("k8s-default")
    req = e.next_decision()
    e.apply(sched.decide(e.state, req.request))  # online at t=0
    req = e.next_decision()  # the BE pod at t=600, after ticks sampled online using 8 cores
    assert req.pod.id == "be"
    # Slack: 0.9 * 10 cores - 8 cores used = 1 core < 4 cores asked.
    assert e.state.be_allocatable[0, 0] == pytest.approx(1000)
    d = sched.decide(e.state, req.request)
    assert d.node is None and any("best-effort cpu" in r for r in d.reasons)
    with pytest.raises(InfeasibleDecisionError):
        e.apply(Decision(0))
