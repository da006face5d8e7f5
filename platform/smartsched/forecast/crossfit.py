"""``smartsched forecast crossfit``: every series forecast by a model that never saw its job.

Owns the out-of-sample evaluation over the whole data set. The fixed
train / validation / test split scores the test jobs only -- on the Google
file about 13 machines at a time, so its "aggregate" is a 13-machine sum,
noisier than the fleet the aggregate target was set on (~105 machines at a
time). Cross-fitting splits the jobs into K folds by the same seeded hash;
for each fold, the LSTM (its validation set drawn from the other folds) and
the baselines are fitted on the other folds and forecast this one. The
held-out forecasts of all folds then give per-machine metrics over every
series and the aggregate of the whole fleet, each value predicted by a model
that never saw that job.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from smartsched.forecast.baselines import baselines, day_steps
from smartsched.forecast.data import Series
from smartsched.forecast.windows import Windows, make_windows


class HeldOut:
    """Forecasts made elsewhere (one model per fold), served through the forecaster API
    for windows in the order they were stored."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.points: list[np.ndarray] = []
        self.bounds: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, point: np.ndarray, bounds: tuple[np.ndarray, np.ndarray] | None) -> None:
        self.points.append(point)
        if bounds is not None:
            self.bounds.append(bounds)

    def predict(self, w: Windows) -> np.ndarray:
        out = np.concatenate(self.points)
        assert len(out) == len(w), "held-out forecasts and windows out of step"
        return out


class HeldOutInterval(HeldOut):
    def interval(self, w: Windows) -> tuple[np.ndarray, np.ndarray]:
        return (np.concatenate([b[0] for b in self.bounds]),
                np.concatenate([b[1] for b in self.bounds]))


def _job(s: Series) -> str:
    return s.id.split("-r")[0].split("-d")[0]  # the job key of ``split_by_series``


def _u(key: str) -> float:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


def fold_of(s: Series, folds: int, seed: int) -> int:
    """The job's fold, from a seeded hash of the job: a job never spans two folds."""
    return int(_u(f"crossfit{seed}:{_job(s)}") * folds)


def _train_val(rest: Sequence[Series], seed: int, val_frac: float = 0.15
               ) -> tuple[list[Series], list[Series]]:
    """Whole jobs to validation (the lowest-hashing ~15 %, at least one), the rest to
    training."""
    jobs = sorted({_job(s) for s in rest}, key=lambda j: _u(f"{seed}:{j}"))
    val_jobs = set(jobs[: max(1, round(val_frac * len(jobs)))])
    return ([s for s in rest if _job(s) not in val_jobs],
            [s for s in rest if _job(s) in val_jobs])


def _concat(parts: Sequence[Windows]) -> Windows:
    offset, series = 0, []
    for p in parts:
        series.append(p.series + offset)
        offset += int(p.series.max()) + 1 if len(p) else 0
    return Windows(np.concatenate([p.past for p in parts]),
                   np.concatenate([p.future for p in parts]),
                   np.concatenate([p.origin_s for p in parts]), np.concatenate(series),
                   parts[0].step_s, parts[0].targets)


def crossfit(series: Sequence[Series], *, folds: int = 3, seed: int = 0, lookback: int = 72,
             hidden: int = 96, epochs: int = 30, horizon: int = 3,
             echo: Callable[[str], Any] = print) -> dict[str, Any]:
    import torch

    from smartsched.forecast.evaluate import compare_to_best_baseline, evaluate
    from smartsched.forecast.lstm import LSTMForecaster, LSTMSettings
    from smartsched.model.errors import ValidationError

    if folds < 2:
        raise ValidationError("folds", f"must be >= 2, got {folds}")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    # Seasonal naive needs a day of past, the LSTM its own lookback (a shorter window was
    # a shape error, after every fold's training).
    season = day_steps(series)
    eval_lookback = max(season + horizon, lookback)
    names = [b.name for b in baselines(season)]
    held = {n: HeldOut(n) for n in names}
    held["LSTM"] = HeldOutInterval("LSTM")
    tests: list[Windows] = []
    for k in range(folds):
        test_s = [s for s in series if fold_of(s, folds, seed) == k]
        rest = [s for s in series if fold_of(s, folds, seed) != k]
        train_s, val_s = _train_val(rest, seed) if rest else ([], [])
        test = make_windows(test_s, eval_lookback, horizon) if test_s else None
        if test_s and test is not None and len(test) == 0 and lookback > season:
            raise ValidationError("lookback", f"no held-out series of fold {k} is "
                                  f"{eval_lookback + horizon} steps long (lower --lookback)")
        if test is None or len(test) == 0 or not train_s:
            raise ValidationError("data", f"fold {k} has no scorable series (too few jobs "
                                  f"for {folds} folds?)")
        echo(f"fold {k + 1}/{folds}: {len(train_s)} / {len(val_s)} series train / val,"
             f" {len(test_s)} held out ({len(test):,} windows)")
        train_w = make_windows(train_s, eval_lookback, horizon, stride=3)
        for b in baselines(season):
            b.fit(train_w)
            held[b.name].add(b.predict(test), None)
        fc = LSTMForecaster(LSTMSettings(lookback=lookback, horizon=horizon, hidden=hidden,
                                         epochs=epochs, seed=seed))
        fc.fit(make_windows(train_s, lookback, horizon, stride=2),
               make_windows(val_s, lookback, horizon, stride=3),
               progress=lambda line: echo("  " + line))
        held["LSTM"].add(fc.predict(test), fc.interval(test))
        tests.append(test)
    all_test = _concat(tests)
    res = evaluate(list(held.values()), all_test, season=season)
    res["folds"] = folds
    compare_to_best_baseline(res, names)
    return res
