"""One MEC site's learner: it trains on its own nodes' usage, and only weights leave it.

Owns a site's private data and the three things the cloud may ask of it, each
answered with model weights or aggregate counts, never a record:

* ``train(global, epochs, mu)`` -- start from the global model, run local epochs
  over its own training windows (FedProx's proximal term when ``mu > 0``), and
  send back the new weights and how many windows they were trained on;
* ``errors(global, split)`` -- sums of absolute errors per target and the
  window count on its validation or test windows (the cloud divides sums);
* ``coverage(global, scales)`` -- for each interval width factor, how many
  validation actuals the 80 % interval would cover (the cloud calibrates the
  interval from the summed counts, as ``LSTMForecaster.calibrate`` does on
  pooled data).

The model is the load forecaster (``forecast.lstm``) that load-aware placement
plans on: each site's nodes' usage is what it learns from. The site reads its
data itself (a path and the ids it holds), so under Ray the records exist only
inside the site's actor. ``SiteLearner`` is a plain class; ``site_actor`` wraps
it as a Ray actor.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from smartsched.federation.wire import decode_weights, encode_weights
from smartsched.forecast.data import Series, split_by_series
from smartsched.forecast.lstm import LSTMForecaster, LSTMSettings
from smartsched.forecast.windows import Windows, make_windows
from smartsched.model.errors import ValidationError

SPLITS = ("val", "test")


def model_shapes(settings: LSTMSettings, targets: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every array of the forecaster's network."""
    from smartsched.forecast.lstm import _net

    return {k: tuple(v.shape) for k, v in _net(settings, targets).state_dict().items()}


class SiteLearner:
    """A site's data and its local training; every answer is weights or counts."""

    def __init__(self, site: str, source: str | Path | Sequence[Series],
                 series_ids: Sequence[str] | None, settings: dict[str, Any], *,
                 split_seed: int = 0, stride: int = 2, seed: int = 0,
                 threads: int | None = None) -> None:
        """``source``: a data file (read here, inside the site) or series already in this
        process; ``series_ids``: the ones this site holds (None: all). ``settings``: the
        forecaster's ``LSTMSettings`` fields, the same at every site."""
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        if not isinstance(site, str) or not site:
            raise ValidationError("site", f"must be a non-empty name, got {site!r}")
        self.site = site
        if isinstance(source, str | Path):
            from smartsched.forecast.run import load_any

            series = load_any(source)
        else:
            series = list(source)
        if series_ids is not None:
            keep = set(series_ids)
            series = [s for s in series if s.id in keep]
        if not series:
            raise ValidationError(f"sites.{site}", "holds no series")
        self.settings = LSTMSettings(**settings)
        s = self.settings
        sp = split_by_series(series, seed=split_seed)
        self.windows: dict[str, Windows] = {}
        for name, part, step in (("train", sp.train, stride), ("val", sp.val, 1),
                                 ("test", sp.test, 1)):
            self.windows[name] = (make_windows(part, s.lookback, s.horizon, step) if part
                                  else _empty(series[0], s))
        if not len(self.windows["train"]):
            raise ValidationError(f"sites.{site}", f"no training window of {s.lookback} + "
                                  f"{s.horizon} steps")
        self.fc = LSTMForecaster(LSTMSettings(**{**asdict(s), "history": []}))
        self.fc.init_net(self.windows["train"])
        self.shapes = {k: tuple(v.shape) for k, v in self.fc.net.state_dict().items()}
        self.data = self.fc.training_tensors(self.windows["train"])
        self.rng = np.random.default_rng([seed, _stable_hash(site)])

    # What the cloud may ask. Inputs are weights; outputs are weights or counts.
    def describe(self) -> dict[str, Any]:
        """What the cloud needs to build the model: the targets, the sampling step and
        the window count per split (the FedAvg weight is the training count)."""
        w = self.windows["train"]
        return {"site": self.site, "targets": list(w.targets), "step_s": float(w.step_s),
                "windows": {k: len(v) for k, v in self.windows.items()}}

    def train(self, weights: bytes, epochs: int = 1, mu: float = 0.0) -> dict[str, Any]:
        import torch

        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValidationError("local_epochs", f"must be an integer >= 1, got {epochs!r}")
        if not (isinstance(mu, int | float) and np.isfinite(mu) and mu >= 0):
            raise ValidationError("mu", f"must be >= 0, got {mu!r}")
        t0 = time.perf_counter()
        self._load(weights)
        anchor = ({k: v.detach().clone() for k, v in self.fc.net.named_parameters()}
                  if mu > 0 else None)
        opt = torch.optim.Adam(self.fc.net.parameters(), lr=self.settings.lr)
        loss = 0.0
        for _ in range(epochs):
            loss = self.fc.train_epoch(self.data, opt, self.rng, anchor, float(mu))
        out = {k: v.detach().numpy() for k, v in self.fc.net.state_dict().items()}
        return {"site": self.site, "weights": encode_weights(out),
                "samples": len(self.windows["train"]), "train_pinball": float(loss),
                "seconds": time.perf_counter() - t0}

    def errors(self, weights: bytes, split: str = "val") -> dict[str, Any]:
        """Sum of |median forecast - actual| at the last horizon step, per target."""
        w = self._split(split)
        self._load(weights)
        return {"site": self.site, **error_sums(self.fc, w)}

    def coverage(self, weights: bytes, scales: Sequence[float]) -> dict[str, Any]:
        """Per target and width factor: validation actuals inside the scaled interval."""
        w = self.windows["val"]
        self._load(weights)
        c = np.asarray(scales, dtype=np.float64)
        if not len(w):
            return {"site": self.site, "covered": [[0] * len(c)] * len(w.targets), "count": 0}
        q = self.fc._quantiles(w)[:, -1]  # [N, K, 3]
        y = w.future[:, self.settings.horizon - 1]  # [N, K]
        lo = q[..., 1:2] - c * (q[..., 1:2] - q[..., 0:1])  # [N, K, S]
        hi = q[..., 1:2] + c * (q[..., 2:3] - q[..., 1:2])
        inside = (y[..., None] >= lo) & (y[..., None] <= hi)
        return {"site": self.site, "covered": inside.sum(axis=0).astype(int).tolist(),
                "count": len(w)}

    # ----------------------------------------------------------------- internals
    def _split(self, split: str) -> Windows:
        if split not in SPLITS:
            raise ValidationError("split", f"must be one of {SPLITS}, got {split!r}")
        return self.windows[split]

    def _load(self, weights: bytes) -> None:
        import torch

        arrays = decode_weights(weights, self.shapes, field="global_model")
        self.fc.net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in arrays.items()})


def error_sums(fc: LSTMForecaster, w: Windows) -> dict[str, Any]:
    """``abs_err``: per target, the sum of |median forecast - actual| at the last horizon
    step over ``w``; ``count``: the windows (the MAE is their ratio, pooled over sites)."""
    if not len(w):
        return {"abs_err": [0.0] * len(w.targets), "count": 0}
    err = np.abs(fc.predict(w)[:, -1] - w.future[:, fc.s.horizon - 1])
    return {"abs_err": err.sum(axis=0).astype(float).tolist(), "count": len(w)}


def _empty(like: Series, s: LSTMSettings) -> Windows:
    k = like.values.shape[1]
    return Windows(np.zeros((0, s.lookback, k), np.float32), np.zeros((0, s.horizon, k),
                   np.float32), np.zeros(0), np.zeros(0, int), like.step_s, like.targets)


def _stable_hash(text: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")


def site_actor(num_cpus: float = 0.5) -> Any:
    """``SiteLearner`` as a Ray actor class (one per MEC site)."""
    import ray

    return ray.remote(num_cpus=num_cpus)(SiteLearner)
