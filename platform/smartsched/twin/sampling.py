"""The usage sample: what running pods use now, per pod and per node.

Owns turning usage profiles into the per-node use the twin reports
(``ClusterState.usage``) and the best-effort pool that follows it. The
engine takes a sample at every metric tick (``sample_usage``); the metrics
and the telemetry synthesizer only read samples (``running_use`` gives the
same per-pod figures to the synthesizer between ticks), so node totals agree
everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smartsched.model.resources import CPU, GPU, MEM
from smartsched.twin.podtable import RUNNING, PodTable
from smartsched.twin.state import ClusterState
from smartsched.twin.usage import usage_factor


@dataclass(frozen=True, slots=True, eq=False)
class RunningUse:
    """What every running pod uses at one instant, and the per-node sums the twin keeps.

    Best-effort pods get only what the other pods leave of a node's capacity
    (cpu throttled, memory suppressed), so they never push other pods into
    contention; their devices are not counted as used.

    Attributes (P running pods, N nodes):
        pods, nodes: [P] pod indices and the node each runs on.
        factor: [P] share of its request each pod wants now (``usage_factor``).
        best_effort: [P] bool.
        hp: [N, 3] cpu, memory, gpu-milli use of the pods that are not best-effort.
        be_demand: [N, 2] cpu, memory best-effort pods want.
        be_got: [N, 2] ... and get.
        usage: [N, 3] the node's use: ``hp`` plus ``be_got`` (cpu, memory).
    """

    pods: np.ndarray
    nodes: np.ndarray
    factor: np.ndarray
    best_effort: np.ndarray
    hp: np.ndarray
    be_demand: np.ndarray
    be_got: np.ndarray
    usage: np.ndarray


def running_use(table: PodTable, capacity: np.ndarray, now: float, seed: int) -> RunningUse:
    """The use of every running pod of ``table`` at ``now`` on nodes of ``capacity`` [N, R]."""
    tb = table
    n = capacity.shape[0]
    run = np.flatnonzero(tb.status == RUNNING)
    nodes = tb.node[run]
    f = usage_factor(
        now, run, tb.usage_kind[run], tb.usage_mean[run], tb.usage_amplitude[run],
        tb.usage_peak[run], tb.usage_burst[run], tb.usage_burst_p[run], seed,
    )
    be = tb.best_effort[run]
    hp = np.zeros((n, 3))
    be_demand = np.zeros((n, 2))
    if be.any():
        keep = ~be
        hp_nodes, hp_req, hp_f = nodes[keep], tb.requests[run[keep]], f[keep]
        be_nodes, be_req, be_f = nodes[be], tb.requests[run[be]], f[be]
        for j in (0, 1):
            be_demand[:, j] = np.bincount(be_nodes, be_req[:, j] * be_f, minlength=n)
    else:  # (the common case: no selection to make)
        hp_nodes, hp_req, hp_f = nodes, tb.requests[run], f
    for j, r in enumerate((CPU, MEM, GPU)):
        hp[:, j] = np.bincount(hp_nodes, hp_req[:, r] * hp_f, minlength=n)
    be_got = np.minimum(be_demand, np.maximum(capacity[:, [CPU, MEM]] - hp[:, :2], 0.0))
    usage = hp.copy()
    usage[:, :2] += be_got
    return RunningUse(run, nodes, f, be, hp, be_demand, be_got, usage)


def sample_usage(state: ClusterState, table: PodTable, now: float, seed: int) -> RunningUse:
    """Take a usage sample: the node usage the twin reports (``state.usage``), the allocation
    it reflects (``state.usage_allocated``: pods placed later are not in it) and the
    best-effort pool (threshold x capacity minus the other pods' use). The engine calls it
    at every metric tick; metrics and telemetry only read what it set."""
    use = running_use(table, state.capacity, now, seed)
    state.usage[:] = use.usage
    state.be_allocatable = np.maximum(
        state.capacity[:, [CPU, MEM]] * state.best_effort_threshold - use.hp[:, :2], 0.0
    )
    state.usage_allocated[:] = state.allocated
    return use
