"""The custom scheduler: pods with ``schedulerName: smartsched`` placed by a profile and bound.

Owns one scheduling pass against a real API server through the official
client: list nodes and pods, build the twin's snapshot (pods already bound
count as allocated), take this scheduler's pending pods in kube's queue order
(priority, then creation time), decide each with the profile on the snapshot
-- allocating as it goes, so one pass never overbooks -- and bind with the
Binding API. A pod-group (Coscheduling label + min-member annotation) binds
all-or-nothing: its members are decided on a fork of the state and bound only
if every member fits. A pod that fits nowhere gets a Kubernetes Event with the
per-check reasons ("0/12 nodes are available: 10 Insufficient gpu, ..."), again
when the reason changes or after ``EVENT_REPEAT_S``, not at every pass.
A bind that conflicts (409: bound meanwhile) re-reads the pod instead of
retrying; one whose answer is lost (a 5xx, a timeout: it may have bound) keeps its
room taken for the rest of the pass; a 429 stops the pass's binds and the daemon
waits as long as its ``Retry-After`` asks. Every API call has a timeout, so a
half-open connection cannot stall the loop; the lists are read as plain JSON, so
one object the client's models refuse cannot stop every pass. A profile that sets
``failure_toleration_s`` adds, before binding, the tolerations of
``node.kubernetes.io/unreachable`` and ``not-ready`` (NoExecute) with that
``tolerationSeconds`` to the pod (tolerations may only be added to a pod; the
taint manager evicts after the smallest matching one), so a failed node's pods are
evicted and placed again that long after it is NotReady instead of after 300 s.
``LeaseLock`` is leader election on a ``coordination.k8s.io`` Lease,
so two replicas never bind the same pod: a lease counts as expired when it has not
changed for its duration on this replica's own clock (client-go's rule: a holder's
skewed ``renewTime`` neither keeps nor gives up the lease), and a pass binds only
until the lease it renewed runs out (``SchedulerLoop.leader_until``).

Between passes ``watch_pods`` watches pods from the list's resourceVersion and
returns as soon as one of this scheduler's pods is pending or a pod frees room
(finished or deleted); a 410 Gone (history compacted) asks for a re-list, a
dropped stream for a reconnect with backoff.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from smartsched.k8s.snapshot import (
    MIN_MEMBER_ANNOTATION,
    POD_GROUP_LABEL,
    POD_GROUP_LABEL_OLD,
    build_snapshot,
)
from smartsched.model.errors import SmartSchedError
from smartsched.scheduling.base import NeedsTwin, WorkloadAware, make_scheduler
from smartsched.scheduling.framework import unschedulable_message
from smartsched.twin.decision import Decision
from smartsched.twin.reservations import Reservation

log = logging.getLogger(__name__)
# A gang hold outlives its due time by this much at most when its group is not tried
# again (deleted, or no longer this scheduler's).
HOLD_GRACE_S = 300.0
# Seconds any API call may take (a watch: its own timeout plus this), so a half-open
# connection raises instead of blocking the loop forever.
API_TIMEOUT_S = 30.0
# The most of one API answer this scheduler reads, and how long the whole answer may take
# (the timeout above bounds each socket read: a proxy sending a byte every few seconds
# held a pass, and its lease renewal, for ever; an endless body was read into memory).
MAX_API_ANSWER_BYTES = 512 << 20
API_ANSWER_DEADLINE_S = 4 * API_TIMEOUT_S


class ApiAnswerError(Exception):
    """An API answer that is not one: too large, too slow, or not JSON."""


def read_json_answer(resp: Any) -> Any:
    """The JSON of an API answer read unparsed (``_preload_content=False``), one socket
    read at a time within MAX_API_ANSWER_BYTES and API_ANSWER_DEADLINE_S; its connection
    given back either way. ``ApiAnswerError`` for anything that is not a JSON answer
    (JSON nested thousands deep raised a RecursionError traceback). A connection whose
    answer was cut is closed, not given back (the next request on it failed)."""
    import json

    from smartsched.prometheus.source import AnswerTooLarge, AnswerTooSlow, read_bounded

    try:
        body = read_bounded(resp, MAX_API_ANSWER_BYTES,
                            time.monotonic() + API_ANSWER_DEADLINE_S)
    except AnswerTooLarge:
        raise ApiAnswerError(f"answered with more than {MAX_API_ANSWER_BYTES:,} "
                             "bytes") from None
    except AnswerTooSlow:
        raise ApiAnswerError(f"did not finish its answer within "
                             f"{API_ANSWER_DEADLINE_S:g} s") from None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise ApiAnswerError("answered with something that is not JSON") from None
# A pod's unchanged FailedScheduling event is recorded again after this long at most
# (the reason is checked every pass; a new Event each pass would flood the API server).
EVENT_REPEAT_S = 300.0
# The longest ``Retry-After`` honoured (a larger or unreadable one counts as this).
MAX_RETRY_AFTER_S = 60.0
# After the API server refuses a pod status patch as forbidden (a Role without
# ``pods/status: patch``), how long pending pods go unmarked before one is tried again:
# each try is a refused call per pending pod per pass otherwise.
STATUS_FORBIDDEN_RETRY_S = 300.0


@dataclass
class PassResult:
    bound: dict[str, str] = field(default_factory=dict)  # pod key -> node
    failed: dict[str, str] = field(default_factory=dict)  # pod key -> reason
    conflicts: list[str] = field(default_factory=list)
    # pod key -> (node nominated, victims evicted through the Eviction API)
    preempting: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    # Seconds the API server asked to wait (a 429's Retry-After): the pass stopped binding.
    retry_after: float | None = None


def retry_after(e: BaseException) -> float | None:
    """Seconds an ``ApiException`` asks to wait (429, or 503 with ``Retry-After``), capped
    at ``MAX_RETRY_AFTER_S``; None for any other error."""
    status = getattr(e, "status", None)
    raw = (getattr(e, "headers", None) or {}).get("Retry-After")
    if status != 429 and raw is None:
        return None
    try:
        secs = float(raw)
    except (TypeError, ValueError):  # absent, or an HTTP date: wait the most
        return MAX_RETRY_AFTER_S
    return min(max(secs, 0.0), MAX_RETRY_AFTER_S) if secs == secs else MAX_RETRY_AFTER_S


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class SchedulerMetrics:
    """What the scheduler exports: attempts by result, end-to-end latency, queue depth."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.attempts = Counter("smartsched_scheduler_attempts",
                                "Scheduling attempts by result", ["result"],
                                registry=self.registry)
        self.e2e = Histogram("smartsched_scheduler_e2e_seconds",
                             "From a pass's start to the pod's bind (or its failure)",
                             buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                             registry=self.registry)
        self.queue = Gauge("smartsched_scheduler_pending_pods",
                           "Pods of this scheduler waiting at the start of a pass",
                           registry=self.registry)
        self.stale_usage = Gauge("smartsched_scheduler_stale_usage_values",
                                 "Node usage values from Prometheus that are stale or missing "
                                 "(the last good value is used)", registry=self.registry)


class SchedulerLoop:
    def __init__(self, core: Any, scheduler_name: str = "smartsched",
                 profile: str = "k8s-default", seed: int = 0,
                 prometheus_url: str | None = None, preemption: bool = False,
                 compliance: str | None = None, audit: Any = None,
                 gang_reservations: bool = False) -> None:
        """``prometheus_url``: read each node's actual usage (and, for a policy that observes
        it, the reduced telemetry) from this Prometheus at every pass; without it the
        snapshot knows requests only and load-aware plugins see idle nodes.
        ``preemption``: when the profile nominates victims (DefaultPreemption), evict them
        through the Eviction API and bind in a later pass; off, such pods stay pending
        with the reason. ``gang_reservations``: a pod group that cannot start holds the room
        its profile reserves (GangReservation: the nodes whose pods leave soonest, by their
        ``smartsched.io/expected-duration-seconds``) across passes, and other pods backfill
        around it (the Reservations filter)."""
        self.core = core
        self.preemption = preemption
        self.gang_reservations = gang_reservations
        # group -> its hold: node names, one member's charged request, whole GPUs, due
        # (this loop's clock), priority; re-applied to every pass's snapshot.
        self._holds: dict[str, tuple[tuple[str, ...], Any, int, float, int]] = {}
        # pod key -> (nominated node, its victims) until it binds
        self._nominated: dict[str, tuple[str, set[str]]] = {}
        self._terminating: set[str] = set()
        self._terminating_on: dict[str, list[tuple[str, int]]] = {}
        self.last_rv: str | None = None
        # time.monotonic() past which this replica's lease may have run out: no bind or
        # eviction after it (set by the daemon at each renewal; None: no election).
        self.leader_until: float | None = None
        self.metrics = SchedulerMetrics()
        self._started = time.time()
        self.name = scheduler_name
        self.profile = profile
        self.sched = make_scheduler(profile, seed)
        self.toleration_s: float | None = getattr(self.sched, "failure_toleration_s", None)
        # The signed decision log (smartsched.audit.AuditLog), written after each pass: a
        # placement, a preemption, and a rejection when its reason changes (a pending pod is
        # tried every pass; its unchanged reason is not logged again).
        self.audit = audit
        self._said: dict[str, str] = {}
        # pod key -> (its last FailedScheduling message, when: time.monotonic())
        self._evented: dict[str, tuple[str, float]] = {}
        # pod key -> the PodScheduled=False status last patched (uid, reason, message,
        # nominated): a pod recreated under its name is another pod
        self._conditioned: dict[str, tuple[Any, str, str, str | None]] = {}
        self._status_forbidden_until = 0.0  # time.monotonic(): no status patch before it
        # resourceVersions of this pass's own status patches: their watch events are no work
        self._own_writes: set[str] = set()
        # Hard constraints on every pass's snapshot (scheduling.compliance): the node list
        # changes between passes, so node names the policy gives are matched leniently.
        self.compliance = None
        if compliance is not None:
            from smartsched.scheduling.compliance import load_policy

            self.compliance = load_policy(compliance)
        if prometheus_url is not None and not prometheus_url.startswith(("http://", "https://")):
            from smartsched.model.errors import ValidationError

            raise ValidationError("prometheus", f"must be an http(s) URL, got {prometheus_url!r}")
        self.prometheus_url = prometheus_url
        self._usage: Any = None  # PrometheusSource for the current node list
        self._projection: Any = None
        telemetry = self.sched.twin_needs().telemetry if isinstance(self.sched, NeedsTwin) \
            else None
        if prometheus_url and telemetry:  # a policy observing reduced telemetry: read it
            from smartsched.twin.telemetry.reduction import TelemetryProjection

            self._projection = TelemetryProjection.load(telemetry)

    def _mine(self, pod: dict[str, Any]) -> bool:
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        status = pod.get("status")
        phase = status.get("phase", "Pending") if isinstance(status, dict) else "Pending"
        return (isinstance(spec, dict) and isinstance(meta, dict)
                and spec.get("schedulerName") == self.name and not spec.get("nodeName")
                and phase == "Pending" and not meta.get("deletionTimestamp")
                and isinstance(meta.get("name"), str)
                # its name and namespace go into API paths and the Event it may get
                and isinstance(meta.get("namespace"), str | None)
                # gated (e.g. by Kueue until admitted): not to be scheduled yet
                and not spec.get("schedulingGates"))

    def _list(self, call: Callable[..., Any]) -> dict[str, Any]:
        """A list as the API's plain JSON (the client's models refuse some objects the
        API holds, and one such object must not stop every pass)."""
        doc = read_json_answer(call(_preload_content=False, _request_timeout=API_TIMEOUT_S))
        if not isinstance(doc, dict) or not isinstance(doc.get("items") or [], list):
            raise ValueError("the API server's list is not a list object")
        return doc

    def run_once(self) -> PassResult:
        t0 = time.perf_counter()
        res = self._pass()
        m = self.metrics
        for _ in res.bound:
            m.attempts.labels("scheduled").inc()
        for _ in res.failed:
            m.attempts.labels("unschedulable").inc()
        for _ in res.conflicts:
            m.attempts.labels("conflict").inc()
        for _ in range(len(res.bound) + len(res.failed)):
            m.e2e.observe(time.perf_counter() - t0)
        if self.audit is not None:
            self._audit_pass(res)
        return res

    def _audit_pass(self, res: PassResult) -> None:
        who = f"scheduler:{self.name}"

        def add(kind: str, key: str, doc: dict[str, Any]) -> None:
            self.audit.append(kind, who, {"pod": key, "profile": self.profile, **doc},
                              tenant=key.partition("/")[0])

        for key, node in res.bound.items():
            self._said.pop(key, None)
            add("placement", key, {"node": node})
        for key, (node, victims) in res.preempting.items():
            add("preemption", key, {"node": node, "victims": victims})
        for key, why in res.failed.items():
            if self._said.get(key) != why:
                self._said[key] = why
                add("rejection", key, {"reason": why})

    def _pass(self) -> PassResult:
        nodes = self._list(self.core.list_node).get("items") or []
        pod_list = self._list(self.core.list_pod_for_all_namespaces)
        self.last_rv = _part(pod_list, "metadata").get("resourceVersion")
        self._own_writes.clear()  # the watch resumes from this list
        pods = [p for p in pod_list.get("items") or [] if isinstance(p, dict)]
        others = [p for p in pods if not self._mine(p)]
        self._terminating = set()
        # node -> (key, priority) of its terminating pods: a preemptor nominated there
        # (by this replica or an earlier leader) waits for the lower-priority ones
        self._terminating_on: dict[str, list[tuple[str, int]]] = {}
        for p in others:
            meta, spec = _part(p, "metadata"), _part(p, "spec")
            if not meta.get("deletionTimestamp"):
                continue
            key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
            self._terminating.add(key)
            if isinstance(spec.get("nodeName"), str):
                self._terminating_on.setdefault(spec["nodeName"], []).append(
                    (key, _priority_or_0(spec.get("priority"))))
        self.metrics.queue.set(len(pods) - len(others))
        mine = sorted((p for p in pods if self._mine(p)), key=lambda p: (
            -_priority_or_0((p.get("spec") or {}).get("priority")),
            str((p.get("metadata") or {}).get("creationTimestamp") or "")))
        pending = {_key(p) for p in mine}
        for seen in (self._nominated, self._evented, self._said,
                     self._conditioned):  # bound, or gone: forget
            for k in [k for k in seen if k not in pending]:
                del seen[k]
        res = PassResult()
        try:
            snap = build_snapshot(nodes, others, time_origin=self._started)
        except SmartSchedError as e:  # no node it can use (all gone, or all malformed)
            for obj in mine:
                res.failed[_key(obj)] = str(e)
                self._event(obj, "FailedScheduling", str(e))
                self._unschedulable(obj, str(e), res)
            return res
        snap.state.compliance = self.compliance
        # Seconds since this scheduler started: schedulers that keep a history of the pods
        # offered (sandboxed:, lookahead:) draw arrival rates from it. When bound pods
        # started is not known: they count as started now (no work claimed lost).
        snap.state.now = time.time() - self._started
        snap.state.bound.since[:] = snap.state.now
        self._apply_holds(snap.state)
        if self.prometheus_url:
            self._read_usage(snap.state)
        from smartsched.k8s.snapshot import pod_model

        groups: dict[str, list[tuple[dict, Any]]] = {}
        taints = {t for n in snap.spec.nodes for t in n.taints}
        for obj in mine:
            key = _key(obj)
            try:
                # it binds: nothing ignored, tolerations matched as upstream does
                pod = pod_model(obj, enforce_affinity=True, taints=taints)
            except ValueError as e:
                res.failed[key] = f"not understood: {e}"
                self._event(obj, "FailedScheduling", res.failed[key])
                self._unschedulable(obj, res.failed[key], res)
                continue
            groups.setdefault(pod.gang_id or "\0" + key, []).append((obj, pod))
        if isinstance(self.sched, WorkloadAware):
            self.sched.prepare([p for g in groups.values() for _, p in g])
        running = _running_group_members(others)
        for gid, members in groups.items():
            self._place_group(snap, members, res, running.get(gid, 0))
        return res

    def _read_usage(self, state: Any) -> None:
        """Actual usage (and reduced telemetry) from Prometheus into the snapshot. Last good
        values survive a failed or stale read; the source is kept while the node list is the
        same, so they survive passes too."""
        from smartsched.prometheus.source import PrometheusSource

        self._usage = PrometheusSource.for_state(self.prometheus_url, state, reuse=self._usage)
        reading = self._usage.apply(state)
        stale = reading.stale_nodes(self._usage.names)
        self.metrics.stale_usage.set(sum(len(v) for v in stale.values()))
        for err in reading.errors:
            log.warning("usage from prometheus: %s", err)
        if self._projection is not None:
            from smartsched.prometheus.features import features_from_prometheus

            feats, errors = features_from_prometheus(self._usage, self._projection)
            state.telemetry_features = feats
            for err in errors[:3]:
                log.warning("telemetry from prometheus: %s", err)

    def watch_pods(self, rv: str | None, timeout_s: float) -> tuple[str | None, bool]:
        """Watch pods from ``rv``: (new resourceVersion or None to re-list, work to do?)."""
        import urllib3
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        if rv is None:
            return None, True
        w = watch.Watch()
        try:
            for ev in w.stream(self.core.list_pod_for_all_namespaces, resource_version=rv,
                               timeout_seconds=max(1, int(timeout_s)),
                               _request_timeout=(API_TIMEOUT_S, max(1, int(timeout_s))
                                                 + API_TIMEOUT_S)):
                obj = ev.get("raw_object") if isinstance(ev, dict) else None
                if not isinstance(obj, dict):  # a line that is not an event: skip it
                    continue
                rv = _part(obj, "metadata").get("resourceVersion", rv)
                if ev.get("type") == "MODIFIED" and rv in self._own_writes:
                    continue  # this scheduler's own status patch of a pending pod
                status = obj.get("status")
                phase = status.get("phase") if isinstance(status, dict) else None
                if self._mine(obj) or ev["type"] == "DELETED" or phase in ("Succeeded",
                                                                           "Failed"):
                    w.stop()
                    return rv, True
            return rv, False
        except ApiException as e:
            if e.status == 410:  # history compacted: list again
                log.info("watch expired (%s); re-listing", e.reason)
                return None, True
            raise
        except (urllib3.exceptions.HTTPError, OSError) as e:  # a dropped stream: reconnect
            log.info("watch stream dropped (%s); reconnecting", e)
            return rv, False

    def _place_group(self, snap: Any, members: list[tuple[dict, Any]], res: PassResult,
                     running: int = 0) -> None:
        """Decide a pod group's pending members on a fork and bind them only if, with its
        members already running, it reaches its min-member (the Coscheduling plugin's
        Permit rule): a group whose bind failed half-way starts its remaining members once
        they fit, instead of waiting for members it already has. A member that does not
        fit when the group reaches its number anyway waits on its own reason. Members
        that disagree on the number are refused (upstream reads it from one PodGroup, and
        the twin refuses such a gang): whichever sorted first decided it."""
        size = members[0][1].gang_size
        keys = [_key(o) for o, _ in members]
        sizes = sorted({p.gang_size for _, p in members})
        if len(sizes) > 1:
            why = (f"pod group {members[0][1].gang_id}: its members disagree on "
                   f"{MIN_MEMBER_ANNOTATION} ({', '.join(map(str, sizes[:8]))})")
            for (obj, _), k in zip(members, keys, strict=True):
                res.failed[k] = why
                self._event(obj, "FailedScheduling", why)
                self._unschedulable(obj, why, res)
            return
        need = max(size - running, 1)
        if len(members) < need:
            why = (f"pod group has {len(members)} of its {size} members pending"
                   + (f" and {running} running" if running else ""))
            for k in keys:
                res.failed[k] = why
            return
        trial = snap.state.fork()
        if running:  # room is needed, and held, for the members still to start only
            members = [(o, dataclasses.replace(p, gang_size=need)) for o, p in members]
            # The twin's gangs never run in part, so the reservation rule takes the room of
            # bound members as theirs to give back (members placed tentatively); here they
            # run, and their room is theirs until they end.
            own = trial.bound.gang_index(members[0][1].gang_id)
            if own is not None:
                trial.bound.gang[trial.bound.gang_rows(own)] = -1
        chosen: list[tuple[int, int, tuple[int, ...]]] = []  # member, node, devices
        missed: dict[int, str] = {}  # member -> why it fits nowhere
        first_miss: tuple[int, Any] | None = None  # (member, its Decision.reserve)
        for i, ((obj, pod), k) in enumerate(zip(members, keys, strict=True)):
            if len(chosen) + len(members) - i < need:  # the group cannot reach its number
                break
            req = trial.compile(pod)
            d = self.sched.decide(trial, req)
            if d.victims:
                if len(members) == 1 and self.preemption:
                    self._preempt(obj, k, snap.state.names[d.node], d.victims, res)
                    return
                d = Decision.reject(
                    f"evicting {len(d.victims)} lower-priority pod(s) would make room, but "
                    + ("a pod group does not preempt" if self.preemption
                       else "preemption is off (--preemption)"))
            if d.node is None:
                why = unschedulable_message(trial.num_nodes, d.rejections)
                if d.rejected_by():
                    why += f" (rejected by {', '.join(d.rejected_by())})"
                missed[i] = why
                if first_miss is None:
                    first_miss = (i, d.reserve)
                continue
            devices = d.devices if d.devices is not None else trial.pick_devices(d.node, req)
            trial.allocate(d.node, req, tuple(devices))
            chosen.append((i, d.node, tuple(devices)))
        if len(chosen) < need:  # nothing binds: say why on every member
            i, reserve = first_miss if first_miss is not None else (0, None)
            why = missed.get(i, "")
            if len(members) > 1 or running:
                why = f"pod group not placed ({keys[i]}: {why})"
                held = self._hold(snap.state, members[i][1], reserve)
                if held:
                    why += f"; {held}"
            for obj, k in zip((o for o, _ in members), keys, strict=True):
                res.failed[k] = why
                self._event(obj, "FailedScheduling", why)
                self._unschedulable(obj, why, res)
            return
        gang = members[0][1].gang_id
        if gang is not None and gang in self._holds:  # starting: let go of its room
            snap.state.reservations.remove(gang)
            del self._holds[gang]
        for i, why in missed.items():  # the group starts without these: each waits
            obj, k = members[i][0], keys[i]
            res.failed[k] = why
            self._event(obj, "FailedScheduling", why)
            self._unschedulable(obj, why, res)
        for i, node, devices in chosen:
            (obj, pod), k = members[i], keys[i]
            name = snap.state.names[node]
            bound = self._bind(obj, name, res, k)
            if bound is not False:  # bound, or perhaps (its answer lost): its room is taken
                snap.state.allocate(node, snap.state.compile(pod), devices)
            if bound:
                res.bound[k] = name
                self._nominated.pop(k, None)

    def _apply_holds(self, state: Any) -> None:
        """Put this loop's gang holds into a new pass's snapshot (node indices change
        between passes; a hold whose node is gone is dropped, as is one long past due:
        its group is gone or cannot use it)."""
        for gang, (names, request, gpus, due, prio) in list(self._holds.items()):
            if any(n not in state.index for n in names) or due + HOLD_GRACE_S < state.now:
                del self._holds[gang]
                continue
            state.reservations.add(Reservation(gang, prio, tuple(state.index[n] for n in names),
                                               request, gpus, due))

    def _hold(self, state: Any, pod: Any, reserve: Any) -> str:
        """After a pod group's rejection: keep the room its profile reserved for the next
        passes (or drop a hold that came due and still does not fit: the twin's rule);
        what to say about it ('' when nothing is held)."""
        gang = pod.gang_id
        if not self.gang_reservations or gang is None:
            return ""
        if reserve is not None and reserve.gang != gang:
            reserve = None
        for g in reserve.displaces if reserve is not None else ():
            self._holds.pop(g, None)
        r = state.reservations.settle(gang, reserve, state.now)
        if r is None:
            self._holds.pop(gang, None)
            return ""
        names = tuple(state.names[n] for n in r.nodes)
        due = r.due
        self._holds[gang] = (names, r.request, r.gpus, due, r.priority)
        when = dt.datetime.fromtimestamp(self._started + due, dt.UTC)
        return (f"room held on {', '.join(names)} from "
                f"{when.isoformat(timespec='seconds')}")

    def _preempt(self, obj: dict[str, Any], key: str, node: str, victims: Sequence[Any],
                 res: PassResult) -> None:
        """kube-scheduler's preemption: evict the victims through the Eviction API (so
        PodDisruptionBudgets are honoured by the API server), nominate the node, bind
        nothing now; a later pass binds once the victims have terminated. A pod whose
        earlier victims are still terminating does not evict more (upstream's
        PodEligibleToPreemptOthers)."""
        import urllib3
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        waiting = self._nominated.get(key)
        status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
        nominated = status.get("nominatedNodeName")
        if waiting is None and isinstance(nominated, str) and nominated:
            # Nominated by an earlier leader (its memory is gone, the pod's status is not):
            # upstream's rule, a lower-priority pod still terminating there means wait.
            prio = _priority_or_0((obj.get("spec") or {}).get("priority"))
            going = {k for k, p in self._terminating_on.get(nominated, ()) if p < prio}
            if going:
                waiting = self._nominated[key] = (nominated, going)
        if waiting is not None and waiting[1] & self._terminating:
            why = (f"waiting for {len(waiting[1] & self._terminating)} preempted pod(s) on "
                   f"{waiting[0]} to terminate")
            res.failed[key] = why
            return
        if not self._may_write(res, key):
            return
        evicted: list[str] = []
        for v in victims:
            if v.id in self._terminating:  # already going (another pod's victim): wait
                evicted.append(v.id)
                continue
            ns, _, name = v.id.partition("/")
            body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=ns))
            try:
                self.core.create_namespaced_pod_eviction(name, ns, body,
                                                         _request_timeout=API_TIMEOUT_S)
                evicted.append(v.id)
                self._terminating.add(v.id)  # later pods of this pass must not pick it
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
                if getattr(e, "status", None) == 404:  # gone already: its room is coming
                    evicted.append(v.id)
                    continue
                answer = (f"{e.status} {e.reason}, e.g. a PodDisruptionBudget"
                          if isinstance(e, ApiException) else f"no answer: {type(e).__name__}")
                why = f"preemption on {node} stopped: evicting {v.id} was refused ({answer})"
                if evicted:  # those already evicted are going: wait for them, evict no more
                    self._nominated[key] = (node, set(evicted))
                res.failed[key] = why
                self._event(obj, "FailedScheduling", why)
                self._unschedulable(obj, why, res, nominated=None)
                return
        self._nominated[key] = (node, set(evicted))
        res.preempting[key] = (node, evicted)
        said = (f"evicted {len(evicted)} lower-priority pod(s) on {node}: "
                f"{', '.join(evicted)}; nominated {node}")
        self._event(obj, "Preempting", said)
        self._unschedulable(obj, f"preempting: {said}", res, nominated=node)

    def _may_write(self, res: PassResult, key: str) -> bool:
        """Whether this pass may still bind or evict (else why not, in ``res.failed``): not
        after the API server asked to wait, nor once this replica's lease may have run
        out (another replica may be binding)."""
        if res.retry_after is not None:
            res.failed[key] = (f"not tried: the API server asked to retry after "
                               f"{res.retry_after:g} s")
            return False
        if self.leader_until is not None and time.monotonic() >= self.leader_until:
            res.failed[key] = "not tried: this replica's lease ran out during the pass"
            return False
        return True

    def _bind(self, obj: dict[str, Any], node: str, res: PassResult, key: str
              ) -> bool | None:
        """True when bound; False when not (why in ``res``); None when the answer was lost
        (a 5xx, a timeout, a dropped connection): it may have bound."""
        import urllib3
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        meta = obj["metadata"]
        if not self._may_write(res, key):
            return False
        if self.toleration_s is not None:
            self._tolerate(obj, key)
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=meta["name"], namespace=meta.get("namespace")),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node))
        try:
            # _preload_content=False: the client cannot deserialize a Binding response.
            self.core.create_namespaced_pod_binding(meta["name"], meta.get("namespace") or
                                                    "default", body, _preload_content=False,
                                                    _request_timeout=API_TIMEOUT_S)
            return True
        except ApiException as e:
            if e.status == 409:  # bound meanwhile (another scheduler): re-read, do not retry
                res.conflicts.append(key)
                try:
                    now = self.core.read_namespaced_pod(meta["name"], meta.get("namespace")
                                                        or "default",
                                                        _request_timeout=API_TIMEOUT_S)
                    log.info("pod %s already bound to %s", key, now.spec.node_name)
                except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError):
                    pass
                return False
            res.failed[key] = f"bind to {node} failed: HTTP {e.status} {e.reason}"
            wait = retry_after(e)
            if wait is not None:  # the API server is overloaded: stop this pass's binds
                res.retry_after = wait
                res.failed[key] += f" (retry after {wait:g} s)"
                return None if e.status >= 500 else False
            if e.status == 404:  # deleted meanwhile
                return False
            self._event(obj, "FailedScheduling", res.failed[key])
            self._unschedulable(obj, res.failed[key], res, reason="SchedulerError")
            return None if e.status >= 500 else False
        except (urllib3.exceptions.HTTPError, OSError) as e:  # timed out, dropped
            res.failed[key] = f"bind to {node} failed: {type(e).__name__} (no answer)"
            return None

    def _unschedulable(self, obj: dict[str, Any], message: str, res: PassResult,
                       reason: str = "Unschedulable", nominated: str | None = "") -> None:
        """Mark a pod left pending as kube-scheduler does: condition PodScheduled=False with
        the reason (Unschedulable; SchedulerError when its bind was refused) and the
        message, and ``status.nominatedNodeName`` when it preempted. ``nominated`` "" (a
        failure with no new nomination) clears a nomination the pod still carries, as
        upstream's clearNominatedNode does; None leaves it (a preemption that stopped
        half-way: its victims are going). The Cluster Autoscaler scales up only for pods
        marked Unschedulable so, and ``kubectl get``/``describe`` show why. Best effort (a
        refusal is logged and the next pass sends it again; after a 403, the first pass
        STATUS_FORBIDDEN_RETRY_S later), and no call when the pod
        already says so (the list carries its status) or this loop already sent it: an
        unchanged pending pod costs no call per pass."""

        import urllib3
        from kubernetes.client.rest import ApiException

        message = message[:1024]
        status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
        conditions = status.get("conditions")
        have = next((c for c in (conditions if isinstance(conditions, list) else ())
                     if isinstance(c, dict) and c.get("type") == "PodScheduled"), None)
        had = status.get("nominatedNodeName") or ""
        waiting = self._nominated.get(_key(obj))
        if nominated == "" and waiting is not None and waiting[1] & self._terminating:
            nominated = None  # its victims are still going (upstream keeps it meanwhile)
        if (have is not None and have.get("status") == "False"
                and have.get("reason") == reason and have.get("message") == message
                and (nominated is None or had == nominated)):
            return
        key = _key(obj)
        sent = (obj["metadata"].get("uid"), reason, message, nominated)
        if self._conditioned.get(key) == sent:
            return
        if res.retry_after is not None or (self.leader_until is not None
                                           and time.monotonic() >= self.leader_until):
            return  # asked to wait, or no longer the leader: the next pass says it
        if time.monotonic() < self._status_forbidden_until:
            return  # refused as forbidden lately: one try per STATUS_FORBIDDEN_RETRY_S
        self._conditioned[key] = sent
        # The transition time moves only when the condition's status changes (upstream).
        since = (have.get("lastTransitionTime") if have is not None
                 and have.get("status") == "False" and have.get("lastTransitionTime")
                 else _now().isoformat(timespec="seconds").replace("+00:00", "Z"))
        body: dict[str, Any] = {"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": reason, "message": message,
            "lastProbeTime": None, "lastTransitionTime": since}]}}
        if nominated and nominated != had:
            body["status"]["nominatedNodeName"] = nominated
        elif nominated == "" and had:  # no longer nominated: null deletes the field
            body["status"]["nominatedNodeName"] = None
        meta = obj["metadata"]
        try:
            resp = self.core.patch_namespaced_pod_status(
                meta["name"], meta.get("namespace") or "default", body,
                _preload_content=False, _request_timeout=API_TIMEOUT_S)
            try:
                rv = (read_json_answer(resp).get("metadata") or {}).get("resourceVersion")
            except (ApiAnswerError, AttributeError):
                rv = None
            if isinstance(rv, str):
                self._own_writes.add(rv)
        except ApiException as e:
            self._conditioned.pop(key, None)  # not sent: the next pass tries again
            if e.status == 403:
                self._status_forbidden_until = time.monotonic() + STATUS_FORBIDDEN_RETRY_S
                log.warning("could not mark %s unschedulable: HTTP 403 %s; pending pods go "
                            "unmarked for %g s (grant the scheduler's Role pods/status: "
                            "patch)", key, e.reason, STATUS_FORBIDDEN_RETRY_S)
                return
            log.warning("could not mark %s unschedulable: HTTP %s %s", key, e.status, e.reason)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            self._conditioned.pop(key, None)
            log.warning("could not mark %s unschedulable: %s", key, type(e).__name__)

    def _tolerate(self, obj: dict[str, Any], key: str) -> None:
        """Add the profile's NotReady/unreachable tolerations to the pod (best effort: a
        refusal is logged and the pod is bound with the tolerations it has)."""
        import urllib3
        from kubernetes.client.rest import ApiException

        meta = obj["metadata"]
        have = (obj.get("spec") or {}).get("tolerations") or []
        new = failover_tolerations(have, self.toleration_s)  # type: ignore[arg-type]
        if new is None:
            return
        try:
            got = self.core.patch_namespaced_pod(meta["name"], meta.get("namespace") or "default",
                                                 {"spec": {"tolerations": new}},
                                                 _request_timeout=API_TIMEOUT_S)
            rv = getattr(getattr(got, "metadata", None), "resource_version", None)
            if isinstance(rv, str):  # its watch event is this scheduler's own write
                self._own_writes.add(rv)
        except ApiException as e:
            log.warning("could not add failover tolerations to %s: HTTP %s %s", key, e.status,
                        e.reason)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            log.warning("could not add failover tolerations to %s: %s", key,
                        type(e).__name__)

    def _event(self, obj: dict[str, Any], reason: str, message: str) -> None:
        import urllib3
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        meta = obj["metadata"]
        ns = meta.get("namespace") or "default"
        if reason == "FailedScheduling":
            last, now = self._evented.get(_key(obj)), time.monotonic()
            if last is not None and last[0] == message and now - last[1] < EVENT_REPEAT_S:
                return
            self._evented[_key(obj)] = (message, now)
        ev = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}.", namespace=ns),
            involved_object=client.V1ObjectReference(kind="Pod", name=meta["name"], namespace=ns,
                                                     uid=meta.get("uid")),
            reason=reason, message=message[:1024], type="Warning",
            source=client.V1EventSource(component=self.name), first_timestamp=_now(),
            last_timestamp=_now(), count=1)
        try:
            self.core.create_namespaced_event(ns, ev, _request_timeout=API_TIMEOUT_S)
        except ApiException as e:
            log.warning("could not record an event for %s: %s", meta["name"], e.reason)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            log.warning("could not record an event for %s: %s", meta["name"],
                        type(e).__name__)


FAILOVER_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")


def failover_tolerations(have: Sequence[dict[str, Any]], seconds: float
                         ) -> list[dict[str, Any]] | None:
    """``have`` plus a NoExecute toleration of each failover taint for ``seconds``
    (rounded up), or None when the pod already tolerates each for no longer (the taint
    manager takes the smallest matching ``tolerationSeconds``). Existing entries are kept
    as they are: Kubernetes only lets tolerations be added to a pod."""
    import math

    secs = math.ceil(seconds)
    out = list(have)
    for taint in FAILOVER_TAINTS:
        matching = [t for t in have
                    if t.get("effect") in (None, "", "NoExecute")
                    and (t.get("key") == taint or (not t.get("key")
                                                   and t.get("operator") == "Exists"))]
        bounded = [t.get("tolerationSeconds") for t in matching
                   if t.get("tolerationSeconds") is not None]
        if bounded and min(bounded) <= secs:
            continue
        out.append({"key": taint, "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": secs})
    return None if len(out) == len(have) else out


class LeaseLock:
    """Leader election on a coordination.k8s.io/v1 Lease (optimistic concurrency).

    Another holder's lease is valid until it has not changed for its duration as this
    replica observed it (client-go's rule): its ``renewTime`` comes from the holder's
    clock, and trusting it would let a skewed clock take a live lease (or keep a dead
    one). ``valid_until``: ``time.monotonic()`` past which a lease this replica took
    or renewed may have run out (counted from before the request)."""

    def __init__(self, coord: Any, name: str, namespace: str, identity: str,
                 lease_s: int = 15, clock: Callable[[], dt.datetime] = _now) -> None:
        self.coord, self.name, self.ns, self.identity = coord, name, namespace, identity
        self.lease_s, self.clock = lease_s, clock
        self.valid_until: float | None = None
        # Another holder's record as last read (holder, renewTime, resourceVersion) and
        # when, on this clock, it was first seen so.
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = dt.datetime.min.replace(tzinfo=dt.UTC)

    def try_acquire(self) -> bool:
        """Take or renew the lease; False when another holder's lease is still valid."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        start = time.monotonic()
        now = self.clock()
        spec = client.V1LeaseSpec(holder_identity=self.identity,
                                  lease_duration_seconds=self.lease_s, renew_time=now,
                                  acquire_time=now)
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.ns,
                                                     _request_timeout=API_TIMEOUT_S)
        except ApiException as e:
            if e.status != 404:
                raise
            try:
                self.coord.create_namespaced_lease(self.ns, client.V1Lease(
                    metadata=client.V1ObjectMeta(name=self.name, namespace=self.ns), spec=spec),
                    _request_timeout=API_TIMEOUT_S)
                self.valid_until = start + self.lease_s
                return True
            except ApiException as e2:
                if e2.status == 409:  # someone created it first
                    return False
                raise
        old = lease.spec or client.V1LeaseSpec()  # a Lease's spec is optional
        held = old.holder_identity
        if held and held != self.identity:
            record = (held, old.renew_time, (lease.metadata or client.V1ObjectMeta())
                      .resource_version)
            if record != self._observed:  # renewed (or a new holder) since the last read
                self._observed, self._observed_at = record, now
            duration = old.lease_duration_seconds or self.lease_s
            if now < self._observed_at + dt.timedelta(seconds=duration):
                return False
        if held == self.identity:
            spec.acquire_time = old.acquire_time or now
        lease.spec = spec
        try:
            # The lease read carries its resourceVersion: a concurrent change is a 409.
            self.coord.replace_namespaced_lease(self.name, self.ns, lease,
                                                _request_timeout=API_TIMEOUT_S)
            self.valid_until = start + self.lease_s
            return True
        except ApiException as e:
            if e.status == 409:  # changed since we read it: someone else won
                return False
            raise


def _running_group_members(pods: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Pods bound, not finished and not terminating, per pod group (``namespace/group``,
    as ``pod_model`` names it): they count toward the group's min-member."""
    count: dict[str, int] = {}
    for p in pods:
        meta, spec = p.get("metadata"), p.get("spec")
        if not isinstance(meta, dict) or not isinstance(spec, dict) or not spec.get(
                "nodeName") or meta.get("deletionTimestamp"):
            continue
        status = p.get("status")
        if isinstance(status, dict) and status.get("phase") in ("Succeeded", "Failed"):
            continue
        labels = meta.get("labels")
        group = (labels.get(POD_GROUP_LABEL) or labels.get(POD_GROUP_LABEL_OLD)
                 if isinstance(labels, dict) else None)
        if isinstance(group, str) and group:
            gid = f"{meta.get('namespace') or 'default'}/{group}"
            count[gid] = count.get(gid, 0) + 1
    return count


def _part(obj: dict[str, Any], name: str) -> dict[str, Any]:
    """``obj[name]`` when it is an object, else empty: a malformed pod among the others
    (metadata a string, say) must not raise out of the pass."""
    v = obj.get(name)
    return v if isinstance(v, dict) else {}


def _key(obj: dict[str, Any]) -> str:
    """``namespace/name`` of a pod this scheduler took (``_mine``: it has a name)."""
    meta = obj["metadata"]
    return f"{meta.get('namespace') or 'default'}/{meta['name']}"


def _priority_or_0(v: Any) -> int:
    """A pod's priority for the queue order (what is not an int counts 0: ``pod_model``
    then refuses the pod with a reason; the order must not stop the pass)."""
    return v if isinstance(v, int) and not isinstance(v, bool) else 0
