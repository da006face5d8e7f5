"""The scheduling framework: extension points, a cycle context, and profiles that run them.

Owns the Protocols every plugin implements (one per extension point, as in
kube-scheduler's framework), the per-cycle context handed to plugins, and
``ProfileScheduler``, which runs a profile: filters -> scores (each 0..100,
normalized over the feasible nodes) -> weighted sum -> highest score, ties
broken uniformly at random from a seeded generator (kube-scheduler's
selectHost) or by lowest index -> the binder picks devices.

Every plugin is vectorized over all nodes: one numpy expression per plugin,
never a Python loop over nodes. A filter returns a ``Status`` (its checks,
each with a reason, a code and the passing mask: ``scheduling.status``),
computed once per cycle. A rejection is a value: a Decision whose
``Rejection``s name the plugin and count the nodes it failed (each node
blamed on the first check that fails it), with a ``RetryHint`` that tells
the twin's queue which events could make the pod schedulable; never an
exception.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from smartsched.model.pod import Pod
from smartsched.model.priority import NEVER
from smartsched.scheduling.base import Reseedable, TwinNeeds, WorkloadAware
from smartsched.scheduling.status import (
    Code,
    EnqueueExtensions,
    NodeConditionFilter,
    QueueingHint,
    Status,
)
from smartsched.twin.decision import Decision, Migration, NodeCondition, Rejection, RetryHint
from smartsched.twin.reservations import Reservation
from smartsched.twin.state import ClusterState, PodRequest

MAX_NODE_SCORE = 100


class CycleContext:
    """One scheduling cycle: the snapshot, the pod, and a store plugins share.

    Plugins must not mutate ``state``; ``cache`` holds values several plugins
    derive from the same snapshot (kube's CycleState); ``statuses`` are the
    profile's filter verdicts once filtered. A plain slotted class: one is made
    per decision.
    """

    __slots__ = ("cache", "request", "state", "statuses")

    def __init__(self, state: ClusterState, request: PodRequest) -> None:
        self.state = state
        self.request = request
        self.cache: dict[str, Any] = {}
        self.statuses: list[Status] = []

    def cached(self, key: str, fn: Any) -> Any:
        if key not in self.cache:
            self.cache[key] = fn()
        return self.cache[key]


@runtime_checkable
class FilterPlugin(Protocol):
    """Filter extension point: which nodes can run the pod."""

    name: str

    def filter(self, ctx: CycleContext) -> Status:
        """The verdict over all nodes: each check's reason, code and passing mask."""
        ...


@runtime_checkable
class ScorePlugin(Protocol):
    """Score extension point: how good each feasible node is, normalized to 0..100."""

    name: str

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray | float:
        """Float [N] in 0..100 (values on infeasible nodes are ignored), or one float
        when every node scores the same."""
        ...


@runtime_checkable
class PostFilterPlugin(Protocol):
    """PostFilter extension point: what to do when no node passes (preemption)."""

    name: str

    def post_filter(self, state: ClusterState, request: PodRequest,
                    eligible: np.ndarray) -> Any:
        """A ``Nomination`` (node and victims), a ``Reservation`` (for a gang that cannot
        start), or None. ``eligible``: nodes where every check other than room passes."""
        ...


@runtime_checkable
class DeschedulePlugin(Protocol):
    """Descheduling extension point (kubernetes-sigs/descheduler's strategies, run by the
    twin every ``interval_s``): bound pods to move so that waiting pods can start."""

    name: str
    interval_s: float

    def plan(self, sched: ProfileScheduler, state: ClusterState,
             waiting: Sequence[PodRequest]) -> tuple[Migration, ...]:
        """Moves for this pass (none: nothing worth moving). ``waiting``: pending pods in
        queue order; ``sched`` runs the profile's filters for them."""
        ...


@runtime_checkable
class DeferPlugin(Protocol):
    """Defer extension point: whether a pod that could start now should wait (carbon).
    Asked only for pods with feasible nodes; a deferred pod is offered again at the next
    periodic flush."""

    name: str

    def defer(self, ctx: CycleContext, feasible: np.ndarray) -> str | None:
        """Why the pod should wait now, or None to place it."""
        ...


@runtime_checkable
class BindPlugin(Protocol):
    """Bind extension point: which devices on the chosen node the pod gets."""

    name: str

    def devices(self, ctx: CycleContext, node: int) -> tuple[int, ...] | None:
        """Device indices on ``node`` (None: the twin's default best-fit binder)."""
        ...


@dataclass(frozen=True)
class Profile:
    """A named list of filters, weighted scorers, a binder and a tie-break rule."""

    name: str
    filters: tuple[FilterPlugin, ...]
    scorers: tuple[tuple[ScorePlugin, float], ...]
    binder: BindPlugin | None = None
    # "random": uniform among the best (kube's selectHost); "first": lowest index;
    # "rank": lowest position in a seeded random node order (the FGD simulator's rule:
    # smallest name, names prefixed by a seeded permutation).
    tie_break: str = "random"
    # A load forecaster (folder) whose per-node predictions the twin attaches for this
    # profile (``ClusterState.predicted_usage``; LoadAware plans on them).
    forecaster: str | None = None
    # Tried in order when no node passes the filters (DefaultPreemption).
    post_filters: tuple[PostFilterPlugin, ...] = ()
    # Periodic passes that move bound pods (GpuDefrag).
    deschedulers: tuple[DeschedulePlugin, ...] = ()
    # Asked before placing a pod that could start: wait instead (CarbonShift).
    deferrers: tuple[DeferPlugin, ...] = ()
    # Run-wide settings (profile_doc.RunSettings): the queue's order, and how long pods
    # tolerate a NotReady node (None: the cluster's default).
    queue_sort: str = "priority"
    failure_toleration_s: float | None = None

    def plugins(self) -> list[object]:
        out: list[object] = [*self.filters, *(p for p, _ in self.scorers), *self.post_filters,
                             *self.deschedulers, *self.deferrers]
        if self.binder is not None and all(self.binder is not p for p in out):
            out.append(self.binder)
        return out


class ProfileScheduler:
    """Runs one profile as a ``Scheduler`` (see ``scheduling.base``)."""

    def __init__(self, profile: Profile, seed: int = 0) -> None:
        self.profile = profile
        self.name = profile.name
        self.queue_sort = profile.queue_sort
        self.failure_toleration_s = profile.failure_toleration_s
        self.rng = np.random.default_rng(seed)
        self.last_scores: np.ndarray | None = None
        self._rank: np.ndarray | None = None
        for p in profile.plugins():
            if isinstance(p, Reseedable):
                p.reseed(seed)
        # What each filter says about retries (read once: protocol checks are slow).
        self._queueing = tuple(
            (f.queueing_hint if isinstance(f, EnqueueExtensions) else None,
             f if isinstance(f, NodeConditionFilter) else None)
            for f in profile.filters)

    def prepare(self, pods: Sequence[Pod]) -> None:
        """Give plugins that model the workload (FGD's typical pods) the pods to come."""
        for p in self.profile.plugins():
            if isinstance(p, WorkloadAware):
                p.prepare(pods)

    def twin_needs(self) -> TwinNeeds:
        """The profile's forecaster, if it plans on predicted usage."""
        return TwinNeeds(forecaster=self.profile.forecaster)

    @property
    def deschedule_interval_s(self) -> float | None:
        """How often the twin runs this profile's descheduling pass (None: no pass)."""
        return min((d.interval_s for d in self.profile.deschedulers), default=None)

    def deschedule(self, state: ClusterState,
                   waiting: Sequence[PodRequest]) -> tuple[Migration, ...]:
        """The first descheduling plugin with moves decides this pass."""
        for d in self.profile.deschedulers:
            moves = d.plan(self, state, waiting)
            if moves:
                return moves
        return ()

    def feasible(self, state: ClusterState, request: PodRequest) -> tuple[np.ndarray, CycleContext]:
        """Run the filters: the mask of nodes that pass them all, and the cycle (with each
        filter's ``Status`` in ``ctx.statuses``)."""
        ctx = CycleContext(state, request)
        statuses = ctx.statuses
        ok = None
        for f in self.profile.filters:
            status = f.filter(ctx)
            statuses.append(status)
            ok = status.passing.copy() if ok is None else np.logical_and(ok, status.passing,
                                                                            out=ok)
        if state.compliance is not None:  # hard constraints bind every profile (compliance.py)
            status = state.compliance.filter(ctx)
            statuses.append(status)
            ok = status.passing.copy() if ok is None else np.logical_and(ok, status.passing,
                                                                            out=ok)
        return ok, ctx

    def _hints(self, ctx: CycleContext) -> tuple[tuple[Any, Any], ...]:
        """Each status's queueing hint; compliance's (after the profile's) has none: its
        isolation verdicts change when other pods leave, so retry on every event."""
        extra = len(ctx.statuses) - len(self._queueing)
        return self._queueing + ((None, None),) * extra

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        ok, ctx = self.feasible(state, request)
        return self.decide_feasible(ctx, ok)

    def decide_feasible(self, ctx: CycleContext, ok: np.ndarray) -> Decision:
        """``decide`` after the filters ran (``feasible``'s mask and cycle): post-filters
        when no node passes, else deferrers, scores (kept in ``last_scores``), selection
        and binder. Split out so a caller that needs the cycle too (a policy choosing
        within this profile's shortlist) filters once."""
        state, request = ctx.state, ctx.request
        idx = np.flatnonzero(ok)
        if idx.size == 0:
            reserve = None
            for post in self.profile.post_filters:
                out = post.post_filter(state, request, self.room_only(ctx))
                if isinstance(out, Reservation):  # a gang that cannot start holds room
                    reserve = out
                elif out is not None:  # a nomination: evict its victims, take its node
                    return Decision(out.node, victims=tuple(out.victims))
            rejected = self.rejection(ctx)
            if reserve is not None:
                return dataclasses.replace(rejected, reserve=reserve)
            return rejected
        for d in self.profile.deferrers:
            why = d.defer(ctx, ok)
            if why is not None:
                return Decision(None, defer=True, rejections=(Rejection(why, d.name),))
        if idx.size == 1 or not self.profile.scorers:
            total = np.zeros(state.num_nodes)
        else:
            total = np.zeros(state.num_nodes)
            for plugin, weight in self.profile.scorers:
                total += weight * plugin.score(ctx, ok)
        self.last_scores = total
        cand = total[idx]
        best = idx[cand == cand.max()]
        if best.size == 1 or self.profile.tie_break == "first":
            node = int(best[0])
        elif self.profile.tie_break == "rank":
            if self._rank is None or self._rank.size != state.num_nodes:
                self._rank = self.rng.permutation(state.num_nodes)
            node = int(best[np.argmin(self._rank[best])])
        else:
            node = int(best[self.rng.integers(best.size)])
        devices = self.profile.binder.devices(ctx, node) if self.profile.binder else None
        return Decision(node, devices)

    def ranked(self, state: ClusterState, request: PodRequest, k: int
               ) -> list[tuple[int, tuple[int, ...] | None]]:
        """The ``k`` best feasible nodes by the profile's score, best first (ties by node
        index), each with the devices its binder would give: the candidates a lookahead
        compares. Empty when no node passes the filters."""
        ok, ctx = self.feasible(state, request)
        idx = np.flatnonzero(ok)
        if idx.size == 0:
            return []
        total = self.weighted_scores(ctx, ok)[idx]
        top = idx[np.argsort(-total, kind="stable")[:k]]
        binder = self.profile.binder
        return [(int(n), binder.devices(ctx, int(n)) if binder else None) for n in top]

    def room_only(self, ctx: CycleContext) -> np.ndarray:
        """Nodes where every check other than room passes: only evicting pods could make
        the pod fit there (the PostFilter's candidates)."""
        ok = np.ones(ctx.state.num_nodes, dtype=bool)
        for (hint, _), status in zip(self._hints(ctx), ctx.statuses, strict=True):
            for _, code, passing in status.checks:
                if not (hint is QueueingHint.RESOURCES and code == Code.UNSCHEDULABLE):
                    ok &= passing
        return ok

    def rejection(self, ctx: CycleContext) -> Decision:
        """The Decision for a pod no node passes: why, per plugin, and when to retry."""
        return Decision.reject(*self.reasons(ctx), retry=self.retry_hint(ctx))

    def node_reasons(self, ctx: CycleContext) -> dict[int, Rejection]:
        """Each infeasible node's first failing check (kube's per-node status)."""
        remaining = np.ones(ctx.state.num_nodes, dtype=bool)
        out: dict[int, Rejection] = {}
        for status in ctx.statuses:
            for reason, code, passing in status.checks:
                failed = remaining & ~passing
                why = Rejection(reason, status.plugin, 1, code)
                out.update(dict.fromkeys(np.flatnonzero(failed).tolist(), why))
                remaining &= ~failed
        return out

    def weighted_scores(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray:
        """The profile's weighted score sum per node (what ``decide`` maximizes)."""
        total = np.zeros(ctx.state.num_nodes)
        if feasible.any():
            for plugin, weight in self.profile.scorers:
                total += weight * plugin.score(ctx, feasible)
        return total

    def reasons(self, ctx: CycleContext) -> tuple[Rejection, ...]:
        """One ``Rejection`` per failing check, with the number of nodes it is the first
        failing check of (kube's "3 nodes: Insufficient cpu")."""
        remaining = np.ones(ctx.state.num_nodes, dtype=bool)
        out: list[Rejection] = []
        for status in ctx.statuses:
            for reason, code, passing in status.checks:
                failed = remaining & ~passing
                n = int(failed.sum())
                if n:
                    out.append(Rejection(reason, status.plugin, n, code))
                remaining &= ~failed
        return tuple(out)

    def retry_hint(self, ctx: CycleContext) -> RetryHint | None:
        """When the rejected pod could pass (see ``twin.decision.RetryHint``), or None when
        a filter does not say which events change its verdicts (retry on every event)."""
        open_nodes = np.ones(ctx.state.num_nodes, dtype=bool)
        conditions: list[NodeCondition] = []
        for (hint, condition), status in zip(self._hints(ctx), ctx.statuses, strict=True):
            for _, code, passing in status.checks:
                if code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
                    open_nodes &= passing
                elif passing.all():
                    # It refused no node: whatever lets the others pass wakes the pod, and
                    # if this check refuses then, that rejection carries its own hint.
                    continue
                elif code != Code.UNSCHEDULABLE or hint in (None, QueueingHint.STATIC):
                    return None
            if hint is QueueingHint.NODE_CONDITION:
                if condition is None:
                    return None
                conditions.append(condition)
        pod = ctx.request.pod
        may_preempt = (bool(self.profile.post_filters) and pod.preemption_policy != NEVER
                       and pod.gang_size <= 1)
        return RetryHint(open_nodes, tuple(conditions),
                         preempt_below=pod.priority if may_preempt else None)


def unschedulable_message(num_nodes: int, rejections: Sequence[Rejection]) -> str:
    """kube-scheduler's message for ``rejections``: "0/4 nodes are available: 3 Insufficient
    cpu, 1 node(s) had untolerated taint"."""
    parts = [f"{r.nodes} {r.reason}" if r.nodes else r.reason for r in rejections]
    return f"0/{num_nodes} nodes are available: {', '.join(parts) or 'no feasible node'}"


def min_max_normalize(raw: np.ndarray, feasible: np.ndarray) -> np.ndarray:
    """Scale ``raw`` linearly over the feasible nodes to 0..100 (all 0 when it is constant)."""
    vals = raw[feasible]
    lo, hi = vals.min(), vals.max()
    if hi == lo:
        return np.zeros_like(raw, dtype=np.float64)
    return (raw - lo) * (MAX_NODE_SCORE / (hi - lo))


def lowest_best(raw: np.ndarray, feasible: np.ndarray) -> np.ndarray | float:
    """0..100 with the lowest ``raw`` over the feasible nodes at 100 and the highest at 0
    (latency, pull time); every node 100 when they are all equal."""
    vals = raw[feasible]
    lo, hi = float(vals.min()), float(vals.max())
    if hi == lo:
        return float(MAX_NODE_SCORE)
    return MAX_NODE_SCORE * (hi - raw) / (hi - lo)


def default_normalize(raw: np.ndarray, feasible: np.ndarray, reverse: bool) -> np.ndarray:
    """kube-scheduler's DefaultNormalizeScore: scale by the max (integer), optionally reversed."""
    max_count = int(raw[feasible].max()) if feasible.any() else 0
    r = raw.astype(np.int64)
    if max_count == 0:
        return np.full(raw.shape, MAX_NODE_SCORE if reverse else 0, dtype=np.float64)
    s = MAX_NODE_SCORE * r // max_count
    return (MAX_NODE_SCORE - s if reverse else s).astype(np.float64)
