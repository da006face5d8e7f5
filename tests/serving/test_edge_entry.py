"""An MEC site's own HTTP entry (issue 22): real HTTP on loopback into a site tier, the
same auth, limits, validation, idempotency and escalation as through the cloud."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from smartsched.model.errors import ValidationError
from smartsched.model.presets import load_cluster
from smartsched.serving.config import parse_service_config
from smartsched.serving.hierarchy import Hierarchy
from smartsched.serving.tiers import SiteTier
from tests.builders import free_port, wait_healthy

TOKEN = "edge-client-token-0123456789"
OPERATOR = "edge-operator-token-0123456789"
BANK = "edge-tenant-bank-0123456789"


class Region:
    """The edge's parent: a region tier, with its calls counted."""

    def __init__(self, tier: SiteTier) -> None:
        self.tier = tier
        self.calls = 0

    async def __call__(self, pods, ttl_s, rid, validate=False):
        self.calls += 1
        return await self.tier.place(pods, ttl_s, rid, validate)


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """mec-0's entry on a loopback port, served from its own event loop thread (as in a
    site replica), its region in process."""
    from smartsched.audit.keys import generate_key
    from smartsched.serving.edge_entry import EdgeEntry, start

    root = tmp_path_factory.mktemp("edge")
    (root / "token").write_text(TOKEN)
    (root / "op").write_text(OPERATOR)
    (root / "bank").write_text(BANK)
    generate_key(root / "audit.key")
    port = free_port()
    cfg = parse_service_config({
        "cluster": "medium", "max_body_bytes": 64 * 1024,
        "auth": {"token_file": str(root / "token"), "operator_token_file": str(root / "op"),
                 "tenants": {"bank": {"token_file": str(root / "bank")}}},
        "audit": {"dir": str(root / "audit" / "log"), "heads": str(root / "heads.jsonl"),
                  "key_file": str(root / "audit.key"), "block_seconds": 0.1},
        "edge_entry": {"ports": {"mec-0": port}}})
    h = Hierarchy.from_spec(load_cluster("medium"))
    region = Region(SiteTier(h, h.parent["mec-0"], "k8s-default"))
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict = {}

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def boot() -> None:
            tier = SiteTier(h, "mec-0", "k8s-default", parent=region)
            box["entry"] = EdgeEntry(cfg, "mec-0", tier)
            box["task"] = start(box["entry"], "127.0.0.1", port)
            ready.set()

        loop.run_until_complete(boot())
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(30)
    url = f"http://127.0.0.1:{port}"
    assert wait_healthy(url, 30)
    yield {"url": url, "entry": box["entry"], "region": region, "port": port, "cfg": cfg,
           "root": root}

    entry = box["entry"]
    closed_after_serving: list[bool] = []
    close = entry.trail.close

    def trail_close() -> None:  # the log is sealed only once the server has stopped
        closed_after_serving.append(entry.task.done())
        close()

    entry.trail.close = trail_close
    asyncio.run_coroutine_threadsafe(entry.aclose(10), loop).result(15)
    assert closed_after_serving == [True] and not entry.serving()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _pod(**kw) -> dict:
    return {"id": f"e-{uuid.uuid4().hex[:8]}", "cpu_milli": 1000, "memory_mib": 512,
            "class": "edge-rt", "latency_slo_ms": 8, **kw}


def _post(url: str, body, token: str | None = TOKEN, path: str = "/v1/placements"):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if isinstance(body, bytes | str):
        return requests.post(url + path, data=body, timeout=10,
                             headers={**headers, "Content-Type": "application/json"})
    return requests.post(url + path, json=body, headers=headers, timeout=10)


def test_places_at_its_site_through_its_own_entry(edge: dict) -> None:
    r = _post(edge["url"], {"pod": _pod()})
    assert r.status_code == 200, r.text
    p = r.json()["placements"][0]
    assert p["placed"] and p["tier"] == "edge" and p["site"] == "mec-0"
    assert p["reservation_id"].startswith("mec-0")
    assert p["reasons"][-1]["outcome"] == "placed"


def test_what_the_site_cannot_hold_escalates_to_its_region(edge: dict) -> None:
    before = edge["region"].calls
    big = _pod(cpu_milli=60_000, memory_mib=4096)  # more than any MEC node has
    p = _post(edge["url"], {"pod": big}).json()["placements"][0]
    assert edge["region"].calls == before + 1
    assert p["placed"] and p["tier"] == "region"
    assert p["reasons"][0]["tier"] == "edge" and p["reasons"][0]["outcome"] == "escalated"


def test_auth_first_and_bad_input_answered_4xx_naming_the_field(edge: dict) -> None:
    url = edge["url"]
    assert _post(url, b"{" * 100, token=None).status_code == 401  # before the body is read
    assert _post(url, {"pod": _pod()}, token="wrong").status_code == 403
    r = _post(url, {"pod": _pod(origin_site="mec-1")})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["pod", "origin_site"]
    r = _post(url, {"pod": _pod(allowed_regions=["region-a"])})
    assert r.status_code == 422 and "allowed_regions" in r.json()["detail"][0]["loc"]
    r = _post(url, {"pod": _pod(allowed_regions=["mec-0", "no-such-site"])})  # as the cloud
    assert r.status_code == 404 and "allowed_regions" in r.json()["detail"][0]["loc"]
    r = _post(url, '{"pod": {"id": "x", "cpu_milli": NaN, "memory_mib": 1}}')
    assert r.status_code == 422 and "NaN" not in r.text
    assert _post(url, b"{\"pod\": ").status_code in (400, 422)  # malformed JSON
    huge = json.dumps({"pod": _pod(labels={"k": "v" * 100_000})})
    assert _post(url, huge).status_code == 413
    r = _post(url, {"pods": [_pod(id="same"), _pod(id="same")]}, path="/v1/placements:batch")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["pods", "id"]


def test_a_body_that_is_not_json_is_a_415_after_auth_and_before_the_limit(edge: dict
                                                                         ) -> None:
    """text/plain (or any type but JSON) to a JSON route: a 415 naming application/json,
    not a 422 about a "valid dictionary", the body never echoed; a client without the token
    is still refused first, and an oversized body of the wrong type is not read."""
    url = edge["url"] + "/v1/placements"
    body = json.dumps({"pod": _pod(id="secret-7f3a")})
    for ctype in ("text/plain", "text/plain; charset=utf-8", "application/xml"):
        r = requests.post(url, data=body, timeout=10, headers={
            "Authorization": f"Bearer {TOKEN}", "Content-Type": ctype})
        assert r.status_code == 415, r.text
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["headers", "content-type"]
        assert "application/json" in detail["msg"] and "secret-7f3a" not in r.text
        assert r.headers["accept-post"] == "application/json"
    r = requests.post(url, data=body, timeout=10, headers={"Content-Type": "text/plain"})
    assert r.status_code == 401  # auth before anything about the body
    r = requests.post(url, data=body, timeout=10, headers={
        "Authorization": "Bearer wrong", "Content-Type": "text/plain"})
    assert r.status_code == 403
    huge = "x" * (edge["cfg"].max_body_bytes + 1)
    r = requests.post(url, data=huge, timeout=10, headers={
        "Authorization": f"Bearer {TOKEN}", "Content-Type": "text/plain"})
    assert r.status_code in (413, 415) and "xxxx" not in r.text
    r = requests.post(url, data=(c for c in [huge.encode()]), timeout=10, headers={
        "Authorization": f"Bearer {TOKEN}", "Content-Type": "text/plain"})  # chunked
    assert r.status_code == 415 and "xxxx" not in r.text
    r = requests.post(url, data=body, timeout=10, headers={
        "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 200, r.text
    text = requests.get(edge["url"] + "/metrics", timeout=10).text
    assert 'status="415"' in text  # measured as every answer is


def test_retry_gets_the_first_answer_and_tenants_stay_scoped(edge: dict) -> None:
    url, rid = edge["url"], uuid.uuid4().hex
    pod = _pod()
    a = _post(url, {"pod": pod, "request_id": rid}).json()["placements"][0]
    b = _post(url, {"pod": pod, "request_id": rid}).json()["placements"][0]
    assert a["reservation_id"] == b["reservation_id"]
    other = _post(url, {"pod": {**pod, "cpu_milli": 2000}, "request_id": rid})
    assert other.status_code == 409
    r = _post(url, {"pod": _pod(tenant="retail")}, token=BANK)
    assert r.status_code == 403 and r.json()["detail"][0]["loc"] == ["pod", "tenant"]
    assert _post(url, {"pod": _pod()}, token=BANK).status_code == 200


def test_decisions_are_audited_in_the_entrys_own_log_and_measured(edge: dict) -> None:
    from smartsched.audit.keys import load_public_key
    from smartsched.audit.store import read_segment, segment_files
    from smartsched.audit.verify import verify_log

    pid = f"audited-{uuid.uuid4().hex[:6]}"
    assert _post(edge["url"], {"pod": _pod(id=pid)}, token=BANK).status_code == 200
    text = requests.get(edge["url"] + "/metrics", timeout=10).text
    assert 'smartsched_request_seconds_count{method="POST",route="/v1/placements"' in text
    assert 'smartsched_decisions_total{profile="k8s-default",tier="edge"}' in text
    audit = edge["cfg"].audit
    log_dir = Path(audit.dir + ".edge-mec-0")
    heads = Path(audit.heads).with_name("heads.edge-mec-0.jsonl")
    pub = load_public_key(Path(audit.key_file).with_suffix(".pub"))
    deadline = time.monotonic() + 15
    while True:  # sealed and signed within block_seconds
        rep = verify_log(log_dir, heads, pub, live=True)
        assert rep.ok, rep.problem
        rows = [read_segment(p).to_pydict() for p in segment_files(log_dir)]
        signed = [(k, pr, json.loads(d).get("pod_id")) for r in rows
                  for k, pr, d in zip(r["kind"], r["principal"], r["payload"], strict=True)
                  ][:rep.records]
        if ("placement", "tenant:bank", pid) in signed:
            break
        assert time.monotonic() < deadline, signed[-5:]
        time.sleep(0.2)
    assert not Path(audit.dir).exists()  # the cloud ingress's log is not this entry's


def test_a_taken_port_and_bad_settings_are_named(edge: dict) -> None:
    from smartsched.serving.app import service_hierarchy
    from smartsched.serving.edge_entry import bind

    with pytest.raises(ValidationError) as e:
        bind("127.0.0.1", edge["port"], "mec-0")
    assert e.value.field == "service.edge_entry.ports.mec-0"
    # A port its predecessor still holds is waited for (a redeploy), up to wait_s.
    import socket as _socket

    port = free_port()
    held = _socket.socket()
    held.bind(("127.0.0.1", port))
    held.listen()
    t0 = time.monotonic()
    with pytest.raises(ValidationError):
        bind("127.0.0.1", port, "mec-0", wait_s=1.0)
    assert time.monotonic() - t0 >= 1.0
    threading.Timer(0.5, held.close).start()
    bind("127.0.0.1", port, "mec-0", wait_s=10.0).close()
    with pytest.raises(ValidationError) as e:
        service_hierarchy(parse_service_config(
            {"cluster": "medium", "edge_entry": {"ports": {"region-a": 20000}}}))
    assert e.value.field == "service.edge_entry.ports.region-a"
    for bad in ({"mec-0": 80}, {"mec-0": 20000, "mec-1": 20000}, {"mec-0": "x"}):
        with pytest.raises(ValidationError) as e:
            parse_service_config({"cluster": "medium", "edge_entry": {"ports": bad}})
        assert e.value.field.startswith("service.edge_entry.ports") or "edge_entry" in str(
            e.value)


@pytest.mark.slow
def test_through_serve_one_writer_behind_both_entries(service: str, auth: dict,
                                                      serve_args: dict) -> None:
    """The site replica of a real Serve deployment answers on its own port; mec-0 filled
    through both entries at once never books more than a node holds, and what the entry
    reserved is released through the cloud ingress (the id names the site)."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.serving.conftest import TOKEN as SERVICE_TOKEN

    entry = f"http://127.0.0.1:{serve_args['edge_entry']['ports']['mec-0']}"
    assert wait_healthy(entry, 60)
    spec = load_cluster("medium")
    cap = {n.name: n.cpu_milli for n in spec.nodes if n.zone.startswith("mec-0")}
    only_here = {"origin_site": "mec-0", "allowed_regions": ["mec-0"]}

    def one(i: int) -> dict:
        pod = _pod(cpu_milli=3000, **only_here)
        base = entry if i % 2 else service
        r = _post(base, {"pod": pod, "ttl_s": 600}, token=SERVICE_TOKEN)
        assert r.status_code == 200, r.text
        return r.json()["placements"][0]

    n = sum(cap.values()) // 3000 + 8  # more than the site holds
    with ThreadPoolExecutor(16) as ex:
        placed = [p for p in ex.map(one, range(n)) if p["placed"]]
    booked: dict[str, int] = {}
    for p in placed:
        assert p["site"] == "mec-0"
        booked[p["node"]] = booked.get(p["node"], 0) + 3000
    assert all(booked[node] <= cap[node] for node in booked)
    slots = sum(c // 3000 for c in cap.values())
    # It filled, and no more (other tests' small pods at mec-0 may take a few slots).
    assert slots - 4 <= len(placed) <= slots
    for p in placed:  # give the room back, through the cloud ingress
        r = requests.delete(f"{service}/v1/reservations/{p['reservation_id']}",
                            headers=auth, timeout=10)
        assert r.status_code == 200, r.text


@pytest.mark.slow
def test_the_site_answers_on_its_own_entry_while_the_cloud_ingress_is_down(
        service: str, serve_args: dict) -> None:
    """Issue 22's autonomy with the cloud itself gone: the cloud ingress's replica killed,
    mec-0's entry still places (its replica is up); the ingress comes back after."""
    import ray

    from tests.serving.conftest import TOKEN as SERVICE_TOKEN

    entry = f"http://127.0.0.1:{serve_args['edge_entry']['ports']['mec-0']}"
    assert wait_healthy(entry, 60)
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if "#cloud#" in a["name"]]
    assert len(names) == 1
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=False)
    try:  # the cloud is down now: its replica is gone until Serve starts another
        cloud_up = requests.get(f"{service}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        cloud_up = False
    assert not cloud_up
    r = _post(entry, {"pod": _pod(), "ttl_s": 5}, token=SERVICE_TOKEN)
    assert r.status_code == 200, r.text
    p = r.json()["placements"][0]
    assert p["placed"] and p["site"] == "mec-0"
    assert wait_healthy(service, 120)  # Serve restarts the ingress for the other tests
