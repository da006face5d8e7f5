"""Round 7 of the service's probe: what a client can hold without being answered.

- Our own servers (the MEC edge entry, the extender) cap their connections at 2,048; idle
  sockets re-opened every 15 s (the head deadline) kept them at the cap, answering 503 to
  everyone else, at no cost to whoever opened them.
- One credential could hold every request slot of the ingress with bodies that never
  finish (2,000 of them: a legitimate placement waited 22 s).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from tests.serving.test_probe_round4 import ok_app_on_a_socket


async def _request(port: int, path: str = "/ok", keep: Any = None) -> bytes:
    """One GET on a new connection (or on ``keep``, a (reader, writer) left open)."""
    r, w = keep or await asyncio.open_connection("127.0.0.1", port)
    w.write(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    await w.drain()
    got = await asyncio.wait_for(r.readuntil(b"}"), 10)
    if keep is None:
        w.close()
    return got


def _capped_app(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, int, asyncio.Event]:
    """An app with ``/ok`` and ``/slow`` (answered once the event is set), its socket and
    port, under our servers' settings with a connection cap of 24 (4 places made)."""
    import smartsched.listen as listen

    monkeypatch.setattr(listen, "MAX_CONCURRENCY", 24)
    monkeypatch.setattr(listen, "IDLE_EVICTION_ROOM", 4)
    app, sock = ok_app_on_a_socket()
    release = asyncio.Event()

    @app.get("/slow")
    async def slow() -> dict:
        await release.wait()
        return {"slow": True}

    return app, sock, sock.getsockname()[1], release


def _serve(app: Any) -> Any:
    import uvicorn

    import smartsched.listen as listen

    return uvicorn.Server(listen.guarded_server_config(app, log_level="warning"))


async def _started(app: Any, sock: Any) -> tuple[Any, Any]:
    """``app`` served on ``sock`` under our servers' settings, once it accepts."""
    server = _serve(app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task


def test_idle_sockets_at_the_cap_give_way_to_a_request(monkeypatch) -> None:
    """At the connection cap a new connection closes idle ones: never-used ones first,
    oldest first, then kept-alive ones between requests; one with a request in flight
    is never closed. (Before: a 503 for every request while the idle ones stayed.)"""
    app, sock, port, release = _capped_app(monkeypatch)

    async def scenario() -> dict[str, Any]:
        server, task = await _started(app, sock)
        out: dict[str, Any] = {}
        kept = await asyncio.open_connection("127.0.0.1", port)
        out["kept first"] = await _request(port, keep=kept)  # then idle between requests
        sr, sw = await asyncio.open_connection("127.0.0.1", port)  # a request in flight
        sw.write(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
        await sw.drain()
        await asyncio.sleep(0.1)
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(40)]
        await asyncio.sleep(0.2)
        out["fresh"] = await _request(port)  # the cap is full of idle sockets
        out["kept again"] = await _request(port, keep=kept)
        release.set()
        out["slow"] = await asyncio.wait_for(sr.readuntil(b"}"), 10)
        closed = 0
        for r, w in idle:
            with contextlib.suppress(TimeoutError):
                closed += await asyncio.wait_for(r.read(1), 0.05) == b""
            w.close()
        out["idle closed"] = closed
        out["open"] = len(server.server_state.connections)
        kept[1].close()
        sw.close()
        server.should_exit = True
        await task
        return out

    out = asyncio.run(scenario())
    for k in ("kept first", "fresh", "kept again", "slow"):
        assert out[k].startswith(b"HTTP/1.1 200"), (k, out[k][:80])
    assert b'{"slow":true}' in out["slow"]
    assert out["idle closed"] >= 40 - 24 + 4 - 2, out  # the oldest idle ones went
    assert out["open"] <= 24, out


def test_a_pipelined_request_in_flight_is_not_taken_for_idle_at_the_cap(monkeypatch
                                                                        ) -> None:
    """A request pipelined behind an answered one was in flight while its connection read
    as idle (the head timer was armed before uvicorn started it): at the cap, with every
    other connection kept alive after a request, it was the oldest and was closed
    unanswered (probe round 7)."""
    app, sock, port, release = _capped_app(monkeypatch)

    async def scenario() -> bytes:
        server, task = await _started(app, sock)
        pr, pw = await asyncio.open_connection("127.0.0.1", port)
        pw.write(b"GET /ok HTTP/1.1\r\nHost: t\r\n\r\nGET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
        await pw.drain()
        await asyncio.wait_for(pr.readuntil(b"}"), 10)  # the first answered; /slow waits
        others = []
        for _ in range(40):  # each kept alive after one request
            keep = await asyncio.open_connection("127.0.0.1", port)
            await _request(port, keep=keep)
            others.append(keep)
        release.set()
        try:
            got = await asyncio.wait_for(pr.readuntil(b"}"), 10)
        except asyncio.IncompleteReadError as e:
            got = b"closed unanswered: " + e.partial
        for _, w in [*others, (pr, pw)]:
            w.close()
        server.should_exit = True
        await task
        return got

    got = asyncio.run(scenario())
    assert got.startswith(b"HTTP/1.1 200") and b'{"slow":true}' in got, got[:120]


@pytest.mark.parametrize("answered_first", [False, True])
def test_a_server_without_a_cap_closes_nothing(monkeypatch, answered_first: bool) -> None:
    """Serve's proxy runs the guarded protocol with no connection cap: nothing is closed
    for room there (its own limits apply)."""
    import uvicorn

    import smartsched.listen as listen

    app, sock = ok_app_on_a_socket()
    port = sock.getsockname()[1]

    async def scenario() -> int:
        config = uvicorn.Config(app, http=listen.guarded_h11(), log_level="warning")
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(30)]
        if answered_first:
            await _request(port, keep=conns[0])
        await asyncio.sleep(0.2)
        n = len(server.server_state.connections)
        for _, w in conns:
            w.close()
        server.should_exit = True
        await task
        return n

    assert asyncio.run(scenario()) == 30


def test_one_credential_cannot_hold_every_slot_with_bodies_that_never_finish() -> None:
    """Bodies still arriving are counted by credential (``max_body_reads_per_credential``,
    from any address: a few addresses let one token hold every slot again) and by
    credential and address (``max_body_reads_per_address``: one stalled client behind a
    shared token does not lock out its other holders). Past either the next is a 429 at
    once (body unread); another credential is read as before; a slot is given back when
    its body has arrived (or timed out)."""
    import json

    from smartsched.serving import replica
    from smartsched.serving.app import app_api
    from tests.serving.test_probe_http_surface import BODY, CLIENT, OPERATOR, FakeIngress

    ing = FakeIngress()
    ing.cfg.max_body_reads_per_credential = 5
    ing.cfg.max_body_reads_per_address = 3

    async def scenario() -> dict[str, Any]:
        stall = asyncio.Event()

        async def request(token: str, client: str, body: bytes | None) -> tuple[int, dict]:
            """A POST whose body arrives at once, or (None) never until ``stall`` is set."""
            sent: list[dict] = []
            scope = {"type": "http", "asgi": {"version": "3.0"}, "method": "POST",
                     "path": "/v1/placements", "raw_path": b"/v1/placements",
                     "root_path": "", "query_string": b"", "http_version": "1.1",
                     "scheme": "http", "server": ("t", 80), "client": (client, 1),
                     "headers": [(b"host", b"t"),
                                 (b"authorization", f"Bearer {token}".encode()),
                                 (b"content-type", b"application/json")]}

            async def receive() -> dict:
                if body is None:
                    await stall.wait()
                    return {"type": "http.disconnect"}
                return {"type": "http.request", "body": body, "more_body": False}

            async def send(msg: dict) -> None:
                sent.append(msg)

            await app_api(scope, receive, send)
            start = next(m for m in sent if m["type"] == "http.response.start")
            raw = b"".join(m.get("body", b"") for m in sent
                           if m["type"] == "http.response.body")
            return start["status"], {**dict(start["headers"]), "body": raw}

        stalled = [asyncio.create_task(request(CLIENT, "10.0.0.1", None)) for _ in range(3)]
        await asyncio.sleep(0.05)
        out: dict[str, Any] = {
            "over": await request(CLIENT, "10.0.0.1", BODY),
            "other address": await request(CLIENT, "10.0.0.2", BODY),
            "other credential": await request(OPERATOR, "10.0.0.1", BODY)}
        stalled += [asyncio.create_task(request(CLIENT, f"10.0.1.{i}", None))
                    for i in range(2)]
        await asyncio.sleep(0.05)
        out["credential full"] = await request(CLIENT, "10.0.0.9", BODY)
        stall.set()
        await asyncio.gather(*stalled, return_exceptions=True)
        out["after"] = await request(CLIENT, "10.0.0.1", BODY)
        return out

    before = replica.current()
    replica.set_current(ing)
    try:
        out = asyncio.run(asyncio.wait_for(scenario(), 30))
    finally:
        replica.set_current(before)
    status, headers = out["over"]
    assert status == 429, headers
    assert headers[b"retry-after"] == b"1" and headers[b"connection"] == b"close"
    assert json.loads(headers["body"])["detail"][0]["loc"] == ["body"]
    assert out["credential full"][0] == 429  # 5 arriving from three addresses
    for k in ("other address", "other credential", "after"):
        assert out[k][0] == 200, (k, out[k])


def test_an_edge_entry_retry_after_its_queued_escalation_was_reconciled_gets_the_booking(
        tmp_path) -> None:
    """Through the MEC entry, a request whose escalation was queued (its region
    unreachable) kept the answer "queued" for good: a retry after the region came back
    and the queue was reconciled still said queued, with no reservation, while the
    region held the pod (the cloud tier keeps no such answer; probe round 7)."""
    from smartsched.model.presets import load_cluster
    from smartsched.serving.config import parse_service_config
    from smartsched.serving.edge_entry import EdgeEntry
    from smartsched.serving.hierarchy import Hierarchy
    from smartsched.serving.schemas import PodSpec
    from smartsched.serving.tiers import SiteTier

    h = Hierarchy.from_spec(load_cluster("medium"))
    region = SiteTier(h, h.parent["mec-0"], "k8s-default")
    link = {"up": False}

    async def parent(pods, ttl, rid, validate=False):
        if not link["up"]:
            raise ConnectionError("link cut")
        return await region.place(pods, ttl, rid, validate)

    cfg = parse_service_config({"cluster": "medium", "auth": {"disabled": True},
                                "journal_dir": str(tmp_path)})
    big = [PodSpec(id="big", cpu_milli=32000, memory_mib=1024)]  # more than mec-0 has

    async def run() -> tuple[Any, Any]:
        edge = SiteTier(h, "mec-0", "k8s-default", parent=parent)
        entry = EdgeEntry(cfg, "mec-0", edge)
        try:
            first = (await entry.place(big, 60.0, "Q1")).placements[0]
            link["up"] = True
            await edge.reconcile()
            again = (await entry.place(big, 60.0, "Q1")).placements[0]
            return first, again
        finally:
            await entry.aclose()

    first, again = asyncio.run(run())
    assert not first.placed and first.escalation is not None
    assert first.escalation.state == "queued"
    assert again.placed and again.reservation_id is not None, again
    held = [r for r in region.placer.reservations.values()
            if any(b.pod.id == "big" for b in r.bookings)]
    assert len(held) == 1  # booked once, at the region, and the retry names it
    assert again.escalation is not None and again.escalation.state == "reconciled"
    assert again.site == h.parent["mec-0"]


def test_a_schedulers_per_node_tally_makes_one_series_per_reason_not_per_count() -> None:
    """kube's refusal ``0/88 nodes are available: 30 Insufficient cpu, 58 Insufficient
    memory, ...`` made a new ``smartsched_rejections`` series for every mix of counts (51
    from 60 refusals at the edge entry, kept for the replica's life; probe round 7)."""
    from smartsched.serving.metrics import ServiceMetrics

    metrics = ServiceMetrics()
    for i in range(60):
        reason = (f"0/88 nodes are available: {30 + i % 7} Insufficient cpu, "
                  f"{58 - i % 5} Insufficient memory, {i % 3 + 1} node(s) had untolerated "
                  "taint")
        metrics.observe_placements([{"pod_id": f"p{i}", "placed": False, "reasons": [
            {"tier": "edge", "site": "mec-0", "outcome": "rejected", "reason": reason,
             "plugins": []}]}])
    text = metrics.render()[0].decode()
    series = [ln for ln in text.splitlines() if ln.startswith("smartsched_rejections_total")]
    assert len(series) == 1 and 'reason="Insufficient memory"' in series[0], series


def test_a_gang_of_two_tenants_is_refused_naming_the_tenant() -> None:
    """With the shared client token a gang could hold a bank pod and a retail pod: one
    reservation neither tenant's token could release (probe round 7)."""
    import dataclasses

    from smartsched.model.errors import ValidationError
    from smartsched.model.pod import Pod
    from smartsched.serving.app import check_gangs

    pods = [Pod(id=f"g{i}", cpu_milli=100, memory_mib=64, gang_id="g", gang_size=2,
                tenant=tenant) for i, tenant in enumerate(("bank", "retail"))]
    with pytest.raises(ValidationError) as e:
        check_gangs(pods)
    assert e.value.field == "pods.tenant"
    check_gangs([dataclasses.replace(p, tenant="bank") for p in pods])


def test_a_confirm_or_release_is_filed_under_the_reservations_tenants() -> None:
    """The shared client token's confirm or release of a bank reservation was filed under
    tenant '' (a per-tenant audit query missed it); a batch holding two tenants' pods is
    filed once per tenant, with its pods."""
    from smartsched.serving.audit_trail import CLIENT_PRINCIPAL, Trail, tenant_principal

    got: list[tuple[str, str, str, Any]] = []

    class Log:
        def append(self, kind: str, who: str, payload: Any, tenant: str = "") -> None:
            got.append((kind, who, tenant, payload.get("pods")))

    trail = Trail(None)
    trail.log = Log()
    out = {"reservation_id": "region-a~r1", "released": True, "pods": ["a", "b", "c"]}
    trail.reservation(CLIENT_PRINCIPAL, "released", out, {"a": "bank", "b": "bank"})
    assert got == [("reservation.released", "client", "", ["c"]),
                   ("reservation.released", "client", "bank", ["a", "b"])]
    got.clear()
    trail.reservation(tenant_principal("bank"), "confirmed", {**out, "pods": ["a"]},
                      {"a": "bank"})
    trail.reservation(CLIENT_PRINCIPAL, "confirmed", {**out, "pods": ["a"]}, {"a": "bank"})
    assert [t for _, _, t, _ in got] == ["bank", "bank"]


def test_a_reused_request_id_is_a_conflict_naming_request_id() -> None:
    from smartsched.serving.tiers import IdempotencyConflict

    e = IdempotencyConflict.of("k1")
    assert e.field == "request_id" and "'k1'" in str(e) and str(e).startswith("request_id")


def test_the_openapi_document_lists_the_429_and_417_answers() -> None:
    """A generated client had no model for the body-read limit's 429 or the 417 that an
    unknown Expect gets (probe round 7)."""
    from tests.serving.test_probe_http_surface import FakeIngress, call

    status, _, doc = call(FakeIngress(), "GET", "/openapi.json")
    assert status == 200
    answers = doc["paths"]["/v1/placements"]["post"]["responses"]
    assert {"417", "429"} <= answers.keys(), sorted(answers)
