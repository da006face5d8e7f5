"""``smartsched bench finance``: the finance case on the same failures for each variant."""

from __future__ import annotations

import pytest

from smartsched.bench.finance import VARIANTS, run_finance, window_bounds
from smartsched.model.presets import load_cluster
from smartsched.workloads.finance import generate_finance


def test_finance_bench_one_night() -> None:
    lines: list[str] = []
    variants = (VARIANTS[0], VARIANTS[-1])  # k8s-default, finance
    res = run_finance(variants, seeds=(7,), nights=1, mtbf_hours=150.0, workers=1,
                      echo=lines.append)
    k8s, fin = res["rows"]["k8s-default"], res["rows"]["finance"]
    assert "k8s-default" in lines[0] and "finance |" in lines[0]
    for row in (k8s, fin):
        assert row["nights"] == 1 and row["deadline_missed"] == 0
        # The bound is a lower bound: no scheduler's window is below it.
        assert row["window_h_mean"] >= row["bound_h_mean"] - 1e-9
    assert k8s["node_failures"] == fin["node_failures"] > 0  # the same failures
    # The least-slack queue shortens the window; the 10 s toleration the failover.
    assert fin["window_h_mean"] < k8s["window_h_mean"]
    if fin["online_to_running_max_s"] is not None:
        assert fin["online_to_running_max_s"] <= 60.0
    if k8s["online_to_running_max_s"] is not None:
        assert k8s["online_to_running_max_s"] >= 340.0


def test_window_bound_is_release_plus_work_or_longest_job() -> None:
    spec = load_cluster("finance")
    pods = generate_finance(spec, hours=24, seed=0)
    (app, bound), = window_bounds(pods, spec).items()
    run = [p for p in pods if p.app == app]
    first = min(p.arrival for p in run)
    longest = max(p.arrival + p.duration for p in run) - first
    pool_cpu = sum(n.cpu_milli for n in spec.nodes if n.labels.get("pool") == "batch")
    work = sum(p.cpu_milli * p.duration for p in run) / pool_cpu
    assert bound * 3600 >= max(longest, work) - 1e-6
    assert bound == pytest.approx(max(
        longest,
        *(t - first + sum(p.cpu_milli * p.duration for p in run if p.arrival >= t) / pool_cpu
          for t in {p.arrival for p in run}),
    ) / 3600)
