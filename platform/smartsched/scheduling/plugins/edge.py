"""LatencySLO: keep latency-bound pods where their clients are close enough.

Owns the filter and score for pods with an origin site and a latency SLO (the
edge real-time pods of an MEC deployment): a node passes when the client
latency from the pod's origin to the node's site is within the SLO; among the
nodes that pass, the closest score highest, so the pod's own MEC site comes
first and a region that meets the SLO second. Pods without an SLO pass
everywhere and score the same everywhere.

  filter  latency(origin, site(node)) <= slo           (UnschedulableAndUnresolvable)
  score   100 * (max - lat) / (max - min) over feasible nodes (all 100 when equal)

Latency is the twin's site model (``Site.latency_ms_from``: access latency plus
distance at the speed of light in fibre), as ``ClusterState.site_latency_ms``.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict

from smartsched.scheduling.framework import CycleContext, lowest_best
from smartsched.scheduling.status import Code, QueueingHint, Status


class LatencySLOArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LatencySLO:
    """Filter nodes beyond a pod's latency SLO; prefer the closest of the rest."""

    name = "LatencySLO"
    Args = LatencySLOArgs
    queueing_hint = QueueingHint.STATIC  # a node's latency from a site never changes

    def __init__(self, args: LatencySLOArgs | None = None) -> None:
        self.args = args or LatencySLOArgs()

    @staticmethod
    def latency(ctx: CycleContext) -> np.ndarray | None:
        """[N] client latency (ms) from the pod's origin to each node, or None."""
        req = ctx.request
        if req.origin < 0:
            return None
        st = ctx.state
        return ctx.cached("latency", lambda: st.site_latency_ms[req.origin][st.site_id])

    def filter(self, ctx: CycleContext) -> Status:
        lat = self.latency(ctx)
        slo = ctx.request.pod.latency_slo_ms
        ok = np.ones(ctx.state.num_nodes, dtype=bool) if lat is None or slo is None \
            else lat <= slo
        return Status.single(self.name, "node(s) beyond the pod's latency SLO",
                             Code.UNSCHEDULABLE_AND_UNRESOLVABLE, ok)

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray | float:
        lat = self.latency(ctx)
        return 0.0 if lat is None else lowest_best(lat, feasible)
