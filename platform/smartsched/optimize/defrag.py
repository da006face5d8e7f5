"""A descheduling plan by annealing: which running pods to move so a waiting gang fits.

Owns the window model's use in defragmentation (issue 21), as the ``AnnealDefrag``
descheduling plugin (found through the ``smartsched.plugins`` entry points, since
scheduling does not import this layer). GpuDefrag's greedy pass
(``scheduling/plugins/defrag.py``) clears one candidate node at a time and sends
the pods it moves only to smaller accelerator nodes; when that tier is as full as
the big one it finds no plan. Here the waiting gang and the movable pods around it
are one window: every movable pod keeps its current place as its home (staying
costs nothing), may move to any node its profile's filters accept (a move costs a
little), and must stay placed; the gang's members are placed all or none. The
values make the order of what matters strict: no movable pod is ever dropped to
start the gang (each is worth more than the gang), the gang is worth more than the
most moves a pass may make, and among plans that start it the fewest moves win
(then the profile's scores). The answer is checked on a fork of the twin -- every
move by the profile's filters, then the whole gang -- before it is returned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from pydantic import Field

from smartsched.model.errors import InfeasibleDecisionError
from smartsched.optimize.annealer import anneal
from smartsched.optimize.candidates import Pruning, build_problem
from smartsched.optimize.repair import polish, repair
from smartsched.scheduling.framework import ProfileScheduler
from smartsched.scheduling.plugins.defrag import GpuDefrag, GpuDefragArgs
from smartsched.twin.decision import Migration
from smartsched.twin.state import ClusterState, PodRequest


def plan_moves(sched: ProfileScheduler, state: ClusterState, members: Sequence[PodRequest],
               rows: np.ndarray, max_moves: int, *, sweeps: int = 20, seed: int = 0,
               pruning: Pruning | None = None) -> tuple[Migration, ...]:
    """Moves of bound pods ``rows`` (``state.bound`` rows) after which every one of
    ``members`` (a gang, or one pod) fits; empty when no plan of at most ``max_moves``
    moves is found. ``state`` is not changed."""
    b = state.bound
    # Best-effort pods live on measured slack, outside the model's bins: they stay.
    rows = np.array([r for r in rows.tolist() if not b.requests[r].best_effort],
                    dtype=np.int64)
    if not members or rows.size == 0:
        return ()
    fork = state.fork()
    running: list[tuple[PodRequest, int, tuple[int, ...]]] = []
    for r in rows.tolist():
        req = b.requests[r]
        devices = tuple(int(d) for d in np.flatnonzero(b.devices[r] > 0))
        fork.release(int(b.node[r]), req, devices)
        running.append((req, int(b.node[r]), devices))
    m = len(members)
    requests = list(members) + [req for req, _, _ in running]
    fixed = {m + j: (nd, dv) for j, (_, nd, dv) in enumerate(running)}
    problem, _ = build_problem(sched, fork, requests, pruning or Pruning(8, 2), value="count",
                               score_weight=0.5, fixed=fixed)
    problem = _defrag_values(problem, m, max_moves)
    res = anneal(problem, sweeps=sweeps, replicas=8, seed=seed)
    assign, _ = repair(problem, res.assign)
    assign, _ = polish(problem, assign, 500)
    start = problem.start
    if np.any(assign[:m] == 0) or np.any(assign[m:] == 0):
        return ()  # the gang does not start, or a running pod would have nowhere to go
    moved = [j for j in range(m, len(requests)) if assign[j] != start[j]]
    if not moved or len(moved) > max_moves:
        return ()
    return _checked(sched, state, problem, assign, moved, running, m, members)


def _defrag_values(problem, m: int, max_moves: int):
    """The window's values and costs for a descheduling plan (module docstring): a move
    costs ``1 / (max_moves + 1)`` of a member, a running pod is worth more than the gang."""
    p = problem.num_pods
    move = 1.0 / (max_moves + 1)
    worth = float(m) + 1.0
    value = np.ones(p)
    value[m:] = 2.0 * worth
    cost = problem.cost.copy()
    home = problem.start
    k = np.arange(cost.shape[1])[None, :]
    # Score bonus kept as built (<= half the smallest value: 0.5); a slot away from home
    # adds a move; slot 0 costs the pod's value.
    runner = np.zeros(p, dtype=bool)
    runner[m:] = True
    away = runner[:, None] & (k >= 1) & (k != home[:, None]) & np.isfinite(cost)
    cost = np.where(away, cost + move, cost)
    cost[:, 0] = value
    big = float(max(value.max(), worth))
    group = np.full(p, -1, dtype=np.int64)
    group[:m] = 0
    start = home.copy()
    start[:m] = 0  # the gang starts unplaced; the running pods where they run
    return dataclasses.replace(
        problem, value=value, cost=cost, lam1=big, lam0=1.5 * big + 1.0,
        group=group if m > 1 else None, lam_g=1.5 * big + 1.0 if m > 1 else 0.0,
        start=start)


def _checked(sched: ProfileScheduler, state: ClusterState, problem, assign: np.ndarray,
             moved: list[int], running: list, m: int,
             members: Sequence[PodRequest]) -> tuple[Migration, ...]:
    """The moves, if on a fork of ``state`` each passes the profile's filters at its new
    node and afterwards every member of the gang passes them where the plan puts it;
    else none."""
    fork = state.fork()
    for j in moved:
        req, node, devices = running[j - m]
        fork.release(node, req, devices)
    out: list[Migration] = []
    for j in moved:
        req = running[j - m][0]
        node = int(problem.node[j, int(assign[j])])
        if not _place(sched, fork, req, node):
            return ()
        out.append(Migration(req.pod, node))
    for i, req in enumerate(members):
        if not _place(sched, fork, req, int(problem.node[i, int(assign[i])])):
            return ()
    return tuple(out)


def _place(sched: ProfileScheduler, fork: ClusterState, req: PodRequest, node: int) -> bool:
    """Allocate ``req`` on ``node`` of ``fork`` if the profile's filters let it."""
    ok, _ = sched.feasible(fork, req)
    if not ok[node]:
        return False
    try:
        fork.allocate(node, req, fork.pick_devices(node, req))
    except InfeasibleDecisionError:
        return False
    return True


class AnnealDefragArgs(GpuDefragArgs):
    sweeps: int = Field(default=20, ge=1, le=10_000)


class AnnealDefrag(GpuDefrag):
    """GpuDefrag's pass (same interval, targets, movable classes and move budget) with
    the plan made jointly by ``plan_moves``; a gang not all waiting falls back to the
    greedy plan."""

    name = "AnnealDefrag"
    Args = AnnealDefragArgs

    def __init__(self, args: AnnealDefragArgs | None = None) -> None:
        super().__init__(args or AnnealDefragArgs())
        self._plans = 0

    def _clear_for(self, sched: ProfileScheduler, state: ClusterState, req: PodRequest,
                   waiting: Sequence[PodRequest] = ()) -> tuple[Migration, ...]:
        members = [w for w in waiting if w.pod.gang_id == req.pod.gang_id] \
            if req.pod.gang_id is not None else [req]
        if len(members) != max(req.pod.gang_size, 1):
            return super()._clear_for(sched, state, req, waiting)
        rows, _, lacking = self.movable_rows(sched, state, req)
        if lacking <= 0 or rows.size == 0:
            return ()
        self._plans += 1
        return plan_moves(sched, state, members, rows, self.args.max_moves,
                          sweeps=self.args.sweeps, seed=self._plans)
