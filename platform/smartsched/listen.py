"""Where a service may listen: a host checked before anything starts.

Owns the one check every listening command (``serve``, ``k8s extender``, ``telemetry
serve``) and the service's config file (``http_options.host``) apply to a host: it is
not empty (the socket layer reads ``''`` as every interface, so a service meant for
loopback was reachable from the network), it resolves, and this machine can bind it.
Without it uvicorn and Serve exited with the resolver's or the socket's bare errno, the
extender with status 0.
"""

from __future__ import annotations

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


# What one of our own HTTP servers (the MEC edge entry, the scheduler extender) allows a
# client before it answers: a request head of at most 64 KiB (h11's limit; uvicorn's
# default httptools parser kept growing one unfinished header line, hundreds of MiB for
# four clients), the whole head within 15 s of the connection (or of the last answer on
# it), and 2,048 connections and requests at once, beyond which new ones get a 503.
MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT_S = 15.0
MAX_CONCURRENCY = 2048


def guarded_h11() -> type:
    """uvicorn's h11 protocol with a deadline for each request's head: a connection that
    has not sent a whole request head ``HEAD_TIMEOUT_S`` after it opened, or after its last
    answer, is closed. (uvicorn has no such timeout: a client sending a header a byte at a
    time -- or nothing -- held its connection for ever, and 1,500 of them held 1,500 open
    files.) A request whose head arrived is left to the body's own limits."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11(H11Protocol):  # type: ignore[misc]
        _head_timer: Any = None
        _head_cycle: Any = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._head_cycle = self.cycle  # a new request head makes a new cycle
            self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _expired(self) -> None:
            self._head_timer = None
            if self.cycle is self._head_cycle and not self.transport.is_closing():
                self.transport.close()  # no request head in time

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._head_timer is not None and self.cycle is not self._head_cycle:
                self._disarm()  # a request's head arrived

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():
                self._arm()  # before a pipelined request may start the next cycle
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedH11


def guarded_server_config(app: Any, **kw: Any) -> Any:
    """A ``uvicorn.Config`` for ``app`` with the limits above (``kw``: the caller's own
    settings: host, port, log level, ...)."""
    import uvicorn

    return uvicorn.Config(app, http=guarded_h11(), h11_max_incomplete_event_size=MAX_HEAD_BYTES,
                          limit_concurrency=MAX_CONCURRENCY, **kw)
