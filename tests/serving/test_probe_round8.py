"""Round 8 of the service's probe, and what round 7 left: our servers' answer at their cap.

- At its connection and request cap, uvicorn answered the edge entry's and the extender's
  clients with a bare text/plain "Service Unavailable", no Retry-After: not the service's
  JSON error shape, and nothing to time a retry by.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from tests.serving.test_probe_round7 import _capped_app, _started


def test_at_the_cap_of_requests_in_flight_the_answer_is_json_with_retry_after(
        monkeypatch) -> None:
    app, sock, port, release = _capped_app(monkeypatch)

    async def scenario() -> bytes:
        server, task = await _started(app, sock)
        busy = []
        for _ in range(24):  # every place holds a request in flight: none is idle
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
            await w.drain()
            busy.append((r, w))
        await asyncio.sleep(0.2)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\n")
        await w.drain()
        got = await asyncio.wait_for(r.read(), 10)  # the answer closes the connection
        w.close()
        release.set()
        for br, bw in busy:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(br.readuntil(b"}"), 10)
            bw.close()
        server.should_exit = True
        await task
        return got

    got = asyncio.run(scenario())
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), got[:200]
    headers = {k.strip().lower(): v.strip() for k, _, v in
               (line.partition(b":") for line in head.split(b"\r\n")[1:])}
    assert headers[b"retry-after"] == b"1"
    assert headers[b"content-type"] == b"application/json"
    doc: Any = json.loads(body)
    assert doc["detail"][0]["loc"] == ["service"]
    assert "over capacity" in doc["detail"][0]["msg"]


def test_the_operator_and_the_clients_keep_their_own_request_ids(service: str, auth: dict,
                                                                 operator: dict) -> None:
    """The client and operator tokens shared one request-id space: the operator sending a
    client's id got the client's booking back (and the audit log filed that placement
    under the operator), or a 409 with another body (probe round 7)."""
    import uuid

    import requests

    rid = f"shared-{uuid.uuid4().hex[:8]}"
    pod = {"id": f"r8-{uuid.uuid4().hex[:8]}", "cpu_milli": 100, "memory_mib": 64}
    body = {"request_id": rid, "pod": pod, "ttl_s": 30}
    first = requests.post(f"{service}/v1/placements", json=body, headers=auth, timeout=30)
    again = requests.post(f"{service}/v1/placements", json=body, headers=auth, timeout=30)
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    booked = first.json()["placements"][0]["reservation_id"]
    assert booked and again.json()["placements"][0]["reservation_id"] == booked
    other = {**body, "pod": {**pod, "id": pod["id"] + "-op"}}
    op = requests.post(f"{service}/v1/placements", json=other, headers=operator, timeout=30)
    assert op.status_code == 200, op.text
    assert op.json()["placements"][0]["reservation_id"] not in (None, booked)
    for rid_ in (booked, op.json()["placements"][0]["reservation_id"]):
        requests.delete(f"{service}/v1/reservations/{rid_}", headers=operator, timeout=30)


def test_each_shared_role_has_its_own_scope_and_the_clients_keep_theirs() -> None:
    from smartsched.serving.audit_trail import (
        ANONYMOUS,
        CLIENT_PRINCIPAL,
        OPERATOR_PRINCIPAL,
        idempotency_scope,
        tenant_principal,
    )

    # the client token and auth switched off keep the keys they had before (a retry across
    # an upgrade finds its answer); '*' starts no tenant name (a-z, 0-9, '-')
    assert idempotency_scope(CLIENT_PRINCIPAL) == idempotency_scope(ANONYMOUS) == "*"
    assert idempotency_scope(OPERATOR_PRINCIPAL) == "*operator"
    assert idempotency_scope(tenant_principal("bank")) == "bank"
