"""``smartsched bench carbon`` on a real grid series (the shared California file)."""

from __future__ import annotations

from pathlib import Path

from smartsched.bench.carbon import run_carbon


def test_carbon_bench_on_a_real_series(tmp_path: Path, data_dir: Path) -> None:
    lines: list[str] = []
    res = run_carbon(["ca-2022"], [24], jobs=60, seed=1, plot=tmp_path / "week.png",
                     data_dir=data_dir, echo=lines.append)
    rows = res["rows"]
    assert [(r["slack_h"], r["interruptible"]) for r in rows] == [(24, True), (24, False)]
    for r in rows:
        assert r["jobs"] == 60 and r["deadline_misses"] == 0
        assert r["oracle_kg"] <= r["forecast_kg"] and r["oracle_kg"] <= r["agnostic_kg"]
        assert 0 < r["oracle_saving_pct"] < 100
        assert r["forecast_wait_h"] >= 0 and r["oracle_wait_h"] >= 0
    errs = res["forecast_errors"]["ca-2022"]
    assert set(errs) >= {"lag regression", "seasonal naive", "last value"}
    assert "captured" in lines[0] and "lag regression" in lines[0]
    assert (tmp_path / "week.png").stat().st_size > 10_000
