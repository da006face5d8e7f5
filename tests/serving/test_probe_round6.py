"""Round 6 of the placement service's probe, and what round 5 left open.

- ``Expect: 100-continue`` with a declared body over the limit: Serve's proxy streams a
  body to the replica as it reads it, and uvicorn answers the client's ``Expect`` as soon
  as the body is read, so the client was told "100 Continue", sent the whole body, and
  only then got the 413 the service decided from the headers. The proxy now answers such
  a request itself (``listen.DeclaredBodyLimit``, through Serve's proxy callback), before
  it reads a byte of the body.
"""

from __future__ import annotations

import json
import socket

import pytest

from tests.builders import asgi_call


async def _ok_app(scope: dict, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_the_proxy_middleware_answers_a_declared_body_over_the_limit() -> None:
    from smartsched.listen import DeclaredBodyLimit

    guard = DeclaredBodyLimit(_ok_app, limit=1000)
    start, body = asgi_call(guard, "POST", "/v1/placements",
                            headers=[(b"content-length", b"1001"), (b"expect", b"100-continue")])
    assert start["status"] == 413
    assert json.loads(body) == {"detail": [{"loc": ["body"],
                                            "msg": "body of 1001 bytes exceeds 1000"}]}
    assert (b"connection", b"close") in start["headers"]
    for length in (b"1000", b"0", b"", b"-5", b"1e9"):  # within, or not ours to judge
        start, body = asgi_call(guard, "POST", "/v1/placements",
                                headers=[(b"content-length", length)] if length else [])
        assert (start["status"], body) == (200, b"ok"), length


def test_the_proxy_hook_returns_the_middleware_only_with_a_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import copy

    import uvicorn.config

    import smartsched.listen as listen

    monkeypatch.setattr(uvicorn.config, "HTTP_PROTOCOLS",
                        copy.copy(uvicorn.config.HTTP_PROTOCOLS))
    monkeypatch.delenv(listen.PROXY_BODY_LIMIT_ENV, raising=False)
    assert listen.guard_serve_proxy() == []
    for bad in ("", "0", "-1", "4MB", "1.5", "\u0661\u0662"):  # not a whole number >= 1
        monkeypatch.setenv(listen.PROXY_BODY_LIMIT_ENV, bad)
        assert listen.guard_serve_proxy() == [], bad
    monkeypatch.setenv(listen.PROXY_BODY_LIMIT_ENV, "2048")
    (mw,) = listen.guard_serve_proxy()
    assert mw.cls is listen.DeclaredBodyLimit and mw.kwargs == {"limit": 2048}


def _head_answer(port: int, head: bytes) -> bytes:
    """The first bytes the server answers to ``head`` (no body is ever sent)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        return s.recv(65536)


@pytest.mark.slow
def test_expect_100_continue_over_the_limit_gets_413_not_100(service: str,
                                                            auth: dict) -> None:
    """Through the real Serve proxy: a declared body over the service's limit is answered
    413 at once (no "100 Continue", so the client never sends it); one within the limit is
    told to go on."""
    from tests.conftest import SERVICE_MAX_BODY_BYTES

    port = int(service.rsplit(":", 1)[1])
    token = auth["Authorization"].encode()
    head = (b"POST /v1/placements:batch HTTP/1.1\r\nHost: t\r\nAuthorization: " + token
            + b"\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n")
    over = _head_answer(port, head % (SERVICE_MAX_BODY_BYTES + 1))
    assert over.startswith(b"HTTP/1.1 413"), over[:200]
    assert b"exceeds" in over
    within = _head_answer(port, head % 100)
    assert within.startswith(b"HTTP/1.1 100"), within[:200]
