"""The demo without the CLI: default schedulers, one tiny run, the comparison files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smartsched.bench.demo import SHIPPED_POLICY, default_schedulers, run_demo


def test_default_schedulers_add_the_shipped_policy_when_present(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert default_schedulers() == ["k8s-default", "fgd"]
    (tmp_path / SHIPPED_POLICY).mkdir(parents=True)
    assert default_schedulers() == ["k8s-default", "fgd", f"rl:{SHIPPED_POLICY}"]
    assert default_schedulers(tmp_path / "elsewhere")[-1] == "fgd"


def test_a_tiny_demo_writes_the_reports_and_the_comparison(tmp_path: Path) -> None:
    lines: list[str] = []
    res = run_demo(tmp_path / "demo", cluster="small", hours=1.0, seed=3, warmup_hours=0.0,
                   schedulers=["k8s-default"], echo=lines.append)
    assert lines == ["simulating k8s-default on small for 1 h of the mixed workload ..."]
    (rep,) = res.reports
    assert rep["scheduler"] == "k8s-default" and rep["seed"] == 3 and rep["decisions"] > 0
    assert "GPU allocation rate" in res.table and "k8s-default" in res.table
    out = tmp_path / "demo"
    assert (out / "comparison.txt").read_text() == res.table + "\n"
    assert json.loads((out / "comparison.json").read_text()) == json.loads(
        json.dumps(res.reports))
    assert (out / "k8s-default" / "report.json").is_file()
