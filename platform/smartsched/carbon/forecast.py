"""Forecasting grid carbon intensity from the series' past only.

Owns the hourly view of a series and a forecast table: for every origin hour ``t``
the intensity expected at ``t + 1 .. t + H``, computed from the values up to ``t``
and nothing after. A planner deciding at the start of hour ``t`` knows the readings
of hours ``< t`` (the hour under way is not over), so it reads row ``t - 1``.

The forecaster is a direct multi-horizon linear model (one least-squares fit per
horizon step, refitted once a day on the previous ``fit_days``): features are the
last reading, the same hour on the most recent day before the target, the same
hour a week before the target, and the last day's mean. Grids repeat daily (solar)
and weekly (demand); the fit finds how much of each a grid has, so nothing is
tuned to one region's file. Two baselines keep it honest: the last value, and
seasonal naive (the same hour a day before the target). ``errors`` reports each one's
mean absolute and percentage error per horizon band on the same origins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from smartsched.forecast.evaluate import mape_pct
from smartsched.model.carbon import CarbonSeries

DAY = 24
WEEK = 7 * DAY


def hourly(series: CarbonSeries) -> np.ndarray:
    """The series as hourly means (a partial last hour is dropped)."""
    k = max(1, round(3600.0 / series.step_s))
    n = int(series.values.size * series.step_s // 3600.0)
    t = np.arange(n * k, dtype=np.float64) * (3600.0 / k)
    return np.asarray(series.at(t), dtype=np.float64).reshape(n, k).mean(axis=1)


@dataclass(frozen=True)
class ForecastTable:
    """``rows[t, h - 1]``: the intensity expected at hour ``t + h`` from hours ``<= t``
    (NaN where the method has too little past). ``name``: the method."""

    rows: np.ndarray
    name: str

    @property
    def horizon(self) -> int:
        return int(self.rows.shape[1])


def _features(y: np.ndarray, mean24: np.ndarray, t: np.ndarray, h: int) -> np.ndarray:
    """[len(t), 5] features at origins ``t`` for target ``t + h`` (all from y[<= t])."""
    day_back = DAY * math.ceil(h / DAY)  # the most recent same hour at or before t
    return np.column_stack([
        np.ones(t.size), y[t], y[t + h - day_back], y[t + h - WEEK], mean24[t],
    ])


def lag_regression(y: np.ndarray, horizon: int, fit_days: int = 28,
                   ridge: float = 1e-3) -> ForecastTable:
    """The forecaster's table over every origin of ``y`` (see the module docstring)."""
    n = y.size
    rows = np.full((n, horizon), np.nan)
    first = WEEK + fit_days * DAY  # a week of lags and fit_days of rows to fit on
    scale = float(np.mean(y[: min(n, first)])) or 1.0
    mean24 = np.convolve(y, np.ones(DAY) / DAY, mode="full")[:n]  # mean of y[t-23..t]
    for day_start in range(first, n, DAY):
        origins = np.arange(day_start, min(day_start + DAY, n))
        for h in range(1, horizon + 1):
            # Fit rows: origins s whose target s + h is known at day_start - 1.
            s = np.arange(day_start - 1 - h - fit_days * DAY + 1, day_start - h)
            s = s[s >= WEEK]
            if s.size < 4 * DAY:
                continue
            x = _features(y, mean24, s, h) / scale
            target = y[s + h] / scale
            a = x.T @ x + ridge * np.eye(x.shape[1])
            coef = np.linalg.solve(a, x.T @ target)
            pred = _features(y, mean24, origins, h) / scale @ coef
            rows[origins, h - 1] = np.clip(pred, 0, None) * scale
    return ForecastTable(rows, "lag regression")


def last_value(y: np.ndarray, horizon: int) -> ForecastTable:
    return ForecastTable(np.repeat(y[:, None], horizon, axis=1), "last value")


def seasonal_naive(y: np.ndarray, horizon: int) -> ForecastTable:
    """The same hour on the most recent day at or before the origin."""
    n = y.size
    rows = np.full((n, horizon), np.nan)
    t = np.arange(n)
    for h in range(1, horizon + 1):
        src = t + h - DAY * math.ceil(h / DAY)
        ok = src >= 0
        rows[t[ok], h - 1] = y[src[ok]]
    return ForecastTable(rows, "seasonal naive")


def ahead(row: np.ndarray, n: int) -> np.ndarray:
    """``n`` hours of one forecast row (h = 1..): hours past its horizon take the same
    hour of its last day; NaN (too little past to forecast) reads 0, no preference."""
    h = np.arange(n)
    beyond = h >= row.size
    h[beyond] -= DAY * np.ceil((h[beyond] - row.size + 1) / DAY).astype(np.int64)
    f = row[np.clip(h, 0, row.size - 1)]
    return np.where(np.isfinite(f), f, 0.0)


BANDS = ((1, 6), (7, 24), (25, 48))


def errors(y: np.ndarray, tables: list[ForecastTable], origins: np.ndarray
           ) -> dict[str, dict[str, dict[str, float]]]:
    """MAE (g/kWh) and MAPE (%) per horizon band for each table, on the same origins
    (those where every table has a forecast and the target exists)."""
    horizon = min(t.horizon for t in tables)
    origins = origins[origins + horizon < y.size]
    ok = np.ones(origins.size, dtype=bool)
    for tb in tables:
        ok &= np.isfinite(tb.rows[origins, :horizon]).all(axis=1)
    origins = origins[ok]
    truth = np.stack([y[origins + h] for h in range(1, horizon + 1)], axis=1)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for tb in tables:
        f = tb.rows[origins, :horizon]
        res = {}
        for lo, hi in BANDS:
            if lo > horizon:
                continue
            sl = slice(lo - 1, min(hi, horizon))
            err = np.abs(f[:, sl] - truth[:, sl])
            res[f"h{lo}-{min(hi, horizon)}"] = {
                "mae": float(err.mean()),
                "mape_pct": mape_pct(err, truth[:, sl]),
            }
        out[tb.name] = res
    return out
