"""Round 5 of the placement service's probe: what round 4 found and left open.

- ``/docs`` and ``/redoc`` were served to anyone: FastAPI's pages load their scripts from
  a public CDN into the browser that holds the operator's token. They are off unless the
  config's ``api_docs`` asks for them; ``/openapi.json`` (what clients are generated from)
  is always served.
"""

from __future__ import annotations

import json

import pytest

from smartsched.model.errors import ValidationError
from smartsched.serving.config import parse_service_config
from tests.serving.test_probe_http_surface import FakeIngress, call_raw


def test_the_api_pages_are_off_by_default_and_the_document_is_served() -> None:
    ing = FakeIngress()
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        status, _, body = call_raw(ing, "GET", path)
        assert status == 404, path
        assert b"cdn" not in body
    status, _, body = call_raw(ing, "GET", "/openapi.json")
    assert status == 200 and "/v1/placements" in json.loads(body)["paths"]
    assert "/docs" not in json.loads(body)["paths"]  # the pages are not API routes


def test_the_api_pages_when_the_config_asks_for_them() -> None:
    ing = FakeIngress()
    ing.cfg.api_docs = True
    status, headers, body = call_raw(ing, "GET", "/docs")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b"/openapi.json" in body
    status, _, body = call_raw(ing, "GET", "/redoc")
    assert status == 200 and b"/openapi.json" in body


def test_the_setting_is_a_boolean() -> None:
    assert parse_service_config({}).api_docs is False
    assert parse_service_config({"api_docs": True}).api_docs is True
    with pytest.raises(ValidationError) as e:
        parse_service_config({"api_docs": "sometimes"})
    assert e.value.field == "service.api_docs"


def _talk(port: int, data: bytes, wait: float) -> tuple[bytes, float]:
    """All the server sends back to ``data`` until it closes the connection (b"" when it
    sent nothing), with ``b"<still open>"`` appended when it had not closed it within
    ``wait`` s; and how long that took."""
    import socket
    import time

    t0 = time.monotonic()
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(data)
        while True:
            left = wait - (time.monotonic() - t0)
            try:
                s.settimeout(max(left, 0.01))
                chunk = s.recv(65536)
            except TimeoutError:
                return got + b"<still open>", time.monotonic() - t0
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return got, time.monotonic() - t0
            got += chunk


def test_a_uvicorn_server_after_the_proxy_hook_bounds_request_heads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Serve's proxy runs its own uvicorn (httptools, no protocol option): the hook Ray
    calls in the proxy's process (``listen.guard_serve_proxy``) makes uvicorn's protocols
    the guarded ones. Here a uvicorn server started after the hook, with the defaults
    Serve's proxy uses: a silent connection is closed at the head deadline, a 100 KiB
    header line is cut off, a normal request is answered, and a kept-alive connection
    idle past the head deadline (within keep-alive) still serves its next request."""
    import asyncio
    import copy
    import socket
    import threading

    import uvicorn
    import uvicorn.config

    import smartsched.listen as listen
    from tests.serving.test_probe_round4 import ok_app_on_a_socket

    monkeypatch.setattr(uvicorn.config, "HTTP_PROTOCOLS",
                        copy.copy(uvicorn.config.HTTP_PROTOCOLS))
    monkeypatch.setattr(listen, "HEAD_TIMEOUT_S", 0.5)
    assert listen.guard_serve_proxy() == []
    app, sock = ok_app_on_a_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_keep_alive=5))
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=lambda: loop.run_until_complete(server.serve([sock])),
                         daemon=True)
    t.start()
    try:
        while not server.started:
            threading.Event().wait(0.01)
        silent, took = _talk(port, b"GET /ok HTTP/1.1\r\n", 5)
        assert silent == b"" and took < 3, (silent[:80], took)
        big, _ = _talk(port, b"GET /ok HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 100_000, 5)
        assert big == b"" or big.startswith(b"HTTP/1.1 4"), big[:80]
        fine, _ = _talk(port, b"GET /ok HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 5)
        assert fine.startswith(b"HTTP/1.1 200") and b'{"ok":true}' in fine
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            for _ in range(2):  # the second after an idle second (head deadline 0.5 s)
                s.sendall(b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n")
                answer = b""
                while b'{"ok":true}' not in answer:
                    chunk = s.recv(65536)
                    assert chunk, answer  # closed before its answer
                    answer += chunk
                assert answer.startswith(b"HTTP/1.1 200")
                threading.Event().wait(1.0)
        protocol = uvicorn.config.HTTP_PROTOCOLS["auto"]
        assert protocol.endswith(":GuardedHttpToolsProtocol"), protocol
    finally:
        server.should_exit = True
        t.join(10)


@pytest.mark.slow
def test_the_services_serve_proxy_closes_a_connection_that_sends_no_whole_head(
        service: str) -> None:
    """Before: Serve's proxy held a connection whose request head never finished for ever
    (it answered nothing and closed nothing). The session's Ray starts with the proxy hook
    as `smartsched serve`'s embedded Ray does."""
    from smartsched.listen import HEAD_TIMEOUT_S

    port = int(service.rsplit(":", 1)[1])
    got, took = _talk(port, b"GET /healthz HTTP/1.1\r\nHost: t\r\n", HEAD_TIMEOUT_S + 15)
    assert got == b"", got[:80]
    assert took < HEAD_TIMEOUT_S + 10
    ok, _ = _talk(port, b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 10)
    assert ok.startswith(b"HTTP/1.1 200")
