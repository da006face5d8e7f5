"""Cases found by the fourth probe of the placement service (2026-12-07): each failed
before its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from smartsched.model.errors import SmartSchedError, ValidationError
from smartsched.serving.app import NodeClaims
from smartsched.serving.config import resolve_reload_profile


def test_a_refused_update_does_not_unclaim_a_name_a_concurrent_one_applied() -> None:
    """A registers p4 and a bad row (refused); B registers p4 alone at the same site and
    applies while A is in flight. A's cleanup used to forget p4, so a third request could
    register it at another site: one node booked in full at two sites."""
    node_site = {"old": "region-a"}
    claims = NodeClaims(node_site)
    a = claims.claim([("p4", "region-a"), ("p4-bad", "region-a")])
    b = claims.claim([("p4", "region-a")])  # shares A's claim
    assert a == ["p4", "p4-bad"] and b == ["p4"]
    claims.settle(["p4"])  # B's site applied it
    claims.release(b)
    claims.release(a)  # A was refused
    assert node_site == {"old": "region-a", "p4": "region-a"}  # p4 stays, p4-bad goes


def test_a_name_is_forgotten_only_when_every_claim_on_it_ends_unapplied() -> None:
    node_site: dict[str, str] = {}
    claims = NodeClaims(node_site)
    a = claims.claim([("n", "region-a")])
    b = claims.claim([("n", "region-a")])
    c = claims.claim([("n", "region-b")])  # another site: no share (the caller refuses it)
    assert c == [] and node_site == {"n": "region-a"}
    claims.release(a)
    assert node_site == {"n": "region-a"}  # B still claims it
    claims.release(b)
    assert node_site == {}
    # A registered name is never claimed, so never forgotten by a refusal.
    node_site["reg"] = "region-a"
    assert claims.claim([("reg", "region-a")]) == []
    claims.release(["reg"])
    assert node_site == {"reg": "region-a"}


@pytest.mark.parametrize("spec", [
    "sandboxed:k8s-default?rollout=rl:evilpol",
    "sandboxed:k8s-default?rollout=rl:~root",
    "sandboxed:k8s-default?rollout=rl:../outside",
    "sandboxed:k8s-default?rollout=sandboxed:rl:../outside",
    "rl:ppo?base=rl:../outside",
    "rl:ppo?filters=~root",
    "rl:ppo?ensemble=fgd",  # a packaged name, but ensemble= is always a folder: ./fgd
    "sandboxed:fgd?config=secrets",  # sandboxed's YAML settings: ./secrets
])
def test_a_reload_names_no_policy_outside_the_models_dir_through_an_option(
        tmp_path: Path, spec: str) -> None:
    """An option whose value is another scheduler spec (sandboxed's ``rollout``, a
    shortlist's ``base``) reached the loader unchecked: a policy loaded from the replica's
    working directory, and the refusals named paths such as /root."""
    models = tmp_path / "models"
    models.mkdir()
    try:
        got = resolve_reload_profile(spec, str(models))
    except ValidationError as e:
        assert e.field == "profile" and "models_dir" in e.message
        return
    # Resolved inside the models dir: every option naming a scheduler or a file is a
    # packaged name or a path under it.
    from smartsched.scheduling.registry import builtin_profiles

    top = str(models.resolve())
    for part in got.split("?", 1)[1].split("&"):
        key, value = part.split("=", 1)
        if key in ("rollout", "base", "filters", "ensemble", "config"):
            packaged = value in builtin_profiles() and key not in ("ensemble", "config")
            assert packaged or value.split(":")[-1].startswith(top), got


def test_packaged_names_in_spec_options_pass_as_they_are(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    assert resolve_reload_profile("sandboxed:fgd?rollout=k8s-default", str(models)) == \
        "sandboxed:fgd?rollout=k8s-default"
    got = resolve_reload_profile("sandboxed:fgd?rollout=rl:ppo", str(models))
    assert got == f"sandboxed:fgd?rollout=rl:{models.resolve() / 'ppo'}"


def test_a_gang_id_with_a_slash_is_refused_naming_the_field() -> None:
    """A tenant's gang ids are scoped as "<tenant>/<id>": a shared-token client naming
    "bank/g2" reached tenant bank's gang g2 and dropped the room held for it."""
    from pydantic import ValidationError as PydanticError

    from smartsched.serving.schemas import PodSpec

    with pytest.raises(PydanticError) as e:
        PodSpec.model_validate({"id": "p", "cpu_milli": 100, "memory_mib": 64,
                                "gang_id": "bank/g2", "gang_size": 1})
    assert e.value.errors()[0]["loc"] == ("gang_id",)
    assert PodSpec.model_validate({"id": "p", "cpu_milli": 100, "memory_mib": 64,
                                   "gang_id": "g2"}).gang_id == "g2"


@pytest.mark.parametrize("field,values", [
    ("origin_site", ("mec-0", "mec-1")),
    ("pod_class", ("edge-rt", "batch")),
    ("latency_slo_ms", (5.0, 50.0)),
])
def test_gang_members_that_would_be_routed_apart_are_refused(field: str, values) -> None:
    """A gang is routed by its first member: members from two MEC sites were both placed
    at the first's, 11 ms from the second's origin with a 5 ms bound."""
    from smartsched.model.pod import Pod
    from smartsched.serving.app import check_gangs

    base = {"cpu_milli": 100, "memory_mib": 64, "gang_id": "g", "gang_size": 2,
            "pod_class": "edge-rt", "origin_site": "mec-0", "latency_slo_ms": 5.0}
    pods = [Pod(id=f"m{i}", **{**base, field: v}) for i, v in enumerate(values)]
    with pytest.raises(ValidationError) as e:
        check_gangs(pods)
    assert e.value.field == f"pods.{'class' if field == 'pod_class' else field}"
    check_gangs([Pod(id=f"m{i}", **base) for i in range(2)])  # alike: accepted
    regions = [("region-a", "region-b"), ("region-b", "region-a")]  # one set, any order
    check_gangs([Pod(id=f"r{i}", **{**base, "origin_site": None, "latency_slo_ms": None,
                                    "pod_class": "batch", "allowed_regions": r})
                 for i, r in enumerate(regions)])


def test_a_query_parameter_given_twice_or_unknown_is_refused_naming_it() -> None:
    """Before: ``?limit=1&limit=2`` took the last value, ``?LIMIT=5`` (or ``limit[]=1``)
    ran with the default limit of 2,000, all 200."""
    import json

    from tests.serving.test_probe_http_surface import OPERATOR, FakeIngress, call_raw

    op = [("Authorization", f"Bearer {OPERATOR}")]
    cases = {"/v1/admin/experience?limit=1&limit=2": (400, ["query", "limit"]),
             "/v1/admin/experience?LIMIT=5": (422, ["query", "LIMIT"]),
             "/v1/admin/experience?limit[]=1": (422, ["query", "limit[]"]),
             "/v1/admin/experience?limit=100001": (422, ["query", "limit"]),
             "/healthz?probe=1": (422, ["query", "probe"])}
    for path, (status, loc) in cases.items():
        got, _, body = call_raw(FakeIngress(), "GET", path, headers=op)
        assert got == status, (path, got, body)
        assert json.loads(body)["detail"][0]["loc"] == loc, (path, body)
    assert call_raw(FakeIngress(), "GET", "/v1/admin/experience?limit=5", headers=op)[0] == 200
    # Authorization comes first; a path that is no route stays a 404.
    assert call_raw(FakeIngress(), "GET", "/v1/admin/experience?limit=1&limit=2")[0] == 401
    assert call_raw(FakeIngress(), "GET", "/v1/nothing?a=1&a=2", headers=op)[0] in (400, 404)


def test_a_pod_is_read_by_its_json_names_only() -> None:
    """``pod_class`` was accepted beside ``class``, which the OpenAPI document names alone
    (with ``additionalProperties: false``)."""
    from pydantic import ValidationError as PydanticError

    from smartsched.serving.schemas import PodSpec

    assert PodSpec.model_validate({"id": "p", "cpu_milli": 1, "class": "online"}) \
        .pod_class.value == "online"
    with pytest.raises(PydanticError) as e:
        PodSpec.model_validate({"id": "p", "cpu_milli": 1, "pod_class": "online"})
    assert e.value.errors()[0]["loc"] == ("pod_class",)


def test_a_body_trickled_within_the_pause_limit_still_ends_in_a_408(monkeypatch) -> None:
    """A byte every 10 s passed the 15 s pause limit and held the request as long as the
    client liked: the whole body now has a deadline too."""
    import asyncio
    import json

    from smartsched.serving import app as app_module
    from tests.serving.test_probe_http_surface import CLIENT, FakeIngress, call_raw

    monkeypatch.setattr(app_module, "BODY_IDLE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(app_module, "BODY_DEADLINE_S", 1.0)

    async def trickle() -> dict:
        await asyncio.sleep(0.1)  # always within the pause limit, never done
        return {"type": "http.request", "body": b" ", "more_body": True}

    ing = FakeIngress()
    status, _, body = call_raw(ing, "POST", "/v1/placements",
                               headers=[("Authorization", f"Bearer {CLIENT}"),
                                        ("Content-Type", "application/json"),
                                        ("Transfer-Encoding", "chunked")],
                               receive_body=trickle)
    assert status == 408, body[:200]
    detail = json.loads(body)["detail"][0]
    assert detail["loc"] == ["body"] and "took over" in detail["msg"]
    assert ing.placed == []


def ok_app_on_a_socket() -> tuple[Any, Any]:
    """An app answering ``GET /ok`` and a loopback socket bound for it (port: the
    kernel's pick)."""
    import socket

    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/ok")
    async def ok() -> dict:
        return {"ok": True}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return app, sock


def test_our_own_servers_bound_request_heads_and_close_a_silent_connection(monkeypatch
                                                                           ) -> None:
    """The edge entry's and the extender's uvicorn (httptools) kept growing an unfinished
    header line (hundreds of MiB for four clients) and held a connection that never sent
    its head for ever. Served here with the same settings: a 100 KiB header line is
    refused, a silent connection is closed once the head deadline passes, and a normal
    request is answered."""
    import asyncio

    import uvicorn

    import smartsched.listen as listen

    monkeypatch.setattr(listen, "HEAD_TIMEOUT_S", 0.5)
    app, sock = ok_app_on_a_socket()
    port = sock.getsockname()[1]

    async def scenario() -> tuple[bytes, bytes, bytes]:
        server = uvicorn.Server(listen.guarded_server_config(app, log_level="warning"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)

        async def talk(data: bytes, wait: float) -> bytes:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(data)
            await w.drain()
            try:
                return await asyncio.wait_for(r.read(65536), wait)
            except TimeoutError:
                return b"<still open>"
            finally:
                w.close()

        big = await talk(b"GET /ok HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 100_000, 5)
        silent = await talk(b"GET /ok HTTP/1.1\r\n", 5)
        fine = await talk(b"GET /ok HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 5)
        coded = await talk(b"POST /ok HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked"
                           b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 5)  # was read as plain
        server.should_exit = True
        await task
        return big, silent, fine, coded

    big, silent, fine, coded = asyncio.run(scenario())
    assert coded.startswith(b"HTTP/1.1 400"), coded[:80]
    assert big.startswith(b"HTTP/1.1 400") or big == b"", big[:80]
    assert silent == b"", silent[:80]  # closed by the server, not left open
    assert fine.startswith(b"HTTP/1.1 200") and b'{"ok":true}' in fine


def test_an_edge_entry_retry_after_a_restart_gets_its_first_answer(tmp_path: Path) -> None:
    """Probe round 4: a pod the site escalated (booked at region-b) was placed again at
    the site when its request was retried after a restart -- the site's journal keeps its
    own bookings only -- so one pod held room at two sites. The entry now journals its
    answers to requests with an id."""
    import asyncio
    from types import SimpleNamespace

    from smartsched.model.presets import load_cluster
    from smartsched.serving.config import parse_service_config
    from smartsched.serving.edge_entry import EdgeEntry
    from smartsched.serving.hierarchy import Hierarchy
    from smartsched.serving.schemas import PodSpec

    h = Hierarchy.from_spec(load_cluster("medium"))

    class Tier:  # the site: each call books anew (room came free while it was down)
        def __init__(self) -> None:
            self.h, self.placer, self.calls = h, SimpleNamespace(answers={}), 0

        async def place(self, pods, ttl_s, key, validate):
            self.calls += 1
            site = "region-b" if self.calls == 1 else "mec-0"
            return [{"pod_id": p.id, "placed": True, "site": site, "node": f"n{self.calls}",
                     "reservation_id": f"r{self.calls}", "reasons": [], "profile": "k8s-default",
                     "tier": "region"} for p in pods]

    cfg = parse_service_config({"cluster": "medium", "auth": {"disabled": True},
                                "journal_dir": str(tmp_path)})
    pod = [PodSpec(id="esc1", cpu_milli=8000)]

    async def run() -> None:
        tier = Tier()
        first = EdgeEntry(cfg, "mec-0", tier)
        a = (await first.place(pod, 60.0, "esc-1")).placements[0]
        assert (a.site, tier.calls) == ("region-b", 1)
        again = (await first.place(pod, 60.0, "esc-1")).placements[0]
        assert again.reservation_id == "r1" and tier.calls == 1
        await first.aclose()  # the replica's process ends
        restarted = EdgeEntry(cfg, "mec-0", tier)
        b = (await restarted.place(pod, 60.0, "esc-1")).placements[0]
        assert (b.site, b.reservation_id, tier.calls) == ("region-b", "r1", 1)
        with pytest.raises(SmartSchedError):  # the id stays bound to its first body
            await restarted.place([PodSpec(id="esc1", cpu_milli=100)], 60.0, "esc-1")
        fresh = (await restarted.place(pod, 60.0, "esc-2")).placements[0]
        assert fresh.reservation_id == "r2"
        await restarted.aclose()

    asyncio.run(run())


def test_scrapes_read_the_sites_once_a_second_and_the_counters_stay_current() -> None:
    """Eight clients scraping /metrics (no token) in a loop pushed the median placement from
    19 to 483 ms: each scrape asked every site two questions."""
    from types import SimpleNamespace

    from tests.serving.test_probe_http_surface import FakeIngress, call_raw

    asked: list[str] = []

    def method(name: str, answer: Any) -> Any:
        async def remote(*args: Any) -> Any:
            asked.append(name)
            return answer
        return SimpleNamespace(remote=remote)

    site = SimpleNamespace(summary=method("summary", {"site": "region-a", "reservations": 3}),
                           node_green=method("node_green", {}))
    ing = FakeIngress(site=site)
    for _ in range(5):
        status, _, body = call_raw(ing, "GET", "/metrics")
        assert status == 200 and b'smartsched_reservations_active{site="region-a"} 3.0' in body
    assert asked == ["summary", "node_green"]  # read once for the five scrapes
    ing.metrics.observe_placements([{"pod_id": "p", "placed": True, "reasons": [],
                                     "profile": "fgd", "tier": "region",
                                     "reservation_id": "r"}])
    body = call_raw(ing, "GET", "/metrics")[2]
    assert b'smartsched_decisions_total{profile="fgd",tier="region"} 1.0' in body
