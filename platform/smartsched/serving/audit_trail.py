"""What the placement service writes to the audit log, and who asked (issue 19).

Owns the service's side of ``smartsched.audit``: the principal of a request (the
operator, the shared client token, a tenant's token, or anyone when auth is off) and
one record per decision -- a placement, a rejection with its statuses, a preemption,
a confirmation, a release, a node update, a profile or policy reload, a refused
credential. Records go through ``AuditLog.append`` (buffered; sealed and signed
within a second), so logging costs the request path microseconds, not a disk write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from smartsched.model.errors import ServiceUnavailableError
from smartsched.serving.config import Audit

log = logging.getLogger(__name__)
REFUSED_PER_S = 100
MAX_REFUSED_TEXT = 256  # characters of a refused request's method and path kept


@dataclass(frozen=True)
class Principal:
    """Who a request came from: ``name`` as the log records it; ``tenant`` when the
    token is a tenant's (its requests are then scoped to that tenant)."""

    name: str
    tenant: str | None = None

    @property
    def role(self) -> str:
        return self.name.split(":", 1)[0]


OPERATOR_PRINCIPAL = Principal("operator")
CLIENT_PRINCIPAL = Principal("client")
ANONYMOUS = Principal("anonymous")  # auth disabled (loopback experiments)
UNKNOWN = Principal("unauthenticated")


def tenant_principal(tenant: str) -> Principal:
    return Principal(f"tenant:{tenant}", tenant)


def idempotency_scope(who: Principal) -> str:
    """The space ``who``'s request ids live in: its tenant's, or, for a shared token, one
    per role. The operator shares no ids with the placement clients (a client's id sent by
    the operator answered with the client's booking, and the audit log filed that
    placement under the operator). The client token and auth switched off keep the '*'
    their keys always had, so a retry across an upgrade still finds its answer. A tenant
    name is a-z, 0-9 and '-', so no tenant's scope is one of these."""
    if who.tenant:
        return who.tenant
    return "*" if who.name in (CLIENT_PRINCIPAL.name, ANONYMOUS.name) else f"*{who.name}"


class Trail:
    """The service's audit records; a no-op without ``service.audit``.

    When the log stops (a failed write: a full disk, say), ``guard`` refuses every
    decision-making request from then on (``on_failure: refuse``, the default: no
    decision without its record), or lets them through with the gap logged as an error
    (``continue``). Records are sealed and made durable within ``block_seconds``, so the
    decisions of the block being written when the disk failed are the ones a failure can
    leave unrecorded; they stand (the journal has them) and the error names the failure.
    """

    def __init__(self, cfg: Audit | None) -> None:
        self.log = None
        self.broken = False
        self.refuse_when_broken = cfg is not None and cfg.on_failure == "refuse"
        self._refused_second, self._refused_n, self._suppressed = -1, 0, 0
        if cfg is not None:
            from smartsched.audit.keys import load_private_key
            from smartsched.audit.log import AuditLog

            # A redeploy starts this replica while its predecessor may still hold the
            # log (until its process exits): wait for it rather than fail the deploy.
            self.log = AuditLog(cfg.dir, cfg.heads, load_private_key(cfg.key_file),
                                block_seconds=cfg.block_seconds, fsync=cfg.fsync,
                                lock_wait_s=60.0)

    def _add(self, kind: str, who: Principal, payload: Mapping[str, Any],
             tenant: str | None = None) -> None:
        if self.log is None:
            return
        try:
            self.log.append(kind, who.name, payload,
                            tenant=who.tenant or "" if tenant is None else tenant)
        except OSError as e:  # AuditWriteError: the log stopped (a full disk, say)
            # The decision stands (it is made and journaled); the gap is loud, not silent:
            # logged here, and the log itself takes nothing until it is restarted.
            if not self.broken:
                log.error("audit log stopped: %s", e)
            self.broken = True

    def guard(self) -> None:
        """Raise ServiceUnavailableError (503) when the log has stopped and the service
        must not decide without it; called before a request changes anything."""
        if self.log is None:
            return
        if not self.broken and self.log.stopped is not None:
            log.error("audit log stopped: %s", self.log.stopped)
            self.broken = True
        if self.broken and self.refuse_when_broken:
            raise ServiceUnavailableError(
                "the audit log stopped after a failed write; decisions are refused until "
                "the service is restarted with a working log (service.audit.on_failure: "
                "refuse)")

    def placements(self, who: Principal, request_id: str | None,
                   results: Iterable[Mapping[str, Any]],
                   tenants: Mapping[str, str] | None = None) -> None:
        """One record per pod; the record's tenant is the pod's (whichever token asked)."""
        tenants = tenants or {}
        for r in results:
            t = tenants.get(str(r.get("pod_id")), who.tenant or "")
            self._add("placement" if r.get("placed") else "rejection", who,
                      {"request_id": request_id, **r}, t)
            for p in r.get("preempted") or ():
                self._add("preemption", who, {"request_id": request_id, "by": r.get("pod_id"),
                                              **p}, t)

    def reservation(self, who: Principal, op: str, out: Mapping[str, Any],
                    tenants: Mapping[str, str] | None = None) -> None:
        """A confirm or release, filed under the tenant of the reservation's pods whichever
        token asked (``tenants``: pod id -> tenant; the shared client token's records read
        tenant '' and a tenant's own query missed them): one record per tenant, with its
        pods, when a batch of the shared token held several."""
        by_tenant: dict[str, list[Any]] = {}
        for pod in out.get("pods") or ():
            by_tenant.setdefault((tenants or {}).get(str(pod), who.tenant or ""), []).append(pod)
        if len(by_tenant) <= 1:
            self._add(f"reservation.{op}", who, out, next(iter(by_tenant), None))
            return
        for tenant, pods in sorted(by_tenant.items()):
            self._add(f"reservation.{op}", who, {**out, "pods": pods}, tenant)

    def node_updates(self, who: Principal, site: str,
                     updates: Iterable[tuple[int, str, Mapping[str, Any]]],
                     usage: Mapping[str, Any]) -> None:
        for _, name, changes in updates:
            self._add("node.update", who, {"site": site, "node": name, "changes": changes,
                                           "usage": usage.get(name)})

    def reload(self, who: Principal, site: str, profile: str) -> None:
        self._add("policy.reload", who, {"site": site, "profile": profile})

    def refused(self, method: str, path: str, status: int) -> None:
        """Refused credentials, at most ``REFUSED_PER_S`` records a second (anyone can send
        them: the log must not be theirs to fill); the rest are counted into the next."""
        now = int(time.monotonic())
        if now != self._refused_second:
            self._refused_second, self._refused_n = now, 0
        self._refused_n += 1
        if self._refused_n > REFUSED_PER_S:
            self._suppressed += 1
            return
        # Anyone's text, at most a few hundred characters a record: a 60 kB path would
        # otherwise write 60 kB into the signed log per refusal.
        self._add("auth.refused", UNKNOWN, {"method": method[:MAX_REFUSED_TEXT],
                                            "path": path[:MAX_REFUSED_TEXT],
                                            "path_length": len(path), "status": status,
                                            "suppressed_before": self._suppressed})
        self._suppressed = 0

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None
