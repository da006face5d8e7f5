"""Feature reduction: the wide telemetry vector -> a few columns the policy can use.

Owns the PCA projection of the per-node telemetry, the sampler that attaches it
to the twin, and the ablation that says which metric families matter.

The policy's input must not grow with the catalogue (hundreds of columns per
node, many of them near-duplicates: three cache levels, two NICs, eight GPUs).
The projection standardizes each column (mean and spread over a twin run),
fills absent instances with the mean (a CPU node's GPU columns carry nothing),
and keeps the first ``k`` principal components. Counters enter as per-second
rates between two samples, gauges as they are.

``TelemetryFeatures`` is the twin's hook (``Engine.telemetry_features``): at
every metric tick it samples the synthesizer, projects, and stores the result
in ``ClusterState.telemetry_features`` [N, k], which the RL features append. In
production, ``smartsched.prometheus.features.features_from_prometheus`` reads the same
columns from Prometheus; the caller puts its result in ``ClusterState.telemetry_features``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from smartsched.model.errors import ValidationError
from smartsched.paths import read_regular_file

PROJECTION_FILE = "projection.npz"
PROJECTION_META = "projection.json"
# Standardized values are clipped: a column nearly constant in the fitting runs must not
# swamp the components when another cluster moves it.
Z_CLIP = 10.0


@dataclass
class TelemetryProjection:
    """Standardize, mean-impute, project onto ``components`` [k, D]."""

    columns: list[str]
    mean: np.ndarray
    scale: np.ndarray
    components: np.ndarray
    explained: np.ndarray  # share of variance of each component

    @property
    def k(self) -> int:
        return int(self.components.shape[0])

    def standardize(self, X: np.ndarray) -> np.ndarray:
        if X.shape[-1] != len(self.columns):
            raise ValidationError("telemetry", f"{X.shape[-1]} columns, the projection was "
                                  f"fitted on {len(self.columns)}")
        Z = np.clip((X - self.mean) / self.scale, -Z_CLIP, Z_CLIP)
        return np.where(np.isnan(Z), 0.0, Z)

    def transform(self, X: np.ndarray) -> np.ndarray:
        """[N, D] -> [N, k] float32."""
        return (self.standardize(X) @ self.components.T).astype(np.float32)

    def top_loadings(self, component: int, n: int = 5) -> list[tuple[str, float]]:
        w = self.components[component]
        order = np.argsort(-np.abs(w))[:n]
        return [(self.columns[j], float(w[j])) for j in order]

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(folder / PROJECTION_FILE, mean=self.mean, scale=self.scale,
                            components=self.components, explained=self.explained)
        (folder / PROJECTION_META).write_text(json.dumps(
            {"columns": self.columns, "k": self.k,
             "explained": [round(float(x), 6) for x in self.explained]}, indent=1) + "\n")
        return folder

    @staticmethod
    def load(folder: str | Path) -> TelemetryProjection:
        folder = Path(folder)
        try:
            meta = json.loads(read_regular_file(folder / PROJECTION_META, 1 << 20))
            with np.load(folder / PROJECTION_FILE) as z:  # allow_pickle=False: data only
                arrays = {k: np.asarray(z[k], dtype=np.float64)
                          for k in ("mean", "scale", "components", "explained")}
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            # ValueError: not JSON, an object array (pickle, refused), not numbers
            raise ValidationError("telemetry", f"no telemetry projection at {folder}: "
                                  f"{type(e).__name__}: {str(e)[:200]}") from None
        columns = meta.get("columns") if isinstance(meta, dict) else None
        d = len(columns) if isinstance(columns, list) else 0
        a = arrays
        if not (d and all(isinstance(c, str) for c in columns)
                and a["mean"].shape == a["scale"].shape == (d,)
                and a["components"].ndim == 2 and a["components"].shape[1] == d
                and 1 <= a["components"].shape[0] <= d
                and a["explained"].shape == (a["components"].shape[0],)
                and all(np.isfinite(x).all() for x in a.values())
                and (a["scale"] > 0).all()):
            raise ValidationError("telemetry", f"{folder}: not a telemetry projection (its "
                                  "columns, means, scales and components must agree in size, "
                                  "be finite and the scales positive)")
        return TelemetryProjection(list(columns), a["mean"], a["scale"], a["components"],
                                   a["explained"])


def fit_projection(X: np.ndarray, columns: Sequence[str], k: int) -> TelemetryProjection:
    """PCA of samples ``X`` [M, D] (NaN = absent). A column's scale is at least 0.1 % of
    its mean (constant columns standardize to 0 and load on nothing)."""
    if X.ndim != 2 or X.shape[1] != len(columns):
        raise ValidationError("telemetry", f"samples of shape {X.shape} for {len(columns)} "
                              "columns")
    if not 1 <= k <= min(X.shape):
        raise ValidationError("components", f"must be in 1..{min(X.shape)}, got {k}")
    mean = np.nanmean(np.where(np.isnan(X).all(axis=0), 0.0, X), axis=0)
    std = np.nanstd(np.where(np.isnan(X).all(axis=0), 0.0, X), axis=0)
    scale = np.maximum(std, np.maximum(1e-3 * np.abs(mean), 1e-9))
    Z = np.clip((X - mean) / scale, -Z_CLIP, Z_CLIP)
    Z = np.where(np.isnan(Z), 0.0, Z)
    _, s, vt = np.linalg.svd(Z - Z.mean(axis=0), full_matrices=False)
    var = s ** 2
    explained = var / max(var.sum(), 1e-12)
    comps = vt[:k]
    # A fixed sign per component (largest loading positive): refits give the same features.
    signs = np.sign(comps[np.arange(k), np.argmax(np.abs(comps), axis=1)])
    comps = comps * signs[:, None]
    return TelemetryProjection(list(columns), mean, scale, comps, explained[:k])


class RateView:
    """Turns successive synthesizer samples into gauges + per-second counter rates."""

    def __init__(self, counters: np.ndarray) -> None:
        self.counters = np.asarray(counters, dtype=bool)
        self._prev: np.ndarray | None = None
        self._prev_t = 0.0

    def __call__(self, X: np.ndarray, t: float) -> np.ndarray:
        out = X.copy()
        if self._prev is None or t <= self._prev_t or self._prev.shape != X.shape:
            out[:, self.counters] = np.nan  # no rate yet: unknown (projects as the mean)
        else:
            out[:, self.counters] = (X[:, self.counters] - self._prev[:, self.counters]) / (
                t - self._prev_t)
        self._prev, self._prev_t = X, t
        return out


def counter_mask(dims: Sequence[Any]) -> np.ndarray:
    return np.array([d.metric.kind == "counter" for d in dims], dtype=bool)


class TelemetryFeatures:
    """The twin hook: at every metric tick, sample, rate, project -> state.telemetry_features."""

    def __init__(self, projection: TelemetryProjection, spec: Any, seed: int) -> None:
        from smartsched.twin.telemetry.catalogue import Layout
        from smartsched.twin.telemetry.synth import TelemetrySynth, column_names

        layout = _layout_for(projection, spec, Layout)
        self.synth = TelemetrySynth(spec, seed, layout)
        names = column_names(layout)
        if names != projection.columns:
            raise ValidationError("telemetry", "the projection was fitted on another "
                                  "telemetry layout (refit it for this cluster)")
        from smartsched.twin.telemetry.catalogue import dimensions

        self.rates = RateView(counter_mask(dimensions(layout)))
        self.projection = projection

    def update(self, engine: Any) -> np.ndarray:
        X = self.rates(self.synth.sample(engine), float(engine.now))
        return self.projection.transform(X)


def _layout_for(projection: TelemetryProjection, spec: Any, layout_cls: Any) -> Any:
    """The standard layout when the projection was fitted on it, else the cluster's."""
    from smartsched.twin.telemetry.synth import column_names

    std = layout_cls.STANDARD
    if column_names(std) == projection.columns:
        return std
    return layout_cls.for_cluster(spec)
