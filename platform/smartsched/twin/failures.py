"""Node failures: exponential times to failure, a fixed repair time.

Owns when nodes fail and come back (mean time between failures per node,
``repair_s`` down). Times are drawn from the engine's seeded generator, only
before ``end`` so a run without a horizon still ends. What happens to a failed
node's pods (evicted, requeued, gangs restarted whole) is the engine's.
"""

from __future__ import annotations

import numpy as np


class FailureModel:
    """Draws failure times for one engine's nodes."""

    def __init__(self, rng: np.random.Generator, mtbf_hours: float | None, repair_s: float,
                 end: float) -> None:
        self.rng = rng
        self.mtbf_s = None if mtbf_hours is None else mtbf_hours * 3600.0
        self.repair_s = repair_s
        self.end = end

    def first_failures(self, num_nodes: int) -> list[tuple[float, int]]:
        """(time, node) of each node's first failure before the end."""
        if self.mtbf_s is None:
            return []
        ttf = self.rng.exponential(self.mtbf_s, num_nodes)
        return [(float(ttf[n]), int(n)) for n in np.flatnonzero(ttf < self.end)]

    def next_failure(self, now: float) -> float | None:
        """When a node that recovered at ``now`` fails next (None: not before the end)."""
        if self.mtbf_s is None:
            return None
        nxt = now + float(self.rng.exponential(self.mtbf_s))
        return nxt if nxt < self.end else None
