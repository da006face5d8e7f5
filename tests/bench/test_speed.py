"""The speed suite's machinery (figures only; no timing assertions)."""

from __future__ import annotations

from smartsched.bench.speed import fork_cost, run_case


def test_fork_cost_reports_figures() -> None:
    r = fork_cost("small", repeats=5)
    assert r["nodes"] == 16 and r["fork_us"] > 0


def test_run_case_measures_a_child_process() -> None:
    r = run_case(["--cluster", "small", "--workload", "mixed", "--hours", "2", "--no-plots"])
    assert r["decisions"] > 0 and r["wall_seconds"] > 0 and r["peak_rss_mib"] > 20


def test_a_case_past_its_limit_is_stopped_and_named() -> None:
    import pytest

    from smartsched.bench.speed import CaseTimeout

    with pytest.raises(CaseTimeout, match="stopped after"):
        run_case(["--cluster", "medium", "--workload", "mixed", "--hours", "24", "--no-plots"],
                 timeout_s=0.2)
