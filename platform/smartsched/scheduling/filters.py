"""Feasibility filters: one numpy expression each, with a reason name per filter.

Owns the node filters every scheduler applies before choosing (resource fit
from the twin, node up / unschedulable, node selector, taints and
tolerations, allowed regions). ``feasible`` returns the combined mask and,
when nothing fits, the count of nodes each filter rejected first, so a
rejection can say why ("12 nodes: insufficient gpu; 4 nodes: untolerated
taint"). The scheduling-framework issue grows these into plugins.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from smartsched.model.resources import CPU, FPGA, MEM
from smartsched.twin.state import ClusterState, PodRequest

FilterFn = Callable[[ClusterState, PodRequest], np.ndarray]


def node_up(state: ClusterState, req: PodRequest) -> np.ndarray:
    return state.up & ~state.unschedulable


def insufficient_cpu(state: ClusterState, req: PodRequest) -> np.ndarray:
    return state.free_res[:, CPU] >= req.vector[CPU]


def insufficient_memory(state: ClusterState, req: PodRequest) -> np.ndarray:
    return state.free_res[:, MEM] >= req.vector[MEM]


def insufficient_fpga(state: ClusterState, req: PodRequest) -> np.ndarray:
    return state.free_res[:, FPGA] >= req.vector[FPGA]


def gpu_model_mismatch(state: ClusterState, req: PodRequest) -> np.ndarray:
    if req.num_gpu == 0 or req.models_ok is None:
        return np.ones(state.num_nodes, dtype=bool)
    return req.models_ok[state.gpu_model]


def node_selector(state: ClusterState, req: PodRequest) -> np.ndarray:
    if req.selector_unknown:
        return np.zeros(state.num_nodes, dtype=bool)
    if req.selector_cols.size == 0:
        return np.ones(state.num_nodes, dtype=bool)
    return state.labels[:, req.selector_cols].all(axis=1)


def untolerated_taint(state: ClusterState, req: PodRequest) -> np.ndarray:
    return ~(state.taints & ~req.tolerated).any(axis=1)


def region_not_allowed(state: ClusterState, req: PodRequest) -> np.ndarray:
    if req.allowed_sites is None:
        return np.ones(state.num_nodes, dtype=bool)
    return req.allowed_sites[state.site_id]


def resource_fit(state: ClusterState, req: PodRequest) -> np.ndarray:
    """The twin's canonical fit (cpu, memory, fpga, gpu devices and model)."""
    return state.resource_fit(req)


# Order matters only for the reasons: each rejected node is blamed on the
# first filter that rejects it, as kube-scheduler reports the first failure.
FILTERS: tuple[tuple[str, FilterFn], ...] = (
    ("node down or unschedulable", node_up),
    ("node selector mismatch", node_selector),
    ("untolerated taint", untolerated_taint),
    ("region not allowed", region_not_allowed),
    ("gpu model mismatch", gpu_model_mismatch),
    ("insufficient cpu", insufficient_cpu),
    ("insufficient memory", insufficient_memory),
    ("insufficient fpga", insufficient_fpga),
    ("insufficient gpu", resource_fit),
)


def feasible(state: ClusterState, req: PodRequest) -> np.ndarray:
    """Mask of nodes passing every filter."""
    ok = resource_fit(state, req) & node_up(state, req)
    if req.selector_cols.size or req.selector_unknown:
        ok &= node_selector(state, req)
    if state.taint_vocab:
        ok &= untolerated_taint(state, req)
    if req.allowed_sites is not None:
        ok &= region_not_allowed(state, req)
    return ok


def rejection_reasons(state: ClusterState, req: PodRequest) -> tuple[str, ...]:
    """Why no node fits: "N nodes: <reason>" per filter, blaming each node's first failure."""
    remaining = np.ones(state.num_nodes, dtype=bool)
    out = []
    for name, fn in FILTERS:
        failed = remaining & ~fn(state, req)
        count = int(failed.sum())
        if count:
            out.append(f"{count} nodes: {name}")
        remaining &= ~failed
    return tuple(out)
