"""An MEC site's own HTTP entry: placement without the Serve proxy or the cloud ingress.

Why it exists (issue 22): the industrial IoT case asks for an answer within 8 ms at
the edge, and on loopback the Serve HTTP proxy alone takes longer than that before a
request reaches any replica (docs/benchmarks.md). A client at the MEC site therefore
talks to its site's replica directly: this module runs a small HTTP server (uvicorn,
the server Serve itself uses) inside the site's replica, on the replica's own event
loop, so a request here and one arriving through Serve are applied one at a time by
the same single writer of the site's state -- a device is never booked twice.

What it keeps from the cloud ingress: the same tokens (client, operator, tenants),
auth before the body is read, the body limit, the request schemas and their 4xx
answers naming the field, tenant scoping, idempotent retries (``request_id``), the
audit trail (its own log beside the service's: ``<dir>.edge-<site>``, heads
``<heads>.edge-<site>``, since one log has one writer) and per-route latency metrics
(``GET /metrics`` on the entry). What it does not do: rank other regions. A pod goes
to this site, and what the site cannot place escalates to its region as through the
cloud (queued while the region is unreachable); one the region cannot place either is
answered unplaced, and the client may ask the cloud ingress for a wider search.
Reservations made here are confirmed or released through the cloud ingress (their
ids name the site).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from smartsched.model.errors import UnknownReferenceError, ValidationError
from smartsched.serving.app import (
    CLIENT_AUTH,
    Authorizer,
    answer_placement,
    make_fastapi,
    request_pods,
)
from smartsched.serving.audit_trail import ANONYMOUS, Principal, Trail, idempotency_scope
from smartsched.serving.config import Audit, ServiceConfig, load_credentials
from smartsched.serving.journal import Journal
from smartsched.serving.metrics import ServiceMetrics
from smartsched.serving.schemas import (
    BatchPlacementRequest,
    PlacementRequest,
    PlacementResponse,
)
from smartsched.serving.site import IDEMPOTENCY_KEEP, AnswerCache
from smartsched.serving.tiers import bind_body, request_fingerprint

# The entry's answers journal, beside its site's (``<site>.jsonl``).
ENTRY_JOURNAL_SUFFIX = ".entry-answers.jsonl"

log = logging.getLogger(__name__)


def entry_audit(audit: Audit | None, site: str) -> Audit | None:
    """The entry's own audit log settings: beside the service's, named after the site."""
    if audit is None:
        return None
    d, h = Path(audit.dir), Path(audit.heads)
    return audit.model_copy(update={
        "dir": str(d.with_name(f"{d.name}.edge-{site}")),
        "heads": str(h.with_name(f"{h.stem}.edge-{site}{h.suffix}"))})


class EdgeEntry(Authorizer):
    """What the entry's routes and middlewares ask for: the config, credentials, audit
    trail and metrics, and ``place`` into the site's tier."""

    def __init__(self, cfg: ServiceConfig, site: str, tier: Any) -> None:
        self.cfg = cfg
        self.site = site
        self.tier = tier  # serving.tiers.SiteTier of this site
        self.creds = load_credentials(cfg.auth)
        self.trail = Trail(entry_audit(cfg.audit, site))
        self.metrics = ServiceMetrics()
        self.server: Any = None  # the uvicorn server, once started
        self.task: asyncio.Task | None = None  # its serve() task
        self._bodies: OrderedDict[str, str] = OrderedDict()  # request key -> its fingerprint
        # The entry's own answers to requests with an id, journaled when the service keeps
        # a journal: the site's journal keeps its own bookings only, so after a restart a
        # retry of a request the site had escalated (booked at its region), or whose
        # bookings had been released, was placed afresh -- one pod booked at two sites.
        self.answers = AnswerCache(IDEMPOTENCY_KEEP, size=len)
        self.journal: Journal | None = None
        if cfg.journal_dir is not None:
            self.journal = Journal(Path(cfg.journal_dir) / f"{site}{ENTRY_JOURNAL_SUFFIX}")
            for e in self.journal.replay():
                if e.get("op") == "answer" and isinstance(e.get("key"), str) \
                        and isinstance(e.get("results"), list):
                    self.answers[e["key"]] = e["results"]
                    self.answers.trim()
            self.journal.rewrite(self._answer_events())
        # A restarted site recovers its answers (their keys carry the body: see ``place``)
        # from its journal, the entry its own: the keys are bound to those bodies again.
        for key in [*tier.placer.answers, *self.answers]:
            bound, sep, body = key.rpartition("#")
            if sep and bound.startswith("!edge:"):
                self._bodies.setdefault(bound, body)

    def _answer_events(self) -> list[dict[str, Any]]:
        return [{"op": "answer", "key": k, "results": r} for k, r in self.answers.items()]

    def _remember(self, key: str, results: list[dict[str, Any]]) -> None:
        self.answers[key] = results
        self.answers.move_to_end(key)
        self.answers.trim()
        if self.journal is not None:
            self.journal.append({"op": "answer", "key": key, "results": results})
            if self.journal.needs_compaction():
                self.journal.rewrite(self._answer_events())

    async def place(self, specs: list, ttl_s: float, rid: str | None,
                    validate: bool = False, who: Principal = ANONYMOUS) -> PlacementResponse:
        self.trail.guard()  # no decision without its record (service.audit.on_failure)
        pods = request_pods(specs, who, self._here)
        # Its own key space: the cloud's keys for this site are derived differently, so a
        # request id used at both entries never answers one with the other's result.
        # '!' starts no tenant name, so no cloud key (``<tenant>:...``) can be one of these.
        key = f"!edge:{idempotency_scope(who)}:{rid}" if rid else None
        if key is not None and rid is not None:  # the key binds the content, as at the cloud
            body = request_fingerprint(pods, ttl_s, validate)
            bind_body(self._bodies, key, body, rid)
            # The site remembers answers by key longer than these bindings last (across a
            # restart): its key carries the body, so another body never gets the bookings
            # made for the first.
            key = f"{key}#{body}"
            if key in self.answers:  # the first answer, also after a restart
                self.answers.move_to_end(key)
                results = self.answers[key]
                self.trail.placements(who, rid, results, {p.id: p.tenant for p in pods})
                return PlacementResponse(request_id=rid, placements=results)
        results = await self.tier.place(pods, ttl_s, key, validate)
        # An answer with an escalation in it is not final (queued: the region may place it
        # later): a retry goes back to the site, which answers from its queue or with what
        # the region placed once reconciled (kept, it answered "queued" for good).
        if key is not None and not any(r.get("escalation") for r in results):
            self._remember(key, results)
        self.metrics.observe_placements(results)
        self.trail.placements(who, rid, results, {p.id: p.tenant for p in pods})
        return PlacementResponse(request_id=rid, placements=results)

    def _here(self, spec: Any, i: int) -> Any:
        """A pod for this site: from it (or from nowhere said) and allowed here."""
        if spec.origin_site not in (None, self.site):
            raise ValidationError(f"pods.{i}.origin_site", f"this is the entry of "
                                  f"{self.site!r}; send other sites' pods to the cloud")
        if spec.allowed_regions and self.site not in spec.allowed_regions:
            raise ValidationError(f"pods.{i}.allowed_regions", f"does not allow "
                                  f"{self.site!r}; send it to the cloud ingress")
        known = {s.name for s in self.tier.h.spec.sites}
        for r in spec.allowed_regions:  # as the cloud checks them: a typo is not ignored
            if r not in known:
                raise UnknownReferenceError(f"pods.{i}.allowed_regions",
                                            f"unknown site {r[:64]!r}")
        return spec.model_copy(update={"origin_site": self.site})

    async def aclose(self, timeout_s: float = 30.0) -> None:
        """Stop listening, let the requests in flight finish (an escalation may wait on
        its region), and only then seal the audit log: no decision without its record."""
        if self.server is not None:
            self.server.should_exit = True
        if self.task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.task), timeout_s)
            except Exception:  # a timeout, or the task's own error: close anyway
                log.warning("edge entry of %s did not stop cleanly within %g s", self.site,
                            timeout_s)
        self.trail.close()
        journal, self.journal = self.journal, None  # a request still in flight keeps its
        if journal is not None:                     # answer in memory only: never a 500
            journal.close()

    def serving(self) -> bool:
        """Whether the server task is running (False once it has ended, for any reason)."""
        return self.task is not None and not self.task.done()


def make_edge_app(entry: EdgeEntry) -> FastAPI:
    """The entry's routes, with the cloud ingress's middlewares and error answers."""
    app = make_fastapi(owner=lambda: entry, title=f"SmartSched edge entry ({entry.site})",
                       description="Placement at this MEC site without the cloud hop.")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "site": entry.site}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        body, ctype = entry.metrics.render()
        return PlainTextResponse(body, media_type=ctype)

    @app.post("/v1/placements", response_model=PlacementResponse, dependencies=CLIENT_AUTH)
    async def place_one(body: PlacementRequest, request: Request) -> Any:
        return await answer_placement(entry, body, request)

    @app.post("/v1/placements:batch", response_model=PlacementResponse,
              dependencies=CLIENT_AUTH)
    async def place_batch(body: BatchPlacementRequest, request: Request) -> Any:
        return await answer_placement(entry, body, request)

    return app


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the replica's process owns its signals, not this server

    return Server


def bind(host: str, port: int, site: str, wait_s: float = 0.0) -> socket.socket:
    """The entry's listening socket, bound now so that a taken port fails the replica's
    start with the field named, instead of a server task dying later. ``wait_s``: how long
    to retry a port in use (a redeploy's predecessor may still be draining)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise ValidationError("service.edge_entry.host", f"cannot resolve {host!r}: {e}") \
            from None
    family, _, _, _, addr = infos[0]
    deadline = time.monotonic() + wait_s
    while True:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
            break
        except OSError as e:
            sock.close()
            if e.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                raise ValidationError(f"service.edge_entry.ports.{site}",
                                      f"cannot listen on {host}:{port}: {e.strerror}") \
                    from None
            time.sleep(0.5)
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def start(entry: EdgeEntry, host: str, port: int, bind_wait_s: float = 0.0) -> asyncio.Task:
    """Serve ``entry`` on ``host:port`` from the running event loop (the replica's)."""
    from smartsched.listen import guarded_server_config

    sock = bind(host, port, entry.site, bind_wait_s)
    # Bounded request heads, a deadline for them, and a cap on connections (a client that
    # never finished its headers held a connection, and its memory, for ever).
    config = guarded_server_config(make_edge_app(entry), log_level="warning",
                                   access_log=False, lifespan="off", timeout_keep_alive=30,
                                   server_header=False, date_header=False)
    server = _server_class()(config)
    entry.server = server
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    entry.task = task

    def ended(t: asyncio.Task) -> None:
        sock.close()  # no client left hanging in the backlog of a server that is gone
        if not t.cancelled() and t.exception() is not None:
            log.error("edge entry of %s stopped: %r", entry.site, t.exception())

    task.add_done_callback(ended)
    return task
