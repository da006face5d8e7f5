"""The twin's scheduling queue: Kubernetes order, gangs, and retries on the right events.

Owns which waiting pod is offered next and when a rejected pod is offered
again. Pending pods are offered in Kubernetes order (priority desc, then
arrival, then submission order); a gang is one unit, offered once all its
members have arrived. A rejected unit is parked:

* with a ``RetryHint`` (what the scheduler's filters said: the nodes no event
  reopens, the pod-independent conditions, and the twin's own resource fit),
  it is retried exactly when an event makes it pass some node -- room freed on
  a node (completion, eviction), a usage sample (node load changed), a node
  back up -- as kube-scheduler's QueueingHints do. A pod refused by LoadAware
  is retried when a node's load falls below the threshold, not on every
  completion. A retry the hint skips could only have failed again.
* without a hint (gangs, whose members must all fit, and decisions that give
  none), it is retried when its first member's requests fit the node where
  room was freed, and at the periodic flush.

A deferred unit waits for the next periodic flush: deferring is a choice
about time, not about room. Node failures and recoveries retry everything.

Parked hinted units are rows of arrays (their requests, open nodes and
condition group), so each check is one numpy expression over all of them.
Must not import scheduling.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

import numpy as np

from smartsched.model.resources import CPU, FPGA, GPU_MODEL_IDS, MEM
from smartsched.twin.decision import NodeCondition, RetryHint
from smartsched.twin.podtable import DONE, FAILED, PENDING, PodTable
from smartsched.twin.state import ClusterState, PodRequest, RequestBatch, Room

# The parts of ClusterState.fit_checks that count as "room" for the rule without a hint.
ROOM_CHECKS = frozenset({"cpu", "memory", "pods", "fpga", "gpu"})
# How units of one priority are ordered (``SchedulingQueue.set_order``).
QUEUE_ORDERS = ("priority", "least-slack")
# Hinted units are checked against all nodes in chunks of this many rows (memory bound).
_CHUNK = 512
# Below this many rows a check is cheaper than finding the rows' distinct signatures.
_DEDUPE_FROM = 16


class SchedulingQueue:
    """Pending units (pod index ``i >= 0``, gang ``-(g + 1)``) and where they wait."""

    def __init__(self, table: PodTable, state: ClusterState,
                 request: Callable[[int], PodRequest]) -> None:
        self.table = table
        self.state = state
        self.request = request  # compiled request of pod i (cached by the engine)
        # (-prio, order key, arrival, rep, unit); the key is 0 in Kubernetes order.
        self._active: list[tuple[int, float, float, int, int]] = []
        self.order = "priority"  # or "least-slack" (see ``set_order``)
        self._unhinted: set[int] = set()
        self._hinted = _HintedPool(state.num_nodes)
        self._deferred: set[int] = set()
        # When woken units were last checked again: (the state's last mutation stamp,
        # usage samples taken) -- either changing may change their verdicts.
        self._samples = 0
        self._woken_checked: tuple[int, int] | None = None

        # Gangs: members, how many arrived, and their size.
        self.gang_members: list[list[int]] = []
        self.gang_of = np.full(len(table), -1, dtype=np.int64)
        gang_ids: dict[str, int] = {}
        for i, p in enumerate(table.pods):
            if p.gang_id is not None and p.gang_size > 1:
                g = gang_ids.setdefault(p.gang_id, len(gang_ids))
                if g == len(self.gang_members):
                    self.gang_members.append([])
                self.gang_members[g].append(i)
                self.gang_of[i] = g
        self._gang_arrived = np.zeros(len(self.gang_members), dtype=np.int64)
        self._gang_size = np.array(
            [table.pods[m[0]].gang_size for m in self.gang_members], dtype=np.int64
        )

    # ---------------------------------------------------------------- units
    def unit_of(self, i: int) -> int:
        """The queue unit pod ``i`` belongs to (its gang, or itself)."""
        g = int(self.gang_of[i])
        return -(g + 1) if g >= 0 else i

    @property
    def waiting(self) -> bool:
        """Whether any unit is parked or deferred."""
        return bool(self._unhinted or self._deferred or self._hinted.parked)

    def is_parked(self, unit: int) -> bool:
        return unit in self._unhinted or self._hinted.is_parked(unit)

    # -------------------------------------------------------------- arrival
    def arrived(self, i: int) -> None:
        """Pod ``i`` is pending: queue it, or count it towards its gang."""
        tb = self.table
        g = int(self.gang_of[i])
        if g >= 0:
            self._gang_arrived[g] += 1
            if self._gang_arrived[g] == self._gang_size[g]:
                first = min(self.gang_members[g], key=lambda m: (tb.arrival[m], m))
                self._push(-(g + 1), first)
            return
        self._push(i, i)

    def _push(self, unit: int, rep: int) -> None:
        tb = self.table
        key = 0.0
        if self.order == "least-slack":
            members = self.gang_members[-unit - 1] if unit < 0 else [rep]
            key = min(self._latest_start(m) for m in members)  # a gang: its tightest member
        heapq.heappush(self._active, (-int(tb.priority[rep]), key, float(tb.arrival[rep]), rep,
                                      unit))

    def set_order(self, order: str) -> None:
        """How units of one priority are ordered: "priority" (Kubernetes: by arrival) or
        "least-slack": by latest start time (deadline minus the work left; units without a
        deadline after those with one, then by arrival). For jobs that share a deadline it
        is longest-first, which shortens the window they all finish in (a list schedule's
        makespan is at most the ideal plus the last-started job's length). Must be set
        before the first arrival."""
        if order not in QUEUE_ORDERS:
            raise ValueError(f"queue order {order!r} is not one of {QUEUE_ORDERS}")
        self.order = order

    def _latest_start(self, i: int) -> float:
        """Pod i's deadline minus its remaining run time (inf: no deadline)."""
        left = float(self.table.remaining[i])
        return float(self.table.deadline[i]) - (left if np.isfinite(left) else 0.0)

    def _requeue(self, units: Iterable[int]) -> None:
        for u in units:
            rep = self.gang_members[-u - 1][0] if u < 0 else u
            self._push(u, rep)

    # ------------------------------------------------------------------ pop
    def pop(self, gang_busy: Callable[[int], bool]) -> int | list[int] | None:
        """The next unit to offer: a pod index, a gang's pending members, or None.

        A gang is offered only when every member still to run is pending and none
        is bound or running (``gang_busy``): members that finished are not re-run.
        """
        tb = self.table
        while self._active:
            unit = heapq.heappop(self._active)[-1]
            if unit < 0:
                g = -unit - 1
                st = tb.status[self.gang_members[g]]
                members = [m for m, s in zip(self.gang_members[g], st, strict=True)
                           if s == PENDING]
                needed = int(((st != DONE) & (st != FAILED)).sum())
                if members and len(members) == needed and not gang_busy(g):
                    return members
            elif tb.status[unit] == PENDING and not self.is_parked(unit):
                if self._hinted.is_woken(unit):
                    # Woken by an event, but pods offered before it may have taken the room:
                    # when the state changed since the last look, check every woken unit's
                    # hint again at once (one numpy pass) and park those that pass nowhere,
                    # instead of asking the scheduler (a full cycle each) to refuse them.
                    stamp = (int(self.state.version.max()), self._samples)
                    if stamp != self._woken_checked:
                        self._hinted.park_failing_woken(self.state)
                        self._woken_checked = stamp
                    if not self._hinted.is_woken(unit):
                        continue
                    self._hinted.release([unit])
                return unit
        return None

    # ---------------------------------------------------------------- parking
    def park(self, unit: int, hint: RetryHint | None) -> None:
        """A rejected unit waits; with a hint, until an event lets it pass somewhere."""
        if hint is None or unit < 0:
            self._unhinted.add(unit)
        else:
            self._hinted.add(unit, self.request(unit), hint)

    def defer(self, unit: int) -> None:
        self._deferred.add(unit)

    # ----------------------------------------------------------------- events
    def room_freed(self, node: int) -> None:
        """A pod left ``node``: retry units that may now pass there."""
        if self._unhinted:
            units = sorted(self._unhinted)
            reps = np.array([self.gang_members[-u - 1][0] if u < 0 else u for u in units])
            ok = np.ones((len(units), 1), dtype=bool)
            for name, mask in self.state.fit_checks(self._table_batch(reps), np.array([node])):
                if name in ROOM_CHECKS:
                    ok &= mask
            units = [u for u, k in zip(units, ok[:, 0], strict=True) if k]
            self._unhinted.difference_update(units)
            self._requeue(units)
        if self._hinted.parked:
            self._requeue(self._hinted.wake(self._hinted.passing_at(self.state, node)))

    def _table_batch(self, pods: np.ndarray) -> RequestBatch:
        """The requests of ``pods`` as a batch, from the pod table (no GPU model: the rule
        without a hint asks only whether the requests fit the room)."""
        tb = self.table
        req = tb.requests[pods]
        return RequestBatch(req[:, CPU:CPU + 1], req[:, MEM:MEM + 1], req[:, FPGA:FPGA + 1],
                            tb.num_gpu[pods][:, None], tb.gpu_milli[pods][:, None],
                            tb.best_effort[pods][:, None], None)

    def usage_sampled(self) -> None:
        """Node usage (and with it load-based verdicts) changed: retry hinted units that
        now pass some node."""
        self._samples += 1
        if self._hinted.parked:
            self._requeue(self._hinted.wake(self._hinted.passing_anywhere(self.state)))

    def flush(self) -> None:
        """The periodic retry: deferred units and units without a hint go back to the queue
        (kube's podMaxInUnschedulablePodsDuration). Hinted units need no flush: every
        event that could let them pass is checked (``room_freed``, ``usage_sampled``)."""
        self._unhinted |= self._deferred
        self._deferred = set()
        units = sorted(self._unhinted)
        self._unhinted = set()
        self._requeue(units)

    def retry_all(self) -> None:
        """Nodes changed (a failure or a recovery): every parked unit goes back."""
        units = sorted(self._unhinted | set(self._hinted.parked_units()))
        self._unhinted = set()
        # Open nodes may have changed: every hint is void (woken units stay queued).
        self._hinted.release(list(self._hinted.row_of))
        self._requeue(units)

    def requeue(self, units: Iterable[int]) -> None:
        """Units evicted by preemption go straight back to the queue (as kube recreates
        preempted pods): any hint they had is void."""
        units = list(units)
        self._unhinted.difference_update(units)
        self._hinted.release([u for u in units if u in self._hinted.row_of])
        self._requeue(units)

    def park_evicted(self, units: Iterable[int]) -> None:
        """Evicted units wait without a hint (the caller retries them with ``retry_all``)."""
        self._unhinted.update(units)


class _HintedPool:
    """Parked units with retry hints, one row each: requests, open nodes, condition group."""

    def __init__(self, num_nodes: int) -> None:
        self.num_nodes = num_nodes
        # Every row's unit: parked (``active``: watching events) or woken (back in the
        # queue, its hint kept for the check when it is popped).
        self.row_of: dict[int, int] = {}
        self.parked = 0
        self._free: list[int] = []
        # A group: the same pod-independent conditions and the same preemption reach (pods
        # below that priority count as room: their evictions could make room).
        self._groups: list[tuple[NodeCondition, ...]] = []
        self._group_pb: list[int | None] = []
        self._group_ids: dict[tuple[int | None, ...], int] = {}
        # Rows with the same signature (request shape, open nodes, condition group) get
        # the same verdict anywhere: each check evaluates one row per signature. A
        # workload has few pod shapes, so a thousand waiting pods are a dozen checks.
        self._sig_ids: dict[tuple[object, ...], int] = {}
        self._alloc(64)

    def _alloc(self, cap: int) -> None:
        old = getattr(self, "unit", None)
        n = 0 if old is None else old.size
        open_ = np.zeros((cap, self.num_nodes), dtype=bool)
        unit = np.zeros(cap, dtype=np.int64)
        active = np.zeros(cap, dtype=bool)
        group = np.zeros(cap, dtype=np.int64)
        sig = np.zeros(cap, dtype=np.int64)
        used = np.zeros(cap, dtype=bool)
        cols = np.zeros((cap, 5), dtype=np.int64)  # cpu, memory, fpga, num_gpu, gpu_milli
        be = np.zeros((cap, 1), dtype=bool)
        models = np.ones((cap, len(GPU_MODEL_IDS) + 1), dtype=bool)
        constrained = np.zeros(cap, dtype=bool)
        if old is not None:
            open_[:n], unit[:n], active[:n], group[:n] = self.open, self.unit, self.active, \
                self.group
            used[:n], sig[:n] = self.used, self.sig
            cols[:n], be[:n], models[:n], constrained[:n] = self.cols, self.be, self.models, \
                self.constrained
        self.open, self.unit, self.active, self.group = open_, unit, active, group
        self.used, self.sig = used, sig
        self.cols, self.be, self.models, self.constrained = cols, be, models, constrained
        self._free.extend(range(cap - 1, n - 1, -1))

    def is_parked(self, unit: int) -> bool:
        r = self.row_of.get(unit)
        return r is not None and bool(self.active[r])

    def is_woken(self, unit: int) -> bool:
        r = self.row_of.get(unit)
        return r is not None and not self.active[r]

    def parked_units(self) -> list[int]:
        return [u for u, r in self.row_of.items() if self.active[r]]

    def add(self, unit: int, req: PodRequest, hint: RetryHint) -> None:
        if unit in self.row_of:
            self.release([unit])
        if not self._free:
            self._alloc(2 * self.unit.size)
        r = self._free.pop()
        key = (*(id(c) for c in hint.conditions), hint.preempt_below)
        g = self._group_ids.get(key)
        if g is None:
            g = self._group_ids[key] = len(self._groups)
            self._groups.append(hint.conditions)
            self._group_pb.append(hint.preempt_below)
        self.row_of[unit] = r
        self.parked += 1
        self.open[r] = hint.open_nodes
        self.unit[r], self.active[r], self.group[r], self.used[r] = unit, True, g, True
        v = req.vector
        self.cols[r] = (v[CPU], v[MEM], v[FPGA], req.num_gpu, req.gpu_milli)
        self.be[r] = req.best_effort
        self.constrained[r] = req.models_ok is not None
        self.models[r] = req.models_ok if req.models_ok is not None else True
        key = (g, tuple(self.cols[r].tolist()), bool(self.be[r, 0]),
               self.models[r].tobytes() if self.constrained[r] else b"",
               self.open[r].tobytes())
        self.sig[r] = self._sig_ids.setdefault(key, len(self._sig_ids))

    def wake(self, units: list[int]) -> list[int]:
        """``units`` go back to the queue: stop watching events for them; returns them."""
        for u in units:
            self.active[self.row_of[u]] = False
        self.parked -= len(units)
        return units

    def park_again(self, unit: int) -> None:
        """A woken unit that no longer passes anywhere watches events again."""
        self.active[self.row_of[unit]] = True
        self.parked += 1

    def release(self, units: list[int]) -> None:
        """Forget ``units`` and their hints."""
        for u in units:
            r = self.row_of.pop(u)
            if self.active[r]:
                self.parked -= 1
            self.active[r] = self.used[r] = False
            self._free.append(r)

    def park_failing_woken(self, state: ClusterState) -> None:
        """Woken units that pass no node now watch events again."""
        woken = np.flatnonzero(self.used & ~self.active)
        passing = set(self._passing_rows(state, woken))
        for u in self.unit[woken].tolist():
            if u not in passing:
                self.park_again(u)

    def _batch(self, rows: np.ndarray) -> RequestBatch:
        c = self.cols[rows]
        models = self.models[rows] if self.constrained[rows].any() else None
        return RequestBatch(c[:, 0:1], c[:, 1:2], c[:, 2:3], c[:, 3:4], c[:, 4:5],
                            self.be[rows], models)

    def _conditions(self, state: ClusterState, g: int) -> np.ndarray | None:
        """[N] bool where every condition of group ``g`` passes (None: no condition)."""
        ok = None
        for c in self._groups[g]:
            m = c.node_condition(state)
            ok = m if ok is None else ok & m
        return ok

    def passing_at(self, state: ClusterState, node: int) -> list[int]:
        """Parked units that pass every check on ``node`` now."""
        rows_all = np.flatnonzero(self.active & self.open[:, node])
        if rows_all.size == 0:
            return []
        if rows_all.size > _DEDUPE_FROM:
            sigs = self.sig[rows_all]
            uniq, first = np.unique(sigs, return_index=True)
            rows = rows_all[first]  # one row per signature
        else:
            rows = rows_all
        ok = np.zeros(rows.size, dtype=bool)
        groups = self.group[rows]
        at = np.array([node])
        for g in set(groups.tolist()):
            cond = self._conditions(state, g)
            if cond is not None and not cond[node]:
                continue
            in_g = np.flatnonzero(groups == g)
            fit = np.ones((in_g.size, 1), dtype=bool)
            for _, mask in state.fit_checks(self._batch(rows[in_g]), at,
                                            self._room(state, g, at)):
                fit &= mask
            ok[in_g] = fit[:, 0]
        if rows is not rows_all:
            ok = np.isin(sigs, uniq[ok])
        return self.unit[rows_all[ok]].tolist()

    def passing_anywhere(self, state: ClusterState) -> list[int]:
        """Parked units that pass every check on some node now."""
        return self._passing_rows(state, np.flatnonzero(self.active))

    def _passing_rows(self, state: ClusterState, rows_all: np.ndarray) -> list[int]:
        """The units of ``rows_all`` that pass every check on some node now."""
        if rows_all.size == 0:
            return []
        sigs = self.sig[rows_all]
        uniq, first = np.unique(sigs, return_index=True)
        ok = self._anywhere(state, rows_all[first])  # one row per signature
        return sorted(self.unit[rows_all[np.isin(sigs, uniq[ok])]].tolist())

    def _anywhere(self, state: ClusterState, rows_all: np.ndarray) -> np.ndarray:
        """Bool per row of ``rows_all``: it passes every check on some node now."""
        out = np.zeros(rows_all.size, dtype=bool)
        groups = self.group[rows_all]
        for g in np.unique(groups).tolist():
            in_g = np.flatnonzero(groups == g)
            rows_g = rows_all[in_g]
            cond = self._conditions(state, g)
            nodes = np.flatnonzero(self.open[rows_g].any(axis=0) if cond is None
                                   else cond & self.open[rows_g].any(axis=0))
            if nodes.size == 0:
                continue
            room = self._room(state, g, nodes)
            for start in range(0, rows_g.size, _CHUNK):
                rows = rows_g[start:start + _CHUNK]
                ok = self.open[np.ix_(rows, nodes)]
                for _, mask in state.fit_checks(self._batch(rows), nodes, room):
                    ok &= mask
                out[in_g[start:start + _CHUNK]] = ok.any(axis=1)
        return out

    def _room(self, state: ClusterState, g: int, nodes: np.ndarray) -> Room | None:
        """Room on ``nodes`` that group ``g``'s pods could get by preemption (the pods of
        lower priority there), or None when they do not preempt."""
        pb = self._group_pb[g]
        if pb is None:
            return None
        res, be, dev = state.bound.room(state.bound.below(pb))
        return res[nodes], be[nodes], dev[nodes]
