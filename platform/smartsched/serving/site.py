"""One site's authoritative placement state: a region's cloud nodes or one MEC edge site.

Owns what must have a single writer: the ``ClusterState`` of the site's nodes,
the reservations taken on it (with their TTL), and the answers already given
to idempotent requests. Every placement goes filter -> score -> bind through
the site's scheduling profile (any name ``make_scheduler`` accepts), then
``ClusterState.allocate`` -- the twin's one definition of fit, which refuses
over-allocation -- so a device can never be booked twice. Gangs are placed
all-or-nothing: members placed before a failing one are released again.

This class knows nothing of Ray or HTTP: Serve deployments wrap it (one
replica per site), tests drive it directly, and the journal makes its state
survive a restart.
"""

from __future__ import annotations

import heapq
import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from smartsched.model.cluster import ClusterSpec, NodeSpec
from smartsched.model.errors import (
    InfeasibleDecisionError,
    SmartSchedError,
    UnknownReferenceError,
    ValidationError,
)
from smartsched.model.pod import Pod
from smartsched.model.resources import CPU, GPU, MEM
from smartsched.scheduling.base import WindowPlanner, WorkloadAware, make_scheduler
from smartsched.scheduling.framework import unschedulable_message
from smartsched.scheduling.sandbox import Placement, Proposal, Sandbox, SandboxConfig
from smartsched.serving.journal import Journal, pod_from_dict, pod_to_dict
from smartsched.twin.reservations import Reservation as TwinReservation
from smartsched.twin.state import ClusterState, PodRequest

log = logging.getLogger(__name__)

IDEMPOTENCY_KEEP = 10_000  # answers remembered per site for retries
# Pods answered, over all the answers remembered: one answer may hold a thousand pods (and
# their reasons), so a count of answers alone let a client make the service hold gigabytes.
IDEMPOTENCY_KEEP_PODS = 100_000


def idempotency_scope_of(key: str) -> str:
    """The scope an answer's key belongs to (``audit_trail.idempotency_scope``: a tenant,
    or a shared token's role): the part before its first ':' (past an edge entry's
    ``!edge:``); '' for a key without one."""
    k = key.removeprefix("!edge:")
    scope, sep, _ = k.partition(":")
    return scope if sep else ""


class AnswerCache(OrderedDict):
    """Answers kept for retries, oldest first: at most ``keep`` answers and ``keep_pods``
    pods answered in all (``size`` of an answer: its pods), the newest always kept.

    Past a bound, the answers that go are the oldest of the scope (tenant, or shared
    role: ``idempotency_scope_of``) holding the most: one tenant's traffic -- 101 batches
    of unplaceable pods -- flushed every other tenant's answers, and a victim's retry was
    booked a second time. A scope evicts only its own unless another holds more."""

    def __init__(self, keep: int = IDEMPOTENCY_KEEP, keep_pods: int = IDEMPOTENCY_KEEP_PODS,
                 size: Callable[[Any], int] = len) -> None:
        super().__init__()
        self.keep, self.keep_pods, self.size = keep, keep_pods, size
        self.pods = 0
        self._scopes: dict[str, OrderedDict[str, int]] = {}  # scope -> key -> its pods
        self._scope_pods: dict[str, int] = {}

    def _forget(self, key: str) -> None:
        scope = idempotency_scope_of(key)
        keys = self._scopes[scope]
        n = keys.pop(key)
        self.pods -= n
        self._scope_pods[scope] -= n
        if not keys:
            del self._scopes[scope], self._scope_pods[scope]

    def __setitem__(self, key: str, value: Any) -> None:
        if dict.__contains__(self, key):
            self._forget(key)
            super().move_to_end(key)  # newest in both orders, as its scope's re-insert is
        super().__setitem__(key, value)
        n = self.size(value)
        scope = idempotency_scope_of(key)
        self._scopes.setdefault(scope, OrderedDict())[key] = n
        self._scope_pods[scope] = self._scope_pods.get(scope, 0) + n
        self.pods += n

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._forget(key)

    def popitem(self, last: bool = True) -> tuple[str, Any]:
        key, value = super().popitem(last)
        self._forget(key)
        return key, value

    def pop(self, key: str, *default: Any) -> Any:  # type: ignore[override]
        if key in self:
            value = super().pop(key)
            self._forget(key)
            return value
        return super().pop(key, *default)

    def move_to_end(self, key: str, last: bool = True) -> None:
        super().move_to_end(key, last)
        self._scopes[idempotency_scope_of(key)].move_to_end(key, last)

    def __reduce__(self) -> Any:  # copies and pickles count their pods once
        return (type(self), (self.keep, self.keep_pods, self.size), None, None,
                iter(list(self.items())))

    def trim(self) -> None:
        """Forget answers until both bounds hold: each time the oldest of the scope that
        holds the most (pods past the pod bound, answers past the count); the newest
        answer stays."""
        def over() -> bool:
            return len(self) > 1 and (len(self) > self.keep or self.pods > self.keep_pods)

        while over():
            by_pods = self.pods > self.keep_pods

            def weight(s: str, by_pods: bool = by_pods) -> int:
                return self._scope_pods[s] if by_pods else len(self._scopes[s])

            newest = next(reversed(self))
            ranked = heapq.nlargest(2, self._scopes, key=weight)
            scope, floor = ranked[0], (weight(ranked[1]) if len(ranked) > 1 else -1)
            if list(self._scopes[scope]) == [newest]:  # the newest stays: the next gives way
                scope, floor = ranked[1], -1
            # From the heaviest scope while it stays the heaviest: one ranking per run of
            # evictions, not per eviction (a sort per eviction took 0.3 s at 1,000 tenants).
            for key in list(self._scopes[scope]):
                if not over() or weight(scope) < floor:
                    break
                if key != newest:
                    del self[key]
                if scope not in self._scopes:
                    break

    def recount(self) -> None:
        """Count the pods again (after answers were extended in place)."""
        self._scopes, self._scope_pods = {}, {}
        self.pods = 0
        for key, value in list(self.items()):
            n = self.size(value)
            scope = idempotency_scope_of(key)
            self._scopes.setdefault(scope, OrderedDict())[key] = n
            self._scope_pods[scope] = self._scope_pods.get(scope, 0) + n
            self.pods += n


# Nodes one site may hold (Kubernetes supports 5,000 per cluster): node updates add nodes
# request by request, and every node costs each decision a row.
MAX_SITE_NODES = 20_000
REPREPARE_EVERY = 500  # pods between refreshes of the scheduler's view of the workload
# The field an unknown (or expired, or another tenant's) reservation is answered under (404),
# on every path: confirm, release, the ingress's routing by id. The API's name for it.
RESERVATION_FIELD = "reservation_id"


@dataclass
class Booking:
    """One pod of a reservation: where it sits and what it holds."""

    pod: Pod
    node: int
    devices: tuple[int, ...]
    request: PodRequest


@dataclass
class Reservation:
    id: str
    bookings: list[Booking]
    expires_at: float
    confirmed: bool = False
    request_id: str | None = None


class FieldConflict(SmartSchedError):
    """A request that conflicts with the service's state (HTTP 409 naming ``field``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(field, message)  # the args rebuild it (errors cross Ray workers)
        self.field, self.message = field, message

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class NodeUpdateConflict(FieldConflict):
    """A node update that would leave a live reservation no room (HTTP 409 naming the
    update's ``field``)."""


def _as_shown(e: Exception, profile: str, label: str) -> ValidationError:
    """``e`` (loading ``profile``, the resolved form of ``label``) as an error that names
    ``label`` only: its message with the resolved path replaced by the label's, the same
    class for a ValidationError, else a ValidationError of ``profile`` without the message
    (an OSError's or a library's text carries paths)."""
    if not isinstance(e, ValidationError):
        return ValidationError("profile", f"cannot load {label[:200]!r} "
                                          f"({type(e).__name__})")
    from urllib.parse import parse_qsl

    resolved, given = profile.rpartition(":")[2], label.rpartition(":")[2]
    message = e.message.replace(profile, label)
    # The path, then each option that names a file (``?filters=FILE``), as the operator gave it.
    pairs = [(resolved, given or "."), (resolved.partition("?")[0], given.partition("?")[0] or ".")]
    theirs, ours = (parse_qsl(x.partition("?")[2], keep_blank_values=True)
                    for x in (profile, label))
    if len(theirs) == len(ours):
        pairs += [(v, w or ".") for (_, v), (_, w) in zip(theirs, ours, strict=True) if v != w]
    for old, new in pairs:
        if old:
            message = message.replace(old, new)
    return type(e)("profile", message)


def _owned_by(r: Reservation, tenant: str | None) -> bool:
    """Whether ``tenant`` (None: any caller) may act on reservation ``r``."""
    return tenant is None or all(b.pod.tenant == tenant for b in r.bookings)


@dataclass
class SiteResult:
    """The outcome for one pod at this site."""

    pod_id: str
    placed: bool
    node: str | None = None
    zone: str | None = None
    devices: tuple[int, ...] = ()
    reservation_id: str | None = None
    expires_at: float | None = None
    reason: str = ""
    plugins: tuple[str, ...] = ()  # the filter plugins that rejected it (not placed)
    extra: dict[str, Any] = field(default_factory=dict)
    # Reservations released to place it (preemption): (reservation id, its pod ids).
    preempted: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The sandbox's verdict on the request (``Verdict.to_dict``), when it was validated.
    validation: dict[str, Any] | None = None


def site_subspec(spec: ClusterSpec, sites: Sequence[str]) -> ClusterSpec:
    """The part of ``spec`` in ``sites`` (their zones and nodes), as its own cluster."""
    wanted = set(sites)
    unknown = wanted - {s.name for s in spec.sites}
    if unknown:
        raise UnknownReferenceError("site", f"unknown site {sorted(unknown)[0]!r}")
    zones = tuple(z for z in spec.zones if z.site in wanted)
    zone_names = {z.name for z in zones}
    nodes = tuple(n for n in spec.nodes if n.zone in zone_names)
    return ClusterSpec(name=f"{spec.name}/{'+'.join(sorted(wanted))}",
                       sites=tuple(s for s in spec.sites if s.name in wanted),
                       zones=zones, nodes=nodes)


class SitePlacer:
    """Single-writer placement state and reservations for one site."""

    def __init__(self, spec: ClusterSpec, profile: str, *, seed: int = 0,
                 clock: Callable[[], float] = time.time, journal: Journal | None = None,
                 preemption: bool = False, sandbox_mode: str = "request",
                 sandbox: SandboxConfig | None = None, gang_gpus: int = 8,
                 compliance: str | dict[str, Any] | None = None,
                 gang_reservations: bool = False) -> None:
        self.spec = spec
        self.state = ClusterState(spec)
        if compliance is not None:  # checked against the whole cluster by the service
            from smartsched.scheduling.compliance import attach, load_policy

            attach(self.state, load_policy(compliance), check=False)
        self.clock = clock
        self.t0 = clock()
        self.profile = profile
        self.configured = profile  # the deployment's own; a live reload may replace it
        self._profile_event: dict[str, Any] | None = None  # the last live reload, journaled
        self.scheduler = make_scheduler(profile, seed)
        self.reservations: dict[str, Reservation] = {}
        self._expiry: list[tuple[float, str]] = []  # heap of (expires_at, reservation id)
        self.answers = AnswerCache(IDEMPOTENCY_KEEP, IDEMPOTENCY_KEEP_PODS)
        self._recent: deque[Pod] = deque(maxlen=2000)
        self._since_prepare: int | None = None
        self.decisions = 0
        self.journal = journal
        self.preemption = preemption
        # Gang room holds (``_hold_gang_room``): gang -> until when (clock) the hold stands
        # for a gang that does not come back.
        self.gang_reservations = gang_reservations
        self._holds: dict[str, float] = {}
        self._last_reserve: Any = None
        self._made_now: set[str] = set()
        self.registered: dict[str, NodeSpec] = {}  # nodes added or changed through the API
        # Sandbox validation (see ``place``): mode, the sandbox (it keeps the recent pods
        # its arrivals are drawn from), and what a validated request collects.
        self.sandbox_mode = sandbox_mode
        self._sandbox_settings = sandbox or SandboxConfig()
        self.sandbox = (Sandbox(self._sandbox_settings.model_copy(
            update={"rollout": self._rollout_for(profile)})) if sandbox_mode != "off" else None)
        self.gang_gpus = gang_gpus
        # Escalations an edge site queued while its region was unreachable (by id: the
        # journal event), journaled so a restarted replica replays them (serving.tiers).
        self.escalations: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._buffer: list[dict[str, Any]] | None = None  # journal events held back
        self._victims: list[Pod] | None = None
        self._popped: list[tuple[str, Any]] | None = None
        if journal is not None:
            self._recover(journal)

    # ------------------------------------------------------------ profile
    def set_profile(self, profile: str, seed: int = 0, label: str | None = None) -> None:
        """Swap the scheduling profile; state and reservations are untouched. ``label`` is
        the name answers and metrics show (default: ``profile``), e.g. a policy's path as
        the operator gave it rather than where the server keeps it: an error then names
        what the operator gave, never the server's paths, and any failure to load (a name
        too long for the file system, an unreadable file) is a ValidationError of
        ``profile``.

        The swap is journaled: a replica restarted after a crash (or a failed health
        check) comes back on it, not on the deployment's profile, as long as the
        deployment's profile is still the one it replaced (a redeploy with another
        profile is the operator's newer word)."""
        self._swap_profile(profile, seed, label)
        self._record_profile(profile, label, seed)

    def configure(self, profile: str, seed: int = 0) -> None:
        """The deployment's own profile (Serve's user_config, applied at every replica
        start and at a redeploy). When the journal holds a live reload made on top of this
        same deployment profile -- a replica restarted after a reload -- the reload stays;
        otherwise the deployment's profile is served (a redeploy is the operator's newer
        word)."""
        self.configured = profile
        ev = self._profile_event
        if ev is not None and ev.get("configured") == profile and (
                self.profile == (ev.get("label") or ev["profile"]) or self._restore(ev)):
            return
        self._swap_profile(profile, seed, None)
        self._record_profile(profile, None, seed)

    def _restore(self, ev: dict[str, Any]) -> bool:
        """Serve the journaled live reload ``ev`` again; False (logged) when it no longer
        loads (its policy was removed since, say)."""
        try:
            self._swap_profile(str(ev["profile"]), int(ev.get("seed") or 0), ev.get("label"))
            return True
        except Exception as e:
            log.warning("the live reload to %s could not be restored (%s); serving %s",
                        ev.get("label") or ev.get("profile"), type(e).__name__,
                        self.configured)
            return False

    def _record_profile(self, profile: str, label: str | None, seed: int) -> None:
        self._profile_event = {"op": "profile", "profile": profile, "label": label,
                               "seed": seed, "configured": self.configured}
        self._log(self._profile_event)

    def _swap_profile(self, profile: str, seed: int, label: str | None) -> None:
        try:
            sched = make_scheduler(profile, seed)  # fails before anything changes
        except Exception as e:
            if label is None or label == profile:
                raise
            raise _as_shown(e, profile, label) from None
        if self._recent and isinstance(sched, WorkloadAware):
            sched.prepare(list(self._recent))
        self.scheduler, self.profile = sched, label or profile
        if self.sandbox is not None and self._rollout_for(profile) != \
                self.sandbox.config.rollout:
            sandbox = self.sandbox.with_rollout(self._rollout_for(profile))
            if self._recent:
                sandbox.prepare(list(self._recent))
            self.sandbox = sandbox

    def _rollout_for(self, profile: str) -> str:
        """The sandbox's rollout (what a request is compared with): as configured, else the
        site's own profile, or the composite heuristic for a policy (``rl:...``)."""
        if "rollout" in self._sandbox_settings.model_fields_set:
            return self._sandbox_settings.rollout
        return profile if ":" not in profile else "composite"

    def _maybe_prepare(self, pods: Sequence[Pod]) -> None:
        """Give heuristics that need the workload (FGD's target) the recently seen pods."""
        self._recent.extend(pods)
        if not isinstance(self.scheduler, WorkloadAware) and self.sandbox is None:
            return
        if self._since_prepare is None or self._since_prepare >= REPREPARE_EVERY:
            if isinstance(self.scheduler, WorkloadAware):
                self.scheduler.prepare(list(self._recent))
            if self.sandbox is not None:
                self.sandbox.prepare(list(self._recent))
            self._since_prepare = 0
        self._since_prepare += len(pods)

    # ------------------------------------------------------------ placing
    def recent_pods(self, limit: int) -> list[Pod]:
        """The last ``limit`` pods this site was asked to place, oldest first."""
        return list(self._recent)[-limit:] if limit > 0 else []

    def can_host(self, pod: Pod) -> bool:
        """Whether any node of the site could hold ``pod`` now (resources only)."""
        req = self.state.compile(pod)
        return bool(self.state.resource_fit(req).any())

    def place(self, pods: Sequence[Pod], ttl_s: float,
              request_id: str | None = None, validate: bool = False) -> list[SiteResult]:
        """Place ``pods`` (a gang or unrelated pods); reserve what was placed for ``ttl_s``.

        Pods sharing a ``gang_id`` succeed or fail together. The answer for a
        ``request_id`` seen before is returned again without a second reservation.
        ``validate`` (or the site's sandbox mode) rolls the request's outcome forward in
        the sandbox before it counts: refused, nothing of it is kept (``_place_validated``).
        """
        if request_id is not None and request_id in self.answers:
            self.answers.move_to_end(request_id)
            held = {r.pod_id: r for r in self.answers[request_id]}
            rest = [p for p in pods if p.id not in held]
            if not rest:  # a retry: the same answer, in the request's order
                answer = self.answers[request_id]
                if [r.pod_id for r in answer] != [p.id for p in pods]:  # recovered
                    self.answers[request_id] = answer = [held[p.id] for p in pods]
                return answer
            # Part of the request is answered here no more: a restart recovers only the
            # reservations still held (one per pod or gang), a preemption takes its pods
            # out. Those pods are placed again; the others keep their bookings.
            with self._journal_group():
                held.update((r.pod_id, r) for r in self._place(rest, ttl_s, request_id,
                                                                 validate))
            self.answers[request_id] = answer = [held[p.id] for p in pods]
            return answer
        with self._journal_group():  # one fsync for the request, before it is answered
            return self._place(pods, ttl_s, request_id, validate)

    def _journal_group(self) -> AbstractContextManager[None]:
        """The journal's group for one request or sweep (a no-op without a journal)."""
        return self.journal.group() if self.journal is not None else nullcontext()

    def _place(self, pods: Sequence[Pod], ttl_s: float, request_id: str | None,
               validate: bool) -> list[SiteResult]:
        self.expire()
        now = self.clock()
        self.state.now = now - self.t0
        self._maybe_prepare(pods)
        if self.sandbox is not None:
            for p in pods:
                self.sandbox.observe(p, self.state.now)
        mode = self.sandbox_mode
        if self.sandbox is not None and (validate or mode in ("risky", "all")):
            results = self._place_validated(pods, now, ttl_s, request_id, validate)
        else:
            results = self._place_all(pods, now, ttl_s, request_id)
        if request_id is not None:
            self.answers[request_id] = results
            self.answers.trim()
        return results

    def _place_all(self, pods: Sequence[Pod], now: float, ttl_s: float,
                   request_id: str | None) -> list[SiteResult]:
        results: list[SiteResult] = []
        self._made_now = set()  # reservations of this request: never victims
        if len({p.gang_id or p.id for p in pods}) > 1 \
                and isinstance(self.scheduler, WindowPlanner):
            # A joint placer (``anneal:<profile>``) solves the batch (its single pods and
            # whole gangs) as one window first; each pod is then booked as usual, as the
            # plan says, a gang all or nothing.
            self.scheduler.plan_window(self.state, [self.state.compile(p) for p in pods])
        groups: dict[str, list[Pod]] = {}
        for p in pods:
            groups.setdefault(p.gang_id or f"\0{p.id}", []).append(p)
        for members in groups.values():
            results.extend(self._place_group(members, now + ttl_s, request_id))
        order = {p.id: i for i, p in enumerate(pods)}
        results.sort(key=lambda r: order[r.pod_id])
        return results

    def _place_validated(self, pods: Sequence[Pod], now: float, ttl_s: float,
                         request_id: str | None, asked: bool) -> list[SiteResult]:
        """Place as usual, holding back the journal; then validate what was done (the
        placements and the pods they preempted) against the state before it. Refused (or
        an error), the state, the reservations and the remembered answers are put back as
        they were and nothing is journaled: every pod is answered unplaced, with the
        sandbox's reasons. In ``risky`` mode, a request that is not risky (one pod or one
        small gang, no preemption) is kept without validation."""
        assert self.sandbox is not None
        before = self.state.fork()
        saved = (dict(self.reservations), list(self._expiry), dict(self._holds))
        self._buffer, self._victims, self._popped = [], [], []
        try:
            results = self._place_all(pods, now, ttl_s, request_id)
            bookings = [b for rid, r in self.reservations.items() if rid in self._made_now
                        for b in r.bookings]  # in the order they were made
            victims = list(self._victims)
            gangs = {p.gang_id for p in pods if p.gang_id is not None and p.gang_size > 1}
            many_gpus = any(p.num_gpu * p.gang_size >= self.gang_gpus for p in pods
                            if p.gang_id in gangs)
            batch = len({p.gang_id or p.id for p in pods}) > 1
            kind = ("preemption" if victims else "batch" if batch
                    else "gang" if gangs else "placement")
            risky = asked or self.sandbox_mode == "all" or bool(victims) or batch or many_gpus
            verdict = None
            if bookings and risky:
                verdict = self.sandbox.validate(before, Proposal(
                    tuple(Placement(b.request, b.node, b.devices) for b in bookings),
                    evictions=tuple(victims), kind=kind, whole_gangs=True))
        except BaseException:
            self._undo(before, saved)
            raise
        finally:
            events, self._buffer, self._victims = self._buffer or [], None, None
        if verdict is not None and not verdict.accepted:
            self._undo(before, saved)
            why = "refused by sandbox validation: " + "; ".join(verdict.reasons)
            return [SiteResult(p.id, False, reason=why, validation=verdict.to_dict())
                    for p in pods]
        self._popped = None
        for e in events:
            self._log(e)
        if verdict is not None:
            for r in results:
                r.validation = verdict.to_dict()
        return results

    def _undo(self, before: ClusterState,
              saved: tuple[dict[str, Reservation], list, dict[str, float]]) -> None:
        """Put back the state (the same object: schedulers keep per-state caches), the
        reservations, the expiry heap, the gang holds (the state's held room comes back
        with the state: a hold the request let go of would otherwise stay in the state with
        nothing to expire it) and the answers a preemption forgot."""
        self.state.__dict__.update(before.__dict__)
        self.reservations, self._expiry, self._holds = saved
        for key, value in reversed(self._popped or ()):  # the first saved is the original
            self.answers[key] = value
        self._popped = None
        self._made_now = set()

    def _place_group(self, members: list[Pod], expires_at: float,
                     request_id: str | None) -> list[SiteResult]:
        bookings: list[Booking] = []
        failed: Pod | None = None
        plugins: tuple[str, ...] = ()
        preempted: tuple[tuple[str, tuple[str, ...]], ...] = ()
        for pod in members:
            booking, why, plugins, preempted = self._place_one(pod, alone=len(members) == 1)
            if booking is None:
                failed = pod
                break
            bookings.append(booking)
        if failed is not None:
            for b in reversed(bookings):  # all-or-nothing
                self.state.release(b.node, b.request, b.devices)
            gang = len(members) > 1
            room = self._hold_gang_room(members[0], expires_at) if gang else None
            # (The pod's own reason: its id, the client's text, may hold ": " itself.)
            reason = f"gang not placed ({failed.id}: {why})" if gang else why
            if room is not None:
                reason += (f"; room held on {len(room['nodes'])} node(s) from "
                           f"{room['due_at']:.0f} (retry then)")
            return [SiteResult(p.id, False, reason=reason, plugins=plugins,
                               extra={"gang_room": room} if room is not None else {})
                    for p in members]
        if len(members) > 1 and members[0].gang_id is not None:  # started: its hold is kept
            self.state.reservations.remove(members[0].gang_id)
            self._holds.pop(members[0].gang_id, None)
        rid = uuid.uuid4().hex
        res = Reservation(rid, bookings, expires_at, request_id=request_id)
        self.reservations[rid] = res
        self._made_now.add(rid)
        self._track(res)
        if self.journal is not None:
            self._log(self._reserve_event(res))
        zone_names = self.state.zone_names
        return [SiteResult(b.pod.id, True, node=self.state.names[b.node],
                           zone=zone_names[int(self.state.zone_id[b.node])],
                           devices=tuple(int(d) for d in b.devices), reservation_id=rid,
                           expires_at=expires_at, preempted=preempted) for b in bookings]

    def _place_one(self, pod: Pod, alone: bool = True
                   ) -> tuple[Booking | None, str, tuple[str, ...],
                              tuple[tuple[str, tuple[str, ...]], ...]]:
        """A booking, or why not (kube's message) and which filter plugins refused it; and
        the reservations released to make room (preemption), with their pods."""
        req = self.state.compile(pod)
        decision = self.scheduler.decide(self.state, req)
        self.decisions += 1
        self._last_reserve = decision.reserve
        if decision.node is None:
            why = unschedulable_message(self.state.num_nodes, decision.rejections)
            if decision.defer:
                said = "; ".join(r.reason for r in decision.rejections)
                why = "the profile deferred it" + (f": {said}" if said else "")
            return None, why, decision.rejected_by(), ()
        preempted: tuple[tuple[str, tuple[str, ...]], ...] = ()
        if decision.victims:
            n = len(decision.victims)
            if not self.preemption:
                return None, (f"fits only by preempting {n} lower-priority pod(s); this "
                              "service does not preempt (service.preemption: false)"), (), ()
            if not alone:
                return None, (f"fits only by preempting {n} lower-priority pod(s); a gang "
                              "does not preempt in the service"), (), ()
            if any(v.tenant != pod.tenant for v in decision.victims):
                # Priority comes from the request: across tenants it would let any token
                # evict the others' pods. Within a tenant, its own priorities rule.
                return None, (f"fits only by preempting {n} pod(s), some of another tenant; "
                              "the service preempts within a tenant only"), (), ()
            rids = self._reservations_of(decision.victims)
            if rids is None:
                return None, "refused: a victim is not held by a reservation here", (), ()
            # A gang is booked in one reservation; one gang id in several is several
            # requests' gangs under one name, which the twin evicts as one gang: the
            # victims would be the other requests' pods too.
            held_by: dict[str, set[str]] = {}
            for rid in rids:
                for b in self.reservations[rid].bookings:
                    if b.pod.gang_id is not None:
                        held_by.setdefault(b.pod.gang_id, set()).add(rid)
            if any(len(held) > 1 for held in held_by.values()):
                return None, (f"fits only by preempting {n} pod(s) whose gang id is booked "
                              "by several requests (they would go as one gang); the service "
                              "does not preempt them"), (), ()
            if set(rids) & self._made_now:
                return None, (f"fits only by preempting {n} pod(s) of this same request; "
                              "it does not preempt its own placements"), (), ()
            trial = self.state.fork()  # check the whole move before releasing anything
            for rid in rids:
                for b in self.reservations[rid].bookings:
                    trial.release(b.node, b.request, b.devices)
            try:
                trial.allocate(decision.node, req, tuple(
                    decision.devices if decision.devices is not None
                    else trial.pick_devices(decision.node, req)), until=self._until(pod))
            except InfeasibleDecisionError as e:
                return None, f"refused by the state: {e}", (), ()
            released = []
            for rid in rids:
                r = self.release(rid)
                if self._victims is not None:
                    self._victims.extend(b.pod for b in r.bookings)
                answer = self.answers.get(r.request_id) if r.request_id is not None else None
                if answer is not None:  # a retry must not see these pods as placed
                    gone = {b.pod.id for b in r.bookings}
                    self.answers[r.request_id] = [a for a in answer if a.pod_id not in gone]
                    if self._popped is not None:
                        self._popped.append((r.request_id, answer))
                released.append((rid, tuple(b.pod.id for b in r.bookings)))
            preempted = tuple(released)
        devices = decision.devices
        if devices is None:
            devices = self.state.pick_devices(decision.node, req)
        try:
            self.state.allocate(decision.node, req, tuple(devices), until=self._until(pod))
        except InfeasibleDecisionError as e:  # a profile bug must not corrupt state
            return None, f"refused by the state: {e}", (), ()
        return Booking(pod, decision.node, tuple(devices), req), "", (), preempted

    def _until(self, pod: Pod) -> float:
        """When a booked pod is expected to leave, in state time: after its declared
        ``duration_s`` (what gang reservations plan on), else never."""
        return self.state.now + pod.duration if pod.duration is not None else np.inf

    def _hold_gang_room(self, lead: Pod, expires_at: float) -> dict[str, Any] | None:
        """After a gang's rejection: hold the room its profile reserved (GangReservation:
        the nodes whose booked pods leave soonest, as their ``duration_s`` says), so that
        other pods backfill around it (the Reservations filter) until the gang comes back
        when it is due. A hold stands until due plus the request's TTL; a gang whose hold
        came due and that still does not fit loses it (nodes are not held for a gang that
        cannot use them), as in the twin. Soft state: not journaled."""
        gang = lead.gang_id
        if not self.gang_reservations or gang is None:
            return None
        reserve, self._last_reserve = self._last_reserve, None
        if reserve is not None and reserve.gang != gang:
            reserve = None
        for g in reserve.displaces if reserve is not None else ():
            self._holds.pop(g, None)
        held = self.state.reservations.settle(gang, reserve, self.state.now)
        if held is None:
            self._holds.pop(gang, None)
            return None
        due_at = self.t0 + held.due
        self._holds[gang] = due_at + max(expires_at - self.clock(), 0.0)
        names = self.state.names
        return {"nodes": [names[n] for n in held.nodes], "due_at": due_at,
                "held_until": self._holds[gang]}

    def _carry_holds(self, state: ClusterState) -> None:
        """Put the gang holds of the current state into ``state``, its rebuild after a node
        update (node indices may differ: re-applied by node name, as the Kubernetes
        scheduler's ``_apply_holds``). A hold whose node is gone, or that the current state
        no longer has, is dropped from ``_holds`` too, so the two agree after it. A node
        update is not a restart: the room promised in an answer (``gang_room``) stays
        held (holds are soft state only across a restart: not journaled)."""
        old = self.state
        for gang in list(self._holds):
            r = old.reservations.by_gang.get(gang)
            names = [old.names[n] for n in r.nodes] if r is not None else []
            if r is None or any(n not in state.index for n in names):
                del self._holds[gang]
                continue
            state.reservations.add(TwinReservation(
                r.gang, r.priority, tuple(state.index[n] for n in names), r.request,
                r.gpus, r.due))

    def drop_gang_hold(self, gang: str) -> bool:
        """Let go of the room held for ``gang`` (placed at another site); whether one was."""
        self._holds.pop(gang, None)
        return self.state.reservations.remove(gang) is not None

    def _reservations_of(self, victims: Sequence[Pod]) -> list[str] | None:
        """The reservations holding ``victims`` (each whole: a gang goes together), or None
        if one of them is held by none."""
        holder = {id(b.request.pod): rid for rid, r in self.reservations.items()
                  for b in r.bookings}
        rids: list[str] = []
        for v in victims:
            rid = holder.get(id(v))
            if rid is None:
                return None
            if rid not in rids:
                rids.append(rid)
        return rids

    # ------------------------------------------------------------ reservations
    def confirm(self, rid: str, tenant: str | None = None) -> Reservation:
        """Keep a reservation until released (the pod was bound / started). With
        ``tenant``, only a reservation of that tenant's pods (another's reads as unknown)."""
        r = self._get(rid, tenant)
        if not r.confirmed:
            r.confirmed = True
            self._log({"op": "confirm", "rid": rid})
        return r

    def release(self, rid: str, tenant: str | None = None) -> Reservation:
        r = self.reservations.get(rid)
        if r is None or not _owned_by(r, tenant):
            raise UnknownReferenceError(RESERVATION_FIELD, f"unknown reservation {rid!r}")
        del self.reservations[rid]
        for b in r.bookings:
            self.state.release(b.node, b.request, b.devices)
        self._log({"op": "release", "rid": rid})
        return r

    def _track(self, r: Reservation) -> None:
        heapq.heappush(self._expiry, (r.expires_at, r.id))

    def expire(self) -> int:
        """Release unconfirmed reservations past their TTL; return how many.

        Runs before every request, so it pops a heap of expiry times instead of
        scanning every live reservation; released or confirmed ones are skipped.
        """
        with self._journal_group():
            return self._expire()

    def _expire(self) -> int:
        now = self.clock()
        for gang in [g for g, t in self._holds.items() if t <= now]:
            self.state.reservations.remove(gang)  # the gang did not come back for it
            del self._holds[gang]
        n = 0
        while self._expiry and self._expiry[0][0] <= now:
            _, rid = heapq.heappop(self._expiry)
            r = self.reservations.get(rid)
            if r is not None and not r.confirmed and r.expires_at <= now:
                self.release(rid)
                n += 1
        return n

    def _get(self, rid: str, tenant: str | None = None) -> Reservation:
        self.expire()
        r = self.reservations.get(rid)
        if r is None or not _owned_by(r, tenant):
            raise UnknownReferenceError(RESERVATION_FIELD,
                                        f"unknown or expired reservation {rid!r}") from None
        return r

    # ------------------------------------------------------------ nodes
    def apply_node_updates(self, updates: Sequence[tuple[int, str, dict[str, Any]]],
                           usage: dict[str, tuple[float, float, float]] | None = None,
                           dry_run: bool = False) -> dict[str, int]:
        """``PUT /v1/nodes`` for this site: ``(row, name, changes)`` merged onto the current
        nodes (a field left out keeps its value), then ``upsert_nodes``. Errors name
        ``nodes.<row>.<field>``; nothing changes unless every update is valid. ``dry_run``
        checks everything (the re-booking of live reservations included) and changes
        nothing: a request touching several sites is checked on all before any applies."""
        current = {n.name: n for n in self.spec.nodes}
        specs = [node_from_update(row, name, changes, current.get(name),
                                  self.spec.zones[0].name) for row, name, changes in updates]
        self.expire()  # a reservation past its TTL holds no room the update must leave
        try:
            return self.upsert_nodes(specs, usage, dry_run=dry_run)
        except NodeUpdateConflict as e:  # named as the request's row
            rows = {f"nodes.{name}": f"nodes.{row}" for row, name, _ in updates}
            raise NodeUpdateConflict(rows.get(e.field, e.field), e.message) from None

    def upsert_nodes(self, nodes: Sequence[NodeSpec],
                     usage: dict[str, tuple[float, float, float]] | None = None,
                     dry_run: bool = False) -> dict[str, int]:
        """Register new nodes or replace changed ones, and/or set observed usage.

        Changing nodes rebuilds the state and re-books every live reservation on
        the same node and devices; if one no longer fits (a node shrank or lost
        devices) nothing changes and the error names the node.
        """
        zones = {z.name for z in self.spec.zones}
        for n in nodes:
            if n.zone not in zones:
                raise UnknownReferenceError(f"nodes.{n.name}.zone",
                                            f"unknown zone {n.zone!r} in this site")
        by_name = {n.name: n for n in self.spec.nodes}
        changed = [n for n in nodes if by_name.get(n.name) != n]
        total = len(by_name) + len({n.name for n in changed} - by_name.keys())
        if total > MAX_SITE_NODES:
            raise ValidationError("nodes", f"the site would hold {total:,} nodes (at most "
                                  f"{MAX_SITE_NODES:,} per site)")
        known = {n.name for n in self.spec.nodes} | {n.name for n in changed}
        for name in usage or {}:
            if name not in known:
                raise UnknownReferenceError(f"nodes.{name}", f"unknown node {name!r}")
        if dry_run:
            if changed:
                self._rebuild(changed, commit=False)
            return {"changed": len(changed), "usage": len(usage or {})}
        if changed:
            self._rebuild(changed)
            self._log({"op": "nodes", "nodes": [_node_dict(n) for n in changed]})
        for name, (cpu, mem, gpu) in (usage or {}).items():
            i = self.state.node_index(name)
            cap = self.state.capacity[i]
            self.state.usage[i] = (cpu * cap[CPU], mem * cap[MEM], gpu * cap[GPU])
        return {"changed": len(changed), "usage": len(usage or {})}

    def _rebuild(self, changed: Sequence[NodeSpec], commit: bool = True) -> None:
        by_name = {n.name: n for n in changed}
        old = [by_name.pop(n.name, n) for n in self.spec.nodes]
        spec = ClusterSpec(name=self.spec.name, sites=self.spec.sites, zones=self.spec.zones,
                           nodes=(*old, *by_name.values()))
        state = ClusterState(spec)
        state.compliance = self.state.compliance  # re-binds to the new node list
        state.usage[: self.state.num_nodes] = self.state.usage
        state.now = self.state.now
        rebooked: dict[str, list[Booking]] = {}
        bound = self.state.bound
        for rid, r in self.reservations.items():
            rebooked[rid] = []
            for b in r.bookings:
                node = state.node_index(self.state.names[b.node])
                req = state.compile(b.pod)
                # When it is expected to leave, as booked: gang reservations plan on it.
                row = next((x for x in bound.row_of.get(id(b.request), ())
                            if bound.node[x] == b.node), None)
                until = float(bound.until[row]) if row is not None else np.inf
                try:
                    state.allocate(node, req, b.devices, until=until)
                except InfeasibleDecisionError as e:
                    name = self.state.names[b.node]
                    raise NodeUpdateConflict(
                        f"nodes.{name}", f"the update of node {name} leaves no room for "
                        f"reservation {rid}: release it first ({e})") from None
                rebooked[rid].append(Booking(b.pod, node, b.devices, req))
        if not commit:
            return
        for rid, bookings in rebooked.items():
            self.reservations[rid].bookings = bookings
        self._carry_holds(state)
        self.spec, self.state = spec, state
        self.registered.update({n.name: n for n in changed})

    # ------------------------------------------------------------ durability
    def _reserve_event(self, r: Reservation) -> dict[str, Any]:
        return {"op": "reserve", "rid": r.id, "expires_at": r.expires_at,
                "confirmed": r.confirmed, "request_id": r.request_id,
                "bookings": [{"pod": pod_to_dict(b.pod), "node": self.state.names[b.node],
                              "devices": list(b.devices)} for b in r.bookings]}

    def _snapshot_events(self) -> list[dict[str, Any]]:
        nodes = ([{"op": "nodes", "nodes": [_node_dict(n) for n in self.registered.values()]}]
                 if self.registered else [])
        profile = [self._profile_event] if self._profile_event is not None else []
        return (profile + nodes + [self._reserve_event(r) for r in self.reservations.values()]
                + list(self.escalations.values()))

    # ------------------------------------------------------------ escalation queue
    def record_escalation(self, esc_id: str, pods: Sequence[Pod], ttl_s: float,
                          validate: bool, queued_at: float) -> None:
        """An escalation queued while the region was unreachable: journaled (fsynced when
        the journal is) before the queued answer leaves, so a restart replays it."""
        event = {"op": "escalate", "id": esc_id, "pods": [pod_to_dict(p) for p in pods],
                 "ttl_s": ttl_s, "validate": validate, "queued_at": queued_at}
        self.escalations[esc_id] = event
        self._log(event)

    def escalation_done(self, esc_id: str) -> None:
        """The region answered a queued escalation: it is not replayed again."""
        if self.escalations.pop(esc_id, None) is not None:
            self._log({"op": "escalated", "id": esc_id})

    def _log(self, event: dict[str, Any]) -> None:
        if self._buffer is not None:  # a request under validation: kept until it counts
            self._buffer.append(event)
            return
        if self.journal is None:
            return
        self.journal.append(event)
        if self.journal.needs_compaction():
            self.journal.rewrite(self._snapshot_events())

    def _recover(self, journal: Journal) -> None:
        """Rebuild reservations from the journal; drop those expired meanwhile."""
        live: dict[str, dict[str, Any]] = {}
        nodes: dict[str, NodeSpec] = {}
        reloaded: dict[str, Any] | None = None
        for e in journal.replay():
            op, rid = e.get("op"), e.get("rid")
            if op == "profile":
                reloaded = e
            elif op == "nodes":
                nodes.update({d["name"]: _node_from_dict(d) for d in e["nodes"]})
            elif op == "reserve":
                live[rid] = e
            elif op == "confirm" and rid in live:
                live[rid]["confirmed"] = True
            elif op == "release":
                live.pop(rid, None)
            elif op == "escalate":
                self.escalations[e["id"]] = e
            elif op == "escalated":
                self.escalations.pop(e.get("id"), None)
        if nodes:
            self._rebuild(list(nodes.values()))  # no reservations yet: cannot conflict
        now = self.clock()
        for rid, e in live.items():
            if not e.get("confirmed") and e["expires_at"] <= now:
                continue
            bookings = []
            for b in e["bookings"]:
                pod = pod_from_dict(b["pod"])
                node = self.state.node_index(b["node"])
                req = self.state.compile(pod)
                self.state.allocate(node, req, tuple(b["devices"]), until=self._until(pod))
                bookings.append(Booking(pod, node, tuple(b["devices"]), req))
            r = Reservation(rid, bookings, e["expires_at"], bool(e.get("confirmed")),
                            e.get("request_id"))
            self.reservations[rid] = r
            self._track(r)
            if r.request_id is not None:  # a request's reservations share its answer
                zone_names = self.state.zone_names
                self.answers.setdefault(r.request_id, []).extend(SiteResult(
                    b.pod.id, True, node=self.state.names[b.node],
                    zone=zone_names[int(self.state.zone_id[b.node])], devices=b.devices,
                    reservation_id=rid, expires_at=r.expires_at) for b in bookings)
        self.answers.recount()
        # Kept (and rewritten with the live state) until ``configure`` says which
        # deployment profile this replica has: Serve applies the user_config after init.
        self._profile_event = reloaded
        if reloaded is not None and reloaded.get("configured") == self.configured:
            self._restore(reloaded)  # the live reload this replica had before it restarted
        # Start the file afresh with the live state only.
        journal.rewrite(self._snapshot_events())

    # ------------------------------------------------------------ views
    def free_fraction(self) -> dict[str, float]:
        """Free share of each resource over the nodes that are up, and (``capacity_*``)
        their capacity: millicores, MiB and GPU milli (the cloud tier divides a batch by
        it, ``CloudTier``'s ``division``)."""
        st = self.state
        total = st.capacity[st.up].sum(axis=0)
        cap = np.maximum(total, 1)
        free = st.free_res[st.up].sum(axis=0)
        return {"cpu": float(free[CPU] / cap[CPU]), "memory": float(free[MEM] / cap[MEM]),
                "gpu": float(free[GPU] / cap[GPU]) if st.capacity[:, GPU].sum() else 0.0,
                "capacity_cpu": float(total[CPU]), "capacity_memory": float(total[MEM]),
                "capacity_gpu": float(total[GPU])}

    def summary(self) -> dict[str, Any]:
        self.expire()
        f = self.free_fraction()
        return {"nodes": self.state.num_nodes, "cpu_free_pct": 100 * f["cpu"],
                "memory_free_pct": 100 * f["memory"], "gpu_free_pct": 100 * f["gpu"],
                "gpus_total": int(self.state.gpu_count.sum()),
                "reservations": len(self.reservations), "profile": self.profile}


NEW_NODE_NEEDS = ("cpu_milli", "memory_mib")


def node_from_update(row: int, name: str, changes: dict[str, Any], current: NodeSpec | None,
                     default_zone: str) -> NodeSpec:
    """The node after an update: ``changes`` over ``current`` (a known node keeps every
    field the update leaves out), or a new node from ``changes`` and the model's defaults.
    A ValidationError names ``nodes.<row>.<field>``."""
    if current is None:
        for need in NEW_NODE_NEEDS:
            if need not in changes:
                raise ValidationError(f"nodes.{row}.{need}", "required for a new node")
        merged: dict[str, Any] = {"zone": default_zone, **changes}
    else:
        merged = {f.name: getattr(current, f.name) for f in fields(NodeSpec)}
        if changes.get("num_gpu") == 0 and "gpu_model" not in changes:
            merged["gpu_model"] = ""  # removing the GPUs removes their model
        if changes.get("num_fpga") == 0 and "fpga_model" not in changes:
            merged["fpga_model"] = ""
        merged.update(changes)
    merged["name"] = name
    if "taints" in merged:
        merged["taints"] = tuple(merged["taints"])
    if "labels" in merged:
        merged["labels"] = dict(merged["labels"])
    try:
        return NodeSpec(**merged)
    except ValidationError as e:
        raise ValidationError(f"nodes.{row}.{e.field.rsplit('.', 1)[-1]}", e.message) from None


def _node_dict(n: NodeSpec) -> dict[str, Any]:
    from dataclasses import asdict

    d = asdict(n)
    d["labels"] = dict(n.labels)
    return d


def _node_from_dict(d: dict[str, Any]) -> NodeSpec:
    return NodeSpec(**{**d, "taints": tuple(d.get("taints", ()))})
