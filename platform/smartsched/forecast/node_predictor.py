"""Per-node predicted usage for the scheduler: the forecaster attached to a cluster.

Owns turning a trained forecaster into ``ClusterState.predicted_usage``. At
every usage sample (a twin metric tick, or a telemetry scrape in production)
it appends each node's CPU and memory utilization (%) to a rolling window and,
once ``lookback`` samples exist, predicts the next ``horizon`` steps for all
nodes in one batch. By default the scheduler plans on a pessimistic value: the
upper end of the 80 % interval, maximized over the horizon -- so load-aware
placement and best-effort overcommit back off before a predicted surge, not
after it. ``plan="median"`` plans on the median forecast instead (maximized
over the horizon), which backs off less. A forecaster is named by its folder,
optionally with the plan: ``models/forecast?plan=median``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from smartsched.forecast.lstm import LSTMForecaster
from smartsched.forecast.windows import Windows
from smartsched.model.errors import ValidationError
from smartsched.model.resources import CPU, MEM

PLANS = ("upper", "median")


def load_forecaster(spec: str | Path) -> tuple[LSTMForecaster, str]:
    """``FOLDER[?plan=upper|median]`` -> (forecaster, plan)."""
    folder, _, query = str(spec).partition("?")
    plan = "upper"
    for part in filter(None, query.split("&")):
        key, _, value = part.partition("=")
        if key != "plan":
            raise ValidationError("forecaster", f"unknown option {key!r} (known: plan)")
        if value not in PLANS:
            raise ValidationError("forecaster.plan", f"must be one of {PLANS}, got {value!r}")
        plan = value
    return LSTMForecaster.load(folder), plan


class NodeUsagePredictor:
    def __init__(self, forecaster: LSTMForecaster, sample_step_s: float,
                 plan: str = "upper") -> None:
        if plan not in PLANS:
            raise ValidationError("forecaster.plan", f"must be one of {PLANS}, got {plan!r}")
        self.plan = plan
        s = forecaster.s
        if tuple(s.targets[:2]) != ("cpu", "mem"):
            raise ValidationError("forecaster", f"needs cpu and mem targets, has {s.targets}")
        if abs(sample_step_s - s.step_s) > 1e-6:
            raise ValidationError("forecaster", f"trained on {s.step_s:.0f} s steps; usage is "
                                  f"sampled every {sample_step_s:.0f} s")
        self.fc = forecaster
        self.buf: np.ndarray | None = None  # [N, L, 2] utilization %
        self.seen = 0

    @staticmethod
    def load(spec: str | Path, sample_step_s: float) -> NodeUsagePredictor:
        """From ``FOLDER[?plan=upper|median]``."""
        fc, plan = load_forecaster(spec)
        return NodeUsagePredictor(fc, sample_step_s, plan)

    def update(self, now: float, state: object) -> np.ndarray | None:
        """Record the nodes' usage now; return [N, 2] predicted cpu (milli) and memory (MiB)
        in use over the next horizon (None until a full lookback has been seen)."""
        cap = np.maximum(state.capacity[:, [CPU, MEM]].astype(np.float64), 1.0)
        util = (100.0 * state.usage[:, :2] / cap).astype(np.float32)
        L = self.fc.s.lookback
        if self.buf is None or self.buf.shape[0] != util.shape[0]:
            self.buf, self.seen = np.zeros((util.shape[0], L, 2), np.float32), 0
        self.buf = np.roll(self.buf, -1, axis=1)
        self.buf[:, -1] = util
        self.seen += 1
        if self.seen < L:
            return None
        n, h = util.shape[0], self.fc.s.horizon
        w = Windows(self.buf, np.zeros((n, h, 2), np.float32), np.full(n, float(now)),
                    np.arange(n), self.fc.s.step_s, ("cpu", "mem"))
        planned = self.fc.predict(w) if self.plan == "median" else self.fc.interval(w)[1]
        peak = np.clip(planned.max(axis=1), 0.0, 400.0)  # [N, 2] %, worst step of the horizon
        return peak / 100.0 * cap
