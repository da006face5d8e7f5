"""``smartsched bench carbon`` on a real grid series (the shared California file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from smartsched.bench.carbon import run_carbon
from smartsched.model.errors import ValidationError


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


@pytest.mark.slow
def test_twin_carbon_bench_one_start_day() -> None:
    from smartsched.bench.carbon import run_twin_carbon

    lines: list[str] = []
    res = run_twin_carbon(days=(150,), slacks=(24,), hours=30.0,
                          variants=("time+space", "green"), workers=1, echo=lines.append)
    rows = {r["variant"]: r for r in res["rows"]}
    assert rows["agnostic"]["batch_kg"] > 0
    assert rows["agnostic"]["deadline_missed"] == rows["time+space"]["deadline_missed"] == 0
    # Three grids of very different intensity: moving batch in time and space pays.
    assert rows["time+space"]["batch_kg"] < rows["agnostic"]["batch_kg"]
    assert rows["time+space"]["batch_wait_h_per_pod"] > rows["agnostic"]["batch_wait_h_per_pod"]
    # GreenScore alone (no waiting) picks cleaner sites for batch too.
    assert rows["green"]["batch_kg"] < rows["agnostic"]["batch_kg"]
    assert all(0 < r["green_score"] <= 1 for r in rows.values())
    assert "batch kg" in lines[0] and "GreenScore" in lines[0]
    with pytest.raises(ValidationError, match="variants"):
        run_twin_carbon(days=(150,), slacks=(24,), variants=("bogus",))


def test_twin_start_days_past_the_grid_series_are_refused(data_dir: Path) -> None:
    """A start day past the year read the series from its beginning again (the 365- and
    366-day grids wrapping at different days), silently."""
    from smartsched.bench.carbon import run_twin_carbon

    with pytest.raises(ValidationError, match="last start day") as e:
        run_twin_carbon([45, 400], [24], hours=24.0, variants=["agnostic"], workers=1)
    assert e.value.field == "days"


def test_a_series_file_shorter_than_the_warm_up_is_named(tmp_path: Path) -> None:
    """A grid file of one's own shorter than five weeks plus the slack was a ValueError
    traceback ("series too short") from the job draw."""
    f = tmp_path / "grid.csv"
    f.write_text("Time,ci\n" + "".join(f"2020-01-{1 + h // 24:02d} {h % 24:02d}:00,{100 + h}\n"
                                        for h in range(200)))
    with pytest.raises(ValidationError, match="holds 200 h") as e:
        run_carbon([str(f)], [24], jobs=10, echo=lambda _: None)
    assert e.value.field == "series"
