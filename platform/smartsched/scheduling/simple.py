"""Reference schedulers: first-fit and random.

First-fit takes the lowest-index feasible node (the FGD paper's FirstFit
baseline); random takes a uniformly random feasible node from a seeded
generator. Both use the shared filters, so they never choose an infeasible
node, and both let the twin's default binder pick devices.
"""

from __future__ import annotations

import numpy as np

from smartsched.scheduling.base import register
from smartsched.scheduling.filters import feasible, rejection_reasons
from smartsched.twin.engine import Decision
from smartsched.twin.state import ClusterState, PodRequest


class FirstFit:
    """Lowest-index feasible node."""

    name = "first-fit"

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        ok = feasible(state, request)
        node = int(np.argmax(ok))
        if not ok[node]:
            return Decision.reject(*rejection_reasons(state, request))
        return Decision(node)


class RandomFit:
    """Uniformly random feasible node."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        idx = np.flatnonzero(feasible(state, request))
        if idx.size == 0:
            return Decision.reject(*rejection_reasons(state, request))
        return Decision(int(idx[self.rng.integers(idx.size)]))


register("first-fit", lambda seed: FirstFit())
register("random", lambda seed: RandomFit(seed))
