"""Forecast windows: (past, future) pairs cut from series at every forecast origin.

Owns the one definition of what a forecaster sees and must predict. At an
origin ``t`` (the last observed step) the past is ``values[t-L+1 .. t]`` and
the future ``values[t+1 .. t+H]``; origins start where a full past exists and
end where a full future does. Windows never cross series, and a split's
windows come only from that split's series.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from smartsched.forecast.data import Series
from smartsched.model.errors import ValidationError


@dataclass(frozen=True)
class Windows:
    past: np.ndarray  # [N, L, K]
    future: np.ndarray  # [N, H, K]
    origin_s: np.ndarray  # [N] absolute time of the last observed step
    series: np.ndarray  # [N] index into the series list
    step_s: float
    targets: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.past.shape[0])


# The most the windows of one call may hold: the window is a day of the data's own steps
# (the seasonal baseline's reach), so memory grows with the square of the steps per day.
MAX_WINDOW_BYTES = 2 << 30


def make_windows(series: Sequence[Series], lookback: int, horizon: int,
                 stride: int = 1) -> Windows:
    """All windows of ``series`` (each long enough for ``lookback + horizon`` steps)."""
    if lookback < 1 or horizon < 1 or stride < 1:
        raise ValueError("lookback, horizon and stride must be >= 1")
    if not series:
        raise ValueError("no series")
    k = series[0].values.shape[1]
    count = sum(len(range(lookback - 1, len(s) - horizon, stride)) for s in series
                if lookback + horizon <= len(s))
    # float32, three times: the windows picked, their concatenation, its float32 copy
    need = 3 * count * (lookback + horizon) * k * 4
    if need > MAX_WINDOW_BYTES:  # (a day of 10-s steps is 8,640: windows that long grew
        # past 5 GB for a 14 MB file before anything said so)
        step = series[0].step_s
        raise ValidationError("data", f"{count:,} windows of {lookback + horizon:,} steps "
                              f"would need {need / 2**30:,.1f} GiB (at most "
                              f"{MAX_WINDOW_BYTES / 2**30:g}): the data's {step:g}-s steps "
                              "make a day's window that long; resample to coarser steps "
                              "(e.g. 5 minutes)")
    past, fut, org, idx = [], [], [], []
    for i, s in enumerate(series):
        T = len(s)
        if lookback + horizon > T:
            continue
        origins = np.arange(lookback - 1, T - horizon, stride)
        # sliding_window_view: [T - w + 1, K, w] -> pick the windows starting at origin-L+1
        view = np.lib.stride_tricks.sliding_window_view(s.values, lookback + horizon, axis=0)
        w = view[origins - lookback + 1].transpose(0, 2, 1)  # [n, L+H, K]
        past.append(w[:, :lookback])
        fut.append(w[:, lookback:])
        org.append(s.start_s + origins * s.step_s)
        idx.append(np.full(len(origins), i))
    if not past:
        return Windows(np.zeros((0, lookback, k), np.float32), np.zeros((0, horizon, k),
                       np.float32), np.zeros(0), np.zeros(0, int), series[0].step_s,
                       series[0].targets)
    return Windows(np.concatenate(past).astype(np.float32),
                   np.concatenate(fut).astype(np.float32), np.concatenate(org),
                   np.concatenate(idx), series[0].step_s, series[0].targets)


def time_features(origin_s: np.ndarray, horizon: int, step_s: float) -> np.ndarray:
    """[N, H, 4]: time of day and day of week (sin, cos) of each predicted step."""
    t = origin_s[:, None] + step_s * np.arange(1, horizon + 1)[None, :]
    day = 2 * np.pi * (t % 86_400) / 86_400
    week = 2 * np.pi * (t % (7 * 86_400)) / (7 * 86_400)
    return np.stack([np.sin(day), np.cos(day), np.sin(week), np.cos(week)], -1).astype(
        np.float32)
