"""Load-aware scoring: place by what nodes actually use, not by what pods requested.

Like Koordinator's LoadAware and Trimaran's TargetLoadPacking, a node's load is
its measured usage (``ClusterState.usage``, sampled by the twin's metric ticks
or, in production, by telemetry) plus an estimate for pods placed since that
sample (their requests x ``estimated_scaling``), so a burst of placements
between two samples does not all land on one node. A ``predicted_usage``
array on the state (from the forecaster, later) replaces the measurement when
``use_prediction`` is set and the array is present.

  filter  node is rejected when est_r / capacity_r > threshold_r (0 disables)
  score   per resource (capacity_r - est_r - pod_r * scaling_r) * 100 / capacity_r,
          clamped at 0, weighted average over cpu and memory
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from smartsched.model.resources import CPU, MEM
from smartsched.scheduling.framework import MAX_NODE_SCORE, CycleContext


class _PerResource(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cpu: float = Field(ge=0, le=10)
    memory: float = Field(ge=0, le=10)


class LoadAwareArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    usage_thresholds: _PerResource = _PerResource(cpu=0.65, memory=0.95)
    estimated_scaling: _PerResource = _PerResource(cpu=0.85, memory=0.70)
    weights: _PerResource = _PerResource(cpu=1, memory=1)
    use_prediction: bool = True


class LoadAware:
    """Filter overloaded nodes and prefer the least actually-used ones."""

    name = "LoadAware"
    Args = LoadAwareArgs

    def __init__(self, args: LoadAwareArgs | None = None) -> None:
        self.args = args or LoadAwareArgs()
        if self.args.weights.cpu + self.args.weights.memory == 0:
            raise ValueError("weights: at least one must be > 0")

    def estimated_usage(self, ctx: CycleContext) -> np.ndarray:
        """[N, 2] estimated cpu (milli) and memory (MiB) in use now."""
        def compute() -> np.ndarray:
            st = ctx.state
            base = st.usage[:, :2]
            pred = getattr(st, "predicted_usage", None)
            if self.args.use_prediction and pred is not None:
                base = np.maximum(base, pred[:, :2])
            since = np.maximum(st.allocated[:, [CPU, MEM]] - st.usage_allocated[:, [CPU, MEM]], 0)
            scale = np.array([self.args.estimated_scaling.cpu, self.args.estimated_scaling.memory])
            return base + since * scale

        return ctx.cached("load_estimate", compute)

    def filter(self, ctx: CycleContext) -> np.ndarray:
        th = np.array([self.args.usage_thresholds.cpu, self.args.usage_thresholds.memory])
        frac = self.estimated_usage(ctx) / np.maximum(ctx.state.capacity[:, [CPU, MEM]], 1)
        return ~((th > 0) & (frac > th)).any(axis=1)

    def explain(self, ctx: CycleContext) -> Sequence[tuple[str, np.ndarray]]:
        return [("node(s) over their usage threshold", self.filter(ctx))]

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray:
        a = self.args
        cap = ctx.state.capacity[:, [CPU, MEM]].astype(np.float64)
        scale = np.array([a.estimated_scaling.cpu, a.estimated_scaling.memory])
        pod = ctx.request.vector[[CPU, MEM]] * scale
        free = np.maximum(cap - self.estimated_usage(ctx) - pod, 0.0)
        per = free * MAX_NODE_SCORE / np.maximum(cap, 1)
        w = np.array([a.weights.cpu, a.weights.memory])
        return per @ w / w.sum()
