"""``smartsched forecast train`` and ``evaluate``: the same split, windows and metrics.

Owns the two commands. Both load the data the same way (the Google 2011 file
is recognized by its columns, anything else is a long table), split by series
with the same seed, train on the training split, stop early and calibrate on
the validation split, and evaluate on the test split. Baselines and the LSTM
are scored on the same test windows (their past is long enough for seasonal
naive, so only series of two days or more are scored).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smartsched.forecast.baselines import baselines, day_steps
from smartsched.forecast.data import Series, Split, load_google2011, load_long, split_by_series
from smartsched.forecast.windows import make_windows
from smartsched.model.errors import ValidationError


def load_any(path: str | Path) -> list[Series]:
    path = Path(path)
    try:
        head = (path.open(encoding="utf-8").readline()
                if path.suffix != ".parquet" and path.is_file() else "")
    except UnicodeDecodeError as e:
        raise ValidationError("data", f"{path} is not UTF-8 text (CSV) or Parquet: "
                              f"{e.reason} at byte {e.start}") from None
    if "vm_file" in head and "cpu_util_pct" in head:
        return load_google2011(path)
    return load_long(path)


def _split(path: str | Path, seed: int, series: list[Series] | None = None) -> Split:
    sp = split_by_series(load_any(path) if series is None else series, seed=seed)
    if not sp.train or not sp.val or not sp.test:
        from smartsched.model.errors import ValidationError

        raise ValidationError("data", "too few series for a train / validation / test split")
    return sp


def train_forecaster(data: str | Path, out: str | Path, *, epochs: int = 20, seed: int = 0,
                     lookback: int = 36, horizon: int = 3, hidden: int = 64,
                     split_seed: int = 0,
                     echo: Callable[[str], Any] = print) -> dict[str, Any]:
    import torch

    from smartsched.forecast.lstm import LSTMForecaster, LSTMSettings

    torch.set_num_threads(max(1, torch.get_num_threads()))
    sp = _split(data, split_seed)
    tr = make_windows(sp.train, lookback, horizon, stride=2)
    va = make_windows(sp.val, lookback, horizon, stride=3)
    echo(f"{len(sp.train)} / {len(sp.val)} / {len(sp.test)} series (train / val / test); "
         f"{len(tr):,} training windows")
    fc = LSTMForecaster(LSTMSettings(lookback=lookback, horizon=horizon, epochs=epochs,
                                     hidden=hidden, seed=seed))
    fc.fit(tr, va, progress=lambda line: echo("  " + line))
    folder = fc.save(out)
    meta = json.loads((folder / "forecaster.json").read_text())
    meta["data"] = {"path": str(data), "split_seed": split_seed}
    (folder / "forecaster.json").write_text(json.dumps(meta, indent=2) + "\n")
    echo(f"saved {folder} (interval scale {fc.s.interval_scale})")
    return {"model": str(folder), "epochs_run": len(fc.s.history),
            "interval_scale": fc.s.interval_scale, "history": fc.s.history}


def evaluate_forecaster(model: str | Path | None, data: str | Path, *, split_seed: int = 0,
                        plot: str | Path | None = None) -> dict[str, Any]:
    from smartsched.forecast.evaluate import compare_to_best_baseline, evaluate

    horizon = 3
    fcs: list[Any] = []
    series = load_any(data)
    if model is not None:
        from smartsched.forecast.lstm import LSTMForecaster

        lstm = LSTMForecaster.load(model)
        horizon = lstm.s.horizon
        series = _for_model(series, lstm.s.targets, lstm.s.step_s, model, data)
    season = day_steps(series)
    sp = _split(data, split_seed, series)
    # Windows long enough for seasonal naive and for the model's own lookback: one that
    # looks back further than the windows sliced the past short and built time features
    # for its whole lookback per window (a model of lookback 10,000 took 24 GB, then died).
    lookback = max(season + horizon, lstm.s.lookback if model is not None else 0)
    train_w = make_windows(sp.train, lookback, horizon, stride=3)
    for b in baselines(season):
        b.fit(train_w)
        fcs.append(b)
    if model is not None:
        fcs.append(lstm)
    test = make_windows(sp.test, lookback, horizon)
    if len(test) == 0:
        from smartsched.model.errors import ValidationError

        raise ValidationError("data", f"no test series is {lookback + horizon} steps long")
    res = evaluate(fcs, test, season=season)
    res["split"] = {"train": len(sp.train), "val": len(sp.val), "test": len(sp.test)}
    compare_to_best_baseline(res, [b.name for b in fcs if b.name != "LSTM"])
    if plot is not None and model is not None:
        _plot(plot, test, lstm, sp)
    return res


def _for_model(series: list[Series], targets: tuple[str, ...], step_s: float,
               model: str | Path, data: str | Path) -> list[Series]:
    """``series`` with the columns a trained model reads, in its order: it was trained on
    ``targets`` (by name) at ``step_s``, and applied to other columns, or to the same ones
    in another order or at another step, it runs and prints figures that mean nothing."""
    have = series[0].targets
    missing = [t for t in targets if t not in have]
    if missing:
        raise ValidationError(missing[0], f"missing column: the model at {model} was trained "
                              f"on targets {list(targets)}, the data has {list(have)}",
                              source=str(data))
    for s in series:
        if abs(s.step_s - step_s) > 1e-6 * step_s:
            raise ValidationError("step_s", f"series {s.id!r} is sampled every "
                                  f"{s.step_s:g} s; the model at {model} was trained on "
                                  f"{step_s:g} s steps", source=str(data))
    idx = [have.index(t) for t in targets]
    return [Series(s.id, s.start_s, s.step_s, tuple(targets), s.values[:, idx])
            for s in series]


def _plot(path: str | Path, test: Any, lstm: Any, sp: Split, n: int = 3) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    series_ids = np.unique(test.series)[:n]
    fig, axes = plt.subplots(len(series_ids), 1, figsize=(9, 2.6 * len(series_ids)),
                             squeeze=False)
    f = lstm.predict(test)[:, -1, 0]
    lo, hi = (x[:, -1, 0] for x in lstm.interval(test))
    for ax, sid in zip(axes[:, 0], series_ids, strict=True):
        sel = np.flatnonzero(test.series == sid)[:288]
        h = (test.origin_s[sel] + test.step_s * lstm.s.horizon) / 3600
        ax.plot(h, test.future[sel, -1, 0], "k", lw=1, label="actual")
        ax.plot(h, f[sel], "tab:blue", lw=1, label="LSTM (15 min ahead)")
        ax.fill_between(h, lo[sel], hi[sel], color="tab:blue", alpha=0.2, label="80 % interval")
        ax.set_title(sp.test[sid].id, fontsize=9)
        ax.set_ylabel(f"{test.targets[0]} %")
    axes[0, 0].legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("hours")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
