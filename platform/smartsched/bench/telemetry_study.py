"""``smartsched telemetry reduce``: fit the projection on twin runs and ablate the families.

Owns the evidence behind the reduced telemetry features. It runs the twin
under a scheduler for a few seeds, records every node's wide telemetry at each
metric tick (counters as rates), fits the PCA projection on the training seeds,
and measures on a held-out seed which metric families carry information the
policy's plain features do not: a ridge regression predicts each node's CPU
and GPU utilization ``horizon_ticks`` ahead from (a) the node's current
CPU / memory / GPU utilization alone (what the policy already observes), (b)
those plus all telemetry, (c) plus all telemetry but one family, and (d) plus
the k projected components. The drop in held-out R^2 when a family is left out
is what it adds beyond the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from smartsched.model.errors import ValidationError
from smartsched.model.resources import CPU, GPU, MEM
from smartsched.twin.telemetry.reduction import (
    Z_CLIP,
    RateView,
    TelemetryProjection,
    counter_mask,
    fit_projection,
)


@dataclass
class Recording:
    """Per tick: telemetry [T, N, D] (rates), utilization [T, N, 3], for one run."""

    X: np.ndarray
    util: np.ndarray


class _Recorder:
    """Engine hook: record the rated telemetry and utilization at every tick."""

    def __init__(self, spec: Any, seed: int, layout: Any) -> None:
        from smartsched.twin.telemetry.catalogue import dimensions
        from smartsched.twin.telemetry.synth import TelemetrySynth

        self.synth = TelemetrySynth(spec, seed, layout)
        self.rates = RateView(counter_mask(dimensions(layout)))
        self.X: list[np.ndarray] = []
        self.util: list[np.ndarray] = []

    def update(self, engine: Any) -> None:
        st = engine.state
        self.X.append(self.rates(self.synth.sample(engine), float(engine.now)).astype(np.float32))
        cap = np.maximum(st.capacity[:, [CPU, MEM, GPU]].astype(np.float64), 1.0)
        self.util.append((st.usage / cap).astype(np.float32))
        return None


def record(cluster: str, workload: str, scheduler: str, hours: float, seed: int,
           layout: Any = None) -> Recording:
    """Run the twin once and record its telemetry at every metric tick."""
    from smartsched.scheduling.run import build_run
    from smartsched.twin.telemetry.catalogue import Layout

    run = build_run(cluster, workload, scheduler, seed=seed, hours=hours)
    rec = _Recorder(run.cluster, seed, layout or Layout.STANDARD)
    run.engine.telemetry_features = rec  # the study's own hook: record at every tick
    run.drive()
    if len(rec.X) < 2:
        from smartsched.model.errors import ValidationError

        raise ValidationError("hours", f"{hours} h gives {len(rec.X)} metric tick(s); "
                              "counter rates need two")
    return Recording(np.stack(rec.X[1:]), np.stack(rec.util[1:]))  # first: no rates yet


def _pairs(recs: Sequence[Recording], horizon: int) -> tuple[np.ndarray, ...]:
    """Rows (tick t, node) -> telemetry at t, utilization at t, utilization at t + horizon."""
    X, now, fut = [], [], []
    for r in recs:
        T = len(r.X) - horizon
        if T <= 0:
            continue
        X.append(r.X[:T].reshape(-1, r.X.shape[2]))
        now.append(r.util[:T].reshape(-1, 3))
        fut.append(r.util[horizon:].reshape(-1, 3))
    if not X:
        from smartsched.model.errors import ValidationError

        raise ValidationError("hours", "runs too short for the prediction horizon")
    return np.concatenate(X), np.concatenate(now), np.concatenate(fut)


ALPHAS = (0.1, 1.0, 10.0, 100.0, 1_000.0, 10_000.0)


def _ridge_fit(A: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    A1 = np.hstack([A, np.ones((len(A), 1))])
    reg = alpha * np.eye(A1.shape[1])
    reg[-1, -1] = 0.0  # the intercept is not shrunk
    return np.linalg.solve(A1.T @ A1 + reg, A1.T @ y)


def _r2(A: np.ndarray, w: np.ndarray, y: np.ndarray) -> float:
    pred = np.hstack([A, np.ones((len(A), 1))]) @ w
    ss = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - pred) ** 2).sum()) / max(ss, 1e-12)


def _ridge_r2(A: np.ndarray, y: np.ndarray, A_test: np.ndarray, y_test: np.ndarray) -> float:
    """Held-out R^2 of ridge regression on standardized inputs; the penalty is chosen on
    the training rows alone (fit on the first 80 %, scored on the last 20 %)."""
    mu, sd = A.mean(axis=0), A.std(axis=0)
    sd = np.where(sd > 1e-9, sd, 1.0)
    Z = np.clip((A - mu) / sd, -Z_CLIP, Z_CLIP)
    Zt = np.clip((A_test - mu) / sd, -Z_CLIP, Z_CLIP)
    cut = int(0.8 * len(Z))
    best = max(ALPHAS, key=lambda a: _r2(Z[cut:], _ridge_fit(Z[:cut], y[:cut], a), y[cut:]))
    return _r2(Zt, _ridge_fit(Z, y, best), y_test)


def study(cluster: str, workload: str, scheduler: str, hours: float,
          train_seeds: Sequence[int], test_seed: int, k: int = 8, horizon_ticks: int = 3,
          echo: Callable[[str], Any] = print) -> tuple[TelemetryProjection, dict[str, Any]]:
    from smartsched.twin.telemetry.catalogue import Layout, column_names, dimensions

    layout = Layout.STANDARD
    names = column_names(layout)
    # Checked before the recordings: the projection refused a bad k only after them all.
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(names):
        raise ValidationError("components", f"must be an integer in 1..{len(names)} (the "
                              f"telemetry's columns), got {k!r}")
    if test_seed in train_seeds:  # its "held-out" R^2 would be measured on training rows
        raise ValidationError("test_seed", f"seed {test_seed} is also a training seed; "
                              "give a held-out seed")
    families = np.array([d.metric.family for d in dimensions(layout)])
    train = []
    for s in train_seeds:
        echo(f"recording {cluster} / {workload} / {scheduler}, seed {s}")
        train.append(record(cluster, workload, scheduler, hours, s, layout))
    echo(f"recording held-out seed {test_seed}")
    test = record(cluster, workload, scheduler, hours, test_seed, layout)
    X, now, fut = _pairs(train, horizon_ticks)
    Xt, now_t, fut_t = _pairs([test], horizon_ticks)
    proj = fit_projection(X.astype(np.float64), names, k)

    targets = {"cpu": 0, "gpu": 2}
    gpu_col = names.index('DCGM_FI_DEV_GPU_UTIL{gpu="0"}')
    res: dict[str, Any] = {"rows": {"train": len(X), "test": len(Xt)}, "k": k,
                           "explained": [float(x) for x in proj.explained],
                           "horizon_ticks": horizon_ticks, "targets": {}}
    for tname, j in targets.items():
        if tname == "gpu":  # only nodes that have GPUs
            rows, rows_t = np.isfinite(X[:, gpu_col]), np.isfinite(Xt[:, gpu_col])
        else:
            rows, rows_t = np.ones(len(X), bool), np.ones(len(Xt), bool)
        if rows.sum() < 10 or rows_t.sum() < 10:
            continue
        res["targets"][tname] = _ablate(
            proj, families, (X[rows], now[rows], fut[rows, j]),
            (Xt[rows_t], now_t[rows_t], fut_t[rows_t, j]))
    res["loadings"] = [proj.top_loadings(c, 4) for c in range(k)]
    return proj, res


def _ablate(proj: TelemetryProjection, families: np.ndarray,
            train: tuple[np.ndarray, ...], test: tuple[np.ndarray, ...]) -> dict[str, Any]:
    """Held-out R^2 with the plain features, + all telemetry, + all but each family,
    + the projection's components. ``train`` / ``test``: (telemetry, utilization now,
    target)."""
    (X, now, y), (Xt, now_t, yt) = train, test
    Z = proj.standardize(X.astype(np.float64))
    Zt = proj.standardize(Xt.astype(np.float64))

    def r2(keep: np.ndarray | None) -> float:
        if keep is None:
            return _ridge_r2(now, y, now_t, yt)
        return _ridge_r2(np.hstack([now, Z[:, keep]]), y, np.hstack([now_t, Zt[:, keep]]), yt)

    comps = _ridge_r2(np.hstack([now, proj.transform(X)]), y,
                      np.hstack([now_t, proj.transform(Xt)]), yt)
    return {"plain": r2(None), "all telemetry": r2(np.ones(len(families), bool)),
            f"{proj.k} components": comps,
            "without": {f: r2(families != f) for f in sorted(set(families))}}


def format_study(res: dict[str, Any]) -> str:
    if not res["targets"]:
        return "too few nodes or ticks for the ablation (under 10 rows per split)"
    lines = [f"held-out R^2 of each node's utilization {res['horizon_ticks']} ticks ahead "
             f"({res['rows']['train']:,} training rows, {res['rows']['test']:,} held-out)", "",
             "| inputs | " + " | ".join(res["targets"]) + " |",
             "|---|" + "---:|" * len(res["targets"])]
    keys = ["plain", "all telemetry", f"{res['k']} components"]
    labels = {"plain": "current CPU/mem/GPU utilization only",
              "all telemetry": "+ all telemetry",
              f"{res['k']} components": f"+ {res['k']} PCA components only"}
    for key in keys:
        lines.append(f"| {labels[key]} | " + " | ".join(
            f"{t[key]:.3f}" for t in res["targets"].values()) + " |")
    fams = next(iter(res["targets"].values()))["without"]
    for f in fams:
        lines.append(f"| + all telemetry but {f} | " + " | ".join(
            f"{t['without'][f]:.3f}" for t in res["targets"].values()) + " |")
    lines += ["", "PCA: share of variance and the largest loadings per component", ""]
    for c, (ex, load) in enumerate(zip(res["explained"], res["loadings"], strict=True)):
        top = ", ".join(f"{n} ({w:+.2f})" for n, w in load)
        lines.append(f"- PC{c + 1} ({100 * ex:.1f} %): {top}")
    return "\n".join(lines)
