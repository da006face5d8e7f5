"""Standard baselines, each a forecaster with the same interface as the LSTM.

Owns the bar a learned forecaster must clear. A forecaster has
``fit(train: Windows)`` (a no-op for most) and ``predict(w: Windows) ->
[N, H, K]`` point forecasts; one with a prediction interval also has
``interval(w) -> (lo, hi)``. Definitions (``y`` the observed past, ``t`` the
origin, ``h`` = 1..H):

  last value        y[t]
  seasonal naive    y[t + h - season]  (same time yesterday; needs L >= season)
  moving average    mean of y[t-w+1 .. t]
  EWMA              exponentially weighted mean of the past, smoothing alpha
  linear AR(p)      least squares on the last p values (and a constant), one
                    model per target and horizon step, fitted on the training windows
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from smartsched.forecast.windows import Windows

DAY_STEPS_5MIN = 288
DAY_S = 86_400.0


def day_steps(series: Sequence[Any]) -> int:
    """Steps in a day of ``series`` (each with ``step_s``): seasonal naive's season. The
    baselines took 288 (a day of 5-minute readings) whatever the data: on hourly data
    "seasonal naive" read twelve days back and every MASE was divided by that. Refused,
    naming ``data``: series of different steps, and readings more than 6 hours apart
    (fewer than four a day: no daily season to speak of; timestamps in milliseconds read
    as seconds give such steps)."""
    from smartsched.model.errors import ValidationError

    steps = sorted({round(float(s.step_s), 3) for s in series})  # (to the millisecond)
    if not steps:
        raise ValidationError("data", "no series")
    if len(steps) > 1:
        raise ValidationError("data", f"series of different steps ({steps[0]:g} s and "
                              f"{steps[-1]:g} s): give one step")
    per_day = DAY_S / steps[0]
    if not per_day >= 4:
        raise ValidationError("data", f"readings {steps[0]:g} s apart, fewer than four a "
                              "day (timestamps in milliseconds? they must be seconds)")
    return round(per_day)


class LastValue:
    name = "last value"

    def fit(self, train: Windows) -> None:
        pass

    def predict(self, w: Windows) -> np.ndarray:
        h = w.future.shape[1]
        return np.repeat(w.past[:, -1:, :], h, axis=1)


class SeasonalNaive:
    name = "seasonal naive"

    def __init__(self, season: int = DAY_STEPS_5MIN) -> None:
        self.season = season

    def fit(self, train: Windows) -> None:
        pass

    def predict(self, w: Windows) -> np.ndarray:
        L, h = w.past.shape[1], w.future.shape[1]
        if self.season > L:
            raise ValueError(f"seasonal naive needs a lookback >= {self.season}, got {L}")
        idx = L - 1 + np.arange(1, h + 1) - self.season
        return w.past[:, idx, :]


class MovingAverage:
    def __init__(self, window: int = 6) -> None:
        self.window = window
        self.name = f"moving average ({window})"

    def fit(self, train: Windows) -> None:
        pass

    def predict(self, w: Windows) -> np.ndarray:
        m = w.past[:, -self.window:, :].mean(axis=1, keepdims=True)
        return np.repeat(m, w.future.shape[1], axis=1)


class EWMA:
    def __init__(self, alpha: float = 0.5, span: int = 36) -> None:
        self.alpha, self.span = alpha, span
        self.name = f"EWMA (alpha {alpha})"

    def fit(self, train: Windows) -> None:
        pass

    def predict(self, w: Windows) -> np.ndarray:
        n = min(self.span, w.past.shape[1])
        wts = self.alpha * (1 - self.alpha) ** np.arange(n)[::-1]
        m = (w.past[:, -n:, :] * wts[None, :, None]).sum(1, keepdims=True) / wts.sum()
        return np.repeat(m, w.future.shape[1], axis=1)


class LinearAR:
    def __init__(self, lags: int = 12, ridge: float = 1e-3) -> None:
        self.lags, self.ridge = lags, ridge
        self.name = f"linear AR({lags})"
        self.coef: np.ndarray | None = None  # [K, H, lags + 1]

    def _design(self, past: np.ndarray, k: int) -> np.ndarray:
        x = past[:, -self.lags:, k].astype(np.float64)
        return np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)

    def fit(self, train: Windows) -> None:
        K, H = train.future.shape[2], train.future.shape[1]
        self.coef = np.zeros((K, H, self.lags + 1))
        for k in range(K):
            X = self._design(train.past, k)
            A = X.T @ X + self.ridge * np.eye(X.shape[1])
            for h in range(H):
                self.coef[k, h] = np.linalg.solve(A, X.T @ train.future[:, h, k])

    def predict(self, w: Windows) -> np.ndarray:
        if self.coef is None:
            raise RuntimeError("fit() first")
        K, H = self.coef.shape[0], self.coef.shape[1]
        out = np.zeros((len(w), H, K), dtype=np.float32)
        for k in range(K):
            out[:, :, k] = self._design(w.past, k) @ self.coef[k].T
        return out


def baselines(season: int = DAY_STEPS_5MIN) -> list:
    """The baselines every evaluation reports (``season``: steps in a day of the data)."""
    return [LastValue(), SeasonalNaive(season), MovingAverage(6), EWMA(0.5), LinearAR(12)]
