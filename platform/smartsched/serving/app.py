"""The Ray Serve application: the cloud ingress -> region / edge deployments.

Owns the deployment graph and the HTTP surface. ``build_app(args)`` is the
import path of ``serve_apps/placement.yaml`` (``serve run``) and of
``smartsched serve``. One deployment per region and per MEC site, each with
exactly one replica (the single writer of its state; methods are coroutines
without awaits around state changes, so requests are applied one at a time on
the replica's event loop). The ``cloud`` deployment is the FastAPI ingress and
the global tier in one replica: it validates, authorizes, measures, ranks
regions and owns the idempotency answers across spill-over. (A separate cloud
deployment cost one more handle hop, ~6 ms p50 per request on 2 cores -- see
docs/benchmarks.md.) Every replica asks a fraction of a CPU (``replica_cpus``).
"""

from __future__ import annotations

import asyncio
import copy
import email.message
import hmac
import inspect
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPBearer
from pydantic import BeforeValidator
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from smartsched.listen import StrictFraming, utf16_or_32
from smartsched.model.errors import (
    PermissionDeniedError,
    ServiceUnavailableError,
    SmartSchedError,
    UnknownReferenceError,
    ValidationError,
    remote_cause,
    unechoed,
)
from smartsched.serving.audit_trail import (
    ANONYMOUS,
    CLIENT_PRINCIPAL,
    OPERATOR_PRINCIPAL,
    Principal,
    Trail,
    idempotency_scope,
    tenant_principal,
)
from smartsched.serving.config import (
    ServiceConfig,
    load_credentials,
    parse_service_config,
    resolve_reload_profile,
)
from smartsched.serving.schemas import (
    TENANT_NAME,
    BatchPlacementRequest,
    NodesRequest,
    PlacementRequest,
    PlacementResponse,
    ProfileUpdate,
    RegionSummary,
)

log = logging.getLogger(__name__)

# Per-node lists cross the sites' by-value hop (gRPC, 4 MiB a message) in pages of this
# many: a site may hold 20,000 nodes named with up to 253 characters (~5 MB of names).
NODE_PAGE = 4000


async def paged(method: Any) -> list[Any]:
    """Every item of a site's paged per-node list (``method(start, count)``: a list, or a
    mapping read as its pairs), page by page until one comes back short."""
    out: list[Any] = []
    while True:
        page = await method.remote(len(out), NODE_PAGE)
        items = list(page.items()) if isinstance(page, dict) else list(page)
        out.extend(items)
        if len(items) < NODE_PAGE:
            return out

API_TITLE = "SmartSched placement service"
PROFILE_FIELDS = ("region_profile", "edge_profile", "profiles")
# The cloud tier's answers to requests with an id, beside the sites' journals.
ANSWERS_JOURNAL = "cloud.answers.jsonl"

# The two credentials, declared in the OpenAPI document (the check itself is
# Ingress.authorize, run before the body is read; these only document it).
CLIENT = "client"
OPERATOR = "operator"
_client_bearer = HTTPBearer(scheme_name="clientToken", auto_error=False,
                            description="Placement clients: place, confirm, release.")
_operator_bearer = HTTPBearer(scheme_name="operatorToken", auto_error=False,
                              description="Operators: everything, plus node updates and "
                                          "profile reloads.")
CLIENT_AUTH = [Security(_client_bearer), Security(_operator_bearer)]
OPERATOR_AUTH = [Security(_operator_bearer)]


def required_role(method: str, path: str) -> str | None:
    """Which credential a request needs: OPERATOR for the admin endpoints (reads too) and
    node updates, None for other reads, CLIENT for the rest."""
    if path.startswith("/v1/admin/"):
        return OPERATOR
    if method in ("GET", "HEAD", "OPTIONS"):
        return None
    if path == "/v1/nodes":
        return OPERATOR
    return CLIENT


def service_hierarchy(cfg: ServiceConfig) -> Any:
    from smartsched.model.presets import load_cluster
    from smartsched.serving.hierarchy import Hierarchy

    try:
        spec = load_cluster(cfg.cluster)
    except ValidationError as e:  # named as the setting it came from
        raise ValidationError("service.cluster", e.message if e.field == "cluster"
                              else str(e)) from None
    h = Hierarchy.from_spec(spec, cfg.edge_parents)
    if cfg.compliance is not None:  # named field errors here, before any replica starts
        from smartsched.scheduling.compliance import attach, load_policy
        from smartsched.twin.state import ClusterState

        policy = load_policy(cfg.compliance)
        attach(ClusterState(h.spec), policy)
        # A rule for a tenant no pod of this API can carry (``Finance``) binds nothing.
        for t in policy.policy.tenants:
            if not TENANT_NAME.fullmatch(t):
                raise ValidationError("service.compliance.tenants", f"tenant {t!r}: pods "
                                      "name tenants by 1-63 lowercase letters, digits, '.', "
                                      "'_' or '-', so no pod could carry this one")
    known = {*h.regions, *h.edges}
    for field, names in (("profiles", cfg.profiles), ("sandbox.sites", cfg.sandbox.sites)):
        for name in names:
            if name not in known:
                raise ValidationError(f"service.{field}.{name}", "unknown site (known: "
                                      f"{', '.join(sorted(known))})")
    for name in cfg.edge_entry.ports:
        if name not in h.edges:
            raise ValidationError(f"service.edge_entry.ports.{name}", "not an MEC site "
                                  f"(edge sites: {', '.join(sorted(h.edges)) or 'none'})")
    return h


def by_value(handle: Any) -> Any:
    """A deployment handle that calls its replica over Serve's inter-deployment gRPC,
    arguments and answers passed by value, instead of as a Ray actor task with its
    object references: about a millisecond less per hop on this machine (a bare chain of
    two deployments, interleaved: p50 14.6 against 16.0 ms), and a request crosses one
    hop (cloud -> region) or two (an escalation). Replicas serve that gRPC whether it is
    used or not, behind Ray's token authentication. Anything else (a test's in-process
    stand-in) is kept as it is."""
    from ray.serve.handle import DeploymentHandle

    return (handle.options(_by_reference=False) if isinstance(handle, DeploymentHandle)
            else handle)


class InProcessSite:
    """A site object in this process, called as its deployment handle would be
    (``site.method.remote(...)``, awaited): ``service.topology: single_process``.

    Arguments and answers are copied, as a Serve call by value copies them, so
    neither side holds a reference the other changes later: the cloud tier adds its
    stages to a site's answers, and the site keeps its answers for retries."""

    def __init__(self, site: Any) -> None:
        self._site = site

    def __getattr__(self, name: str) -> _InProcessMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        return _InProcessMethod(getattr(self._site, name))


class _InProcessMethod:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        return self._call(copy.deepcopy(args), copy.deepcopy(kwargs))

    async def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = self.fn(*args, **kwargs)
        if inspect.isawaitable(out):
            out = await out
        return copy.deepcopy(out)


def in_process_sites(args: dict[str, Any], h: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every region and MEC site built in this process (regions first: an edge site's
    escalations go to its region's object), as handles the cloud tier calls."""
    plain = SiteDeployment.func_or_class

    def built(*a: Any) -> InProcessSite:
        site = plain(args, *a)
        # As Serve's reconfigure does for a replica of its own: the deployment's profile,
        # keeping a journaled live reload made on top of it (and superseding one made on
        # top of another, which a redeploy back to that profile would have revived).
        site.tier.configure(site.tier.placer.configured)
        return InProcessSite(site)

    regions = {r: built(r) for r in h.regions}
    edges = {e: built(e, regions[h.parent[e]]) for e in h.edges}
    return regions, edges


@serve.deployment(num_replicas=1, max_ongoing_requests=2000)
class SiteDeployment:
    """One region or MEC site (see ``serving.tiers.SiteTier``)."""

    def __init__(self, args: dict[str, Any], site: str, parent: Any = None) -> None:
        from smartsched.serving.tiers import SiteTier

        cfg = parse_service_config(args)
        h = service_hierarchy(cfg)
        tier = "region" if site in h.regions else "edge"

        parent = by_value(parent)

        async def call_parent(pods: list, ttl_s: float, rid: str | None,
                              validate: bool = False) -> list:
            return await parent.place.remote(pods, ttl_s, rid, validate)

        # The real profile arrives through reconfigure(user_config) right after this,
        # so that changing it later is an in-place update, not a new replica.
        self.tier = SiteTier(h, site, cfg.profile_of(site, tier),
                             parent=call_parent if parent is not None else None, seed=cfg.seed,
                             journal_dir=cfg.journal_dir, usage=cfg.prometheus,
                             preemption=cfg.preemption, sandbox=cfg.sandbox,
                             compliance=cfg.compliance, autonomy=cfg.edge_autonomy,
                             gang_reservations=cfg.gang_reservations)
        # An MEC site's own HTTP entry (service.edge_entry), served from this replica's
        # event loop: the same single writer, no proxy or cloud hop on its path.
        self.entry = None
        port = cfg.edge_entry.ports.get(site)
        if port is not None:
            from smartsched.serving.edge_entry import EdgeEntry, start

            self.entry = EdgeEntry(cfg, site, self.tier)
            # A redeploy's predecessor may hold the port while it drains: wait for it.
            start(self.entry, cfg.edge_entry.host, port, bind_wait_s=60.0)

    async def __del__(self) -> None:
        """Serve's graceful shutdown: the edge entry stops listening, finishes what it
        has in flight, then seals its audit log."""
        entry = getattr(self, "entry", None)
        if entry is not None:
            await entry.aclose()

    def check_health(self) -> None:
        """Serve's health check: a site whose own entry stopped is restarted."""
        if self.entry is not None and not self.entry.serving():
            raise RuntimeError(f"the edge entry of {self.tier.site} stopped")

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Live policy reload: ``{profile: <name|rl:PATH>}`` swaps the profile in place
        (on the replica's event loop, between requests: the site keeps one writer)."""
        profile = (user_config or {}).get("profile")
        if profile:  # the deployment's profile (Serve calls this at every replica start)
            self.tier.configure(str(profile))

    async def place(self, pods: list, ttl_s: float, rid: str | None,
                    validate: bool = False) -> list[dict[str, Any]]:
        return await self.tier.place(pods, ttl_s, rid, validate)

    async def confirm(self, rid: str, tenant: str | None = None) -> dict[str, Any]:
        return self.tier.confirm(rid, tenant)

    async def release(self, rid: str, tenant: str | None = None) -> dict[str, Any]:
        return self.tier.release(rid, tenant)

    async def summary(self) -> dict[str, Any]:
        return self.tier.summary()

    async def node_green(self, start: int = 0, count: int = NODE_PAGE) -> dict[str, float]:
        """A page of the site's node scores (``NODE_PAGE``: a whole site's 20,000 names of
        253 characters passed the hop's 4 MiB, and /metrics answered 503 for good). The
        first page takes the reading the later pages come from: scored once, and a node
        switched on or off between pages shifts nothing."""
        if start == 0 or getattr(self, "_green_pages", None) is None:
            self._green_pages = list(self.tier.node_green().items())
        return dict(self._green_pages[start:start + count])

    async def drop_gang_hold(self, gang: str) -> bool:
        return self.tier.drop_gang_hold(gang)

    async def escalations(self, limit: int = 100) -> dict[str, Any]:
        return self.tier.escalations(limit)

    async def reconcile(self) -> dict[str, Any]:
        return await self.tier.reconcile()

    async def free(self) -> dict[str, float]:
        return self.tier.free()

    async def recent(self, limit: int) -> dict[str, Any]:
        return self.tier.recent(limit)

    async def set_profile(self, profile: str, label: str | None = None) -> str:
        return self.tier.set_profile(profile, label)

    async def node_names(self, start: int = 0, count: int = NODE_PAGE) -> list[str]:
        """A page of the nodes this site holds, the ones registered through the API
        included (paged as ``node_green``, from the first page's reading)."""
        if start == 0 or getattr(self, "_name_pages", None) is None:
            self._name_pages = list(self.tier.placer.state.names)
        return self._name_pages[start:start + count]

    async def apply_node_updates(self, updates: list, usage: dict,
                                 dry_run: bool = False) -> dict[str, Any]:
        return await self.tier.apply_node_updates(updates, usage, dry_run)

    async def prepare_node_updates(self, token: str, updates: list,
                                   usage: dict) -> dict[str, Any]:
        return await self.tier.prepare_node_updates(token, updates, usage)

    async def commit_node_updates(self, token: str, updates: list,
                                  usage: dict) -> dict[str, Any]:
        return await self.tier.commit_node_updates(token, updates, usage)

    async def confirm_node_hold(self, token: str) -> bool:
        return self.tier.confirm_node_hold(token)

    async def abort_node_updates(self, token: str) -> bool:
        return self.tier.abort_node_updates(token)


def _printable(x: Any) -> str:
    """``x`` as text JSON can carry (lone surrogates escaped), at most 200 characters."""
    return str(x)[:200].encode("utf-8", "backslashreplace").decode("utf-8")


def _loc_part(x: Any) -> str | int:
    """A location step as it can be answered: a field name or index, not an input's text
    (pydantic puts a dict's own key into the location; that key is the client's input)."""
    if isinstance(x, int) or (isinstance(x, str) and x.isascii() and x.isprintable()
                              and len(x) <= 64):
        return x
    return "<key>"


def _named_for(request: Request, field: str) -> str:
    """``field`` as the request's body names it: the single-pod route's body holds
    ``pod``, not ``pods`` (the pod goes through the batch's code as ``pods.0``)."""
    if request.url.path.endswith("/v1/placements") and (
            field == "pods" or field.startswith("pods.")):
        rest = field.removeprefix("pods").removeprefix(".").removeprefix("0")
        return "pod" + (rest if not rest or rest.startswith(".") else "." + rest)
    return field


def _error(status: int, field: str, msg: str) -> JSONResponse:
    return JSONResponse({"detail": [{"loc": [_printable(x) for x in field.split(".")],
                                     "msg": _printable(unechoed(msg))}]}, status_code=status)




# The longest a request's body may pause between two of its parts (a client that declared
# more bytes than it sent, or stalled mid-chunk, held its request open until the proxy's
# own limits, 70 s and more): then a 408.
BODY_IDLE_TIMEOUT_S = 15.0
# ... and the longest a whole body may take (a byte every 10 s passed the pause limit and
# held the request for as long as the client liked).
BODY_DEADLINE_S = 60.0


class BodyLimit:
    """ASGI middleware: 413 for bodies over the limit, declared (Content-Length) or
    streamed (chunked); 408 for a body that stops arriving (``BODY_IDLE_TIMEOUT_S``).
    A body is read here, up to the limit, before the app sees it: an error raised while
    the app reads would be answered by FastAPI as a 400 "error parsing the body", not as
    what it is."""

    def __init__(self, app: Any, owner: Any = None) -> None:
        self.app = app
        self.owner = owner or _current
        # Bodies still arriving, by credential and by (credential, client address):
        # AuthFirst, outside this, has put the request's principal in its scope.
        self.reading: dict[Any, int] = {}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        ing = self.owner()  # the limit is the running ingress's (see serving.replica)
        cfg = ing.cfg if ing is not None else ServiceConfig()
        limit = cfg.max_body_bytes
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            resp = _error(413, "body", f"body of {int(declared)} bytes exceeds {limit}")
            resp.headers["Connection"] = "close"  # its unread body is not a next request
            return await resp(scope, receive, send)
        if scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        # Counted by credential (a few addresses -- an IPv6 /64 is 2^64 of them -- let one
        # token hold every slot) and by credential and address (one stalled client behind
        # a shared token does not lock out its other holders).
        who = getattr((scope.get("state") or {}).get("principal"), "name", "unauthenticated")
        keys = (who, (who, str((scope.get("client") or ("", 0))[0])))
        for key, most, what in ((keys[0], cfg.max_body_reads_per_credential, ""),
                                (keys[1], cfg.max_body_reads_per_address,
                                 " from this address")):
            if self.reading.get(key, 0) >= most:
                resp = _error(429, "body", f"this credential already has {most} request "
                              f"bodies arriving{what}: send each body whole, then the next")
                resp.headers["Retry-After"] = "1"
                resp.headers["Connection"] = "close"  # its unread body is not a next request
                return await resp(scope, receive, send)
        for key in keys:
            self.reading[key] = self.reading.get(key, 0) + 1
        try:
            buffered = await self._read(scope, receive, send, limit)
        finally:
            for key in keys:
                if (left := self.reading.pop(key) - 1) > 0:
                    self.reading[key] = left
        if buffered is None:
            return None

        async def replay() -> dict:
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)

    async def _read(self, scope: dict, receive: Any, send: Any, limit: int
                    ) -> list[dict] | None:
        """The body's messages, read whole within the limits; None when it was refused
        (and answered)."""
        buffered: list[dict] = []
        seen = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BODY_DEADLINE_S
        while True:
            left = deadline - loop.time()
            try:  # a client that stops sending mid-body held the request (70 s and more)
                msg = await asyncio.wait_for(receive(), min(BODY_IDLE_TIMEOUT_S, left))
            except TimeoutError:
                why = (f"no part of the body arrived for {BODY_IDLE_TIMEOUT_S:.0f} s"
                       if left > BODY_IDLE_TIMEOUT_S else
                       f"the body took over {BODY_DEADLINE_S:.0f} s")
                await _error(408, "body", f"{why}: send the whole body at once")(
                    scope, receive, send)
                return None
            buffered.append(msg)
            if msg["type"] != "http.request":
                break
            seen += len(msg.get("body", b""))
            if seen > limit:
                await _error(413, "body", f"body exceeds {limit} bytes")(scope, receive, send)
                return None
            if not msg.get("more_body", False):
                break
        head = b"".join(m.get("body", b"") for m in buffered[:4])
        if utf16_or_32(head):
            await _error(400, "body", "JSON must be UTF-8 (this body is UTF-16 or "
                         "UTF-32)")(scope, receive, send)
            return None
        return buffered


JSON_MEDIA_TYPE = "application/json"


def is_json_media_type(value: bytes | None) -> bool:
    """Whether a Content-Type header names JSON as FastAPI reads it (``application/json``
    or ``application/<x>+json``, parameters such as ``charset`` aside)."""
    if not value:
        return False
    if value.startswith(b"application/json") and value[16:17] in (b"", b";", b" "):
        return True  # the common case, without parsing
    m = email.message.Message()
    m["content-type"] = value.decode("latin-1")
    sub = m.get_content_subtype()
    return m.get_content_maintype() == "application" and (sub == "json"
                                                          or sub.endswith("+json"))


class StrictQuery:
    """ASGI middleware: a query string the route would misread is refused, not guessed at.
    A parameter given twice (``?limit=1&limit=2``: which one counts depends on the reader;
    400, as for a JSON key given twice) and one the route does not take (``?LIMIT=5`` ran
    with the default limit; 422 naming it) are answered before the route runs. Requests
    that match no route go on to their 404."""

    def __init__(self, app: Any, routes: Callable[[], list] | None = None) -> None:
        self.app = app
        self.routes = routes or (lambda: [])
        self._known: dict[int, frozenset[str]] = {}

    def _params(self, route: Any) -> frozenset[str] | None:
        dependant = getattr(route, "dependant", None)
        if dependant is None:
            return None
        key = id(route)
        if key not in self._known:
            names = {p.alias for p in dependant.query_params}
            stack = list(dependant.dependencies)
            while stack:
                d = stack.pop()
                names |= {p.alias for p in d.query_params}
                stack.extend(d.dependencies)
            self._known[key] = frozenset(names)
        return self._known[key]

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        query = scope.get("query_string") or b""
        if scope["type"] == "http" and query:
            from urllib.parse import parse_qsl

            from starlette.routing import Match

            keys = [k for k, _ in parse_qsl(query.decode("latin-1"), keep_blank_values=True)]
            seen: set[str] = set()
            for k in keys:
                if k in seen:
                    return await _error(400, f"query.{_loc_part(k)}", "a query parameter "
                                        "given twice")(scope, receive, send)
                seen.add(k)
            for route in self.routes():
                match, _ = route.matches(scope)
                if match != Match.FULL:
                    continue
                known = self._params(route)
                unknown = [k for k in keys if known is not None and k not in known]
                if unknown:
                    return await _error(422, f"query.{_loc_part(unknown[0])}",
                                        "not a parameter of this route")(scope, receive, send)
                break
        await self.app(scope, receive, send)


class JsonOnly:
    """ASGI middleware: 415 for a body whose Content-Type is not JSON sent to a route that
    reads a JSON body (FastAPI would take the bytes as the body and answer a 422 about a
    "valid dictionary"); a body without a Content-Type is read as JSON (``make_fastapi``
    turns FastAPI's strict Content-Type off for that). Also 415 for a body sent with a
    Content-Encoding (gzip, ...): it is not decoded, so its bytes would be answered as
    "not parseable as JSON" (or, for a body not encoded at all, read as if it were); and
    400 for more than one Content-Type (this check and FastAPI would read different ones).
    The body is never read nor echoed, and a request without a body, or to a route
    without one (confirm, release), is let through. Inside authorization (a client
    without the token is refused first) and outside the body limit (a wrong type is
    answered without reading the body)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method") in ("POST", "PUT", "PATCH"):
            raw = scope.get("headers") or []
            headers = dict(raw)
            length = headers.get(b"content-length")
            has_body = (b"transfer-encoding" in headers if length is None
                        else length.strip() not in (b"", b"0"))
            ctypes = [v for k, v in raw if k == b"content-type"]
            ctype = ctypes[0] if ctypes else None  # the one FastAPI reads
            codings = [c.strip().lower() for k, v in raw if k == b"content-encoding"
                       for c in v.split(b",")]
            if has_body and len(ctypes) > 1 and _reads_body(scope):
                return await _error(400, "headers.content-type", "more than one Content-Type "
                                    "header")(scope, receive, send)
            if has_body and any(c not in (b"", b"identity") for c in codings) \
                    and _reads_body(scope):
                resp = _error(415, "headers.content-encoding", "unsupported content encoding: "
                              "send the body unencoded (identity)")
                resp.headers["Accept-Encoding"] = "identity"  # RFC 7694
                return await resp(scope, receive, send)
            # No Content-Type: the body is read as JSON (requests' data=json.dumps(...)
            # sends none), so only a type that names something else is refused.
            if has_body and ctype and not is_json_media_type(ctype) and _reads_body(scope):
                resp = _error(415, "headers.content-type",
                              f"unsupported media type: this endpoint takes "
                              f"{JSON_MEDIA_TYPE}")
                if scope["method"] != "PUT":  # the header naming what it takes
                    resp.headers[f"Accept-{scope['method'].title()}"] = JSON_MEDIA_TYPE
                return await resp(scope, receive, send)
        await self.app(scope, receive, send)


def _reads_body(scope: dict) -> bool:
    """Whether the route ``scope`` goes to reads a body (only asked for a body that is not
    JSON, so the common case does not route twice). Unknown routes: no (404/405 as ever)."""
    from starlette.routing import Match

    app = scope.get("app")
    for route in getattr(getattr(app, "router", None), "routes", ()):
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return getattr(route, "body_field", None) is not None
    return False


class Measure:
    """ASGI middleware: each request's latency by method, route and status, into the
    running ingress's metrics (plain ASGI: Starlette's BaseHTTPMiddleware costs a task and
    a stream wrapper per request)."""

    def __init__(self, app: Any, owner: Any = None) -> None:
        self.app = app
        self.owner = owner or _current

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status = 500

        async def sending(msg: dict) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, sending)
        finally:
            ing = self.owner()
            if ing is not None:  # the router sets scope["route"] on the shared scope
                path = getattr(scope.get("route"), "path", "unmatched")
                ing.metrics.request(scope["method"], path, status, time.perf_counter() - t0)


class HeadAsGet:
    """ASGI middleware: HEAD answered as GET, headers only (RFC 9110: a server supports
    HEAD wherever it supports GET). FastAPI's routes declare GET alone, so ``HEAD /healthz``
    (a load balancer's probe) was a 405. Outermost: authorization and the metrics see a
    GET, which HEAD is."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "HEAD":
            return await self.app(scope, receive, send)

        async def headers_only(msg: dict) -> None:
            if msg["type"] == "http.response.body":
                msg = {**msg, "body": b""}
            await send(msg)

        # A copy: the server keeps its own HEAD (and so sends no body itself either).
        await self.app({**scope, "method": "GET"}, receive, headers_only)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's dict, refusing a key given twice: which value counts would depend on
    the reader (Python's json keeps the last, others the first or refuse), so a proxy or
    audit that read the first ``tenant`` or ``cpu_milli`` saw another request than the one
    placed. Answered as a 400 naming the key, never its value."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise HTTPException(400, detail=[{
                    "loc": ["body", _loc_part(key)],
                    "msg": "a key given twice in one JSON object: send each key once"}])
            seen.add(key)
    return out


class _UniqueKeysRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = json.loads(await self.body(), object_pairs_hook=_unique_keys)
        return self._json


class UniqueKeysRoute(APIRoute):
    """The service's routes: a JSON body is parsed refusing duplicate keys
    (``_unique_keys``), once, where FastAPI parses it."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def unique_keys(request: Request) -> Response:
            return await handler(_UniqueKeysRequest(request.scope, request.receive))

        return unique_keys


class AuthFirst:
    """ASGI middleware: every mutating call is authorized before its body is read or
    parsed -- a client without the token costs a header check, not a parse of a 4 MB
    batch. (The routes check again; this only answers earlier.)"""

    def __init__(self, app: Any, owner: Any = None) -> None:
        self.app = app
        self.owner = owner or _current

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path, root = scope.get("path", ""), scope.get("root_path", "")
            role = required_role(scope["method"],
                                 path[len(root):] if path.startswith(root) else path)
            if role is not None:
                ing = self.owner()
                if ing is not None and (
                        denied := ing.authorize(Request(scope), role)) is not None:
                    return await denied(scope, receive, send)
        await self.app(scope, receive, send)


def _current() -> Any:
    """The running ingress of this process (``serving.replica``), or None."""
    from smartsched.serving.replica import current

    return current()


_ERROR_BODY = {"application/json": {"schema": {
    "type": "object", "required": ["detail"],
    "properties": {"detail": {"anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "object", "properties": {
            "loc": {"type": "array", "items": {"anyOf": [{"type": "string"},
                                                         {"type": "integer"}]}},
            "msg": {"type": "string"}}}}]}}}}}
# What every route may answer besides its own (the OpenAPI document listed 200 and 422
# only): the error body names the field (``loc``) and the rule (``msg``), never the input.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"description": why, "content": _ERROR_BODY} for code, why in (
        (400, "malformed request: a JSON key or query parameter given twice, a body that "
              "is not JSON"),
        (401, "no bearer token, or not a known one"),
        (403, "the token may not do this (an operator route, another tenant's pods)"),
        (404, "no such route, site, region or reservation"),
        (408, "the body stalled"),
        (409, "conflicts with the current state (capacity in use, a node of another site)"),
        (413, "body over the size limit"),
        (415, "body not JSON, or encoded"),
        (417, "an Expect header other than 100-continue"),
        (429, "this credential already has max_body_reads_per_credential bodies arriving "
              "(max_body_reads_per_address from one address): retry after Retry-After "
              "seconds"),
        (503, "a site is restarting or unreachable: retry after Retry-After seconds"))}


def _add_docs_pages(app: FastAPI, owner: Callable[[], Any]) -> None:
    """``/docs`` (Swagger UI) and ``/redoc``, answered only when the owner's config has
    ``api_docs`` on, else 404 as any path that is not a route."""
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

    def document(request: Request) -> str:
        ing = owner()
        if ing is None or not getattr(ing.cfg, "api_docs", False):
            raise StarletteHTTPException(404, "Not Found")
        # Under a route prefix (Serve's route_prefix) the document is under it too.
        root = request.scope.get("root_path", "").rstrip("/")
        return root + (app.openapi_url or "/openapi.json")

    @app.get("/docs", include_in_schema=False)
    async def swagger(request: Request) -> Response:
        return get_swagger_ui_html(openapi_url=document(request), title=f"{app.title} - API")

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> Response:
        return get_redoc_html(openapi_url=document(request), title=f"{app.title} - API")


def make_fastapi(owner: Any = None, title: str = API_TITLE,
                 description: str = "Where should this workload run? Placement through "
                                    "cloud, region and MEC edge schedulers.") -> FastAPI:
    """The app with the service's middlewares and error answers and no routes. ``owner``:
    what the middlewares ask for the body limit, authorization and metrics (a callable
    returning an object with ``cfg``, ``authorize`` and ``metrics``; default: the
    process's ingress)."""
    # strict_content_type=False: a JSON body sent without a Content-Type is read as JSON
    # (FastAPI's strict default answered it with a 422 saying the body is not an object).
    # Its reason, a browser's cross-site request to a cookie-authenticated API, does not
    # apply: what changes anything takes a bearer token in a header (auth.disabled: open
    # to every client that reaches the port anyway).
    # redirect_slashes=False: ``POST /v1/placements/`` was a 307 to a Location built from
    # the request's Host header (an internal address behind a proxy, or whatever a client
    # sent); a path that is not a route is a 404.
    # docs_url/redoc_url None: the interactive pages are routes of our own below, served
    # only where the service's config asks for them (``api_docs``).
    app = FastAPI(title=title, version="1", description=description,
                  strict_content_type=False, redirect_slashes=False,
                  responses=ERROR_RESPONSES, docs_url=None, redoc_url=None)
    app.router.route_class = UniqueKeysRoute  # every route added later: duplicate keys 400
    # Outermost last: HEAD as GET, auth, then measuring, then the media type (415), then the
    # query string (a parameter twice or unknown), then the body limit, then the routes.
    app.add_middleware(BodyLimit, owner=owner)
    app.add_middleware(StrictQuery, routes=lambda: app.routes)
    app.add_middleware(JsonOnly)
    app.add_middleware(Measure, owner=owner)
    app.add_middleware(AuthFirst, owner=owner)
    app.add_middleware(HeadAsGet)
    app.add_middleware(StrictFraming)

    _add_docs_pages(app, owner or _current)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> JSONResponse:
        # FastAPI answers a body json cannot parse (malformed, nested too deeply, a number
        # of thousands of digits, bytes that are not UTF-8) with a bare 400: name the field.
        if e.status_code == 400 and e.detail == "There was an error parsing the body":
            return _error(400, "body", "not parseable as JSON (malformed, not UTF-8, nested "
                                       "too deeply or a number too long)")
        detail = unechoed(e.detail) if isinstance(e.detail, str) else e.detail
        return JSONResponse({"detail": detail}, status_code=e.status_code,
                            headers=getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer echoes the input, and fails (500) on what JSON cannot carry
        # back (NaN, lone surrogates): name the field and the rule, never the value.
        detail = [{"loc": [_loc_part(x) for x in err.get("loc", ())][:16],
                   "msg": _printable(err.get("msg", "invalid"))[:300],
                   "type": _printable(err.get("type", ""))[:64]}
                  for err in e.errors()[:32]]
        return JSONResponse({"detail": detail}, status_code=422)

    # An error raised in a region or edge replica reaches here wrapped by Ray (its message
    # then carries the remote traceback, pid, node IP and actor id): answer from the
    # original exception only.
    @app.exception_handler(UnknownReferenceError)
    async def _unknown(request: Request, e: UnknownReferenceError) -> JSONResponse:
        c = remote_cause(e)
        return _error(404, _named_for(request, getattr(c, "field", "request")),
                      getattr(c, "message", str(c)))

    @app.exception_handler(ValidationError)
    async def _invalid(request: Request, e: ValidationError) -> JSONResponse:
        c = remote_cause(e)
        return _error(422, _named_for(request, getattr(c, "field", "request")),
                      getattr(c, "message", str(c)))

    @app.exception_handler(PermissionDeniedError)
    async def _forbidden(request: Request, e: PermissionDeniedError) -> JSONResponse:
        c = remote_cause(e)
        return _error(403, _named_for(request, getattr(c, "field", "request")),
                      getattr(c, "message", str(c)))

    @app.exception_handler(ServiceUnavailableError)
    async def _unavailable(_: Request, e: ServiceUnavailableError) -> JSONResponse:
        return JSONResponse({"detail": [{"loc": ["service"], "msg": str(remote_cause(e))}]},
                            status_code=503, headers={"Retry-After": "60"})

    # A site's replica that died or is restarting (Serve starts a new one in seconds):
    # Ray's error was a bare 500, which clients do not retry (client.py retries 502/503/504),
    # so a release sent then was lost. A 503 to retry, without Ray's actor id or message.
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import (
        BackPressureError,
        DeploymentUnavailableError,
        ReplicaUnavailableError,
    )

    async def _site_down(_: Request, e: Exception) -> JSONResponse:
        return JSONResponse({"detail": [{"loc": ["service"], "msg": "a site of this service "
                                         "is restarting or overloaded: retry (a request "
                                         "without a request_id may or may not have been "
                                         "applied)"}]},
                            status_code=503, headers={"Retry-After": "5"})

    for down in (RayActorError, DeploymentUnavailableError, ReplicaUnavailableError,
                 BackPressureError):
        app.add_exception_handler(down, _site_down)

    # A call between replicas by value is a gRPC message, which Serve caps at 4 MiB
    # (RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH): a request whose share for one site is
    # larger was a bare 500. Too large is the request's size (413); any other gRPC failure
    # is a site that cannot be reached now (503, as above).
    import grpc

    async def _hop_failed(request: Request, e: Exception) -> JSONResponse:
        code = getattr(e, "code", lambda: None)()
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and request.method in ("POST", "PUT"):
            return _error(413, "body", "too large to pass between the service's sites "
                          "(at most 4 MiB a site): send fewer pods at once")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit" in request.query_params:
            # An answer too large (the sites cap theirs, so this is a safety net).
            return _error(422, "limit", "the answer is too large to pass between the "
                          "service's replicas: ask for fewer")
        return await _site_down(request, e)

    app.add_exception_handler(grpc.aio.AioRpcError, _hop_failed)

    @app.exception_handler(SmartSchedError)
    async def _other(request: Request, e: SmartSchedError) -> JSONResponse:
        c = remote_cause(e)  # a conflict names its field when it has one
        return _error(409, _named_for(request, getattr(c, "field", "request")),
                      getattr(c, "message", str(c)))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception) -> JSONResponse:
        # Anything no handler above maps was Starlette's bare text 500: the service's error
        # shape instead, nothing of the exception in it (it goes to the log).
        log.error("unexpected error answering %s %s", request.method, request.url.path,
                  exc_info=e)
        return JSONResponse({"detail": [{"loc": ["service"], "msg": (
            "an internal error: the service logged it")}]}, status_code=500)

    return app


app_api = make_fastapi()


# Routes are registered before @serve.ingress captures (pickles) the app; they reach
# the replica's Ingress through serving.replica (see there why).
async def _ingress() -> Any:
    from smartsched.serving.replica import current

    ing = current()
    if ing is None:  # 503: clients retry (a 409 told them their request was wrong)
        raise ServiceUnavailableError("the service is starting")
    return ing


@app_api.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


# How long the sites' gauges (reservations, GreenScores) read for one scrape serve the
# next: a scrape asks every site two questions, and eight clients scraping in a loop (the
# endpoint takes no token) pushed the median placement from 19 to 483 ms. Concurrent
# scrapes wait for one reading; the ingress's own counters are always current.
METRICS_FRESH_S = 1.0


@app_api.get("/metrics")
async def metrics(ing: Any = Depends(_ingress)) -> PlainTextResponse:
    lock = getattr(ing, "_site_gauges_lock", None)
    if lock is None:
        lock = ing._site_gauges_lock = asyncio.Lock()
    async with lock:
        read_at = getattr(ing, "_site_gauges_at", None)
        if read_at is None or time.monotonic() - read_at >= METRICS_FRESH_S:
            names = list(ing.sites)
            got = await asyncio.gather(*(ing.sites[n].summary.remote() for n in names),
                                       *(paged(ing.sites[n].node_green) for n in names))
            sums, per_node = got[:len(names)], got[len(names):]
            ing.metrics.set_reservations({s["site"]: s["reservations"] for s in sums})
            ing.metrics.set_green({s["site"]: s["green"] for s in sums if s.get("green")})
            ing.metrics.set_node_green({n: dict(pairs) for n, pairs in
                                        zip(names, per_node, strict=True)})
            ing._site_gauges_at = time.monotonic()
    body, ctype = ing.metrics.render()
    return PlainTextResponse(body, media_type=ctype)


async def answer_placement(owner: Any, body: PlacementRequest | BatchPlacementRequest,
                           request: Request) -> Any:
    """Authorize, check a batch's pod ids, place: the placement routes of the cloud ingress
    and of the edge sites' own entries (``owner``: either)."""
    if (denied := owner.authorize(request)) is not None:
        return denied
    if isinstance(body, BatchPlacementRequest):
        pods = body.pods
        ids = [p.id for p in pods]
        if len(set(ids)) != len(ids):
            raise ValidationError("pods.id", "pod ids in a batch must be unique")
    else:
        pods = [body.pod]
    ttl_s = body.ttl_s if body.ttl_s is not None else float(owner.cfg.default_ttl_s)
    return await owner.place(pods, ttl_s, body.request_id, body.validate_,
                             request.state.principal)


@app_api.post("/v1/placements", response_model=PlacementResponse, dependencies=CLIENT_AUTH)
async def place_one(body: PlacementRequest, request: Request,
                    ing: Any = Depends(_ingress)) -> Any:
    return await answer_placement(ing, body, request)


@app_api.post("/v1/placements:batch", response_model=PlacementResponse,
              dependencies=CLIENT_AUTH)
async def place_batch(body: BatchPlacementRequest, request: Request,
                      ing: Any = Depends(_ingress)) -> Any:
    return await answer_placement(ing, body, request)


async def _reservation_op(ing: Any, request: Request, rid: str, op: str, event: str) -> Any:
    """Authorize, route the reservation to its site, run ``op`` there, count ``event``."""
    if (denied := ing.authorize(request)) is not None:
        return denied
    ing.trail.guard()
    site, local = ing.site_of(rid)
    who = request.state.principal
    out = await getattr(site, op).remote(local, who.tenant)  # a tenant: its own only
    tenants = out.pop("tenants", None)  # for the audit record, not the answer
    ing.metrics.reservation_event(event)
    ing.trail.reservation(who, event, out, tenants)
    return out


@app_api.post("/v1/reservations/{rid}:confirm", dependencies=CLIENT_AUTH)
async def confirm(rid: str, request: Request, ing: Any = Depends(_ingress)) -> Any:
    return await _reservation_op(ing, request, rid, "confirm", "confirmed")


@app_api.delete("/v1/reservations/{rid}", dependencies=CLIENT_AUTH)
async def release(rid: str, request: Request, ing: Any = Depends(_ingress)) -> Any:
    return await _reservation_op(ing, request, rid, "release", "released")


@app_api.get("/v1/clusters/{region}/summary", response_model=RegionSummary)
async def region_summary(region: str, ing: Any = Depends(_ingress)) -> Any:
    if region not in ing.h.regions:
        raise UnknownReferenceError("region", f"unknown region {region!r}")
    edges = [e for e in ing.h.edges if ing.h.parent[e] == region]
    got = await asyncio.gather(*(ing.sites[s].summary.remote() for s in [region, *edges]))
    return {**got[0], "edge_sites": got[1:]}


@app_api.put("/v1/nodes", dependencies=OPERATOR_AUTH)
async def put_nodes(body: NodesRequest, request: Request, ing: Any = Depends(_ingress)) -> Any:
    """Register nodes, change them (labels, taints, capacity) or report their usage
    (operator credential)."""
    if (denied := ing.authorize(request, OPERATOR)) is not None:
        return denied
    ing.trail.guard()
    await ing.learn_node_sites()
    per_site: dict[str, tuple[list, dict]] = {}
    first: dict[str, int] = {}
    for i, n in enumerate(body.nodes):
        if (j := first.setdefault(n.name, i)) != i:
            raise ValidationError(f"nodes.{i}.name", f"node {n.name!r} is also nodes.{j}: "
                                  "one update per node in a request")
        if n.site not in ing.sites:
            raise UnknownReferenceError(f"nodes.{i}.site", f"unknown site {n.site!r}")
        owner = ing.node_site.get(n.name)
        if owner is not None and owner != n.site:
            raise ValidationError(f"nodes.{i}.name", f"node {n.name!r} belongs to {owner}")
        if n.zone is not None and n.zone not in ing.site_zones[n.site]:
            raise UnknownReferenceError(f"nodes.{i}.zone",
                                        f"unknown zone {n.zone!r} in {n.site}")
        updates, usage = per_site.setdefault(n.site, ([], {}))
        updates.append((i, n.name, n.changes()))
        if n.usage is not None:
            usage[n.name] = (n.usage.cpu, n.usage.memory, n.usage.gpu)
    # New names are claimed for their site before the first await: a concurrent request
    # registering the same name at another site is then refused, not applied at both.
    claimed = ing.node_claims.claim([(n.name, n.site) for n in body.nodes])

    def keep_claims(site: str) -> None:  # a site that may have applied keeps its names
        ing.node_claims.settle([name for _, name, _ in per_site[site][0]])

    def applied(site: str) -> None:
        keep_claims(site)  # before the record: a trail that fails must not unclaim them
        updates, usage = per_site[site]
        ing.trail.node_updates(request.state.principal, site, updates, usage)

    try:
        if len(per_site) == 1:  # one site applies it whole or not at all
            ((site, (updates, usage)),) = per_site.items()
            try:
                out = [await ing.sites[site].apply_node_updates.remote(updates, usage)]
            except BaseException as e:
                # Refused by the site: nothing applied. Anything else (the replica died,
                # the request was cancelled) may have come after the site applied: its
                # new names stay claimed, as a failed commit's do across sites.
                if not isinstance(remote_cause(e), SmartSchedError):
                    keep_claims(site)
                raise
            applied(site)
        else:
            try:
                out = await _update_sites(ing, per_site, applied, keep_claims)
            except BaseException as e:  # (a refusal or a lost hold: nothing applied)
                if not isinstance(remote_cause(e), SmartSchedError):
                    for site in per_site:  # cancelled or broken mid-commit: may have
                        keep_claims(site)
                raise
    finally:
        ing.node_claims.release(claimed)  # names no site applied and nobody else claims
    return {"sites": out}


class NodeClaims:
    """Which site each node name belongs to, with the names claimed by node updates
    still in flight (registered at no site yet).

    A request claims the new names it registers before its first await, so a concurrent
    request naming one at another site is refused. Requests registering the same new name
    at the same site share the claim: one that is refused lets go of its share only, and
    the name is forgotten only when no request still claims it and no site applied it --
    a refused request must not un-claim a name a concurrent one registered meanwhile (the
    name could then be registered at a second site, and the node booked twice)."""

    def __init__(self, node_site: dict[str, str]) -> None:
        self.node_site = node_site  # name -> site: registered or claimed
        self._pending: dict[str, int] = {}  # name -> requests claiming it, none applied

    def claim(self, rows: list[tuple[str, str]]) -> list[str]:
        """Claim each new name (or share a pending claim of it at the same site); the
        names this request now holds a share of. The caller has checked the sites."""
        mine = []
        for name, site in rows:
            if name not in self.node_site:
                self.node_site[name] = site
                self._pending[name] = 1
                mine.append(name)
            elif name in self._pending and self.node_site[name] == site:
                self._pending[name] += 1
                mine.append(name)
        return mine

    def settle(self, names: list[str]) -> None:
        """A site applied (or may have applied) ``names``: they belong to it for good."""
        for name in names:
            self._pending.pop(name, None)

    def release(self, names: list[str]) -> None:
        """This request's shares of ``names`` end; a name nobody applied or claims is
        forgotten."""
        for name in names:
            left = self._pending.get(name)
            if left is None:
                continue  # applied: it stays
            if left > 1:
                self._pending[name] = left - 1
            else:
                del self._pending[name]
                self.node_site.pop(name, None)


def _half_applied(failed: list[tuple[str, BaseException]], committed: set[str],
                  unsure: Callable[[str], None]) -> Exception:
    """The answer when sites failed their commit after others applied theirs: which did
    and which may not have (a commit that raised may have applied before it failed, so
    the failed sites keep their new names, ``unsure``). A site's own refusal is said as
    it is; anything else (a replica that died, a disk) is not, since its message carries
    replica ids and paths; it goes to the log."""
    from smartsched.serving.site import NodeUpdateConflict

    why = []
    for s, got in failed:
        unsure(s)
        c = remote_cause(got)
        if isinstance(c, SmartSchedError):
            why.append(f"site {s}: {getattr(c, 'message', None) or c}")
        else:
            log.warning("node update: site %s failed its commit: %r", s, got)
            why.append(f"site {s} failed or restarted")
    field = getattr(remote_cause(failed[0][1]), "field", "nodes")
    return NodeUpdateConflict(
        field if isinstance(field, str) else "nodes",
        f"{'; '.join(why)} -- site(s) {', '.join(sorted(committed))} applied their part, "
        f"site(s) {', '.join(s for s, _ in failed)} may not have: send their rows again")


async def _update_sites(ing: Any, per_site: dict[str, tuple[list, dict]],
                        applied: Callable[[str], None],
                        unsure: Callable[[str], None]) -> list[dict[str, Any]]:
    """A node update spanning sites, all or nothing: every site checks its part and is
    held (``SiteTier.prepare_node_updates``: placements and node updates there wait), then
    every site is asked whether it still holds (``confirm_node_hold``, which renews the
    hold), then every site commits (``applied(site)`` for each). A refusal lets go of the
    sites held and is raised (the first in the request's order: its error names the
    request's row); no site has changed. A hold lost before the commits (a site slow to
    check its part let another's hold lapse, and a placement came) is a 503 to retry,
    with no site changed: committing the others would half-apply the update. One such
    update at a time, so two never wait on each other's held sites."""
    sites = list(per_site)
    token = uuid.uuid4().hex
    committed: set[str] = set()
    async with ing.node_updates_lock:
        try:
            prepared = await asyncio.gather(
                *(ing.sites[s].prepare_node_updates.remote(token, *per_site[s])
                  for s in sites), return_exceptions=True)
            for got in prepared:
                if isinstance(got, BaseException):
                    raise got
            held = await asyncio.gather(
                *(ing.sites[s].confirm_node_hold.remote(token) for s in sites),
                return_exceptions=True)
            lost = [s for s, ok in zip(sites, held, strict=True) if ok is not True]
            if lost:
                why = ("did not answer" if isinstance(held[sites.index(lost[0])], BaseException)
                       else "lapsed before it could commit (a site was slow to check its "
                       "part)")
                raise ServiceUnavailableError(f"the node update's hold on site {lost[0]} "
                                              f"{why}; no site applied it: retry")
            done = await asyncio.gather(
                *(ing.sites[s].commit_node_updates.remote(token, *per_site[s])
                  for s in sites), return_exceptions=True)
            for s, got in zip(sites, done, strict=True):
                if not isinstance(got, BaseException):
                    committed.add(s)
                    unsure(s)  # its names are its own now, whatever follows
            for s in sites:
                if s in committed:
                    applied(s)
            failed = [(s, got) for s, got in zip(sites, done, strict=True)
                      if isinstance(got, BaseException)]
            if failed and not committed:
                raise failed[0][1]  # a held commit cannot meet a conflict: a broken site
            if failed:
                raise _half_applied(failed, committed, unsure)
            return list(done)
        finally:  # the sites still held let go now (the others: a no-op)
            await asyncio.gather(*(ing.sites[s].abort_node_updates.remote(token)
                                   for s in sites if s not in committed),
                                 return_exceptions=True)


def _whole_number(v: Any) -> Any:
    """A query integer written as digits only, as the body's integers must be (``1.0`` and
    ``+1`` were read as 1)."""
    if isinstance(v, str) and not (v.isascii() and v.isdigit()):
        raise ValueError("must be a whole number written as digits")
    return v


DIGITS = BeforeValidator(_whole_number)


@app_api.get("/v1/admin/experience", dependencies=OPERATOR_AUTH)
async def experience(request: Request,
                     limit: Annotated[int, Query(ge=0, le=100_000), DIGITS] = 2000,
                     ing: Any = Depends(_ingress)) -> Any:
    """The pods the sites were recently asked to place (each site's last ``limit``, at most
    2 MiB of them a site: the newest that fit), oldest first per site: what continuous
    learning replays on the twin (operator credential). ``omitted`` names the sites whose
    window the 2 MiB cut, with how many of their last ``limit`` pods were left out."""
    if (denied := ing.authorize(request, OPERATOR)) is not None:
        return denied
    if not 0 <= limit <= 100_000:
        raise ValidationError("limit", "must be between 0 and 100000")
    names = list(ing.sites)
    got = await asyncio.gather(*(ing.sites[n].recent.remote(limit) for n in names))
    return {"sites": {n: r["pods"] for n, r in zip(names, got, strict=True)},
            "omitted": {n: r["omitted"] for n, r in zip(names, got, strict=True)
                        if r["omitted"]}}


@app_api.get("/v1/admin/sites/{site}/escalations", dependencies=OPERATOR_AUTH)
async def escalations(site: str, request: Request,
                      limit: Annotated[int, Query(ge=0, le=10_000), DIGITS] = 100,
                      ing: Any = Depends(_ingress)) -> Any:
    """An MEC site's autonomy state: whether it reaches its region, the escalations it
    queued while it did not, and the region's answers to the ones reconciled since
    (operator credential: the pods of every tenant are listed)."""
    if (denied := ing.authorize(request, OPERATOR)) is not None:
        return denied
    if site not in ing.h.edges:
        raise UnknownReferenceError("site", f"unknown edge site {site!r}")
    if not 0 <= limit <= 10_000:
        raise ValidationError("limit", "must be between 0 and 10000")
    return await ing.sites[site].escalations.remote(limit)


@app_api.put("/v1/admin/sites/{site}/profile", dependencies=OPERATOR_AUTH)
async def set_profile(site: str, body: ProfileUpdate, request: Request,
                      ing: Any = Depends(_ingress)) -> Any:
    """Live reload of a site's profile (or policy) by an operator; state and reservations
    stay. A policy or profile file is read only from the service's ``models_dir``."""
    if (denied := ing.authorize(request, OPERATOR)) is not None:
        return denied
    ing.trail.guard()
    if site not in ing.sites:
        raise UnknownReferenceError("site", f"unknown site {site!r}")
    # Loaded from the resolved path; shown (answers, metrics, summaries) as the operator
    # named it, so the server's directory layout is not published.
    try:
        path = resolve_reload_profile(body.profile, ing.cfg.models_dir)
        shown = await ing.sites[site].set_profile.remote(path, body.profile)
    except ValidationError as e:
        raise reload_refused(e, ing.cfg.models_dir) from None
    ing.trail.reload(request.state.principal, site, shown)
    return {"site": site, "profile": shown}


def reload_refused(e: ValidationError, models_dir: str | None) -> ValidationError:
    """A site's refusal of a reload as the request names it: under ``profile``, the body's
    one field (a loader names ``scheduler``, ``scheduler.<option>`` or a file's own field,
    given first in the message), and without the server's ``models_dir`` however the
    message spells it (a path with a colon, or one its ``repr`` escapes, got past the
    site's rewriting back to the operator's name)."""
    c = remote_cause(e)
    field, message = getattr(c, "field", "profile"), getattr(c, "message", "")
    if models_dir:
        roots = {str(Path(models_dir)), str(Path(models_dir).resolve())}
        for root in sorted(roots, key=len, reverse=True):
            for form in (root, repr(root)[1:-1]):
                field = field.replace(form + "/", "").replace(form, ".")
                message = message.replace(form + "/", "").replace(form, ".")
    if field not in ("profile", "scheduler"):
        message = f"{field}: {message}"
    # A 422 (a refusal of the operator's right stays one): the site and the route exist,
    # the body's value is what is wrong (an unknown scheduler or a missing policy was a
    # 404, as for a missing site).
    cls = PermissionDeniedError if isinstance(c, PermissionDeniedError) else ValidationError
    return cls("profile", message)


def scope_to_tenant(specs: list, tenant: str) -> list:
    """A tenant's pods: theirs by default; naming another tenant is refused (403)."""
    for i, spec in enumerate(specs):
        if spec.tenant not in ("default", tenant):
            raise PermissionDeniedError(f"pods.{i}.tenant", f"this token places pods of "
                                        f"tenant {tenant!r} only")
    # Gang ids are the tenant's own too: a gang moves whole (preemption, restarts),
    # and another tenant's gang of the same name must not move with it.
    return [spec.model_copy(update={"tenant": tenant, "gang_id": (
        f"{tenant}/{spec.gang_id}" if spec.gang_id else None)}) for spec in specs]


def request_pods(specs: list, who: Principal,
                 adapt: Callable[[Any, int], Any] | None = None) -> list:
    """A placement request's pods, stamped now: scoped to a tenant's token, each spec
    passed through ``adapt(spec, i)`` first (an entry's own rules), conversion errors named
    ``pods.<i>.<field>``, gangs whole."""
    now = time.time()
    if who.tenant is not None:
        specs = scope_to_tenant(specs, who.tenant)
    pods = []
    for i, spec in enumerate(specs):
        if adapt is not None:
            spec = adapt(spec, i)
        try:
            pods.append(spec.to_pod(now))
        except ValidationError as e:
            raise ValidationError(f"pods.{i}.{e.field}", e.message) from None
    check_gangs(pods)
    return pods


def check_gangs(pods: list) -> None:
    """A request's gangs are whole: every member sent, all naming the same size."""
    gangs: dict[str, list] = {}
    for p in pods:
        if p.gang_id:
            gangs.setdefault(p.gang_id, []).append(p)
    for gid, members in gangs.items():
        sizes = {m.gang_size for m in members}
        if len(sizes) > 1:
            raise ValidationError("pods.gang_size", f"gang {gid!r}: its members disagree "
                                  f"on gang_size ({sorted(sizes)})")
        if len(members) != members[0].gang_size:
            raise ValidationError("pods.gang_size", f"gang {gid!r} sends {len(members)} "
                                  f"members, gang_size says {members[0].gang_size}")
        # A gang is routed whole, by its first member: members that would go elsewhere
        # (another origin, class, latency bound or region list) cannot be placed as one.
        for attr, name in GANG_ALIKE:
            if len({_alike(getattr(m, attr)) for m in members}) > 1:
                raise ValidationError(f"pods.{name}", f"gang {gid!r}: its members disagree "
                                      f"on {name}; a gang is routed and placed as one")


# What a gang's members must share (attribute, request field).
GANG_ALIKE = (("pod_class", "class"), ("origin_site", "origin_site"),
              ("latency_slo_ms", "latency_slo_ms"), ("allowed_regions", "allowed_regions"),
              # one reservation of two tenants: neither tenant's token could release it,
              # and one tenant's rules placed the other's pod
              ("tenant", "tenant"))


def _alike(value: Any) -> Any:
    """A member's value as the comparison reads it (a region list in any order)."""
    return frozenset(value) if isinstance(value, tuple | list) else value


class Authorizer:
    """Bearer-token checks against ``self.creds`` (None: auth off), refusals recorded in
    ``self.trail``: the cloud ingress and the edge sites' own entries share them."""

    creds: Any
    trail: Trail

    def authorize(self, request: Request, role: str = CLIENT) -> JSONResponse | None:
        """None when the request carries a token good for ``role`` (the operator token is
        good for everything, the client token for CLIENT only); the refusal otherwise."""
        denied = self._authorize(request, role)
        if denied is not None:
            self.trail.refused(request.method, request.url.path, denied.status_code)
        return denied

    def _authorize(self, request: Request, role: str) -> JSONResponse | None:
        if self.creds is None:
            request.state.principal = ANONYMOUS
            return None
        given_headers = request.headers.getlist("authorization")
        if len(given_headers) > 1:  # which one counts would depend on who reads it
            return _error(400, "headers.authorization", "more than one Authorization header")
        header = given_headers[0] if given_headers else ""
        if not header:
            return JSONResponse({"detail": "missing bearer token"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        scheme, _, given = header.partition(" ")
        given = given.strip().encode("utf-8", "surrogateescape")
        ok_operator = self.creds.operator is not None and hmac.compare_digest(
            given, self.creds.operator.encode())
        bearer = scheme.lower() == "bearer"
        if bearer and ok_operator:
            request.state.principal = OPERATOR_PRINCIPAL
            return None
        if bearer and role == CLIENT:
            if hmac.compare_digest(given, self.creds.client.encode()):
                request.state.principal = CLIENT_PRINCIPAL
                return None
            for token, tenant in self.creds.tenants.items():  # a few tenants: constant time
                if hmac.compare_digest(given, token.encode()):
                    request.state.principal = tenant_principal(tenant)
                    return None
        if role == OPERATOR and self.creds.operator is None:
            return JSONResponse({"detail": "operator endpoints are off: this service has no "
                                           "operator token configured"}, status_code=403)
        return JSONResponse({"detail": "invalid token" if role == CLIENT
                             else "this endpoint needs the operator token"}, status_code=403)


@serve.deployment(num_replicas=1, max_ongoing_requests=2000)
@serve.ingress(app_api)
class Ingress(Authorizer):
    """HTTP: validation, auth, routing by reservation id, Prometheus metrics."""

    def __init__(self, args: dict[str, Any], regions: dict[str, Any],
                 edges: dict[str, Any]) -> None:
        from smartsched.serving.hierarchy import RankWeights
        from smartsched.serving.metrics import ServiceMetrics
        from smartsched.serving.tiers import CloudTier

        self.cfg = parse_service_config(args)
        self.creds = load_credentials(self.cfg.auth)
        self.trail = Trail(self.cfg.audit)
        self.h = service_hierarchy(self.cfg)
        if self.cfg.topology == "single_process":
            from smartsched.serving.app import in_process_sites  # this process's module

            regions, edges = in_process_sites(args, self.h)
        regions = {k: by_value(h) for k, h in regions.items()}
        edges = {k: by_value(h) for k, h in edges.items()}
        self.sites = {**regions, **edges}
        self._regions = regions
        self._free: dict[str, dict[str, float]] | None = None
        self._refresher: asyncio.Task | None = None

        def caller(handle: Any) -> Any:
            async def call(pods: list, ttl_s: float, rid: str | None,
                           validate: bool = False) -> list:
                return await handle.place.remote(pods, ttl_s, rid, validate)
            return call

        def dropper(handle: Any) -> Any:
            async def drop(gang: str) -> Any:
                return await handle.drop_gang_hold.remote(gang)
            return drop

        journal = None
        if self.cfg.journal_dir is not None:  # idempotent answers outlive this replica
            from pathlib import Path

            from smartsched.serving.journal import Journal

            journal = Journal(Path(self.cfg.journal_dir) / ANSWERS_JOURNAL)
        self.cloud = CloudTier(self.h, {k: caller(v) for k, v in regions.items()},
                               {k: caller(v) for k, v in edges.items()}, self._free_of,
                               RankWeights(**self.cfg.ranking.model_dump(
                                   exclude={"division"})),
                               drop_holds={k: dropper(v) for k, v in self.sites.items()},
                               journal=journal, division=self.cfg.ranking.division)
        self.metrics = ServiceMetrics()
        self.site_names = frozenset(s.name for s in self.h.spec.sites)
        zone_site = self.h.spec.zone_site()
        self.node_site = {n.name: zone_site[n.zone] for n in self.h.spec.nodes}
        self.node_claims = NodeClaims(self.node_site)
        self._node_sites_learned = False
        self.node_updates_lock = asyncio.Lock()  # node updates spanning sites: one at a time
        self.site_zones: dict[str, list[str]] = {}
        for z in self.h.spec.zones:
            self.site_zones.setdefault(z.site, []).append(z.name)
        from smartsched.serving.replica import set_current

        set_current(self)

    def __del__(self) -> None:  # Serve's graceful shutdown: seal and sign what is buffered
        trail = getattr(self, "trail", None)
        if trail is not None:
            trail.close()

    # ------------------------------------------------------------ helpers
    def site_of(self, rid: str) -> tuple[Any, str]:
        from smartsched.serving.site import RESERVATION_FIELD
        from smartsched.serving.tiers import RID_SEP

        site, sep, local = rid.rpartition(RID_SEP)
        if not sep or site not in self.sites:
            raise UnknownReferenceError(RESERVATION_FIELD, f"unknown reservation {rid!r}")
        return self.sites[site], local

    async def place(self, specs: list, ttl_s: float, rid: str | None,
                    validate: bool = False, who: Principal = ANONYMOUS) -> PlacementResponse:
        self.trail.guard()  # no decision without its record (service.audit.on_failure)
        pods = request_pods(specs, who)
        for i, pod in enumerate(pods):
            self._check_refs(pod, i)
        # Idempotency keys per tenant (per role for the shared tokens), so one tenant's
        # request id never answers another's, nor a client's the operator's.
        key = f"{idempotency_scope(who)}:{rid}" if rid else None
        results = await self.cloud.place(pods, ttl_s, key, validate, shown_id=rid)
        self.metrics.observe_placements(results)
        self.trail.placements(who, rid, results, {p.id: p.tenant for p in pods})
        return PlacementResponse(request_id=rid, placements=results)

    async def _fetch_free(self) -> dict[str, dict[str, float]]:
        names = list(self._regions)
        got = await asyncio.gather(*(self._regions[n].free.remote() for n in names))
        return dict(zip(names, got, strict=True))

    async def _refresh_free(self, every_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                self._free = await self._fetch_free()
            except Exception:  # a restarting region: keep the last figures
                continue

    async def _free_of(self) -> dict[str, dict[str, float]]:
        """Region headroom for ranking, refreshed in the background once a second
        (never on a request's path after the first)."""
        if self._free is None:
            self._free = await self._fetch_free()
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_free())
        return self._free

    async def learn_node_sites(self) -> None:
        """Once: which site holds each node registered through the API (the sites keep
        them in their journals; this replica may be newer than they are), so a name
        registered at one site is never registered again at another."""
        if self._node_sites_learned:
            return
        names = list(self.sites)
        got = await asyncio.gather(*(paged(self.sites[n].node_names) for n in names))
        for site, nodes in zip(names, got, strict=True):
            for node in nodes:
                self.node_site.setdefault(node, site)
        self._node_sites_learned = True

    def _check_refs(self, pod: Any, i: int) -> None:
        sites = self.site_names
        for r in pod.allowed_regions:  # region or MEC site names, as in the twin
            if r not in sites:
                raise UnknownReferenceError(f"pods.{i}.allowed_regions", f"unknown site {r!r}")
        if pod.origin_site is not None and pod.origin_site not in sites:
            raise UnknownReferenceError(f"pods.{i}.origin_site",
                                        f"unknown site {pod.origin_site!r}")

def checked_service(args: dict[str, Any], credentials: bool = True
                    ) -> tuple[ServiceConfig, Any]:
    """The service's settings and hierarchy, with everything a replica would otherwise find
    only once it starts checked here: the cluster and its sites, the tokens, the sandbox's
    profiles and every site's own profile (``profiles``, ``region_profile``,
    ``edge_profile``), each error naming its field. ``smartsched serve`` runs this before
    it starts Ray; ``build_app`` runs it before any replica."""
    from smartsched.scheduling.base import make_scheduler

    cfg = parse_service_config(args)
    h = service_hierarchy(cfg)
    if credentials:  # (``smartsched serve`` checks the rest before it writes token files)
        load_credentials(cfg.auth)  # fail here, before any replica starts, when no token
    if cfg.sandbox.mode != "off" or any(m != "off" for m in cfg.sandbox.sites.values()):
        from smartsched.scheduling.sandbox import Sandbox

        Sandbox(cfg.sandbox.settings, field="service.sandbox.settings")  # names bad profiles
    built: dict[str, str] = {}  # profile -> the first site that uses it (each built once)
    for name in [*h.regions, *h.edges]:
        tier = "region" if name in h.regions else "edge"
        profile = cfg.profile_of(name, tier)
        if profile in built:
            continue
        built[profile] = name
        field = (f"service.profiles.{name}" if name in cfg.profiles
                 else f"service.{tier}_profile")
        try:
            make_scheduler(profile)
        except ValidationError as e:
            raise ValidationError(field, f"{profile!r}: {e}") from None
    return cfg, h


def build_app(args: dict[str, Any]) -> Any:
    """The application for ``serve run serve_apps/placement.yaml`` (``args`` = ServiceConfig)."""
    cfg, h = checked_service(args)
    opts = {"ray_actor_options": {"num_cpus": cfg.replica_cpus}}
    # Profiles travel as user_config only: a changed profile (here or in the YAML's
    # deployments section) reaches the running replica through reconfigure, keeping
    # its state and reservations; the init args stay the same.
    plain = cfg.model_dump(exclude=set(PROFILE_FIELDS))

    def site(name: str, *parent: Any) -> Any:
        tier = "region" if name in h.regions else "edge"
        return SiteDeployment.options(
            name=name, user_config={"profile": cfg.profile_of(name, tier)}, **opts,
        ).bind(plain, name, *parent)

    if cfg.topology == "single_process":  # the ingress builds the sites, profiles included
        return Ingress.options(name="cloud", **opts).bind(cfg.model_dump(), {}, {})
    regions = {r: site(r) for r in h.regions}
    edges = {e: site(e, regions[h.parent[e]]) for e in h.edges}
    return Ingress.options(name="cloud", **opts).bind(plain, regions, edges)
