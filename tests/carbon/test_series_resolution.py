"""A grid series is the same series whatever the file's resolution (probe round 6).

Before, each 15-minute bin averaged the readings that fell in it by count and the last
reading held for one bin: an hourly year spanned 8,759.25 h, an hourly day 23.25 h (so it
drifted 45 minutes a day when it repeated, and the outlook wrapped at 23 h), the same
hourly values at 15-minute steps gave other benchmark figures, and a reading of a
10-minute series weighed 1/8 or 1/4 of its hour by where it fell.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from smartsched.carbon.forecast import hourly
from smartsched.model.carbon import load_carbon_csv


def _series(tmp_path: Path, name: str, step_min: int, values: np.ndarray) -> Path:
    t = pd.date_range("2020-03-01", periods=values.size, freq=f"{step_min}min", tz="UTC")
    p = tmp_path / f"{name}.csv"
    pd.DataFrame({"Time": t.strftime("%Y-%m-%d %H:%M:%S"), "ci": values}).to_csv(p, index=False)
    return p


@pytest.mark.parametrize("step_min", [60, 30, 20, 15, 5])
def test_the_same_hourly_values_at_any_resolution_give_the_same_series(
        tmp_path: Path, step_min: int) -> None:
    day = 200.0 + 100.0 * np.sin(np.arange(48) / 24 * 2 * np.pi)  # two days, hourly
    per_hour = 60 // step_min
    s = load_carbon_csv(_series(tmp_path, "x", step_min, np.repeat(day, per_hour)),
                        "Time", "ci")
    assert s.span_s == 48 * 3600.0
    assert hourly(s) == pytest.approx(day)


def test_a_one_day_series_repeats_every_24_hours(tmp_path: Path) -> None:
    s = load_carbon_csv(_series(tmp_path, "day", 60, np.arange(24.0) * 10 + 100), "Time", "ci")
    assert s.span_s == 24 * 3600.0
    for d in range(5):
        assert s.at(d * 86400.0) == 100.0 and s.at(d * 86400.0 + 5 * 3600.0) == 150.0


def test_readings_weigh_by_the_time_they_hold(tmp_path: Path) -> None:
    """Ten-minute readings (as Spain's grid operator publishes): one spike of 10 minutes
    is a sixth of its hour, wherever it falls in it."""
    for at in range(6):
        v = np.full(12, 120.0)
        v[at] = 720.0
        h = hourly(load_carbon_csv(_series(tmp_path, f"s{at}", 10, v), "Time", "ci"))
        assert h.tolist() == pytest.approx([220.0, 120.0]), at


def test_an_empty_reading_holds_the_one_before_for_the_files_own_step(tmp_path: Path) -> None:
    p = tmp_path / "holes.csv"
    p.write_text("Time,ci\n2020-01-01 00:00,100\n2020-01-01 01:00,\n2020-01-01 02:00,70\n")
    s = load_carbon_csv(p, "Time", "ci")
    assert s.span_s == 3 * 3600.0  # the last reading holds for the file's step, 1 h
    assert hourly(s).tolist() == [100.0, 100.0, 70.0]


def test_a_local_clock_going_back_in_autumn_is_named_as_such(tmp_path: Path) -> None:
    from smartsched.model.errors import ValidationError

    p = tmp_path / "local.csv"
    p.write_text("Time,ci\n2020-10-25 01:30,100\n2020-10-25 02:30,110\n"
                 "2020-10-25 02:00,120\n2020-10-25 03:00,130\n")
    with pytest.raises(ValidationError, match="daylight-saving") as e:
        load_carbon_csv(p, "Time", "ci")
    assert (e.value.field, e.value.row) == ("Time", 2)
    dmy = tmp_path / "dmy.csv"  # a day-first date is no UTC offset
    dmy.write_text("Time,ci\n25-10-2020 01:30,100\n25-10-2020 02:30,110\n"
                   "25-10-2020 02:00,120\n")
    with pytest.raises(ValidationError, match="daylight-saving"):
        load_carbon_csv(dmy, "Time", "ci")
    shuffled = tmp_path / "shuffled.csv"  # days out of order: not a clock change
    shuffled.write_text("Time,ci\n2020-10-25 01:00,100\n2020-10-20 02:00,110\n")
    with pytest.raises(ValidationError) as e:
        load_carbon_csv(shuffled, "Time", "ci")
    assert "daylight" not in str(e.value)
