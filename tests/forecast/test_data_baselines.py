"""Forecast data, splits without leakage, windows, baselines and metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from smartsched.forecast.baselines import EWMA, LastValue, LinearAR, MovingAverage, SeasonalNaive
from smartsched.forecast.data import (
    Series,
    load_google2011,
    load_long,
    series_from_long,
    split_by_series,
)
from smartsched.forecast.evaluate import evaluate, point_metrics
from smartsched.forecast.windows import make_windows
from smartsched.model.errors import ValidationError


def _series(sid: str, values: np.ndarray, step: float = 300.0) -> Series:
    v = np.asarray(values, dtype=np.float32).reshape(len(values), -1)
    return Series(sid, 0.0, step, tuple(f"t{k}" for k in range(v.shape[1])), v)


def test_long_table_and_errors_name_the_column(tmp_path: Path) -> None:
    df = pd.DataFrame({"series_id": ["a"] * 4 + ["b"] * 3,
                       "timestamp": [0, 300, 600, 900, 0, 300, 600],
                       "cpu": [1, 2, 3, 4, 5, 6, 7.0]})
    f = tmp_path / "x.csv"
    df.to_csv(f, index=False)
    s = load_long(f)
    assert [x.id for x in s] == ["a", "b"] and s[0].values[:, 0].tolist() == [1, 2, 3, 4]
    with pytest.raises(ValidationError) as e:
        series_from_long(df.drop(columns="timestamp"), ["cpu"])
    assert e.value.field == "timestamp"
    bad = df.astype({"cpu": object})
    bad.loc[2, "cpu"] = "n/a"
    with pytest.raises(ValidationError) as e:
        series_from_long(bad, ["cpu"])
    assert e.value.field == "cpu" and e.value.row == 2
    gap = df.copy()
    gap.loc[3, "timestamp"] = 1500
    with pytest.raises(ValidationError, match="not regular"):
        series_from_long(gap, ["cpu"])
    (tmp_path / "g.csv").write_text("vm_file,job_id,day,step,cpu_util_pct\nv,1,1,0,3\n")
    with pytest.raises(ValidationError) as e:
        load_google2011(tmp_path / "g.csv")
    assert e.value.field == "mem_util_pct"


def test_splits_never_share_a_job(data_dir: Path) -> None:
    series = load_google2011(data_dir / "google2011-vm-utilization" / "gcd_vm_cpu_mem_5min.csv")
    assert sum(len(s) for s in series) == 358_848  # every row, chained into runs of days
    sp = split_by_series(series, seed=3)
    jobs = [{s.id.split("-r")[0] for s in part} for part in (sp.train, sp.val, sp.test)]
    assert not (jobs[0] & jobs[2]) and not (jobs[0] & jobs[1]) and not (jobs[1] & jobs[2])
    assert len(sp.test) > 0 and len(sp.train) > len(sp.test)
    # The split is a function of the job and the seed only: stable across calls.
    again = split_by_series(list(reversed(series)), seed=3)
    assert {s.id for s in again.test} == {s.id for s in sp.test}


def test_windows_cut_past_and_future() -> None:
    s = _series("a", np.arange(10.0))
    w = make_windows([s], lookback=3, horizon=2)
    assert len(w) == 6  # origins 2..7
    assert w.past[0, :, 0].tolist() == [0, 1, 2] and w.future[0, :, 0].tolist() == [3, 4]
    assert w.past[-1, :, 0].tolist() == [5, 6, 7] and w.future[-1, :, 0].tolist() == [8, 9]
    assert w.origin_s.tolist() == [300.0 * t for t in range(2, 8)]
    assert len(make_windows([_series("b", np.arange(4.0))], 3, 2)) == 0  # too short


def test_baselines_on_known_series() -> None:
    season = 4
    base = np.tile([1.0, 2.0, 3.0, 4.0], 5)  # period 4
    w = make_windows([_series("s", base)], lookback=8, horizon=2)
    np.testing.assert_allclose(SeasonalNaive(season).predict(w), w.future)  # exact
    np.testing.assert_allclose(LastValue().predict(w)[:, :, 0],
                               np.repeat(w.past[:, -1, :], 2, axis=1))
    ramp = make_windows([_series("r", np.arange(30.0))], lookback=6, horizon=3)
    assert MovingAverage(3).predict(ramp)[0, 0, 0] == pytest.approx((3 + 4 + 5) / 3)
    # weights alpha (1 - alpha)^age over the last 2 values (4, 5): 0.25 and 0.5
    assert EWMA(0.5, span=2).predict(ramp)[0, 0, 0] == pytest.approx((0.25 * 4 + 0.5 * 5) / 0.75)
    ar = LinearAR(lags=3)
    ar.fit(ramp)  # a straight line: AR recovers it
    np.testing.assert_allclose(ar.predict(ramp), ramp.future, atol=1e-3)


def test_metrics_against_hand_computed_values() -> None:
    y = np.array([10.0, 20.0, 40.0])
    f = np.array([12.0, 18.0, 40.0])
    ref = np.array([9.0, 25.0, 30.0])
    m = point_metrics(y, f, ref)
    assert m["MAE"] == pytest.approx(4 / 3)
    assert m["MAPE"] == pytest.approx(100 * (0.2 + 0.1 + 0) / 3)
    assert m["sMAPE"] == pytest.approx(100 * (4 / 22 + 4 / 38 + 0) / 3)
    assert m["MASE"] == pytest.approx((4 / 3) / (16 / 3))
    # Aggregate sums machines at the same origin: two copies of one series.
    s = _series("a", np.tile([1.0, 2.0, 3.0, 4.0], 4))
    w = make_windows([s, _series("b", s.values[:, 0])], lookback=4, horizon=1)
    res = evaluate([SeasonalNaive(4), LastValue()], w, season=4)
    assert res["models"]["seasonal naive"]["t0"]["aggregate"]["MAE"] == 0.0
    assert res["models"]["last value"]["t0"]["aggregate"]["MAE"] == pytest.approx(
        2 * res["models"]["last value"]["t0"]["machine"]["MAE"])


def test_a_damaged_parquet_series_file_is_named(tmp_path) -> None:
    bad = tmp_path / "usage.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(ValidationError, match="not a readable Parquet file"):
        load_long(bad)


def _long(path: Path, step_s: float, unit: float = 1.0) -> Path:
    """30 machines of a daily sine plus a slope of 0.01 a step, readings ``step_s`` apart
    (timestamps in ``unit`` of a second: 1000 writes milliseconds)."""
    rows = []
    for m in range(30):
        for t in range(24 * 3600 // int(step_s) * 12):
            day = t * step_s / 86_400.0
            rows.append((f"m{m}", (1_600_000_000 + t * step_s) * unit,
                         50 + 5 * np.sin(2 * np.pi * day) + 0.01 * t))
    pd.DataFrame(rows, columns=["series_id", "timestamp", "cpu"]).to_csv(path, index=False)
    return path


def test_seasonal_naive_reads_a_day_back_at_the_datas_own_step(tmp_path: Path) -> None:
    """It took 288 steps (a day of 5-minute readings) whatever the data: on hourly data it
    read twelve days back (error 2.88 where a day back is 0.24) and every MASE was divided
    by that (probe round 6). Milliseconds read as seconds are refused, not scored."""
    from smartsched.forecast.baselines import day_steps
    from smartsched.forecast.run import evaluate_forecaster

    res = evaluate_forecaster(None, _long(tmp_path / "hourly.csv", 3600.0))
    naive = res["models"]["seasonal naive"]["cpu"]
    assert naive["machine"]["MAE"] == pytest.approx(0.24, abs=1e-6), naive
    with pytest.raises(ValidationError, match="milliseconds") as e:
        evaluate_forecaster(None, _long(tmp_path / "ms.csv", 3600.0, unit=1000.0))
    assert e.value.field == "data"
    from types import SimpleNamespace as S

    assert day_steps([S(step_s=300.0)]) == 288 and day_steps([S(step_s=900.0)]) == 96
    assert day_steps([S(step_s=300.0), S(step_s=300.0000001)]) == 288  # one step
    with pytest.raises(ValidationError, match="different steps"):
        day_steps([S(step_s=300.0), S(step_s=60.0)])


def test_mape_leaves_zero_actuals_out_and_does_not_depend_on_the_unit() -> None:
    """One idle machine's 0 % reading, divided by a 1e-9 guard, made every MAPE tens of
    billions of percent; values below the guard (any tiny unit) read as nearly exact
    (probe round 8)."""
    y = np.array([10.0, 0.0, 20.0, 0.0])
    f = np.array([12.0, 3.0, 18.0, 0.0])
    m = point_metrics(y, f)
    assert m["MAPE"] == pytest.approx(100 * (0.2 + 0.1) / 2)
    assert point_metrics(y * 1e-12, f * 1e-12)["MAPE"] == pytest.approx(m["MAPE"])
    assert np.isnan(point_metrics(np.zeros(3), np.ones(3))["MAPE"])
