"""The metrics server of ``telemetry serve`` and the scheduler's ``--metrics-port``
(probe round 4: prometheus_client's own answered the metrics on every path, HEAD with a
405, echoed the request line in its error page, named the Python version, and kept a
thread for every client that stopped sending)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from smartsched.prometheus import http


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(http._Handler, "timeout", 1.0)
    reg = CollectorRegistry()
    Counter("probe_total", "a counter", registry=reg).inc()
    s = http.serve_registry(reg, 0)
    yield s
    s.shutdown()
    s.server_close()


def _raw(port: int, data: bytes, wait: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as k:
        k.settimeout(wait)
        k.sendall(data)
        out = b""
        try:
            while chunk := k.recv(4096):
                out += chunk
        except TimeoutError:
            return out + b"<still open>"
        return out


def test_metrics_only_at_metrics_and_head_as_get(server: Any) -> None:
    port = server.server_port
    got = _raw(port, b"GET /metrics HTTP/1.0\r\n\r\n")
    assert got.startswith(b"HTTP/1.0 200") and b"probe_total 1.0" in got
    assert b"Server: smartsched\r\n" in got and b"CPython" not in got
    head = _raw(port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
    length = next(line for line in got.split(b"\r\n") if line.startswith(b"Content-Length"))
    assert head.startswith(b"HTTP/1.0 200") and length in head and b"probe_total" not in head
    for path in (b"/../../etc/passwd", b"/anything", b"*"):
        bad = _raw(port, b"GET " + path + b" HTTP/1.0\r\n\r\n")
        assert bad.startswith(b"HTTP/1.0 404") and b"probe_total" not in bad, bad[:80]
    assert _raw(port, b"POST /metrics HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 405")


def test_errors_echo_nothing_and_a_silent_client_is_dropped(server: Any) -> None:
    port = server.server_port
    for line in (b"GARBAGE <script>alert(1)</script> HTTP/1.1", b"garbage <script>"):
        bad = _raw(port, line + b"\r\n\r\n")
        assert bad[:16].split(b" ")[1][:3] in (b"400", b"404", b"405") or \
            bad.startswith(b"400"), bad[:80]
        assert b"script" not in bad and b"arbage" not in bad, bad
    t0 = time.monotonic()
    assert _raw(port, b"GET /metr") == b""  # closed by the server, not held open
    assert time.monotonic() - t0 < 4


def test_a_dripping_head_is_cut_and_connections_are_capped(monkeypatch) -> None:
    """One byte every few seconds kept each read under the idle timeout and a server thread
    for ever, and every such client got one more (probe round 8)."""
    monkeypatch.setattr(http._Handler, "timeout", 1.0)
    monkeypatch.setattr(http, "HEAD_TIMEOUT_S", 1.5)
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 4)
    reg = CollectorRegistry()
    Counter("probe_total", "a counter", registry=reg).inc()
    s = http.serve_registry(reg, 0)
    try:
        port = s.server_port
        with socket.create_connection(("127.0.0.1", port)) as k:
            t0 = time.monotonic()
            closed = False
            for ch in b"GET /metrics HTTP/1.1\r\nHost: x\r\n":
                try:
                    k.sendall(bytes([ch]))
                except OSError:
                    closed = True
                    break
                time.sleep(0.5)
                k.settimeout(0.01)
                try:
                    if k.recv(1) == b"":
                        closed = True
                        break
                except TimeoutError:
                    pass
            assert closed and time.monotonic() - t0 < 4
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        time.sleep(0.2)
        assert _raw(port, b"GET /metrics HTTP/1.0\r\n\r\n", wait=2.0) == b""  # no place
        for k in held:
            k.close()
        time.sleep(0.3)
        assert b"probe_total" in _raw(port, b"GET /metrics HTTP/1.0\r\n\r\n")
    finally:
        s.shutdown()
        s.server_close()
