"""Forecast metrics at the horizon, per machine and on the aggregate, for every forecaster.

Owns the figures ``smartsched forecast evaluate`` prints. All metrics are on
the prediction for the last horizon step (15 minutes ahead at 5-minute steps),
per target:

  MAE    mean |y - f|
  MAPE   100 * mean |y - f| / |y| over the points whose actual is not zero (an idle
         machine's 0 % has no percentage error: divided by a tiny guard, one such
         reading made every MAPE tens of billions of percent); nan when every one is
  sMAPE  100 * mean 2 |y - f| / (|y| + |f|)
  MASE   MAE / MAE of seasonal naive on the same points (< 1: better than it)
  coverage  share of y inside the forecaster's interval (when it has one)

"Aggregate" sums actuals and forecasts over all machines that have a window at
the same origin time (bottom-up), then computes the same metrics over those
sums -- the load of the whole test fleet.

A ratio to a reference that made no error at all (MASE, ``MASE_vs_best``: a
constant or all-zero test series, which seasonal naive or last value forecast
exactly) is undefined: it is nan, shown as "n/a" with a note, rather than a
division error or a huge number from dividing by a tiny guard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from smartsched.forecast.baselines import DAY_STEPS_5MIN, SeasonalNaive
from smartsched.forecast.windows import Windows


def point_metrics(y: np.ndarray, f: np.ndarray, ref: np.ndarray | None = None
                  ) -> dict[str, float]:
    """MAE, MAPE, sMAPE (and MASE against ``ref``) of forecasts ``f`` for actuals ``y``."""
    y = np.asarray(y, dtype=np.float64)
    f = np.asarray(f, dtype=np.float64)
    err = np.abs(y - f)
    out = {"MAE": float(err.mean()),
           "MAPE": mape_pct(err, y),
           "sMAPE": float(100 * (2 * err / np.maximum(np.abs(y) + np.abs(f), 1e-9)).mean())}
    if ref is not None:
        out["MASE"] = _ratio(out["MAE"], float(np.abs(y - np.asarray(ref)).mean()))
    return out


def mape_pct(err: np.ndarray, actual: np.ndarray) -> float:
    """100 * mean(err / |actual|) over the points whose actual is not zero (see the module
    docstring); nan where none is. No floor: the figure does not depend on the unit."""
    a = np.abs(np.asarray(actual, dtype=np.float64))
    keep = a > 0
    if not keep.any():
        return float("nan")
    with np.errstate(over="ignore"):  # err / a past 1e308 is inf: a figure, not a warning
        return float(100 * (np.asarray(err, dtype=np.float64)[keep] / a[keep]).mean())


def _ratio(mae: float, ref_mae: float) -> float:
    """``mae / ref_mae``; nan (undefined) where the reference made no error."""
    return mae / ref_mae if ref_mae > 0 else float("nan")


def _aggregate(w: Windows, arr: np.ndarray) -> np.ndarray:
    """Sum ``arr`` [N, K] over windows with the same origin time -> [T, K]."""
    _, inv = np.unique(w.origin_s, return_inverse=True)
    out = np.zeros((inv.max() + 1, arr.shape[1]))
    np.add.at(out, inv, arr)
    return out


def evaluate(forecasters: Sequence[Any], test: Windows,
             season: int = DAY_STEPS_5MIN) -> dict[str, Any]:
    """Per forecaster and target: per-machine and aggregate metrics at the last horizon step."""
    y = test.future[:, -1, :]
    ref = SeasonalNaive(season).predict(test)[:, -1, :]
    y_agg, ref_agg = _aggregate(test, y), _aggregate(test, ref)
    _, per_origin = np.unique(test.origin_s, return_counts=True)
    out: dict[str, Any] = {"windows": len(test), "targets": list(test.targets), "models": {},
                           # how many machines each aggregate value sums (its noise level)
                           "machines_per_origin_median": float(np.median(per_origin))}
    for fc in forecasters:
        f = fc.predict(test)[:, -1, :]
        f_agg = _aggregate(test, f)
        row: dict[str, Any] = {}
        lo_hi = fc.interval(test) if hasattr(fc, "interval") else None
        for k, target in enumerate(test.targets):
            per = point_metrics(y[:, k], f[:, k], ref[:, k])
            agg = point_metrics(y_agg[:, k], f_agg[:, k], ref_agg[:, k])
            if lo_hi is not None:
                lo, hi = lo_hi[0][:, -1, k], lo_hi[1][:, -1, k]
                per["coverage"] = float(((y[:, k] >= lo) & (y[:, k] <= hi)).mean())
            row[target] = {"machine": per, "aggregate": agg}
        out["models"][fc.name] = row
    return out


def compare_to_best_baseline(res: dict[str, Any], baseline_names: Sequence[str]) -> None:
    """Add ``best_baseline`` (lowest per-machine MAE per target) and every model's
    ``MASE_vs_best`` (its MAE over that baseline's; nan where that baseline is exact, see
    the module docstring) to an ``evaluate`` result."""
    res["best_baseline"] = {}
    for t in res["targets"]:
        best = min(baseline_names, key=lambda n: res["models"][n][t]["machine"]["MAE"])
        res["best_baseline"][t] = best
        ref = res["models"][best][t]["machine"]["MAE"]
        for row in res["models"].values():
            row[t]["machine"]["MASE_vs_best"] = _ratio(row[t]["machine"]["MAE"], ref)


def _shown(x: float, fmt: str) -> str:
    return "n/a" if np.isnan(x) else format(x, fmt)


def format_table(res: dict[str, Any]) -> str:
    lines = []
    undefined = False
    for target in res["targets"]:
        lines += [f"**{target}**, {res['windows']:,} test windows, error at the last horizon "
                  f"step; agg = sum over the machines at each origin (median "
                  f"{res['machines_per_origin_median']:.0f})", "",
                  "| model | MAE | MAPE % | sMAPE % | MASE | agg MAPE % | agg MASE | coverage |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, row in res["models"].items():
            m, a = row[target]["machine"], row[target]["aggregate"]
            cov = f"{100 * m['coverage']:.1f} %" if "coverage" in m else "-"
            undefined |= bool(np.isnan(m["MASE"]) or np.isnan(a["MASE"]))
            lines.append(f"| {name} | {m['MAE']:.3f} | {_shown(m['MAPE'], '.2f')} | "
                         f"{m['sMAPE']:.2f} | "
                         f"{_shown(m['MASE'], '.3f')} | {_shown(a['MAPE'], '.2f')} | "
                         f"{_shown(a['MASE'], '.3f')} | {cov} |")
        lines.append("")
    if undefined:
        lines += ["MASE n/a: seasonal naive forecast those points exactly (constant series), "
                  "so a ratio to its error is undefined.", ""]
    lines += ["MAPE leaves out the points whose actual is 0 (they have no percentage error; "
              "n/a when every one is); sMAPE and MAE count them.", ""]
    return "\n".join(lines)
