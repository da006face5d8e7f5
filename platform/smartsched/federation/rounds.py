"""The cloud's side of federated training: rounds of send, local training, FedAvg.

Owns the protocol and its record. Each round the global model goes down to every
site as bytes, each site trains on its own windows and sends its weights back,
and the cloud averages them by training-sample count (``aggregate.fedavg``).
After each round the sites report error sums on their validation and test
windows; the global model with the lowest validation error (mean over targets)
is kept (early stopping on pooled validation, as the central trainer does). At the end the
80 % interval is calibrated from the sites' summed coverage counts. The record
holds what a round costs: bytes down and up, and its wall time.

Sites are anything with ``train`` / ``errors`` / ``coverage``
methods (and ``describe``) called as ``site.method.remote(...)``: Ray actor handles
(``site.site_actor``) or ``InProcess`` wrappers for tests and single-process
runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from smartsched.federation import MAX_LOCAL_EPOCHS, MAX_ROUNDS
from smartsched.federation.aggregate import fedavg
from smartsched.federation.wire import decode_weights, encode_weights
from smartsched.forecast.lstm import LSTMForecaster, LSTMSettings
from smartsched.model.errors import ValidationError

SCALES = np.geomspace(0.05, 20.0, 241)  # the interval width factors the sites count over


class InProcess:
    """A local object called like a Ray actor handle (``obj.method.remote(...)``)."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._obj, name)

        class _Remote:
            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> Any:
                return fn(*args, **kwargs)

        return _Remote


def _get(values: list[Any]) -> list[Any]:
    try:
        import ray
        from ray import ObjectRef
    except ImportError:  # pragma: no cover - ray is a dependency
        return values
    if values and isinstance(values[0], ObjectRef):
        return ray.get(values)
    return values


@dataclass
class FederatedRun:
    """The trained global model and the record of every round."""

    forecaster: LSTMForecaster
    rounds: list[dict[str, Any]] = field(default_factory=list)
    best_round: int = 0
    sites: dict[str, dict[str, int]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"config": self.config, "sites": self.sites, "best_round": self.best_round,
                "interval_scale": self.forecaster.s.interval_scale, "rounds": self.rounds}


def federate(sites: Mapping[str, Any], settings: LSTMSettings, *,
             rounds: int = 20, local_epochs: int = 1, mu: float = 0.0,
             server_momentum: float = 0.0,
             echo: Callable[[str], Any] | None = None) -> FederatedRun:
    """Train the forecaster across ``sites`` (name -> handle) for ``rounds`` rounds.
    ``mu > 0``: FedProx's proximal term at the sites. ``server_momentum > 0``: FedAvgM
    (Hsu et al., 2019), the cloud steps along a running sum of the averaged updates
    instead of jumping to the average, which damps the drift between non-IID sites."""
    import torch

    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= MAX_ROUNDS:
        raise ValidationError("rounds", f"must be an integer in 1..{MAX_ROUNDS}, got {rounds!r}")
    if (isinstance(local_epochs, bool) or not isinstance(local_epochs, int)
            or not 1 <= local_epochs <= MAX_LOCAL_EPOCHS):
        raise ValidationError("local_epochs", f"must be an integer in 1..{MAX_LOCAL_EPOCHS}, "
                              f"got {local_epochs!r}")
    if not (isinstance(mu, int | float) and np.isfinite(mu) and mu >= 0):
        raise ValidationError("mu", f"must be >= 0, got {mu!r}")
    if not (isinstance(server_momentum, int | float) and 0 <= server_momentum < 1):
        raise ValidationError("server_momentum", f"must be within [0, 1), got "
                              f"{server_momentum!r}")
    if not sites:
        raise ValidationError("sites", "no site to federate")
    names = list(sites)
    handles = [sites[n] for n in names]
    described = _get([h.describe.remote() for h in handles])
    kinds = {(tuple(d["targets"]), d["step_s"]) for d in described}
    if len(kinds) != 1:
        raise ValidationError("sites", f"sites disagree on targets / step: {sorted(kinds)}")
    targets, step_s = kinds.pop()
    fc = LSTMForecaster(LSTMSettings(**{**asdict(settings), "history": [],
                                        "targets": targets, "step_s": step_s}))
    torch.manual_seed(fc.s.seed)
    from smartsched.forecast.lstm import _net

    fc.net = _net(fc.s, len(targets))
    shapes = {k: tuple(v.shape) for k, v in fc.net.state_dict().items()}
    current = {k: v.detach().numpy().copy() for k, v in fc.net.state_dict().items()}
    sizes = {n: d["windows"] for n, d in zip(names, described, strict=True)}
    run = FederatedRun(fc, sites=sizes, config={
        "rounds": rounds, "local_epochs": local_epochs, "mu": float(mu),
        "server_momentum": float(server_momentum),
        "algorithm": ("fedprox" if mu > 0 else "fedavg") + ("m" if server_momentum else ""),
        "sites": names,
        "parameters": int(sum(np.prod(s) for s in shapes.values()))})
    best_val, best = np.inf, current
    velocity: dict[str, Any] = {}
    for r in range(1, rounds + 1):
        t0 = time.perf_counter()
        down = encode_weights(current)
        ups = _get([h.train.remote(down, local_epochs, float(mu)) for h in handles])
        updates = [(decode_weights(u["weights"], shapes, field=f"sites.{n}.update"),
                    u["samples"]) for n, u in zip(names, ups, strict=True)]
        avg = fedavg(updates)
        if server_momentum > 0:
            for k in avg:
                velocity[k] = (server_momentum * velocity.get(k, 0.0)
                               + (avg[k] - current[k])).astype(np.float32)
            current = {k: (current[k] + velocity[k]).astype(np.float32) for k in avg}
        else:
            current = avg
        train_s = time.perf_counter() - t0
        blob = encode_weights(current)
        val = _pooled(_get([h.errors.remote(blob, "val") for h in handles]))
        test = _pooled(_get([h.errors.remote(blob, "test") for h in handles]))
        rec = {"round": r, "seconds": time.perf_counter() - t0, "train_seconds": train_s,
               "bytes_down": len(down) * len(handles),
               "bytes_up": sum(len(u["weights"]) for u in ups),
               "train_pinball": float(np.average([u["train_pinball"] for u in ups],
                                                 weights=[u["samples"] for u in ups])),
               "val_mae": val, "test_mae": test,
               "site_seconds": {n: u["seconds"] for n, u in zip(names, ups, strict=True)}}
        run.rounds.append(rec)
        score = float(np.mean(val)) if val else np.inf  # as the central trainer stops
        if score < best_val - 1e-9:
            best_val, best, run.best_round = score, current, r
        if echo:
            echo(f"round {r}: val MAE {_fmt(val)}, test MAE {_fmt(test)}, "
                 f"{rec['bytes_up'] / 1e3:.0f} kB up, {rec['seconds']:.1f} s")
    if run.best_round == 0:
        best, run.best_round = current, rounds
    fc.net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in best.items()})
    fc.s.interval_scale = calibrate_from_counts(
        _get([h.coverage.remote(encode_weights(best), SCALES.tolist()) for h in handles]))
    return run


def _pooled(reports: list[dict[str, Any]]) -> list[float]:
    n = sum(r["count"] for r in reports)
    if n == 0:
        return []
    return (np.sum([r["abs_err"] for r in reports], axis=0) / n).astype(float).tolist()


def calibrate_from_counts(reports: list[dict[str, Any]], target: float = 0.8) -> list[float]:
    """The smallest width factor per target whose summed coverage reaches ``target``."""
    n = sum(r["count"] for r in reports)
    if n == 0:
        return []
    covered = np.sum([r["covered"] for r in reports], axis=0) / n  # [K, S]
    out = []
    for row in covered:
        ok = np.flatnonzero(row >= target)
        out.append(float(SCALES[ok[0]] if ok.size else SCALES[-1]))
    return out


def _fmt(v: list[float]) -> str:
    return " / ".join(f"{x:.3f}" for x in v) if v else "-"
