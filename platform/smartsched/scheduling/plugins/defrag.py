"""GpuDefrag: a descheduling pass that clears whole accelerator nodes for waiting pods.

Owns one descheduling plugin, after kubernetes-sigs/descheduler (evict movable
pods so the scheduler can place better) with the target of Volcano's and
Kueue's GPU defragmentation: room for a pod -- typically a gang member -- that
needs whole GPUs no node has free. Every ``interval_s`` the twin offers the
pending pods in queue order; for the first ones that ask for whole GPUs
(``targets`` of them) and cannot start:

1. nodes that pass every check of the pod's profile other than room are the
   candidates; the pod needs ``gang_size`` nodes where a member fits, some of
   which may already have room;
2. a candidate can be cleared when moving its movable pods (``movable``
   classes, not in a gang: by default inference and batch) lets a member
   fit (``ClusterState.fit_checks`` with their room added) -- cheapest first
   (fewest pods to move, then the least GPU to move);
3. each movable pod on a chosen node needs a destination now: a node with
   fewer GPUs than the one it leaves (so fragments consolidate on the small
   accelerator tier, never onto another big node), passing the profile's
   filters for that pod, with room on a fork of the state where earlier moves
   of the pass already happened, and not a candidate being cleared; the
   fullest such node (fewest free GPUs) wins;
4. the pass moves pods only if afterwards the whole gang fits (checked with the
   profile's filters on the fork), and
   at most ``max_moves`` pods: a half-cleared gang gains nothing and each move
   costs a restart (image pull, container start, work since the last
   checkpoint).

A pass that cannot make a whole gang fit moves nothing; the next target is
tried instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from smartsched.model.pod import POD_CLASS_IDS, PodClass
from smartsched.model.resources import MILLI_PER_DEVICE
from smartsched.twin.decision import Migration
from smartsched.twin.state import ClusterState, PodRequest

if TYPE_CHECKING:
    from smartsched.scheduling.framework import ProfileScheduler


class GpuDefragArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    interval_s: float = Field(default=300.0, ge=10.0, le=86_400.0)
    max_moves: int = Field(default=8, ge=1, le=256)
    targets: int = Field(default=3, ge=1, le=64)
    movable: list[PodClass] = Field(default_factory=lambda: [PodClass.AI_INFER,
                                                             PodClass.BATCH])


def whole_gpus(req: PodRequest) -> int:
    """Whole GPUs one member takes (a share takes none whole)."""
    return req.num_gpu if req.gpu_milli >= MILLI_PER_DEVICE else 0


class GpuDefrag:
    """Move inference and batch pods off big accelerator nodes when a waiting pod needs
    them whole."""

    name = "GpuDefrag"
    Args = GpuDefragArgs

    def __init__(self, args: GpuDefragArgs | None = None) -> None:
        self.args = args or GpuDefragArgs()
        self.interval_s = self.args.interval_s
        self._movable = np.array(sorted(POD_CLASS_IDS[c] for c in self.args.movable),
                                 dtype=np.int8)

    def plan(self, sched: ProfileScheduler, state: ClusterState,
             waiting: Sequence[PodRequest]) -> tuple[Migration, ...]:
        tried: set[str] = set()
        for req in waiting:
            if len(tried) >= self.args.targets:
                break
            if whole_gpus(req) == 0:
                continue
            key = req.pod.gang_id or req.pod.id  # one member speaks for its gang
            if key in tried:
                continue
            tried.add(key)
            moves = self._clear_for(sched, state, req, waiting)
            if moves:
                return moves
        return ()

    def movable_rows(self, sched: ProfileScheduler, state: ClusterState,
                     req: PodRequest) -> tuple[np.ndarray, np.ndarray, int]:
        """Bound movable pods (not in a gang) on the nodes where only room keeps ``req``
        out; those nodes; and how many more nodes a member must fit on (<= 0: it fits)."""
        ok, ctx = sched.feasible(state, req)
        lacking = max(req.pod.gang_size, 1) - int(ok.sum())
        b = state.bound
        cand = sched.room_only(ctx) & ~ok
        rows = np.flatnonzero(b.used & np.isin(b.cls, self._movable) & (b.gang < 0))
        return rows[cand[b.node[rows]]], cand, lacking

    def _clear_for(self, sched: ProfileScheduler, state: ClusterState, req: PodRequest,
                   waiting: Sequence[PodRequest] = ()) -> tuple[Migration, ...]:
        rows, cand, lacking = self.movable_rows(sched, state, req)
        if lacking <= 0:
            return ()  # it fits: it waits for another reason (its gang mates, a timer)
        b = state.bound
        if rows.size == 0:
            return ()
        room = b.room(rows)
        clearable = cand.copy()
        for _, mask in state.fit_checks(req, extra=room):
            clearable &= mask
        nodes = np.flatnonzero(clearable)
        if nodes.size < lacking:
            return ()
        count = np.bincount(b.node[rows], minlength=state.num_nodes)
        gpu_moved = np.bincount(b.node[rows], weights=b.devices[rows].sum(axis=1),
                                minlength=state.num_nodes)
        nodes = nodes[np.lexsort((nodes, gpu_moved[nodes], count[nodes]))]
        fork = state.fork()
        moves: list[Migration] = []
        cleared = np.zeros(state.num_nodes, dtype=bool)  # never a destination this pass
        cleared[nodes] = True
        for n in nodes.tolist():
            on_node = rows[b.node[rows] == n]
            if len(moves) + on_node.size > self.args.max_moves:
                continue
            trial = fork.fork()
            planned = self._destinations(sched, trial, on_node, n, ~cleared)
            if planned is None:
                continue
            fork = trial
            moves.extend(planned)
            # Done once the pod's whole gang fits on the state these moves leave.
            if int(sched.feasible(fork, req)[0].sum()) >= max(req.pod.gang_size, 1):
                return tuple(moves)
        return ()

    @staticmethod
    def _destinations(sched: ProfileScheduler, fork: ClusterState, rows: np.ndarray,
                      source: int, allowed: np.ndarray) -> list[Migration] | None:
        """Move ``rows`` off ``source`` on ``fork`` (mutating it) to ``allowed`` nodes with
        fewer GPUs; None if one cannot go."""
        bound = fork.bound
        smaller = (fork.gpu_count < fork.gpu_count[source]) & allowed
        out: list[Migration] = []
        for r in rows.tolist():
            req = bound.requests[r]
            devices = tuple(int(d) for d in np.flatnonzero(bound.devices[r] > 0))
            fork.release(source, req, devices)
            ok, _ = sched.feasible(fork, req)
            dest = np.flatnonzero(ok & smaller)
            if dest.size == 0:
                return None
            free = fork.gpu_free[dest].sum(axis=1)
            node = int(dest[np.lexsort((dest, free))[0]])
            fork.allocate(node, req, fork.pick_devices(node, req))
            out.append(Migration(req.pod, node))
        return out
