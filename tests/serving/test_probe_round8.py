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

import pytest

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


def test_per_node_lists_cross_the_site_hop_in_pages() -> None:
    """A site of 20,000 nodes with 253-character names (~5 MB of names) passed the hop's
    4 MiB: /metrics answered 503 for good, and after an ingress restart every node update
    a 413 'send fewer pods' (probe round 8). Each call now carries a page."""
    from types import SimpleNamespace

    from smartsched.serving.app import NODE_PAGE, SiteDeployment, paged

    names = [f"{i:05d}-" + "n" * 247 for i in range(2 * NODE_PAGE + 17)]
    state = SimpleNamespace(names=names)
    tier = SimpleNamespace(placer=SimpleNamespace(state=state),
                           node_green=lambda: {n: 0.5 for n in names})
    site = SiteDeployment.func_or_class.__new__(SiteDeployment.func_or_class)
    site.tier = tier
    sizes: list[int] = []

    def remote_of(fn: Any) -> Any:
        async def remote(start: int, count: int) -> Any:
            page = await fn(site, start, count)
            sizes.append(len(json.dumps(page)))
            return page
        return SimpleNamespace(remote=remote)

    cls = SiteDeployment.func_or_class
    got_names = asyncio.run(paged(remote_of(cls.node_names)))
    got_green = asyncio.run(paged(remote_of(cls.node_green)))
    assert got_names == names and dict(got_green) == {n: 0.5 for n in names}
    assert max(sizes) < 2 * 1024 * 1024, max(sizes)  # well under the hop's 4 MiB


def test_a_live_lookahead_reload_is_held_to_a_decisions_worth_of_rollouts(tmp_path) -> None:
    """``lookahead:k8s-default?k=64&horizon=100&samples=100`` (within the scheduler's own
    bounds) was accepted live; its ninth placement held the region ~2 minutes, Serve's
    health check restarted it into the same journaled profile: a crash loop (probe
    round 8)."""
    from smartsched.model.errors import ValidationError
    from smartsched.serving.config import RELOAD_LOOKAHEAD_ROLLOUTS, resolve_reload_profile

    root = str(tmp_path)
    for spec in ("lookahead:k8s-default?k=64&horizon=100&samples=100",
                 "lookahead:fgd?k=64", "lookahead:fgd?rollout=lookahead:fgd",
                 "lookahead:fgd??k=+64&horizon=+100&samples=+100", "lookahead:fgd?k=6_4",
                 "lookahead:fgd?k=%C2%B2"):
        with pytest.raises(ValidationError) as e:
            resolve_reload_profile(spec, root)
        assert e.value.field == "profile", spec
    with pytest.raises(ValidationError, match=f"at most {RELOAD_LOOKAHEAD_ROLLOUTS} in a live"):
        resolve_reload_profile("lookahead:fgd?k=64", root)  # 64 x 8 x 2 by default
    for spec in ("lookahead:fgd", "lookahead:fgd?k=8&horizon=8&samples=4",
                 "lookahead:fgd?rollout=bestfit"):
        assert resolve_reload_profile(spec, root).startswith("lookahead:fgd"), spec


def test_a_method_nobody_routes_is_one_metrics_label() -> None:
    """The edge entry (h11) takes any token as a method, and each made 16 new series: 300
    requests grew its /metrics from 65 KB to 10 MB (probe round 8)."""
    from smartsched.serving.metrics import ServiceMetrics

    m = ServiceMetrics()
    for i in range(50):
        m.request(f"M{i:06d}" + "X" * 2000, "unmatched", 405, 0.001)
    m.request("GET", "/healthz", 200, 0.001)
    text = m.render()[0].decode()
    assert 'method="other"' in text and 'method="GET"' in text and "XXXX" not in text
    assert len(text) < 64 * 1024


def test_one_tenants_answers_evict_only_its_own() -> None:
    """The answer caches were shared and bounded by pods answered: tenant retail's 101
    batches of unplaceable pods flushed tenant bank's answer, whose retry then booked its
    pod a second time (probe round 8). The scope holding the most now gives way."""
    from smartsched.serving.site import AnswerCache, idempotency_scope_of

    assert idempotency_scope_of("bank:r1#region-a#abc") == "bank"
    assert idempotency_scope_of("!edge:*:r1#f00") == "*"
    assert idempotency_scope_of("plain") == ""
    cache = AnswerCache(keep=50, keep_pods=100, size=len)
    cache["bank:once"] = [{}]
    cache.trim()
    for i in range(40):  # retail: 40 answers of 10 pods, four times the bound
        cache[f"retail:b{i}"] = [{}] * 10
        cache.trim()
        assert cache.pods <= 100
    assert "bank:once" in cache and "retail:b39" in cache and "retail:b0" not in cache
    cache.move_to_end("bank:once")
    for i in range(60):  # the count bound too: the client token's many small answers
        cache[f"*:c{i}"] = [{}]
        cache.trim()
    assert "bank:once" in cache and len(cache) <= 50
    assert cache.pods == sum(len(v) for v in cache.values())


def test_a_pod_file_with_one_id_twice_is_refused_before_it_is_sent() -> None:
    """`smartsched place` sent such a file as it was (the service refuses it: 422
    ``pods.id``); probe round 8."""
    from smartsched.client import pod_specs
    from smartsched.model.errors import ValidationError

    pod = {"id": "same", "cpu_milli": 100, "memory_mib": 64}
    with pytest.raises(ValidationError) as e:
        pod_specs([pod, {**pod, "cpu_milli": 200}])
    assert e.value.field == "id" and e.value.row == 1
    assert len(pod_specs([pod, {**pod, "id": "other"}])) == 2


def test_an_error_nothing_maps_is_the_services_json_500_with_nothing_of_it() -> None:
    """An exception of no mapped kind (round 8 met one when code changed under a running
    service) reached the client as Starlette's bare text 500."""
    from smartsched.serving import replica
    from smartsched.serving.app import app_api
    from tests.serving.test_probe_http_surface import BODY, CLIENT, FakeIngress

    class Broken(FakeIngress):
        async def place(self, *a: Any, **k: Any) -> Any:
            raise RuntimeError("ImportError at /srv/secret/path.py pid 4242")

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/placements",
             "raw_path": b"/v1/placements", "root_path": "", "query_string": b"",
             "headers": [(b"host", b"t"), (b"content-length", str(len(BODY)).encode()),
                         (b"content-type", b"application/json"),
                         (b"authorization", f"Bearer {CLIENT}".encode())],
             "client": ("127.0.0.1", 1), "server": ("t", 80)}
    msgs = [{"type": "http.request", "body": BODY, "more_body": False}]
    out: list[dict] = []

    async def receive() -> dict:
        return msgs.pop(0) if msgs else {"type": "http.disconnect"}

    async def send(m: dict) -> None:
        out.append(m)

    before = replica.current()
    replica.set_current(Broken())
    try:  # (Starlette raises the error on to the server, after the answer, for its log)
        with contextlib.suppress(RuntimeError):
            asyncio.run(app_api(scope, receive, send))
    finally:
        replica.set_current(before)
    assert out[0]["status"] == 500
    body = b"".join(m.get("body", b"") for m in out[1:])
    assert json.loads(body)["detail"][0]["loc"] == ["service"]
    assert b"secret" not in body and b"4242" not in body
