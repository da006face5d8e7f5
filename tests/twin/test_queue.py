"""The twin's queue: a rejected pod is retried only on events that can change the verdict
of the filter that rejected it (queueing hints), and skipping the others changes nothing."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest

from smartsched.model.pod import UsageProfile
from smartsched.model.presets import load_cluster
from smartsched.scheduling.base import make_scheduler
from smartsched.scheduling.runner import run
from smartsched.twin.decision import Decision
from smartsched.twin.engine import Engine, EngineConfig
from smartsched.twin.state import ClusterState, PodRequest
from smartsched.workloads.resolve import load_workload
from tests.builders import cluster, node, pod


class Counting:
    """A scheduler wrapper counting decisions per pod; ``hints=False`` drops retry hints
    (the queue then retries on every event that frees room, as it did before hints)."""

    def __init__(self, inner: Any, hints: bool = True) -> None:
        self.inner, self.hints, self.name = inner, hints, inner.name
        self.offers: Counter[str] = Counter()
        self.placed_at: dict[str, float] = {}

    def prepare(self, pods: Any) -> None:
        self.inner.prepare(pods)

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        self.offers[request.pod.id] += 1
        d = self.inner.decide(state, request)
        if d.node is not None:
            self.placed_at[request.pod.id] = state.now
        return d if self.hints else dataclasses.replace(d, retry=None)


def _load_aware_day() -> tuple[Engine, Counting, Counting]:
    # One node: "base" keeps it at 70 % CPU use (LoadAware's threshold is 65 %) until it
    # ends at 1000 s; "short" ends at 110 s, freeing room but not load; "late" asks for a
    # core at 20 s and must wait until a usage sample shows the node cool (tick at 1200 s).
    steady = UsageProfile(mean=1.0)
    pods = [pod("base", cpu=7000, arrival=0.0, duration=1000.0, usage=steady),
            pod("short", cpu=1000, arrival=10.0, duration=100.0, usage=steady),
            pod("late", cpu=1000, arrival=20.0, duration=100.0, usage=steady)]
    spec = cluster(node("a", cpu=10000, mem=65536))
    cfg = EngineConfig(seed=0, horizon_s=2000.0, power_management=False)
    return Engine(spec, pods, cfg), Counting(make_scheduler("load-aware")), \
        Counting(make_scheduler("load-aware"), hints=False)


def test_a_pod_rejected_by_load_waits_for_a_usage_sample_not_for_completions() -> None:
    e, hinted, _ = _load_aware_day()
    run(e, hinted)
    assert hinted.placed_at["late"] == 1200.0  # the first sample after "base" ended
    # Offered on arrival, then once more when the node cooled: the completions of
    # "short" (110 s) and "base" (1000 s) freed room on an over-loaded node, so no retry.
    assert hinted.offers["late"] == 2


def test_without_a_hint_the_same_pod_is_retried_at_every_event() -> None:
    e, _, unhinted = _load_aware_day()
    run(e, unhinted)
    assert unhinted.placed_at["late"] == 1200.0
    assert unhinted.offers["late"] > 2  # completions at 110 and 1000 s, flushes every 300 s


def _report_without_timing(rep: dict[str, Any]) -> dict[str, Any]:
    drop = {"decision_latency_us", "decisions_per_second", "rejections_by_reason",
            "rejections_by_plugin"}
    return {k: v for k, v in rep.items() if k not in drop}


@pytest.mark.parametrize("profile", ["load-aware", "k8s-default", "online-batch"])
@pytest.mark.parametrize("seed", [0, 7])
def test_hints_skip_only_retries_that_would_fail(profile: str, seed: int) -> None:
    """The same day with and without hints: identical outcomes, fewer decisions."""
    spec = load_cluster("small")
    pods = load_workload("mixed", spec, 8.0, seed)
    reports, offers = [], []
    for hints in (True, False):
        e = Engine(spec, pods, EngineConfig(seed=seed, horizon_s=8 * 3600.0))
        sched = Counting(make_scheduler(profile, seed), hints=hints)
        reports.append(_report_without_timing(run(e, sched)))
        offers.append(sum(sched.offers.values()))
    assert reports[0] == reports[1]
    assert offers[0] <= offers[1]


def test_a_rejection_names_its_plugins_and_gives_a_hint() -> None:
    st = ClusterState(cluster(node("a", cpu=2000),
                              node("b", cpu=2000, taints=("x=y:NoSchedule",))))
    d = make_scheduler("k8s-default").decide(st, st.compile(pod("big", cpu=4000)))
    assert d.node is None
    # Each node is blamed on its first failing check: both lack cpu.
    assert d.reasons == ("2 nodes: Insufficient cpu",)
    assert d.rejected_by() == ("NodeResourcesFit",)
    assert d.retry is not None
    # The tainted node is closed for good (no event the twin models opens it), the other
    # one is open: room freed there could help.
    assert d.retry.open_nodes.tolist() == [True, False]
