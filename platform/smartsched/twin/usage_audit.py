"""The twin as a resource-use collector (``audit.usage.UsageCollector``).

Each running pod's use is what the twin runs it with: its usage profile's factor
now times its request (``twin.sampling.running_use``, the same figures the node
totals and the telemetry come from); a best-effort pod gets its share of what its
node had left, as the twin throttles it.
"""

from __future__ import annotations

import numpy as np

from smartsched.audit.usage import PodUsage
from smartsched.model.resources import CPU, GPU, MEM
from smartsched.twin.sampling import running_use


class TwinUsageCollector:
    name = "twin"

    def __init__(self, engine: object, epoch_s: float = 0.0) -> None:
        """``epoch_s``: the wall-clock time of the twin's second 0 (records carry
        ``epoch_s + now``)."""
        self.engine = engine
        self.epoch_s = epoch_s

    def sample(self) -> list[PodUsage]:
        e = self.engine
        tb, st = e.table, e.state  # type: ignore[attr-defined]
        use = running_use(tb, st.capacity, e.now, e.config.seed)  # type: ignore[attr-defined]
        req = tb.requests[use.pods].astype(np.float64)
        per = req[:, [CPU, MEM, GPU]] * use.factor[:, None]
        if use.best_effort.any():  # throttled to what the node left them
            share = np.divide(use.be_got, use.be_demand, out=np.ones_like(use.be_got),
                              where=use.be_demand > 0)
            be = use.best_effort
            per[be, :2] *= share[use.nodes[be]]
            per[be, 2] = 0.0
        ts = self.epoch_s + float(e.now)  # type: ignore[attr-defined]
        return [PodUsage(tb.pods[p].id, tb.pods[p].tenant, st.names[int(n)], float(c),
                         float(m), float(g), ts)
                for p, n, (c, m, g) in zip(use.pods.tolist(), use.nodes.tolist(),
                                           per.tolist(), strict=True)]
