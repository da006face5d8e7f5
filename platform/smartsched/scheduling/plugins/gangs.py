"""Gang reservation and backfill (the semantics of Slurm backfill, Volcano and Kueue).

Owns two plugins:

GangReservation (PostFilter): a gang member that fits nowhere gets a
reservation for its gang -- the ``gang_size`` nodes where a member's room
comes free soonest, judged from when the pods bound there are expected to
leave (``BoundPods.until``: bind time plus the pod's remaining run), on nodes
where every check other than room passes and no other gang holds room. The
reservation is due when the last of those nodes has room:

  t(node) = earliest t with  free + sum(charged of pods leaving by t) >= member
            and whole free GPUs (devices emptied by t) >= member's GPUs
  due     = the gang_size-th smallest t(node)

A reservation stands until it is due; a gang still waiting after that gets a
new one, or loses it (the twin drops a due reservation that is not renewed, so
nodes are not held for a gang that cannot use them). At most
``max_reservations`` gangs hold room; a gang of higher priority displaces the
lowest-priority holder, one of equal or lower priority waits for a slot.
Members of a gang whose reservation is due may preempt lower-priority pods on
its nodes (the room was promised; see DefaultPreemption). Members of the gang
placed tentatively before one was rejected count as gone (they are rolled
back with it).

Reservations (Filter): other pods may use a reserved node only if that does
not delay the gang -- they are expected to end before it is due, or they
rank below the gang and the driver lets a due gang preempt them (the twin;
``Reservations.gang_preempts``: the service and the Kubernetes scheduler never
let a gang preempt, so there they do not pass), or the node keeps the
reserved room beside them (free - pod >= reserved, whole GPUs likewise). The
gang's own members always pass. Its verdict changes with time and with other
pods' lengths, so it gives no queueing hint (pods it refuses are retried on
every event that frees room, and at the periodic flush).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from smartsched.model.resources import MILLI_PER_DEVICE
from smartsched.scheduling.framework import CycleContext
from smartsched.scheduling.status import Code, Status
from smartsched.twin.reservations import Reservation, holder
from smartsched.twin.state import ClusterState, PodRequest


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GangReservationArgs(BaseModel):
    """``max_reservations``: how many waiting gangs hold room at once (Slurm's backfill
    depth). The queue tries gangs in priority then arrival order, so the first that
    cannot start get them; one reservation per gang that waits would wall off the
    accelerators from everything else."""

    model_config = ConfigDict(extra="forbid")
    max_reservations: int = Field(default=1, ge=1, le=64)
    # A pod outside any gang asking at least this many whole GPUs gets a reservation too,
    # as a gang of one (Slurm reserves for the head job whatever its size): without one,
    # pods that take part of a node keep taking each node that frees, and a pod needing
    # a whole node waits until the end. None: gangs only. Twin only: the service and the
    # Kubernetes scheduler hold room for gangs (pod groups) alone.
    singles_from_gpus: int | None = Field(default=None, ge=1, le=64)


def member_gpus(req: PodRequest) -> int:
    """Whole GPUs one member takes (a GPU share reserves none)."""
    return req.num_gpu if req.gpu_milli >= MILLI_PER_DEVICE else 0


def earliest_room(state: ClusterState, req: PodRequest, nodes: np.ndarray) -> np.ndarray:
    """[len(nodes)] when each node could host ``req`` (now if it fits now; inf if never,
    as far as the pods bound there are expected to leave).

    Vectorized over nodes and bound pods: the pods of each node, soonest end first, are
    released cumulatively (a cumulative sum per node), and a node's time is the end of
    the first pod after which ``req`` fits. A pod that never says when it ends (inf) and
    every one after it never release room."""
    b = state.bound
    now = state.now
    need = ClusterState.charged(req)
    gpus = member_gpus(req)
    out = np.full(nodes.size, np.inf)
    live = np.flatnonzero(b.used & np.isin(b.node, nodes))
    # Members of this gang placed tentatively before one was rejected are rolled back
    # with it: their room counts as free now.
    own = b.gang_index(req.pod.gang_id)
    mine = live[b.gang[live] == own] if own is not None else live[:0]
    live = np.setdiff1d(live, mine)
    back, _, back_dev = b.room(mine)
    free = state.free_res[nodes] + back[nodes]  # [K, R]
    dev = state.gpu_free[nodes].astype(np.int64) + back_dev[nodes]  # [K, D]
    exists = state.gpu_exists[nodes]  # [K, D]

    def fits(free_: np.ndarray, dev_: np.ndarray, exists_: np.ndarray) -> np.ndarray:
        whole = ((dev_ == MILLI_PER_DEVICE) & exists_).sum(axis=-1)
        return (free_ >= need).all(axis=-1) & (whole >= gpus)

    now_ok = fits(free, dev, exists)
    out[now_ok] = now
    # Pods that will leave, on nodes that do not fit now: by node, then by end.
    live = live[np.isfinite(b.until[live])]
    index = np.full(state.num_nodes, -1, dtype=np.int64)
    index[nodes] = np.arange(nodes.size)
    pos = index[b.node[live]]  # each pod's place in ``nodes``
    keep = ~now_ok[pos]
    live, pos = live[keep], pos[keep]
    if live.size == 0:
        return out
    order = np.lexsort((b.until[live], pos))
    live, pos = live[order], pos[order]
    starts = np.flatnonzero(np.r_[True, pos[1:] != pos[:-1]])
    seg = np.repeat(starts, np.diff(np.r_[starts, pos.size]))

    def seg_cumsum(x: np.ndarray) -> np.ndarray:
        c = np.cumsum(x, axis=0)
        return c - (c[seg] - x[seg])  # minus the running total before the node's first pod

    ok = fits(free[pos] + seg_cumsum(b.charged[live]),
              dev[pos] + seg_cumsum(b.devices[live].astype(np.int64)), exists[pos])
    hit = np.flatnonzero(ok)
    first_nodes, first = np.unique(pos[hit], return_index=True)
    out[first_nodes] = np.maximum(b.until[live[hit[first]]], now)
    return out


class GangReservation:
    """PostFilter for gang members: reserve the nodes that free up soonest."""

    name = "GangReservation"
    Args = GangReservationArgs

    def __init__(self, args: GangReservationArgs | None = None) -> None:
        self.args = args or GangReservationArgs()

    def post_filter(self, state: ClusterState, req: PodRequest,
                    eligible: np.ndarray) -> Reservation | None:
        pod = req.pod
        single = pod.gang_id is None or pod.gang_size <= 1
        if single and (self.args.singles_from_gpus is None
                       or member_gpus(req) < self.args.singles_from_gpus):
            return None
        key = holder(pod)
        held = state.reservations.by_gang.get(key)
        if held is not None and held.due > state.now:
            return None  # the gang's reservation stands
        res = state.reservations
        others = [r for g, r in res.by_gang.items() if g != key]
        excess = len(others) + 1 - self.args.max_reservations
        displaced: list[str] = []
        if excess > 0:
            # The depth is taken: only a gang of higher priority takes a slot, from the
            # lowest-priority holders (the queue offers gangs in priority order, so a
            # holder of equal priority came first and keeps it).
            lower = sorted((r for r in others if r.priority < pod.priority),
                           key=lambda r: (r.priority, -r.due))
            if len(lower) < excess:
                return None
            displaced = [r.gang for r in lower[:excess]]
        gone = np.zeros(state.num_nodes, dtype=bool)
        for g in displaced:
            gone[list(res.by_gang[g].nodes)] = True
        free_of_others = (res.owner < 0) | (res.owner == res.known_id(key)) | gone
        nodes = np.flatnonzero(eligible & free_of_others & state.up)
        size = max(pod.gang_size, 1) if not single else 1
        if nodes.size < size:
            return None
        t = earliest_room(state, req, nodes)
        order = np.lexsort((nodes, t))[:size]
        if not np.isfinite(t[order]).all():
            return None
        return Reservation(key, pod.priority, tuple(int(n) for n in nodes[order]),
                           ClusterState.charged(req), member_gpus(req),
                           float(t[order].max()), displaces=tuple(displaced))


class Reservations:
    """Filter: keep reserved room for the gang it was promised to (backfill rule)."""

    name = "Reservations"
    Args = NoArgs

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def filter(self, ctx: CycleContext) -> Status:
        st, req = ctx.state, ctx.request
        res = st.reservations
        if not len(res):
            return Status.single(self.name, "node(s) reserved for a waiting gang",
                                 Code.UNSCHEDULABLE, np.ones(st.num_nodes, dtype=bool))
        pod = req.pod
        reserved = res.owner >= 0
        own = res.owner == res.known_id(holder(pod))
        ends_before = (pod.duration is not None) & (st.now + (pod.duration or 0.0) <= res.due)
        below = (pod.priority < res.priority) & res.gang_preempts  # evicted when due
        beside = ((st.free_res - ClusterState.charged(req)) >= res.reserved).all(axis=1) & (
            st.gpu_full - (req.num_gpu if req.num_gpu else 0) >= res.gpus)
        ok = ~reserved | own | ends_before | below | beside
        return Status.single(self.name, "node(s) reserved for a waiting gang",
                             Code.UNSCHEDULABLE, ok)
