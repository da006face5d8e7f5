"""The three tiers as plain classes: a site (region or edge) and the cloud router.

Owns the decision flow of the hierarchy without Ray, so it can be tested in
process and wrapped by Serve deployments (``serving.deployments``) that hold
one instance per replica:

* ``SiteTier`` -- one region's cloud nodes or one MEC site (a ``SitePlacer``).
  An edge site answers pods from its own nodes and escalates to its parent
  region when it cannot place them. When the region cannot be reached (the call
  fails or times out) the edge keeps deciding on its own state and profile and
  queues the escalation; ``reconcile`` (run in the background every few
  seconds while anything is queued) replays queued escalations to the region
  with the request ids they were first sent with, so a call that did reach the
  region before the link broke is answered from the region's idempotency record
  instead of booking twice. Queued pods are booked nowhere until then, and the
  cloud does not spill them over elsewhere: one pod, one placement.
* ``CloudTier`` -- picks regions for each pod (``serving.hierarchy``) and
  asks them in order, spilling over when one is full; pods from an edge site
  with a latency SLO go to that site first (unless ``allowed_regions`` leaves the
  site out: compliance names sites, as in the twin). It remembers answers by request id,
  so a retry never books twice even when the first attempt spilled over.

Calls between tiers go through ``SiteCaller`` objects: direct method calls in
process, deployment handles under Serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from smartsched.model.errors import SmartSchedError, ValidationError, remote_cause
from smartsched.model.pod import Pod, PodClass
from smartsched.serving.hierarchy import Hierarchy, RankWeights, dominant_resource
from smartsched.serving.journal import Journal
from smartsched.serving.site import (
    IDEMPOTENCY_KEEP,
    AnswerCache,
    FieldConflict,
    SitePlacer,
    SiteResult,
    site_subspec,
)
from smartsched.twin.green import node_scores, node_use, site_terms
from smartsched.twin.state import POWER_OFF

RID_SEP = "~"  # reservation id = "<site>~<hex>": the ingress routes by it
# How long a site prepared for a node update spanning sites stays held for its commit (a
# round trip from the ingress, milliseconds): past it, an ingress gone meanwhile does not
# keep the site's placements waiting.
NODE_UPDATE_HOLD_S = 10.0
# The most JSON a site's ``recent`` answer holds: under the 4 MiB Serve allows a message
# between replicas, with room for its framing.
RECENT_MAX_BYTES = 2 * 1024 * 1024



class IdempotencyConflict(FieldConflict):
    """A request id reused with a different body (HTTP 409 naming ``request_id``)."""

    def __str__(self) -> str:
        return self.message

    @classmethod
    def of(cls, request_id: str) -> IdempotencyConflict:
        return cls("request_id", f"request_id {request_id[:64]!r} was already used with a "
                   "different body; use a new request_id for a new request")


def request_fingerprint(pods: Sequence[Pod], ttl_s: float, validate: bool = False) -> str:
    """A digest of what a placement request asks: every pod field the client gives (not
    ``arrival``, which the service stamps on receipt), the TTL and whether to validate."""
    from smartsched.serving.journal import pod_to_dict

    asked = [{k: v for k, v in pod_to_dict(p).items() if k != "arrival"} for p in pods]
    doc = json.dumps([asked, ttl_s] + ([True] if validate else []), sort_keys=True,
                     default=str)
    return hashlib.sha256(doc.encode()).hexdigest()

def bind_body(bodies: OrderedDict[str, str], key: str, body: str, shown_id: str) -> None:
    """Bind ``key`` to the fingerprint ``body`` of the first request sent with it (kept for
    the last IDEMPOTENCY_KEEP keys); IdempotencyConflict naming ``shown_id`` (the id as
    the client sent it) when it was bound to another. Called before any await, so
    requests in flight together are bound too."""
    first = bodies.setdefault(key, body)
    bodies.move_to_end(key)
    while len(bodies) > IDEMPOTENCY_KEEP:
        bodies.popitem(last=False)
    if first != body:
        raise IdempotencyConflict.of(shown_id)


class SiteCaller(Protocol):
    def __call__(self, pods: list[Pod], ttl_s: float, request_id: str | None,
                 validate: bool = False) -> Awaitable[list[dict[str, Any]]]: ...


def _stage(tier: str, site: str, outcome: str, reason: str,
           plugins: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"tier": tier, "site": site, "outcome": outcome, "reason": reason,
            "plugins": list(plugins)}


class SiteTier:
    """A region or an edge site: authoritative state, decisions, reservations."""

    def __init__(self, hierarchy: Hierarchy, site: str, profile: str, *,
                 parent: SiteCaller | None = None, seed: int = 0,
                 clock: Callable[[], float] = time.time, journal_dir: str | None = None,
                 usage: Any = None, preemption: bool = False, sandbox: Any = None,
                 compliance: str | None = None, autonomy: Any = None,
                 gang_reservations: bool = False) -> None:
        """``usage``: a ``serving.config.UsageFromPrometheus`` (or None): node usage is
        then pulled from Prometheus in the background of requests. ``sandbox``: a
        ``serving.config.SandboxPolicy`` (None: validate only requests that ask).
        ``autonomy``: a ``serving.config.EdgeAutonomy`` (None: its defaults), how an edge
        site waits for its region and queues escalations while it is unreachable."""
        self.h = hierarchy
        self.site = site
        self.tier = "region" if site in hierarchy.regions else "edge"
        self.region = hierarchy.region_of(site)
        journal = None
        if journal_dir is not None:
            from pathlib import Path

            from smartsched.serving.journal import Journal

            journal = Journal(Path(journal_dir) / f"{site}.jsonl")
        mode, settings, gang_gpus = "request", None, 8
        if sandbox is not None:
            mode, settings, gang_gpus = sandbox.mode_of(site), sandbox.settings, sandbox.gang_gpus
        self.placer = SitePlacer(site_subspec(hierarchy.spec, [site]), profile, seed=seed,
                                 clock=clock, journal=journal, preemption=preemption,
                                 sandbox_mode=mode, sandbox=settings, gang_gpus=gang_gpus,
                                 compliance=compliance, gang_reservations=gang_reservations)
        self.parent = parent
        self.usage_cfg = usage
        self._usage_src: Any = None
        self._usage_due = 0.0
        self._usage_task: Any = None
        self.usage_status: dict[str, Any] = {}
        if autonomy is None:
            from smartsched.serving.config import EdgeAutonomy

            autonomy = EdgeAutonomy()
        self.autonomy = autonomy
        # escalation id -> what to replay; escalation id -> the region's answers
        self.queued: OrderedDict[str, _Escalation] = OrderedDict()
        self.reconciled: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self.parent_down_since: float | None = None
        self.parent_error = ""
        self._reconciler: asyncio.Task | None = None
        self._replaying = asyncio.Lock()
        # A node update spanning sites, prepared here and not yet committed or aborted:
        # placements and other node updates wait for it (``prepare_node_updates``).
        self._node_hold: _NodeHold | None = None
        self.hold_clock: Callable[[], float] = time.monotonic
        # Escalations queued before a restart (the site's journal): replayed as before.
        if self.placer.escalations:
            from smartsched.serving.journal import pod_from_dict

            for rid, e in self.placer.escalations.items():
                self.queued[rid] = _Escalation([pod_from_dict(d) for d in e["pods"]],
                                               e["ttl_s"], bool(e["validate"]),
                                               e["queued_at"])
            self._start_reconciler()  # a running loop (a replica) starts it; else reconcile()

    async def refresh_usage(self) -> dict[str, Any]:
        """Read the site's node usage from Prometheus (in a thread) and apply it here, on
        the event loop, so it never interleaves with a decision. Values that are missing or
        stale keep their last good reading; errors are reported in ``usage_status``."""
        from smartsched.prometheus.source import PrometheusSource, write_usage

        cfg = self.usage_cfg
        src = self._usage_src = PrometheusSource.for_state(
            cfg.url, self.placer.state, reuse=self._usage_src, timeout_s=cfg.timeout_s,
            retries=1, stale_after_s=cfg.stale_after_s)
        self._usage_due = time.monotonic() + cfg.interval_s
        reading = await asyncio.to_thread(src.read_usage)
        st = self.placer.state  # nodes may have changed while the read was in flight
        if list(st.names) == src.names:
            write_usage(st, reading)
        stale = reading.stale_nodes(src.names)
        self.usage_status = {"read_at": reading.at, "errors": reading.errors,
                             "stale_values": sum(len(v) for v in stale.values()),
                             "unknown_nodes": reading.unknown_nodes}
        return self.usage_status

    def _maybe_refresh_usage(self) -> None:
        """Start a background refresh when one is due (never blocks the request)."""
        if self.usage_cfg is None:
            return
        now = time.monotonic()
        if now < self._usage_due or (self._usage_task and not self._usage_task.done()):
            return
        self._usage_due = now + self.usage_cfg.interval_s
        self._usage_task = asyncio.get_running_loop().create_task(self._refresh_logged())

    async def _refresh_logged(self) -> None:
        try:
            await self.refresh_usage()
        except Exception as e:  # reported in the summary; the next interval retries
            self.usage_status = {"errors": [f"{type(e).__name__}: {e}"]}

    def _result(self, r: SiteResult, stages: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "pod_id": r.pod_id, "placed": r.placed,
            "region": self.region if r.placed else None,
            "site": self.site if r.placed else None, "zone": r.zone, "node": r.node,
            "devices": list(r.devices), "tier": self.tier if r.placed else None,
            "profile": self.placer.profile if r.placed else None,
            "reservation_id": f"{self.site}{RID_SEP}{r.reservation_id}" if r.placed else None,
            "expires_at": r.expires_at,
            "preempted": [{"reservation_id": f"{self.site}{RID_SEP}{rid}", "pod_ids": list(ids)}
                          for rid, ids in r.preempted],
            "validation": r.validation,
            "gang_room": r.extra.get("gang_room"),
            "reasons": [*stages, _stage(self.tier, self.site,
                                        "placed" if r.placed else "full", r.reason or
                                        f"placed by {self.placer.profile}", r.plugins)],
        }

    async def place(self, pods: list[Pod], ttl_s: float, request_id: str | None,
                    validate: bool = False) -> list[dict[str, Any]]:
        """Place here; an edge site escalates what it cannot place to its parent region
        (queued when the region is unreachable). ``validate``: the request asked for
        sandbox validation. Waits while a node update spanning sites holds this site."""
        await self._held_out()
        self._maybe_refresh_usage()
        results = [self._result(r, []) for r in self.placer.place(pods, ttl_s, request_id,
                                                                  validate)]
        if self.parent is None or all(r["placed"] for r in results):
            return results
        # Escalate the pods (whole gangs) that did not fit here.
        missing = [p for p, r in zip(pods, results, strict=True) if not r["placed"]]
        lost = {r["pod_id"]: r for r in results if not r["placed"]}
        esc_rid = (f"{request_id}@{self.site}" if request_id is not None
                   else f"auto-{secrets.token_hex(8)}@{self.site}")
        if esc_rid in self.reconciled:  # a retry of a request reconciled since: its answer
            # (copies: the tiers above add their stages to what they get)
            by_id = {r["pod_id"]: {**r, "reasons": list(r["reasons"])}
                     for r in self.reconciled[esc_rid]}
        elif esc_rid in self.queued:  # a retry of a request still queued: still queued
            by_id = {p.id: self._queued_result(lost[p.id], esc_rid, "") for p in missing}
        else:
            try:
                up = await self._ask_parent(missing, ttl_s, esc_rid, validate)
            except _Unreachable as e:
                return self._queue(results, missing, ttl_s, esc_rid, validate, str(e))
            by_id = {r["pod_id"]: self._escalated(lost[r["pod_id"]], r) for r in up}
        return [by_id.get(r["pod_id"], r) if not r["placed"] else r for r in results]

    def _escalated(self, local: dict[str, Any], up: dict[str, Any]) -> dict[str, Any]:
        last = local["reasons"][-1]
        up["reasons"] = [_stage("edge", self.site, "escalated",
                                f"{last['reason']}; escalated to {self.region}",
                                tuple(last["plugins"])), *up["reasons"]]
        return up

    async def _ask_parent(self, pods: list[Pod], ttl_s: float, rid: str,
                          validate: bool) -> list[dict[str, Any]]:
        """The region's answers, or ``_Unreachable`` when the call fails or times out. An
        error that is an answer (bad input, a conflict: ``SmartSchedError``) is raised."""
        assert self.parent is not None
        try:
            up = await asyncio.wait_for(self.parent(pods, ttl_s, rid, validate),
                                        self.autonomy.escalation_timeout_s)
        except SmartSchedError:
            raise
        except Exception as e:  # a broken link, a stopped deployment, a timeout
            cause = remote_cause(e)
            if isinstance(cause, SmartSchedError):
                raise cause from None
            if self.parent_down_since is None:
                self.parent_down_since = time.time()
            self.parent_error = (f"{type(cause).__name__}" if not isinstance(
                cause, TimeoutError) else f"no answer in {self.autonomy.escalation_timeout_s:g} s")
            raise _Unreachable(f"{self.region} unreachable ({self.parent_error})") from None
        self.parent_down_since, self.parent_error = None, ""
        return up

    def _queue(self, results: list[dict[str, Any]], missing: list[Pod], ttl_s: float,
               esc_rid: str, validate: bool, why: str) -> list[dict[str, Any]]:
        """Queue the escalation (bounded); answer its pods as queued, not placed."""
        held = sum(len(q.pods) for q in self.queued.values())
        full = held + len(missing) > self.autonomy.max_queued_pods
        if not full:
            esc = _Escalation(missing, ttl_s, validate, time.time())
            self.placer.record_escalation(esc_rid, missing, ttl_s, validate, esc.queued_at)
            self.queued[esc_rid] = esc
            self._start_reconciler()
        out = []
        for r in results:
            if r["placed"]:
                out.append(r)
            elif full:  # final too: the region may have booked it before the link broke
                last = r["reasons"][-1]
                r["reasons"][-1] = {**last, "reason": f"{last['reason']}; {why}; the "
                                    f"escalation queue is full ({held} pods), not queued: "
                                    "retry with the same request id"}
                r["escalation"] = {"id": esc_rid, "state": "dropped"}
                out.append(r)
            else:
                out.append(self._queued_result(r, esc_rid, why))
        return out

    def _queued_result(self, r: dict[str, Any], esc_rid: str, why: str) -> dict[str, Any]:
        last = r["reasons"][-1]
        r["reasons"] = [*r["reasons"][:-1], _stage(
            "edge", self.site, "queued", f"{last['reason']}; "
            f"{why or self.region + ' unreachable'}: escalation {esc_rid} queued, replayed "
            "to the region when it is back", tuple(last["plugins"]))]
        r["escalation"] = {"id": esc_rid, "state": "queued"}
        return r

    def _start_reconciler(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._reconciler is None or self._reconciler.done():
            self._reconciler = loop.create_task(self._reconcile_loop())

    async def _reconcile_loop(self) -> None:
        while self.queued:
            await asyncio.sleep(self.autonomy.reconcile_every_s)
            try:
                await self.reconcile()
            except Exception:  # an answer-type error is kept on the escalation; go on
                continue

    async def reconcile(self) -> dict[str, Any]:
        """Replay queued escalations to the region, oldest first, each with the request id
        it was first sent with; stop at the first that still cannot reach it."""
        async with self._replaying:
            done = 0
            while self.queued:
                rid, esc = next(iter(self.queued.items()))
                esc.attempts += 1
                try:
                    up = await self._ask_parent(esc.pods, esc.ttl_s, rid, esc.validate)
                except _Unreachable:
                    break
                except SmartSchedError as e:  # the region refused it: an answer, kept
                    up = [_unplaced(p, [_stage("region", self.region, "rejected",
                                               f"on reconciliation: {e}")]) for p in esc.pods]
                self.queued.pop(rid)
                self.placer.escalation_done(rid)
                queued_stage = _stage("edge", self.site, "queued",
                                      f"queued {time.time() - esc.queued_at:.1f} s while "
                                      f"{self.region} was unreachable; replayed "
                                      f"{esc.attempts} time(s)")
                for r in up:
                    r["reasons"] = [queued_stage, *r["reasons"]]
                    r["escalation"] = {"id": rid, "state": "reconciled"}
                self.reconciled[rid] = up
                while len(self.reconciled) > IDEMPOTENCY_KEEP:
                    self.reconciled.popitem(last=False)
                done += 1
            return {"reconciled": done, "queued": len(self.queued)}

    def escalations(self, limit: int = 100) -> dict[str, Any]:
        """The edge's autonomy state: is the region reachable, what is queued, and the
        answers of the last ``limit`` reconciled escalations."""
        return {
            "site": self.site, "region": self.region,
            "region_reachable": self.parent_down_since is None,
            "unreachable_since": self.parent_down_since, "last_error": self.parent_error,
            "queued": [{"id": rid, "pods": [p.id for p in q.pods], "queued_at": q.queued_at,
                        "attempts": q.attempts} for rid, q in self.queued.items()],
            "reconciled": [{"id": rid, "placements": res}
                           for rid, res in (list(self.reconciled.items())[-limit:]
                                            if limit > 0 else [])],
        }

    # Reservations and views (the ingress routes by reservation id).
    def confirm(self, rid: str, tenant: str | None = None) -> dict[str, Any]:
        """The confirmed reservation's answer, with ``tenants`` (pod id -> tenant) for the
        audit record, which the ingress takes out of the answer."""
        r = self.placer.confirm(rid, tenant)
        return {"reservation_id": f"{self.site}{RID_SEP}{r.id}", "confirmed": True,
                "pods": [b.pod.id for b in r.bookings],
                "tenants": {b.pod.id: b.pod.tenant for b in r.bookings if b.pod.tenant}}

    def release(self, rid: str, tenant: str | None = None) -> dict[str, Any]:
        """As ``confirm``, for a release."""
        r = self.placer.release(rid, tenant)
        return {"reservation_id": f"{self.site}{RID_SEP}{r.id}", "released": True,
                "pods": [b.pod.id for b in r.bookings],
                "tenants": {b.pod.id: b.pod.tenant for b in r.bookings if b.pod.tenant}}

    def summary(self) -> dict[str, Any]:
        out = {"site": self.site, "tier": self.tier, **self.placer.summary(),
               "green": self.green()}
        if self.parent is not None:
            out["autonomy"] = {"region_reachable": self.parent_down_since is None,
                               "queued_escalations": len(self.queued),
                               "queued_pods": sum(len(q.pods) for q in self.queued.values())}
        if self.usage_cfg is not None:
            out["usage_from_prometheus"] = self.usage_status
        return out

    def green(self) -> dict[str, Any]:
        """This site's GreenScore now and its terms (``twin.green``), from the nodes' reported
        usage when there is any, else from what is booked on them."""
        st = self.placer.state
        source = "usage" if st.usage.any() else "allocation"
        terms = site_terms(st, self.placer.clock() - self.placer.t0, source=source)
        i = st.site_names.index(self.site)
        return {"score": float(terms["score"][i]), "pue_share": float(terms["pue"][i]),
                "renewable_share": float(terms["renewable"][i]),
                "efficiency": float(terms["efficiency"][i]), "use_from": source}

    def node_green(self) -> dict[str, float]:
        """Each powered-on, up node's GreenScore now (node name -> 0..1): its site's PUE and
        grid, and its own work per watt at its reported usage (else its bookings), the same
        source as ``green``. Nodes off or down have no work to score and are left out."""
        st = self.placer.state  # this site's nodes only (``site_subspec``)
        source = "usage" if st.usage.any() else "allocation"
        scores = node_scores(st, self.placer.clock() - self.placer.t0,
                             node_use(st, source))
        keep = np.flatnonzero((st.power != POWER_OFF) & st.up)
        return {st.names[i]: float(scores[i]) for i in keep}

    # Node updates (``PUT /v1/nodes``). One spanning sites is two-phase: every site is
    # prepared (checked, then held), then each commits. While a site is held, nothing that
    # could take room or change node rows runs there (placements and other node updates
    # wait; confirm, release and expiry only give room back), so a commit cannot meet a
    # conflict its check did not see: no site applies its part while another refuses.
    async def apply_node_updates(self, updates: list[tuple[int, str, dict[str, Any]]],
                                 usage: dict[str, tuple[float, float, float]],
                                 dry_run: bool = False) -> dict[str, Any]:
        """A node update of this site alone (or its dry run), once no other holds it."""
        await self._held_out()
        return {"site": self.site,
                **self.placer.apply_node_updates(updates, usage, dry_run=dry_run)}

    async def prepare_node_updates(self, token: str,
                                   updates: list[tuple[int, str, dict[str, Any]]],
                                   usage: dict[str, tuple[float, float, float]],
                                   hold_s: float = NODE_UPDATE_HOLD_S) -> dict[str, Any]:
        """First phase of a node update spanning sites: check this site's part (a dry run:
        re-booking every live reservation included; its errors name the request's rows) and
        hold the site for ``token`` until ``commit_node_updates`` or
        ``abort_node_updates`` (at most ``hold_s``). Refused, nothing is held."""
        await self._held_out()
        out = {"site": self.site,
               **self.placer.apply_node_updates(updates, usage, dry_run=True)}
        self._node_hold = _NodeHold(token, self.hold_clock() + hold_s, asyncio.Event())
        return out

    async def commit_node_updates(self, token: str,
                                  updates: list[tuple[int, str, dict[str, Any]]],
                                  usage: dict[str, tuple[float, float, float]]
                                  ) -> dict[str, Any]:
        """Second phase: apply (and journal) what ``token`` prepared, then let go of the
        site. Under its hold it applies as checked; a hold that lapsed is checked again."""
        await self._held_out(token)
        try:
            return {"site": self.site, **self.placer.apply_node_updates(updates, usage)}
        finally:
            self._let_go(token)

    def confirm_node_hold(self, token: str, hold_s: float = NODE_UPDATE_HOLD_S) -> bool:
        """Between the phases: whether this site still holds for ``token``, and if so its
        hold runs ``hold_s`` more from now, so the commit that follows meets it. A hold
        that lapsed was dropped by the first placement or update that came after it: that
        one may have taken the room the check counted on, and the update must not commit
        anywhere (``serving.app._update_sites``). A lapsed hold nothing came after is
        still here and still true, and is renewed."""
        hold = self._node_hold
        if hold is None or hold.token != token:
            return False
        hold.until = self.hold_clock() + hold_s
        return True

    def abort_node_updates(self, token: str) -> bool:
        """Let go of the site held for ``token`` (another site refused): whether it was."""
        return self._let_go(token)

    def _let_go(self, token: str) -> bool:
        hold = self._node_hold
        if hold is None or hold.token != token:
            return False
        self._node_hold = None
        hold.released.set()
        return True

    async def _held_out(self, token: str | None = None) -> None:
        """Wait while a node update other than ``token``'s holds this site; a hold past its
        time is dropped (the request that took it is gone)."""
        while (hold := self._node_hold) is not None and hold.token != token:
            left = hold.until - self.hold_clock()
            if left <= 0:
                self._let_go(hold.token)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(hold.released.wait(), left)

    def free(self) -> dict[str, float]:
        return self.placer.free_fraction()

    def recent(self, limit: int, max_bytes: int = RECENT_MAX_BYTES) -> dict[str, Any]:
        """The last ``limit`` pods this site was asked to place (the learner's experience),
        oldest first, as the journal writes pods: ``pods``, the newest of them whose JSON
        fits in ``max_bytes``, and ``omitted``, how many older ones of the ``limit`` did not
        (so a learner knows its window was cut, not that the site was quiet). The answer
        crosses a by-value hop whose messages Serve caps at 4 MiB: 2,000 pods with long
        selectors made the endpoint a bare 500."""
        import json

        from smartsched.serving.journal import pod_to_dict

        asked = self.placer.recent_pods(limit)
        out: list[dict[str, Any]] = []
        used = 2  # the list's brackets
        for p in reversed(asked):
            d = pod_to_dict(p)
            used += len(json.dumps(d)) + 2  # and its separator
            if used > max_bytes:
                break
            out.append(d)
        return {"pods": out[::-1], "omitted": len(asked) - len(out)}

    def drop_gang_hold(self, gang: str) -> bool:
        """Let go of the room held here for ``gang`` (placed elsewhere); whether one was."""
        return self.placer.drop_gang_hold(gang)

    def set_profile(self, profile: str, label: str | None = None) -> str:
        self.placer.set_profile(profile, label=label)
        return self.placer.profile

    def configure(self, profile: str) -> str:
        """The deployment's profile (its user_config): see ``SitePlacer.configure``."""
        self.placer.configure(profile)
        return self.placer.profile


class CloudTier:
    """The global tier: region choice, spill-over, edge-first for latency-bound pods."""

    def __init__(self, hierarchy: Hierarchy, regions: dict[str, SiteCaller],
                 edges: dict[str, SiteCaller],
                 free_of: Callable[[], Awaitable[dict[str, dict[str, float]]]],
                 weights: RankWeights | None = None, clock: Callable[[], float] = time.time,
                 drop_holds: dict[str, Callable[[str], Awaitable[Any]]] | None = None,
                 journal: Journal | None = None, division: str = "by_capacity") -> None:
        """``drop_holds``: per site, drop the room it holds for a gang (``gang_room``), so a
        gang placed elsewhere, or held by another site already, does not keep it.
        ``journal``: where the answers to requests with an id are kept across a restart
        (else a retry after one is placed again, possibly at another site than the first
        time: booked twice). ``division``: how a batch's pods that rank alike share the
        regions (``DIVISIONS``; see ``divide_by_capacity``)."""
        if division not in DIVISIONS:
            raise ValidationError("ranking.division",
                                  f"must be one of {', '.join(DIVISIONS)}, got {division!r}")
        self.division = division
        self.h = hierarchy
        self.regions = regions
        self.edges = edges
        self.drop_holds = drop_holds or {}
        self._held_at: OrderedDict[str, str] = OrderedDict()  # gang -> the site holding room
        self.free_of = free_of
        self.weights = weights or RankWeights()
        self.clock = clock
        self.t0 = clock()
        # request id -> (fingerprint of the request's body, the answer)
        self.answers = AnswerCache(IDEMPOTENCY_KEEP, size=lambda answer: len(answer[1]))
        # request key -> the fingerprint of the first body sent with it, bound before the
        # first await: concurrent requests with one key and different bodies get a 409
        # instead of each placing (an answer is stored only when its request is done).
        self._bodies: OrderedDict[str, str] = OrderedDict()
        # request key -> done when its request is: a retry while the first try is in flight
        # waits for it and gets its answer (it ranked the regions afresh and could be
        # booked in another region: one request, two reservations).
        self._in_flight: dict[str, asyncio.Future[None]] = {}
        # request key -> each group's (gang's or pod's) regions, in the order its tries
        # reached them, until the request has an answer: a retry after a try that failed
        # (a 503: a region booked, then its answer was lost) sends each group where it
        # went before, in the same order, so each site meets the same pods under the
        # same key and answers with its booking, instead of wherever a fresh ranking
        # points (one pod, two bookings until a TTL ran out). Journaled before each call
        # ("sent"), so a retry after this replica died mid-request -- the case its 503
        # asks clients to retry -- goes where the first try did too.
        self._sent: OrderedDict[str, dict[str, list[str]]] = OrderedDict()
        self.journal = journal
        if journal is not None:
            for e in journal.replay():
                if e.get("op") == "answer":
                    self._remember(e["key"], e["body"], e["results"], log=False)
                elif e.get("op") == "sent":
                    self._note_sent(e["key"], e["group"], e["site"])
            for key in [k for k in self._sent if k in self.answers]:
                del self._sent[key]
            journal.rewrite(self._answer_events())

    def _remember(self, key: str, body: str, results: list[dict[str, Any]],
                  log: bool = True) -> None:
        """Keep the answer to request ``key`` (the last IDEMPOTENCY_KEEP), journaled."""
        self.answers[key] = (body, results)
        self.answers.move_to_end(key)
        self.answers.trim()
        self._bodies.setdefault(key, body)
        if log and self.journal is not None:
            self.journal.append({"op": "answer", "key": key, "body": body,
                                 "results": results})
            if self.journal.needs_compaction():  # as the kept answers only
                self.journal.rewrite(self._answer_events())

    def _answer_events(self) -> list[dict[str, Any]]:
        return [*({"op": "answer", "key": k, "body": body, "results": res}
                  for k, (body, res) in self.answers.items()),
                *({"op": "sent", "key": k, "group": g, "site": s}
                  for k, groups in self._sent.items()
                  for g, sites in groups.items() for s in sites)]

    def _note_round(self, key: str, buckets: dict[tuple[str, str], list[_Plan]]) -> None:
        """Note where each group of request ``key`` goes this round (regions only), on
        disk before any site can book: one journal group, one fsync, for the round."""
        new = [(g, site) for (kind, site), bucket in buckets.items() if kind == "region"
               for g in map(_group_of, bucket) if self._note_sent(key, g, site)]
        if new and self.journal is not None:
            with self.journal.group():
                for g, site in new:
                    self.journal.append({"op": "sent", "key": key, "group": g,
                                         "site": site})

    def _note_sent(self, key: str, group: str, site: str) -> bool:
        """Record that ``group`` of request ``key`` was sent to ``site``; whether that is
        new (the last IDEMPOTENCY_KEEP requests are kept)."""
        went = self._sent.setdefault(key, {}).setdefault(group, [])
        self._sent.move_to_end(key)
        while len(self._sent) > IDEMPOTENCY_KEEP:
            self._sent.popitem(last=False)
        if site in went:
            return False
        went.append(site)
        return True

    async def place(self, pods: Sequence[Pod], ttl_s: float,
                    request_id: str | None, validate: bool = False,
                    shown_id: str | None = None) -> list[dict[str, Any]]:
        """Place ``pods``; a retry with the same ``request_id`` and the same body gets the
        first answer again, the same ``request_id`` with another body is refused
        (``IdempotencyConflict``: the key binds the request's content, as in the IETF
        Idempotency-Key draft), also while the first is still in flight. ``shown_id``:
        the id as the client sent it, for the refusal (``request_id`` may be a key
        derived from it)."""
        body = request_fingerprint(pods, ttl_s, validate) if request_id is not None else ""
        if request_id is None:
            return await self._place(pods, ttl_s, None, validate, body)
        shown = shown_id if shown_id is not None else request_id
        bind_body(self._bodies, request_id, body, shown)
        while True:
            if request_id in self.answers:
                self.answers.move_to_end(request_id)
                first, answer = self.answers[request_id]
                if first != body:
                    raise IdempotencyConflict.of(shown)
                return answer
            pending = self._in_flight.get(request_id)
            if pending is None:
                break
            # The first try is in flight: its answer, once it has one (a try that failed,
            # or whose answer is not final -- escalations queued at an edge -- leaves none,
            # and this one goes on as a new try).
            await asyncio.shield(pending)
        done = self._in_flight[request_id] = asyncio.get_running_loop().create_future()
        try:
            return await self._place(pods, ttl_s, request_id, validate, body)
        finally:
            del self._in_flight[request_id]
            done.set_result(None)

    async def _place(self, pods: Sequence[Pod], ttl_s: float, request_id: str | None,
                     validate: bool, body: str) -> list[dict[str, Any]]:
        """One try of ``place`` (a request id's tries one at a time)."""
        groups: dict[str, list[Pod]] = {}
        for p in pods:
            groups.setdefault(p.gang_id or f"\0{p.id}", []).append(p)
        free = await self.free_of()
        now = self.clock() - self.t0
        ranked: dict[tuple[Any, ...], list[tuple[str, str]]] = {}  # one ranking per kind
        plans = [self._plan(members, free, now, ranked) for members in groups.values()]
        if self.division == "by_capacity" and len(plans) > 1:
            divide_by_capacity(self.h, plans, free)
        sent = self._sent.get(request_id, {}) if request_id else {}
        for plan in plans:  # an earlier try's regions first, in its order (after the edge)
            lead = 1 if plan.seq and plan.seq[0][0] == "edge" else 0
            for region in reversed(sent.get(_group_of(plan), [])):
                at = [i for i, (kind, site, _) in enumerate(plan.seq)
                      if kind == "region" and site == region]
                if at:
                    kind, site, why = plan.seq.pop(at[0])
                    plan.seq.insert(lead, (kind, site, f"{why}; an earlier try went here"))
        # Rounds: every group still unplaced goes to its next target; groups with the
        # same target share one call (a batch costs one hop per site, not per pod).
        for rnd in itertools.count():
            buckets: dict[tuple[str, str], list[_Plan]] = {}
            for plan in plans:
                if plan.result is None and plan.pos < len(plan.seq):
                    kind, site, _ = plan.seq[plan.pos]
                    buckets.setdefault((kind, site), []).append(plan)
            if not buckets:
                break
            if request_id is not None:
                self._note_round(request_id, buckets)
            # Every call of the round ends before a failure is raised: a retry waiting for
            # this try must not start while its other calls are still booking.
            done = await asyncio.gather(*(self._call(kind, site, bucket, ttl_s, request_id,
                                                     rnd, validate, body)
                                          for (kind, site), bucket in buckets.items()),
                                        return_exceptions=True)
            for got in done:
                if isinstance(got, BaseException):
                    raise got
        out: dict[str, dict[str, Any]] = {}
        for plan in plans:
            res = plan.result or [{**_unplaced(p, [*plan.stages, _stage(
                "cloud", "global", "rejected", plan.final)]), "gang_room": plan.room}
                for p in plan.members]
            out.update({r["pod_id"]: r for r in res})
        await self._release_extra_holds(plans)
        results = [out[p.id] for p in pods]
        # An answer with escalations queued at an edge is not final: a retry goes back to
        # the edge, which answers it from its queue or from the reconciled answer.
        if request_id is not None and not any(r.get("escalation") for r in results):
            self._remember(request_id, body, results)
            self._sent.pop(request_id, None)
        return results

    async def _release_extra_holds(self, plans: list[_Plan]) -> None:
        """One hold per gang: a gang placed nowhere keeps the first hold made for it (its
        answer names it) and lets go of the others; a gang placed somewhere lets go of
        every hold made for it, in this request or in an earlier one."""
        for plan in plans:
            gang = plan.members[0].gang_id
            if gang is None:
                continue
            drop = set(plan.rooms)
            if plan.result is None:
                if plan.rooms:
                    drop.discard(plan.rooms[0])
                    self._held_at[gang] = plan.rooms[0]
                    while len(self._held_at) > IDEMPOTENCY_KEEP:
                        self._held_at.popitem(last=False)
            elif not all(r["placed"] for r in plan.result):
                continue  # queued at an edge whose region is unreachable: not settled yet
            else:
                earlier = self._held_at.pop(gang, None)
                if earlier is not None:
                    drop.add(earlier)
                drop.discard(plan.result[0].get("site"))  # started there: its hold is gone
            for site in drop:
                if site not in self.drop_holds:
                    continue
                try:
                    await self.drop_holds[site](gang)
                except Exception:  # a hold left behind expires at its time anyway
                    continue

    def _plan(self, members: list[Pod], free: dict[str, dict[str, float]], now: float,
              ranked_by_key: dict[tuple[Any, ...], list[tuple[str, str]]]) -> _Plan:
        """Where to try a group, in order: its edge site first (latency-bound pods from an
        edge site), then the ranked regions (the edge's parent is skipped: the edge site
        escalates to it itself). Pods that rank alike (the same fields enter the ranking)
        share one ranking per request: a batch of like pods ranks once."""
        lead = members[0]
        seq: list[tuple[str, str, str]] = []
        skip = None
        origin = lead.origin_site
        if (origin in self.edges and (lead.pod_class == PodClass.EDGE_RT
                                      or lead.latency_slo_ms is not None)
                and (not lead.allowed_regions or origin in lead.allowed_regions)):
            seq.append(("edge", origin, ""))
            skip = self.h.region_of(origin)
        key = (lead.allowed_regions, lead.origin_site, lead.latency_slo_ms, lead.num_gpu > 0,
               lead.cpu_milli > 0, lead.cpu_milli, lead.gpu_total_milli)
        ranked = ranked_by_key.get(key)
        if ranked is None:
            ranked = ranked_by_key[key] = self.h.rank_regions(lead, free, now, self.weights)
        seq += [("region", r, why) for r, why in ranked if r != skip]
        final = "no allowed region can place it"
        if not ranked:
            final = ("no allowed region exists: " + ", ".join(lead.allowed_regions)
                     if lead.allowed_regions else "no region")
            edges = [r for r in lead.allowed_regions if r in self.edges]
            if edges:  # they exist (the ingress refused unknown names): say why not there
                final = (f"allowed_regions names no region, only MEC sites ({', '.join(edges)}"
                         "): a pod reaches an MEC site from its own origin_site there, with "
                         "class edge-rt or a latency_slo_ms")
        return _Plan(members, seq, final)

    async def _call(self, kind: str, site: str, bucket: list[_Plan], ttl_s: float,
                    request_id: str | None, rnd: int, validate: bool = False,
                    body: str = "") -> None:
        """``body``: the request's fingerprint (with ``request_id``)."""
        pods = [p for plan in bucket for p in plan.members]
        rid = None
        if request_id is not None:  # the same pods at the same site give the same key
            # ... of the same request: the sites remember keys longer than this tier may
            # (each sees part of the traffic), so the key carries the request's
            # fingerprint, or a reused id with another body would get the old booking.
            digest = hashlib.sha1("\0".join([body, *(p.id for p in pods)]).encode()
                                  ).hexdigest()[:16]
            rid = f"{request_id}#{site}#{digest}"
        for plan in bucket:
            why = plan.seq[plan.pos][2]
            if kind == "region":
                plan.stages.append(_stage("cloud", "global", "escalated", f"try {site}: {why}"))
        call = self.edges[site] if kind == "edge" else self.regions[site]
        res = await call(pods, ttl_s, rid, validate)
        by_id = {r["pod_id"]: r for r in res}
        for plan in bucket:
            mine = [by_id[p.id] for p in plan.members]
            if all(r["placed"] or r.get("escalation") for r in mine):
                # Placed, or queued (or dropped) at an edge site whose region is
                # unreachable: the region may hold it or get it later, so it must not be
                # placed anywhere else.
                for r in mine:
                    r["reasons"] = [*plan.stages, *r["reasons"]]
                plan.result = mine
            else:
                plan.stages += mine[0]["reasons"]
                room = mine[0].get("gang_room")
                if room is not None:
                    plan.rooms.append(site)
                    plan.room = plan.room or room  # the first site's hold
                plan.pos += 1


class _Unreachable(Exception):
    """The parent region did not answer (the link is cut, it is stopped, or slow)."""


@dataclass
class _NodeHold:
    token: str  # the node update holding the site
    until: float  # SiteTier.hold_clock
    released: asyncio.Event


@dataclass
class _Escalation:
    pods: list[Pod]
    ttl_s: float
    validate: bool
    queued_at: float
    attempts: int = 0


def _group_of(plan: _Plan) -> str:
    """The group a plan places: its gang, or its one pod."""
    lead = plan.members[0]
    return f"gang:{lead.gang_id}" if lead.gang_id else f"pod:{lead.id}"


@dataclass
class _Plan:
    members: list[Pod]
    seq: list[tuple[str, str, str]]  # (tier, site, why) to try in order
    final: str  # the reason if every target refuses
    pos: int = 0
    stages: list[dict[str, Any]] = field(default_factory=list)
    result: list[dict[str, Any]] | None = None
    room: dict[str, Any] | None = None  # room a site holds for the gang (gang_room)
    rooms: list[str] = field(default_factory=list)  # every site that held room for it


DIVISIONS = ("aggregated", "by_capacity")


def _demand(pod: Pod, need: str) -> float:
    """What ``pod`` asks of resource ``need`` (the units of ``free_fraction``'s capacity)."""
    return float(pod.gpu_total_milli if need == "gpu" else pod.cpu_milli if need == "cpu"
                 else pod.memory_mib)


def divide_by_capacity(h: Hierarchy, plans: list[_Plan],
                       free: dict[str, dict[str, float]]) -> None:
    """Share a batch among the regions in proportion to their capacity (Karmada's divided
    replicas, weighted by each member cluster's size), instead of sending every pod that
    ranks alike to the one region ranked first and spilling over only once it is full.

    Plans that start at a region (not edge-first) and ask the same dominant resource are
    divided together among the regions each could go to first: allowed, and within the
    pod's latency SLO where one is set (a region over it is never moved ahead of one
    within). Walking the plans in request order, each goes first to the region furthest
    below its share of the demand assigned so far (ties: the hierarchy's order); the rest of
    its ranked list stays behind it, so a full region still spills over. The shares
    depend on capacity (nodes up) and on the request, not on load: a retry of the request
    is divided as it was, and each site's idempotency key (the pods sent there) is
    the same."""
    groups: dict[tuple[str, frozenset[str]], list[tuple[_Plan, list[str]]]] = {}
    for plan in plans:
        if not plan.seq or plan.seq[0][0] != "region":
            continue
        lead = plan.members[0]
        regions = [site for kind, site, _ in plan.seq if kind == "region"]
        if lead.latency_slo_ms is not None and lead.origin_site is not None:
            origin = h.site(lead.origin_site)
            regions = [r for r in regions
                       if h.site(r).latency_ms_from(origin) <= lead.latency_slo_ms]
        if len(regions) < 2:
            continue
        need = dominant_resource(lead)
        groups.setdefault((need, frozenset(regions)), []).append((plan, regions))
    for (need, _), members in groups.items():
        if len(members) < 2:
            continue
        # Ties break in the hierarchy's order, not the ranking's (which moves with load):
        # the same request is divided the same way whenever it comes.
        order = [r for r in h.regions if r in members[0][1]]
        weight = np.array([max(float(free.get(r, {}).get(f"capacity_{need}", 0.0)), 0.0)
                          for r in order])
        if not weight.sum() > 0:
            continue
        share = weight / weight.sum()
        given = np.zeros(len(order))
        for plan, _ in members:
            d = sum(_demand(p, need) for p in plan.members)
            pick = int(np.argmax(share * (given.sum() + d) - given))  # first of the most
            given[pick] += d
            first = order[pick]
            i = next(i for i, (kind, site, _) in enumerate(plan.seq)
                     if kind == "region" and site == first)
            kind, site, why = plan.seq.pop(i)
            plan.seq.insert(0, (kind, site, f"{why}; batch divided by region capacity "
                                            f"({100 * share[pick]:.0f} % here)"))


def _unplaced(pod: Pod, stages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"pod_id": pod.id, "placed": False, "region": None, "site": None, "zone": None,
            "node": None, "devices": [], "tier": None, "profile": None,
            "reservation_id": None, "expires_at": None, "reasons": stages}
