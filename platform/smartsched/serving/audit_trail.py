"""What the placement service writes to the audit log, and who asked (issue 19).

Owns the service's side of ``smartsched.audit``: the principal of a request (the
operator, the shared client token, a tenant's token, or anyone when auth is off) and
one record per decision -- a placement, a rejection with its statuses, a preemption,
a confirmation, a release, a node update, a profile or policy reload, a refused
credential. Records go through ``AuditLog.append`` (buffered; sealed and signed
within a second), so logging costs the request path microseconds, not a disk write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from smartsched.serving.config import Audit


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


class Trail:
    """The service's audit records; a no-op without ``service.audit``."""

    def __init__(self, cfg: Audit | None) -> None:
        self.log = None
        if cfg is not None:
            from smartsched.audit.keys import load_private_key
            from smartsched.audit.log import AuditLog

            self.log = AuditLog(cfg.dir, cfg.heads, load_private_key(cfg.key_file),
                                block_seconds=cfg.block_seconds, fsync=cfg.fsync)

    def _add(self, kind: str, who: Principal, payload: Mapping[str, Any]) -> None:
        if self.log is not None:
            self.log.append(kind, who.name, payload, tenant=who.tenant or "")

    def placements(self, who: Principal, request_id: str | None,
                   results: Iterable[Mapping[str, Any]]) -> None:
        for r in results:
            self._add("placement" if r.get("placed") else "rejection", who,
                      {"request_id": request_id, **r})
            for p in r.get("preempted") or ():
                self._add("preemption", who, {"request_id": request_id, "by": r.get("pod_id"),
                                              **p})

    def reservation(self, who: Principal, op: str, out: Mapping[str, Any]) -> None:
        self._add(f"reservation.{op}", who, out)

    def node_updates(self, who: Principal, site: str,
                     updates: Iterable[tuple[int, str, Mapping[str, Any]]],
                     usage: Mapping[str, Any]) -> None:
        for _, name, changes in updates:
            self._add("node.update", who, {"site": site, "node": name, "changes": changes,
                                           "usage": usage.get(name)})

    def reload(self, who: Principal, site: str, profile: str) -> None:
        self._add("policy.reload", who, {"site": site, "profile": profile})

    def refused(self, method: str, path: str, status: int) -> None:
        self._add("auth.refused", UNKNOWN, {"method": method, "path": path, "status": status})

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None
