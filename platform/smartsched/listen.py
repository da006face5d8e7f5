"""Where a service may listen: a host checked before anything starts.

Owns the one check every listening command (``serve``, ``k8s extender``, ``telemetry
serve``) and the service's config file (``http_options.host``) apply to a host: it is
not empty (the socket layer reads ``''`` as every interface, so a service meant for
loopback was reachable from the network), it resolves, and this machine can bind it.
Without it uvicorn and Serve exited with the resolver's or the socket's bare errno, the
extender with status 0. Also what a client may do before its request is answered: the
guarded uvicorn protocols (a deadline and a size cap for each request head) of our own
servers and of Ray Serve's proxy.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from typing import Any

from smartsched.model.errors import ValidationError


def check_listen_host(value: object, field: str) -> str:
    """``value`` if a service can listen there, else a ValidationError naming ``field``.
    Binds a throw-away socket to port 0 of the host's first address (nothing listens;
    the port is the kernel's pick), so an address of another machine is refused too."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(field, "is empty (give a host name or address; 0.0.0.0 "
                              "listens on every interface)")
    shown = repr(value[:200])
    if value.startswith("[") and value.endswith("]"):
        raise ValidationError(field, f"{shown}: give an IPv6 address without brackets")
    try:
        infos = socket.getaddrinfo(value, None, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except UnicodeError:
        raise ValidationError(field, f"{shown} is not a valid host name") from None
    except socket.gaierror as e:
        if e.errno == socket.EAI_AGAIN:
            raise ValidationError(field, f"{shown} could not be resolved now (temporary "
                                  "name-resolution failure; give an address)") from None
        raise ValidationError(field, f"{shown} does not resolve to an address "
                              f"({e.strerror})") from None
    except OSError as e:
        raise ValidationError(field, f"{shown} does not resolve to an address "
                              f"({e.strerror or e})") from None
    family, _, _, _, addr = infos[0]
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((addr[0], 0, *addr[2:]))
    except OSError as e:
        raise ValidationError(field, f"{shown} is not an address this machine can listen "
                              f"on ({e.strerror or e})") from None
    return value


# What one of our HTTP servers (the MEC edge entry, the scheduler extender, and Serve's
# proxy through ``guard_serve_proxy``) allows a client before it answers: a request head
# of at most 64 KiB (h11's limit; uvicorn's default httptools parser kept growing one
# unfinished header line, hundreds of MiB for four clients), the whole head within 15 s of
# the connection (or of the last answer on it, or the keep-alive time if longer), and (our
# own servers) 2,048 connections and requests at once, beyond which new ones get a 503.
MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT_S = 15.0
MAX_CONCURRENCY = 2048
# At the connection cap, a new connection closes idle ones (waiting for a request head)
# until this many places are free: an idle socket costs its client nothing to re-open, so
# 2,048 of them re-opened every 15 s kept our servers answering 503 to everyone else.
IDLE_EVICTION_ROOM = 16


def _guarded(base: type) -> type:
    """``base`` (uvicorn's h11 or httptools protocol) with a deadline and a size cap for
    each request's head: a connection that has not sent a whole request head
    ``HEAD_TIMEOUT_S`` after it opened (or, after an answer, the keep-alive time if that is
    longer) is closed, and so is one whose unfinished head passes ``MAX_HEAD_BYTES``.
    (uvicorn has no such timeout: a client sending a header a byte at a time -- or
    nothing -- held its connection for ever, and 1,500 of them held 1,500 open files;
    its httptools parser kept growing one unfinished header line.) A request whose head
    arrived is left to the body's own limits.

    Where the server caps its connections (``limit_concurrency``: our own servers, not
    Serve's proxy), a connection that brings the count to the cap closes idle ones first
    (``_make_room``): the ones that never sent a request, oldest first, then kept-alive
    ones between requests, oldest first; never one with a request in flight."""

    class Guarded(base):  # type: ignore[misc, valid-type]
        _head_timer: Any = None
        _head_cycle: Any = None
        _head_bytes = 0
        _armed_at = 0.0
        _answered = 0  # requests whose head arrived on this connection

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm(HEAD_TIMEOUT_S)
            self._make_room()

        def _make_room(self) -> None:
            cap = getattr(self, "limit_concurrency", None)
            conns = getattr(self, "connections", None)
            if cap is None or conns is None or len(conns) < cap:
                return
            idle = sorted((c for c in conns if c is not self
                           and getattr(c, "_head_timer", None) is not None
                           and c._waiting() and not c.transport.is_closing()),
                          key=lambda c: (c._answered > 0, c._armed_at))
            for c in idle[:len(conns) - max(cap - IDLE_EVICTION_ROOM, 1)]:
                c._disarm()
                c.transport.close()
                conns.discard(c)  # its place is free now, not when the loop gets to it

        def _arm(self, delay: float) -> None:
            self._disarm()
            self._head_cycle = self.cycle  # a new request head makes a new cycle
            self._head_bytes = 0
            self._armed_at = self.loop.time()
            self._head_timer = self.loop.call_later(delay, self._expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _expired(self) -> None:
            self._head_timer = None
            # Not once the connection was upgraded (a WebSocket's protocol owns the
            # transport now, and no new cycle ever comes).
            owner = getattr(self.transport, "get_protocol", lambda: self)()
            if (self.cycle is self._head_cycle and owner is self
                    and not self.transport.is_closing()):
                self.transport.close()  # no request head in time

        def data_received(self, data: bytes) -> None:
            if self._head_timer is not None:
                self._head_bytes += len(data)
            super().data_received(data)
            if self._head_timer is None:
                return
            if self.cycle is not self._head_cycle:
                self._disarm()  # a request's head arrived
                self._answered += 1
            elif self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self._disarm()
                self.transport.close()  # a head larger than any we answer

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # Armed for the next head only when no request is in flight once uvicorn has
            # moved on: it starts a pipelined request it had read already in the call
            # above (h11: the next cycle; httptools: its pipeline), and that request --
            # being answered -- must not count as waiting for its head (armed before,
            # such a connection read as idle and was closed at the connection cap).
            if self._waiting() and not self.transport.is_closing():
                keep_alive = float(getattr(self, "timeout_keep_alive", 0) or 0)
                self._arm(max(HEAD_TIMEOUT_S, keep_alive))

        def _waiting(self) -> bool:
            """No request in flight on this connection (its last one, if any, answered)."""
            return self.cycle is None or getattr(self.cycle, "response_complete", True)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def guarded_h11() -> type:
    """uvicorn's h11 protocol with the head deadline and size cap (``_guarded``)."""
    return _protocol("GuardedH11Protocol")


_PROTOCOLS: dict[str, type] = {}


def _protocol(name: str) -> type:
    """The guarded protocol class ``name`` (made once; uvicorn imported only here)."""
    if name not in _PROTOCOLS:
        if name == "GuardedH11Protocol":
            from uvicorn.protocols.http import h11_impl
            from uvicorn.protocols.http.h11_impl import H11Protocol as base

            # At its cap uvicorn answers with this module-level app, named in h11_impl's
            # globals: a bare text/plain "Service Unavailable" without Retry-After, which
            # our clients could neither read nor time. Only our own servers (the edge
            # entry, the extender) speak h11 in their processes; Serve's proxy runs
            # httptools, in its own process, without a cap.
            if hasattr(h11_impl, "service_unavailable"):
                h11_impl.service_unavailable = over_capacity
        elif name == "GuardedHttpToolsProtocol":
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
        else:
            raise AttributeError(name)
        _PROTOCOLS[name] = _guarded(base)
    return _PROTOCOLS[name]


def __getattr__(name: str) -> Any:
    """The guarded protocols as module attributes, for uvicorn's import strings
    (``smartsched.listen:GuardedHttpToolsProtocol``, see ``guard_serve_proxy``)."""
    if name in ("GuardedH11Protocol", "GuardedHttpToolsProtocol"):
        return _protocol(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Ray Serve's HTTP proxy runs its own uvicorn, which takes no protocol class: this hook,
# named by Ray's RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH, is called in the proxy's
# process before its server starts. The embedded Ray sets it (ray_local); on a cluster of
# your own, set it in the environment of ``ray start``.
SERVE_PROXY_CALLBACK = "smartsched.listen:guard_serve_proxy"


# The service's body limit, for Serve's proxy (set by ``smartsched serve`` before it starts
# the embedded Ray, whose processes inherit it; on a cluster of your own, set it in the
# environment of ``ray start`` beside the callback variable).
PROXY_BODY_LIMIT_ENV = "SMARTSCHED_PROXY_MAX_BODY_BYTES"


async def send_json(send: Any, status: int, doc: Any,
                    headers: tuple[tuple[bytes, bytes], ...] = ((b"connection", b"close"),)
                    ) -> None:
    """Answer ``doc`` as JSON with ``status`` straight through an ASGI ``send`` (the
    middlewares here answer before any app, FastAPI's included, is reached)."""
    body = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


# How long a client turned away at the cap is asked to wait (idle connections are closed
# for new ones at once, so a place frees as soon as one request in flight is answered).
OVER_CAPACITY_RETRY_S = 1


async def over_capacity(scope: dict, receive: Any, send: Any) -> None:
    """The answer at our servers' cap on connections and requests in flight: the
    service's JSON error shape with Retry-After, as the ingress's 429 has."""
    await send_json(send, 503, {"detail": [{"loc": ["service"], "msg": (
        f"over capacity: {MAX_CONCURRENCY} connections or requests at once; retry in "
        f"{OVER_CAPACITY_RETRY_S} s"), "type": "over_capacity"}]},
        ((b"retry-after", str(OVER_CAPACITY_RETRY_S).encode()), (b"connection", b"close")))


class DeclaredBodyLimit:
    """ASGI middleware for Serve's proxy: a request whose Content-Length is over ``limit``
    gets the service's 413 at once, its body unread. The service checks the same limit, but
    in its replica, after the proxy has begun to stream the body there -- and uvicorn
    answers a client's ``Expect: 100-continue`` as soon as the body is read, so such a
    client was told to go on and sent the whole body before its 413."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            declared = dict(scope.get("headers") or []).get(b"content-length", b"")
            if declared.isdigit() and int(declared) > self.limit:
                return await send_json(send, 413, {"detail": [{"loc": ["body"], "msg": (
                    f"body of {int(declared)} bytes exceeds {self.limit}")}]})
        await self.app(scope, receive, send)


class AnswerWhenSilent:
    """ASGI middleware for Serve's proxy: a request the proxy leaves unanswered gets a 503
    with Retry-After. When the replica it called dies mid-request (a crash, a kill, a node
    lost), Serve's proxy sends nothing -- it answers only its own 408, 429 and 503 -- and
    uvicorn then sent a bare 500, which clients do not retry: a release sent at that
    moment was reported lost although it may have been applied. Answers already begun are
    left alone, and so is anything but HTTP."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watched(message: dict) -> None:
            nonlocal started
            if message.get("type") == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception:
            if started:
                raise
            logging.getLogger(__name__).warning("Serve's proxy failed before it answered",
                                                exc_info=True)
        if not started:
            await send_json(send, 503, {"detail": [{"loc": ["service"], "msg": (
                "the service stopped before it answered: retry (a request without a "
                "request_id may or may not have been applied)")}]},
                ((b"retry-after", b"5"),))


def utf16_or_32(body: bytes) -> bool:
    """Whether ``body`` is JSON in UTF-16 or UTF-32 (a byte-order mark, or a NUL among its
    first four bytes, which UTF-8 JSON never has): Python's JSON reader takes them, but
    JSON between systems is UTF-8 (RFC 8259 8.1), and a proxy, an audit tap or a WAF in
    front would read another body than the service did."""
    head = body[:4]
    return head.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in head


class StrictFraming:
    """ASGI middleware for our own servers (the service's app, the MEC edge entry, the
    scheduler extender): a request whose framing two readers could read differently is
    refused before any of its body is read. Transfer-Encoding together with Content-Length
    (uvicorn's h11 read the body as chunked and kept the connection: a request-smuggling
    vector behind a proxy that trusts Content-Length; RFC 9112 6.1) and a transfer coding
    other than chunked (``gzip, chunked`` was read as plain bytes) are a 400 that closes
    the connection; an expectation other than ``100-continue`` is a 417 (RFC 9110 10.1.1).
    ``extender``: answers in the extender protocol's shape (``{"Error": ...}``), else the
    service's (``{"detail": [{"loc", "msg"}]}``)."""

    def __init__(self, app: Any, extender: bool = False) -> None:
        self.app = app
        self.extender = extender

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            raw = scope.get("headers") or []
            codings = [c.strip().lower() for k, v in raw if k == b"transfer-encoding"
                       for c in v.split(b",")]
            expects = [v.strip().lower() for k, v in raw if k == b"expect"]
            problem = None
            if codings and any(k == b"content-length" for k, _ in raw):
                problem = (400, "headers.transfer-encoding", "Transfer-Encoding and "
                           "Content-Length together: send one of them")
            elif codings and codings != [b"chunked"]:
                problem = (400, "headers.transfer-encoding", "only the chunked transfer "
                           "coding is read: send the body chunked or with Content-Length")
            elif any(e != b"100-continue" for e in expects):
                problem = (417, "headers.expect", "only Expect: 100-continue is met")
            if problem is not None:
                status, field, msg = problem
                return await send_json(send, status, (
                    {"Error": f"{field}: {msg}"} if self.extender else
                    {"detail": [{"loc": field.split("."), "msg": msg}]}))
        await self.app(scope, receive, send)


def proxy_body_limit() -> int | None:
    """The limit ``PROXY_BODY_LIMIT_ENV`` sets (None: unset, or not a whole number >= 1)."""
    raw = os.environ.get(PROXY_BODY_LIMIT_ENV, "")
    return int(raw) if raw.isascii() and raw.isdigit() and int(raw) >= 1 else None


def guard_serve_proxy() -> list[Any]:
    """Make every uvicorn server this process starts from here on use the guarded
    protocols (the head deadline and size cap): Serve's proxy held a connection that never
    finished its request head for ever. Returns the proxy's middlewares (the hook's other
    use): ``AnswerWhenSilent``, and ``DeclaredBodyLimit`` where ``PROXY_BODY_LIMIT_ENV``
    gives the limit."""
    import importlib.util

    import uvicorn.config

    tools = importlib.util.find_spec("httptools") is not None
    uvicorn.config.HTTP_PROTOCOLS.update({
        # "auto" is httptools where it is installed, as uvicorn's own auto is.
        "auto": f"{__name__}:Guarded{'HttpTools' if tools else 'H11'}Protocol",
        "h11": f"{__name__}:GuardedH11Protocol",
        "httptools": f"{__name__}:GuardedHttpToolsProtocol"})
    from starlette.middleware import Middleware

    limit = proxy_body_limit()
    return [Middleware(AnswerWhenSilent)] + (
        [] if limit is None else [Middleware(DeclaredBodyLimit, limit=limit)])


def guarded_server_config(app: Any, **kw: Any) -> Any:
    """A ``uvicorn.Config`` for ``app`` with the limits above (``kw``: the caller's own
    settings: host, port, log level, ...)."""
    import uvicorn

    return uvicorn.Config(app, http=guarded_h11(), h11_max_incomplete_event_size=MAX_HEAD_BYTES,
                          limit_concurrency=MAX_CONCURRENCY, **kw)
