"""Temporal shifting: deadlines never missed, the bound is a bound, the forecaster sees
only the past, and series with gaps or negative values are refused naming the row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartsched.carbon.forecast import (
    DAY,
    WEEK,
    errors,
    hourly,
    lag_regression,
    last_value,
    seasonal_naive,
)
from smartsched.carbon.shifting import Job, agnostic, emitted_kg, forecast, oracle
from smartsched.model.carbon import CarbonSeries, load_carbon_csv
from smartsched.model.errors import ValidationError


def _grid(seed: int, days: int = 50) -> np.ndarray:
    """A daily and weekly shape with weather-like noise (not one of the shared files)."""
    rng = np.random.default_rng(seed)
    t = np.arange(days * DAY)
    weather = np.convolve(rng.normal(0, 40, t.size), np.ones(30) / 30, mode="same") * 5
    y = 300 + 80 * np.cos(2 * np.pi * (t % DAY - 13) / DAY) + 20 * (t % WEEK < 2 * DAY) \
        + weather + rng.normal(0, 10, t.size)
    return np.clip(y, 5, None)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.lists(st.tuples(
    st.integers(0, 40 * DAY), st.integers(1, 30), st.integers(0, 60), st.booleans()),
    min_size=1, max_size=25))
def test_deadlines_are_never_missed(seed, specs) -> None:
    y = _grid(seed)
    table = lag_regression(y, 48)
    for arrival, work, extra, pausable in specs:
        job = Job(arrival, work, arrival + work + extra, 2.0, pausable)
        for hours in (forecast(job, table), oracle(job, y), agnostic(job)):
            assert hours.size == work and len(set(hours.tolist())) == work
            assert hours.min() >= job.arrival and hours.max() < job.deadline
            if not pausable:
                assert (np.diff(hours) == 1).all()
        # The bound is a bound: nothing runs the job on less carbon.
        best = emitted_kg(job, oracle(job, y), y)
        assert best <= emitted_kg(job, forecast(job, table), y) + 1e-9
        assert best <= emitted_kg(job, agnostic(job), y) + 1e-9


def test_oracle_picks_the_cleanest_hours() -> None:
    y = np.array([5.0, 1.0, 9.0, 2.0, 8.0, 3.0] * 10)
    assert oracle(Job(0, 2, 6), y).tolist() == [1, 3]
    assert oracle(Job(0, 2, 6, interruptible=False), y).tolist() == [0, 1]
    assert emitted_kg(Job(0, 2, 6, power_kw=1000.0), np.array([1, 3]), y) == pytest.approx(3.0)


def test_the_forecaster_sees_only_the_past() -> None:
    """Changing every value after hour t changes no forecast made at t or before, and no
    hour the policy ran before t (a look-ahead would show here)."""
    y = _grid(3)
    t = 40 * DAY + 5
    z = y.copy()
    z[t + 1:] = z[t + 1:][::-1] * 3 + 100
    for make in (lag_regression, seasonal_naive, last_value):
        a, b = make(y, 48).rows, make(z, 48).rows
        assert np.array_equal(a[: t + 1], b[: t + 1], equal_nan=True), make.__name__
        assert not np.array_equal(a[t + 1:], b[t + 1:], equal_nan=True)
    job = Job(t - 20, 10, t + 28)
    ran_y = forecast(job, lag_regression(y, 48))
    ran_z = forecast(job, lag_regression(z, 48))
    assert ran_y[ran_y <= t + 1].tolist() == ran_z[ran_z <= t + 1].tolist()


def test_forecaster_beats_its_baselines_on_a_seasonal_grid() -> None:
    y = _grid(7, days=80)
    res = errors(y, [lag_regression(y, 48), seasonal_naive(y, 48), last_value(y, 48)],
                 np.arange(WEEK + 28 * DAY, y.size))
    for band in ("h1-6", "h7-24", "h25-48"):
        ours = res["lag regression"][band]["mae"]
        assert ours < res["seasonal naive"][band]["mae"]
        assert ours < res["last value"][band]["mae"]


def test_hourly_means_of_a_quarter_hour_series() -> None:
    s = CarbonSeries(np.array([1.0, 2.0, 3.0, 4.0, 10.0, 10.0, 10.0, 10.0, 7.0]), 900.0)
    assert hourly(s).tolist() == [2.5, 10.0]


@pytest.mark.parametrize(("job", "field"), [
    ({"arrival": 5, "work": 0, "deadline": 9}, "job.work"),
    ({"arrival": 5, "work": 5, "deadline": 9}, "job.deadline"),
    ({"arrival": -1, "work": 1, "deadline": 9}, "job.arrival"),
    ({"arrival": 1, "work": 1, "deadline": 9, "power_kw": 0}, "job.power_kw"),
])
def test_bad_jobs_name_the_field(job, field) -> None:
    with pytest.raises(ValidationError) as e:
        Job(**job)
    assert e.value.field == field


def test_a_job_past_the_series_end_is_refused() -> None:
    y = _grid(1, days=10)
    with pytest.raises(ValidationError) as e:
        oracle(Job(y.size - 5, 2, y.size + 3), y)
    assert e.value.field == "job.deadline"


def _csv(tmp_path: Path, rows: list[str]) -> Path:
    p = tmp_path / "ci.csv"
    p.write_text("Time,ci\n" + "\n".join(rows) + "\n")
    return p


@pytest.mark.parametrize(("rows", "row", "what"), [
    (["2020-01-01 00:00,100", "2020-01-01 01:00,-5", "2020-01-01 02:00,90"], 1, ">= 0"),
    (["2020-01-01 00:00,100", "2020-01-01 01:00,90", "2020-01-01 09:00,80"], 2, "gap"),
    (["2020-01-01 00:00,100", "2020-01-01 01:00,", "2020-01-01 02:00,",
      "2020-01-01 03:00,", "2020-01-01 04:00,", "2020-01-01 05:00,80"], 5, "gap"),
    (["2020-01-01 00:00,100", "2020-01-01 01:00,lots", "2020-01-01 02:00,90"], 1, "number"),
    (["2020-01-01 00:00,100", "2020-01-01 02:00,90", "2020-01-01 01:00,95"], 2, "increase"),
    (["2020-01-01 00:00,100", "yesterday,90"], 1, "timestamp"),
])
def test_series_with_gaps_or_negative_values_are_refused_naming_the_row(
        tmp_path, rows, row, what) -> None:
    with pytest.raises(ValidationError, match=what) as e:
        load_carbon_csv(_csv(tmp_path, rows), "Time", "ci")
    assert e.value.row == row


def test_short_holes_are_held_and_a_missing_column_named(tmp_path) -> None:
    s = load_carbon_csv(_csv(tmp_path, ["2020-01-01 00:00,100", "2020-01-01 01:00,",
                                        "2020-01-01 02:00,70"]), "Time", "ci", step_s=3600.0)
    assert s.values.tolist() == [100.0, 100.0, 70.0]
    with pytest.raises(ValidationError) as e:
        load_carbon_csv(_csv(tmp_path, ["2020-01-01 00:00,100"]), "Time", "intensity")
    assert e.value.field == "intensity"
