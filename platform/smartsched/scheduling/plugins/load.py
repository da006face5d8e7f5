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

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from smartsched.model.resources import CPU, MEM
from smartsched.scheduling.framework import MAX_NODE_SCORE, CycleContext
from smartsched.scheduling.status import Code, QueueingHint, Status
from smartsched.twin.state import ClusterState

_ALL = slice(None)


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
    # Its verdict depends on the node's load only: the twin re-evaluates it when usage is
    # sampled or room is freed, instead of retrying rejected pods on every completion.
    queueing_hint = QueueingHint.NODE_CONDITION

    def __init__(self, args: LoadAwareArgs | None = None) -> None:
        self.args = args or LoadAwareArgs()
        if self.args.weights.cpu + self.args.weights.memory == 0:
            raise ValueError("weights: at least one must be > 0")

    def estimated_usage(self, ctx: CycleContext) -> np.ndarray:
        """[N, 2] estimated cpu (milli) and memory (MiB) in use now."""
        return ctx.cached("load_estimate", lambda: self._estimate(ctx.state))

    def _estimate(self, st: ClusterState, nodes: np.ndarray | slice = _ALL) -> np.ndarray:
        base = st.usage[nodes, :2]
        pred = st.predicted_usage
        if self.args.use_prediction and pred is not None:
            base = np.maximum(base, pred[nodes, :2])
        since = np.maximum(st.allocated[nodes][:, [CPU, MEM]]
                           - st.usage_allocated[nodes][:, [CPU, MEM]], 0)
        scale = np.array([self.args.estimated_scaling.cpu, self.args.estimated_scaling.memory])
        return base + since * scale

    def _under_threshold(self, st: ClusterState, est: np.ndarray,
                         nodes: np.ndarray | slice = _ALL) -> np.ndarray:
        a = self.args.usage_thresholds
        frac = est / np.maximum(st.capacity[nodes][:, [CPU, MEM]], 1)
        over = np.zeros(frac.shape[0], dtype=bool)
        for j, th in enumerate((a.cpu, a.memory)):
            if th > 0:  # 0 disables the resource's threshold
                over |= frac[:, j] > th
        return ~over

    def node_condition(self, state: ClusterState,
                       nodes: np.ndarray | slice = _ALL) -> np.ndarray:
        """Nodes (all, or those given) under their usage threshold: the filter's verdict
        for any pod."""
        return self._under_threshold(state, self._estimate(state, nodes), nodes)

    def filter(self, ctx: CycleContext) -> Status:
        ok = self._under_threshold(ctx.state, self.estimated_usage(ctx))
        return Status.single(self.name, "node(s) over their usage threshold",
                             Code.UNSCHEDULABLE, ok)

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray:
        a = self.args
        cap = ctx.state.capacity[:, [CPU, MEM]].astype(np.float64)
        scale = np.array([a.estimated_scaling.cpu, a.estimated_scaling.memory])
        pod = ctx.request.vector[[CPU, MEM]] * scale
        free = np.maximum(cap - self.estimated_usage(ctx) - pod, 0.0)
        per = free * MAX_NODE_SCORE / np.maximum(cap, 1)
        w = np.array([a.weights.cpu, a.weights.memory])
        return per @ w / w.sum()
