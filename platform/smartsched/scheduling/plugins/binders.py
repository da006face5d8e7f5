"""Bind plugins: which GPUs on the chosen node a pod gets.

``BestFitGpu`` is Open-GPU-Share's default (the tightest-fitting devices,
lowest index on ties), the same rule as the twin's default binder.
``TopologyAwareGpu`` keeps a multi-GPU pod's devices close: under one PCIe
switch if possible, else on one NUMA socket, else on as few sockets as
possible; within that, tightest fit. It loops over a node's switches and
sockets (a handful), never over nodes.
"""

from __future__ import annotations

import numpy as np

from smartsched.scheduling.framework import CycleContext
from smartsched.scheduling.plugins.k8s import NoArgs


class BestFitGpu:
    """Tightest-fitting devices (Open-GPU-Share "best")."""

    name = "BestFitGpu"
    Args = NoArgs

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def devices(self, ctx: CycleContext, node: int) -> tuple[int, ...] | None:
        return ctx.state.pick_devices(node, ctx.request) if ctx.request.num_gpu else ()


def topology_devices(
    free: np.ndarray, switch: np.ndarray, socket: np.ndarray, milli: int, k: int
) -> tuple[int, ...]:
    """Choose ``k`` devices with ``free >= milli``, closest together (see module docstring)."""
    cand = np.flatnonzero(free >= milli)
    if cand.size < k:
        raise ValueError(f"only {cand.size} devices fit, need {k}")
    # Order candidates tightest-first so every group's first k are its best fit.
    cand = cand[np.lexsort((cand, free[cand]))]
    if k == 1:
        return (int(cand[0]),)
    for groups in (switch[cand], socket[cand]):
        ids, counts = np.unique(groups, return_counts=True)
        ok = ids[counts >= k]
        if ok.size:
            # The fullest group that still fits keeps larger groups free (best fit).
            g = ok[np.argmin(counts[counts >= k])]
            return tuple(sorted(int(d) for d in cand[groups == g][:k]))
    # Spread over sockets, largest free groups first.
    sock = socket[cand]
    ids, counts = np.unique(sock, return_counts=True)
    chosen: list[int] = []
    for g in ids[np.argsort(-counts, kind="stable")]:
        chosen.extend(int(d) for d in cand[sock == g])
        if len(chosen) >= k:
            break
    return tuple(sorted(chosen[:k]))


class TopologyAwareGpu:
    """Multi-GPU pods get devices under one switch / one socket when possible."""

    name = "TopologyAwareGpu"
    Args = NoArgs

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def devices(self, ctx: CycleContext, node: int) -> tuple[int, ...] | None:
        st, req = ctx.state, ctx.request
        if not req.num_gpu:
            return ()
        return topology_devices(st.gpu_free[node], st.gpu_switch[node], st.gpu_socket[node],
                                req.gpu_milli, req.num_gpu)
