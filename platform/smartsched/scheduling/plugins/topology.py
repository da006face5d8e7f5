"""NUMA-aware scoring: prefer nodes where a multi-GPU request fits the free topology tightly.

Like scheduler-plugins' NodeResourceTopology (LeastNUMANodes), a node scores
by how few NUMA sockets the pod's GPUs would span:

    100                       if k free devices sit under one PCIe switch
    75 / sockets_needed       otherwise (sockets_needed = fewest sockets holding k)
    0                         if the node cannot hold k devices

Pods with fewer than two GPUs score 100 everywhere (topology cannot matter).
Vectorized over nodes; loops only over switch and socket ids (a handful).
"""

from __future__ import annotations

import numpy as np

from smartsched.scheduling.framework import MAX_NODE_SCORE, CycleContext
from smartsched.scheduling.plugins.k8s import NoArgs


class NumaAware:
    """Score nodes by the number of NUMA sockets a multi-GPU pod would span."""

    name = "NumaAware"
    Args = NoArgs

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray:
        st, req = ctx.state, ctx.request
        k = req.num_gpu
        n = st.num_nodes
        if k < 2:
            return np.full(n, float(MAX_NODE_SCORE))
        usable = st.gpu_free >= req.gpu_milli
        n_sock = int(st.gpu_socket.max()) + 1
        n_sw = int(st.gpu_switch.max()) + 1
        per_switch = np.stack([(usable & (st.gpu_switch == w)).sum(1) for w in range(n_sw)], 1)
        per_sock = np.stack([(usable & (st.gpu_socket == s)).sum(1) for s in range(n_sock)], 1)
        one_switch = (per_switch >= k).any(axis=1)
        cum = np.cumsum(-np.sort(-per_sock, axis=1), axis=1)
        enough = cum >= k
        needed = np.where(enough.any(axis=1), enough.argmax(axis=1) + 1, 0)
        score = np.where(needed > 0, 75.0 / np.maximum(needed, 1), 0.0)
        return np.where(one_switch, float(MAX_NODE_SCORE), score)
