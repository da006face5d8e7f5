"""Node failures as Kubernetes handles them: NotReady after the node-monitor grace,
eviction after the pods' toleration, restart in place when repaired first; the
availability and re-placement figures; the least-slack queue order."""

from __future__ import annotations

import numpy as np
import pytest

from smartsched.model.errors import ValidationError
from smartsched.model.pod import PodClass
from smartsched.scheduling.base import make_scheduler
from smartsched.scheduling.runner import run
from smartsched.twin.engine import Engine, EngineConfig
from smartsched.twin.podtable import BOUND, DONE, RUNNING
from tests.builders import cluster, node, pod

HORIZON = 4000.0


def _engine(pods, *nodes, **cfg):
    spec = cluster(*(nodes or (node("a"), node("b"))))
    cfg = {"power_management": False, "horizon_s": HORIZON, **cfg}
    return Engine(spec, pods, EngineConfig(**cfg))


def _online(pid: str, **kw):
    return pod(pid, cpu=6000, pod_class=PodClass.ONLINE, priority=1000, **kw)


def _drive(e: Engine, until: float | None = None, scheduler: str = "first-fit") -> None:
    """Run with ``scheduler``; stop once simulated time passes ``until`` (None: the end)."""
    sched = make_scheduler(scheduler, 0)
    while (req := e.next_decision()) is not None:
        e.apply(sched.decide(e.state, req.request))
        if until is not None and e.now >= until:
            return


def test_kubernetes_timing_notready_after_grace_evicted_after_toleration() -> None:
    # One online pod on a, b empty: a fails at 100 s.
    e = _engine([_online("web")])
    e.inject_failure(0, 100.0)
    m = run(e, make_scheduler("first-fit", 0))
    t = e.table
    assert t.node[0] == 1 and t.status[0] == RUNNING
    # Bound again at 100 + 40 (grace) + 300 (toleration): 340 s after the failure.
    f = m["failures"]
    assert f["node_failures"] == 1 and f["pods_stopped"] == 1
    assert f["to_bound_s"]["p50"] == pytest.approx(340.0)
    assert f["to_running_s"]["p50"] == pytest.approx(340.0)
    assert f["classes"]["online"]["max_to_running_s"] == pytest.approx(340.0)
    online = m["availability"]["online"]
    assert online["downtime_s"] == pytest.approx(340.0)
    assert online["lifetime_s"] == pytest.approx(HORIZON)
    assert m["slo"]["online_availability_pct"] == pytest.approx(100 * (1 - 340 / HORIZON))


def test_state_during_grace_and_toleration() -> None:
    # Small probes arrive at 120 s (inside the grace) and 200 s (after NotReady) so the
    # engine stops there and the state can be read.
    probes = [pod("p120", cpu=100, arrival=120.0, duration=1.0),
              pod("p200", cpu=100, arrival=200.0, duration=1.0)]
    e = _engine([_online("web"), *probes])
    e.inject_failure(0, 100.0)
    sched = make_scheduler("first-fit", 0)
    seen = {}
    while (req := e.next_decision()) is not None:
        seen.setdefault(req.pod.id, (bool(e.state.up[0]), int(e.table.status[0]),
                                     int(e.table.node[0])))
        e.apply(sched.decide(e.state, req.request))
    # 120 s: a has failed but the control plane does not know: still up; web is stalled
    # (bound, not running). 200 s: NotReady, web still bound there until 440 s.
    assert seen["p120"] == (True, BOUND, 0)
    assert seen["p200"] == (False, BOUND, 0)
    assert e.table.scheduled_at[0] == 0.0 and e.table.node[0] == 1


def test_no_pod_runs_on_a_dead_node() -> None:
    pods = [pod("filler", cpu=8000, duration=None, arrival=0.0),
            pod("late", cpu=2000, arrival=110.0, duration=100.0)]
    # filler on a (first fit); b fails at 100; late arrives at 110: a is full, b looks up.
    e = _engine(pods)
    e.inject_failure(1, 100.0)
    sched = make_scheduler("first-fit", 0)
    while (req := e.next_decision()) is not None:
        e.apply(sched.decide(e.state, req.request))
        running_on_dead = (e.table.status == RUNNING) & e._dead[np.maximum(e.table.node, 0)]
        assert not running_on_dead.any(), e.now
    t = e.table
    # late was bound to b at 110 (b not NotReady until 140), stuck, evicted at 440, and
    # placed again when b came back (repair 3600 s after 100): it ran and finished.
    assert t.scheduled_at[1] == pytest.approx(110.0)
    assert t.started_at[1] >= 3700.0 - 1e-6 and t.status[1] == DONE


def test_scheduler_toleration_shortens_eviction() -> None:
    e = _engine([_online("web")], node("a", cpu=32000), node("b", cpu=32000))
    sched = make_scheduler("finance", 0)
    e.failure_toleration_s = sched.failure_toleration_s
    req = e.next_decision()
    e.apply(sched.decide(e.state, req.request))
    e.inject_failure(int(e.table.node[0]), 100.0)  # wherever the profile put it
    m = run(e, sched)
    assert m["failures"]["to_bound_s"]["p50"] == pytest.approx(50.0)  # 40 s grace + 10 s


def test_zero_grace_and_toleration_requeue_at_once() -> None:
    e = _engine([_online("web")], node_monitor_grace_s=0.0, eviction_toleration_s=0.0)
    e.inject_failure(0, 100.0)
    m = run(e, make_scheduler("first-fit", 0))
    assert m["failures"]["to_bound_s"]["p50"] == pytest.approx(0.0)
    assert e.table.node[0] == 1


def test_repaired_before_eviction_restarts_in_place() -> None:
    e = _engine([_online("web")], repair_s=200.0)
    e.inject_failure(0, 100.0)
    m = run(e, make_scheduler("first-fit", 0))
    assert e.table.node[0] == 0 and e.table.status[0] == RUNNING
    f = m["failures"]
    assert f["restarted_in_place"] == 1 and f["to_bound_s"]["p50"] is None
    assert f["to_running_s"]["p50"] == pytest.approx(200.0)
    assert m["availability"]["online"]["downtime_s"] == pytest.approx(200.0)
    assert m["pods"]["evictions"] == 0


def test_failed_batch_job_loses_its_run_and_finishes_later() -> None:
    # A 1,000 s job without checkpoints on a; a fails at 600 s: the 600 s are lost, the
    # job runs again in full once re-placed on b at 940 s.
    e = _engine([pod("job", cpu=6000, duration=1000.0)])
    e.inject_failure(0, 600.0)
    m = run(e, make_scheduler("first-fit", 0))
    t = e.table
    assert t.status[0] == DONE and t.node[0] == 1
    assert t.finished_at[0] == pytest.approx(940.0 + 1000.0)
    assert m["pods"]["lost_pod_hours"] == pytest.approx(600.0 / 3600)


def test_a_still_failed_pod_counts_until_the_end() -> None:
    # Only one node: web cannot go anywhere until the repair at 100 + 3600 > horizon.
    e = _engine([_online("web")], node("a"), repair_s=10_000.0)
    e.inject_failure(0, 100.0)
    m = run(e, make_scheduler("first-fit", 0))
    f = m["failures"]
    assert f["not_running_at_end"] == 1
    assert f["to_running_all_s"]["p50"] == pytest.approx(HORIZON - 100.0)
    assert m["availability"]["online"]["downtime_s"] == pytest.approx(HORIZON - 100.0)


def test_inject_failure_validates() -> None:
    e = _engine([_online("web")])
    with pytest.raises(ValidationError) as err:
        e.inject_failure(5, 10.0)
    assert err.value.field == "node"
    with pytest.raises(ValidationError) as err:
        e.inject_failure(0, -1.0)
    assert err.value.field == "at_s"
    fill = Engine(cluster(node("a")), [_online("web")], EngineConfig(mode="fill"))
    with pytest.raises(ValidationError) as err:  # it was dropped without a word
        fill.inject_failure(0, 0.0)
    assert err.value.field == "mode"
    with pytest.raises(ValidationError) as err:
        EngineConfig(eviction_toleration_s=-1.0)
    assert err.value.field == "eviction_toleration_s"
    with pytest.raises(ValidationError) as err:
        EngineConfig(node_monitor_grace_s=float("inf"))
    assert err.value.field == "node_monitor_grace_s"


def test_same_failures_whatever_the_scheduler() -> None:
    from smartsched.scheduling.run import build_run

    logs = []
    for sched in ("k8s-default", "finance"):
        r = build_run("finance", "finance", sched, seed=3, hours=24.0, warmup_hours=2.0,
                      engine_overrides={"node_mtbf_hours": 100.0, "power_management": False})
        r.drive()
        logs.append(r.engine.metrics.failure_log)
    assert logs[0] and logs[0] == logs[1]


# ------------------------------------------------------------------ queue order
def _jobs(order: str):
    pods = [pod(f"j{d}", cpu=8000, duration=float(d), arrival=0.0, deadline=10_000.0)
            for d in (10, 100, 50)]
    pods.append(pod("nodeadline", cpu=8000, duration=5.0, arrival=0.0))
    pods.append(pod("urgent", cpu=8000, duration=1.0, arrival=1.0, priority=10))
    e = _engine(pods, node("a"))
    e.queue.set_order(order)
    run(e, make_scheduler("first-fit", 0))
    return {p.id: float(e.table.started_at[i]) for i, p in enumerate(e.table.pods)}


def test_least_slack_runs_the_longest_of_a_shared_deadline_first() -> None:
    s = _jobs("least-slack")
    # Latest start time first: j100 (9,900) at 0; urgent (higher priority, arrived at 1 s)
    # when it ends; then j50 (9,950), j10 (9,990); pods without a deadline last.
    assert s["j100"] == 0.0
    assert s["urgent"] == pytest.approx(100.0)
    assert s["j50"] == pytest.approx(101.0) and s["j10"] == pytest.approx(151.0)
    assert s["nodeadline"] == pytest.approx(161.0)
    # Kubernetes order: by arrival, then list order (j10, j100, j50, nodeadline).
    k = _jobs("priority")
    assert k["j10"] == 0.0 and k["urgent"] == pytest.approx(10.0)
    assert k["j100"] == pytest.approx(11.0) and k["j50"] == pytest.approx(111.0)
    assert k["nodeadline"] == pytest.approx(161.0)


def test_unknown_queue_order_is_refused() -> None:
    e = _engine([_online("web")])
    with pytest.raises(ValueError, match="least-slack"):
        e.queue.set_order("shortest")
