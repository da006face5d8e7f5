"""Round 5 of the placement service's probe: what round 4 found and left open.

- ``/docs`` and ``/redoc`` were served to anyone: FastAPI's pages load their scripts from
  a public CDN into the browser that holds the operator's token. They are off unless the
  config's ``api_docs`` asks for them; ``/openapi.json`` (what clients are generated from)
  is always served.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

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


@contextlib.contextmanager
def _guarded_server(monkeypatch: pytest.MonkeyPatch, app: Any, sock: Any,
                    keep_alive_s: float) -> Iterator[int]:
    """``app`` served by uvicorn, with Serve's defaults, on ``sock`` in a thread, after the
    proxy hook (``listen.guard_serve_proxy``) with a 0.5 s head deadline; its port."""
    import asyncio
    import copy
    import threading
    import time

    import uvicorn
    import uvicorn.config

    import smartsched.listen as listen

    monkeypatch.setattr(uvicorn.config, "HTTP_PROTOCOLS",
                        copy.copy(uvicorn.config.HTTP_PROTOCOLS))
    monkeypatch.setattr(listen, "HEAD_TIMEOUT_S", 0.5)
    listen.guard_serve_proxy()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                           timeout_keep_alive=keep_alive_s))
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=lambda: loop.run_until_complete(server.serve([sock])),
                         daemon=True)
    t.start()
    try:
        while not server.started:
            time.sleep(0.01)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        t.join(10)


def test_a_uvicorn_server_after_the_proxy_hook_bounds_request_heads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Serve's proxy runs its own uvicorn (httptools, no protocol option): the hook Ray
    calls in the proxy's process (``listen.guard_serve_proxy``) makes uvicorn's protocols
    the guarded ones. Here a uvicorn server started after the hook, with the defaults
    Serve's proxy uses: a silent connection is closed at the head deadline, a 100 KiB
    header line is cut off, a normal request is answered, and a kept-alive connection
    idle past the head deadline (within keep-alive) still serves its next request."""
    import socket
    import threading

    import uvicorn.config

    from tests.serving.test_probe_round4 import ok_app_on_a_socket

    app, sock = ok_app_on_a_socket()
    with _guarded_server(monkeypatch, app, sock, keep_alive_s=5) as port:
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


def test_a_window_search_stops_at_its_time_limit_with_a_feasible_answer() -> None:
    """HTTP probe 5: a live reload to ``anneal:fgd?sweeps=100000`` held a region's single
    writer for 100 s on a 50-pod batch (Serve's health check then restarted it, undoing
    the reload). The search is anytime: ``time_limit_s`` stops it, the repair still runs."""
    import time

    from smartsched.optimize.placer import AnnealOptions, place_window
    from smartsched.scheduling.base import make_scheduler
    from smartsched.twin.state import ClusterState
    from tests.optimize.test_placer import _apply, _gpu, _spec

    st = ClusterState(_spec())
    reqs = [st.compile(_gpu(f"p{i}", 1, 300 + 100 * (i % 5))) for i in range(40)]
    t0 = time.perf_counter()
    res = place_window(make_scheduler("first-fit"), st, reqs,
                       AnnealOptions(sweeps=100_000, polish=10_000_000, lns=1_000_000,
                                     time_limit_s=0.3))
    took = time.perf_counter() - t0
    assert took < 10, took  # unlimited, the 100,000 sweeps alone take minutes
    assert _apply(st, reqs, res.decisions) >= 1  # feasible on the real state


def test_a_live_reload_to_anneal_gets_a_time_limit(tmp_path) -> None:
    from smartsched.serving.config import RELOAD_ANNEAL_TIME_S, resolve_reload_profile

    models = tmp_path / "m"
    models.mkdir()
    got = resolve_reload_profile("anneal:fgd?sweeps=100000", str(models))
    assert got == f"anneal:fgd?sweeps=100000&time_limit_s={RELOAD_ANNEAL_TIME_S:g}"
    assert resolve_reload_profile("anneal:fgd?time_limit_s=0.5", str(models)) == \
        "anneal:fgd?time_limit_s=0.5"
    for bad in ("anneal:fgd?time_limit_s=30", "anneal:fgd?time_limit_s=0",
                "anneal:fgd?time_limit_s=x", "sandboxed:anneal:fgd?time_limit_s=9",
                "anneal:fgd?replicas=1024", "anneal:fgd?k=64&d=16"):
        with pytest.raises(ValidationError) as e:
            resolve_reload_profile(bad, str(models))
        assert e.value.field == "profile"
    nested = resolve_reload_profile("sandboxed:anneal:fgd?sweeps=3", str(models))
    assert "time_limit_s=" in nested
    from smartsched.scheduling.base import make_scheduler

    assert make_scheduler(got).options.time_limit_s == RELOAD_ANNEAL_TIME_S


def test_a_live_reload_survives_a_replica_restart(tmp_path) -> None:
    """HTTP probe 5: a reload answered 200, and after the site's replica restarted (a
    crash, a failed health check) the site was back on the deployment's profile, saying
    nothing. The reload is journaled with the reservations; a redeploy with another
    profile still wins, and a reload that can no longer load leaves the deployment's."""
    from smartsched.serving.journal import Journal
    from smartsched.serving.site import SitePlacer
    from tests.builders import cluster, node, pod

    spec = cluster(*(node(f"n{i}", cpu=16000, mem=65536) for i in range(4)))

    def start(profile: str) -> SitePlacer:
        return SitePlacer(spec, profile, journal=Journal(tmp_path / "s.jsonl"))

    def serving_after_restart(profile: str) -> str:
        site = start(profile)
        site.journal.close()
        return site.profile

    site = start("k8s-default")
    site.set_profile("fgd")
    placed = site.place([pod("a", cpu=1000)], ttl_s=600)
    assert placed[0].placed
    site.journal.close()
    again = start("k8s-default")  # the same deployment, restarted
    assert again.profile == "fgd" and placed[0].reservation_id in again.reservations
    again.journal.close()
    again = start("k8s-default")  # and once more: the rewritten journal keeps it
    assert again.profile == "fgd"
    again.set_profile("k8s-default")  # back by hand
    again.journal.close()
    assert serving_after_restart("k8s-default") == "k8s-default"
    # A redeploy with another profile is the operator's newer word.
    site = start("k8s-default")
    site.set_profile("fgd")
    site.journal.close()
    assert serving_after_restart("bestfit") == "bestfit"
    # A reload whose policy is gone since: the deployment's profile, and no error.
    models = tmp_path / "gone"
    import shutil
    from pathlib import Path

    shutil.copytree(Path(__file__).resolve().parents[2] / "models" / "ppo_mixed_small", models)
    site = start("k8s-default")
    site.set_profile(f"rl:{models}", label="rl:gone")
    assert site.profile == "rl:gone"
    site.journal.close()
    assert serving_after_restart("k8s-default") == "rl:gone"
    shutil.rmtree(models)
    assert serving_after_restart("k8s-default") == "k8s-default"


def test_error_answers_never_quote_the_clients_input() -> None:
    """HTTP probe 5: unknown regions, sites, reservation ids, request ids, gang ids, GPU
    models and option names came back quoted in 404s, 409s and 422s."""

    from smartsched.model.errors import UnknownReferenceError, unechoed
    from smartsched.serving.app import make_fastapi

    assert unechoed("unknown region 'SECRET'") == "unknown region '...'"
    assert unechoed('unknown region "a\'b"') == "unknown region '...'"
    assert unechoed("the site's journal isn't here") == "the site's journal isn't here"
    app = make_fastapi(owner=lambda: None)

    @app.get("/boom/{what}")
    async def boom(what: str) -> None:
        raise UnknownReferenceError("region", f"unknown region {what!r}")

    from tests.builders import asgi_call

    _, body = asgi_call(app, "GET", "/boom/SECRETREGION")
    assert b"SECRETREGION" not in body and json.loads(body)["detail"][0]["loc"] == ["region"]


@pytest.mark.parametrize(("body", "loc", "needle"), [
    ({"pod": {"tolerations": ["::::=:"]}}, ["pod", "tolerations", 0], "malformed toleration"),
    ({"pod": {"tolerations": ["key=val:BadEffect"]}}, ["pod", "tolerations", 0],
     "malformed toleration"),
    ({"pod": {"id": "a\u202eb"}}, ["pod", "id"], "bidirectional"),
    ({"request_id": ""}, ["request_id"], "at least 1 character"),
])
def test_lax_fields_are_held_to_their_rules(body: dict, loc: list, needle: str) -> None:
    """HTTP probe 5: malformed tolerations were placed (200); an RTL override passed as a
    name; an empty request_id was said to need "at least 1 item"."""
    from smartsched.serving.schemas import PlacementRequest

    doc = {"pod": {"id": "a", "cpu_milli": 100, "memory_mib": 100}}
    doc = {**doc, **{k: v for k, v in body.items() if k != "pod"}}
    doc["pod"].update(body.get("pod", {}))
    with pytest.raises(Exception) as e:
        PlacementRequest.model_validate(doc)
    err = e.value.errors()[0]
    assert [x for x in err["loc"]] == loc and needle in err["msg"]
    ok = {"pod": {"id": "a", "cpu_milli": 100, "memory_mib": 100, "tolerations": [
        "*", "k", "k=v", "k=v:NoSchedule", "nvidia.com/gpu=present:NoSchedule",
        "k:NoExecute"]}}
    PlacementRequest.model_validate(ok)


def test_a_live_reload_survives_a_restart_that_reapplies_the_user_config(tmp_path) -> None:
    """Review of round 5: in the distributed topology a site's replica starts on the
    default profile and Serve then applies the deployment's user_config (reconfigure) at
    every start, which undid the journaled reload again. ``configure`` keeps a reload made
    on top of the same deployment profile, and a redeploy to another profile wins."""
    from smartsched.serving.journal import Journal
    from smartsched.serving.site import SitePlacer
    from tests.builders import cluster, node

    spec = cluster(*(node(f"n{i}", cpu=16000, mem=65536) for i in range(4)))

    def replica_start(user_config_profile: str) -> SitePlacer:
        site = SitePlacer(spec, "k8s-default", journal=Journal(tmp_path / "s.jsonl"))
        site.configure(user_config_profile)  # Serve's reconfigure(user_config)
        return site

    site = replica_start("fgd")
    assert site.profile == "fgd"
    site.set_profile("bestfit")  # the operator's live reload
    site.journal.close()
    site = replica_start("fgd")  # a crash: the same user_config comes back
    assert site.profile == "bestfit"
    site.journal.close()
    site = replica_start("first-fit")  # a redeploy with another profile
    assert site.profile == "first-fit"
    site.journal.close()
    site = replica_start("first-fit")  # and it stands across restarts
    assert site.profile == "first-fit"
    site.journal.close()


def test_the_guarded_protocols_leave_pipelined_requests_and_websockets_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of round 5: with httptools, a pipelined request's cycle already existed when
    the first answer completed, was taken for one waiting for its head, and its connection
    was closed mid-answer; and an upgraded connection (a WebSocket) was closed at the head
    deadline."""
    import asyncio
    import socket

    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/slow")
    async def slow() -> dict:
        await asyncio.sleep(1.5)
        return {"ok": True}

    async def ws(sock: Any) -> None:  # a Starlette route: no annotation to resolve
        await sock.accept()
        while True:
            await sock.send_text(await sock.receive_text())

    app.router.add_websocket_route("/ws", ws)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    with _guarded_server(monkeypatch, app, sock, keep_alive_s=1) as port:
        one = b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n"
        got, _ = _talk(port, one + one[:-2] + b"Connection: close\r\n\r\n", 10)
        assert got.count(b"HTTP/1.1 200") == 2, got[-200:]

        async def echo_after_a_pause() -> str:
            import websockets

            async with websockets.connect(f"ws://127.0.0.1:{port}/ws") as c:
                await asyncio.sleep(1.5)  # past the head deadline
                await c.send("still here")
                return await asyncio.wait_for(c.recv(), 5)

        assert asyncio.run(echo_after_a_pause()) == "still here"


def test_query_integers_are_digits_as_body_integers_are() -> None:
    """HTTP probe 5: ``?limit=1.0`` and ``?limit=+1`` were read as 1, where the body
    refuses ``100.0`` for an integer."""
    from tests.serving.test_probe_http_surface import OPERATOR, FakeIngress, call_raw

    op = [("Authorization", f"Bearer {OPERATOR}")]
    for raw in ("1.0", "%2B1", "1e2", "%EF%BC%91", "-0"):
        status, _, body = call_raw(FakeIngress(), "GET", f"/v1/admin/experience?limit={raw}",
                                   headers=op)
        assert status == 422, (raw, body)
        assert json.loads(body)["detail"][0]["loc"] == ["query", "limit"]
    assert call_raw(FakeIngress(), "GET", "/v1/admin/experience?limit=5", headers=op)[0] == 200
    _, _, doc = call_raw(FakeIngress(), "GET", "/openapi.json")
    params = json.loads(doc)["paths"]["/v1/admin/experience"]["get"]["parameters"]
    schema = next(p["schema"] for p in params if p["name"] == "limit")
    assert schema["type"] == "integer" and schema["maximum"] == 100_000


def test_a_stale_reload_is_not_revived_by_a_redeploy_back(tmp_path) -> None:
    """Single-process topology (the ingress builds each site with its profile and then
    configures it, as ``in_process_sites`` does): a reload made on top of k8s-default, a
    redeploy to bestfit, then a redeploy back to k8s-default serves k8s-default, not the
    old reload."""
    from smartsched.serving.journal import Journal
    from smartsched.serving.site import SitePlacer
    from tests.builders import cluster, node

    spec = cluster(*(node(f"n{i}", cpu=16000, mem=65536) for i in range(4)))

    def built(profile: str) -> SitePlacer:
        site = SitePlacer(spec, profile, journal=Journal(tmp_path / "s.jsonl"))
        site.configure(site.configured)
        return site

    site = built("k8s-default")
    site.set_profile("fgd")
    site.journal.close()
    site = built("k8s-default")  # a restart
    assert site.profile == "fgd"
    site.journal.close()
    site = built("bestfit")  # a redeploy
    assert site.profile == "bestfit"
    site.journal.close()
    site = built("k8s-default")  # and back
    assert site.profile == "k8s-default"
    site.journal.close()
