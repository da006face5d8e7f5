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
import re
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


def test_the_proxy_hook_returns_the_body_limit_only_with_a_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import copy

    import uvicorn.config

    import smartsched.listen as listen

    monkeypatch.setattr(uvicorn.config, "HTTP_PROTOCOLS",
                        copy.copy(uvicorn.config.HTTP_PROTOCOLS))

    def classes() -> list[type]:
        return [m.cls for m in listen.guard_serve_proxy()]

    monkeypatch.delenv(listen.PROXY_BODY_LIMIT_ENV, raising=False)
    assert classes() == [listen.AnswerWhenSilent]
    for bad in ("", "0", "-1", "4MB", "1.5", "\u0661\u0662"):  # not a whole number >= 1
        monkeypatch.setenv(listen.PROXY_BODY_LIMIT_ENV, bad)
        assert classes() == [listen.AnswerWhenSilent], bad
    monkeypatch.setenv(listen.PROXY_BODY_LIMIT_ENV, "2048")
    silent, limit = listen.guard_serve_proxy()
    assert silent.cls is listen.AnswerWhenSilent
    assert limit.cls is listen.DeclaredBodyLimit and limit.kwargs == {"limit": 2048}


async def _silent_app(scope: dict, receive, send) -> None:
    """Serve's proxy when the replica it called died: no answer at all."""


async def _failing_app(scope: dict, receive, send) -> None:
    raise RuntimeError("the actor died unexpectedly")


async def _fails_late_app(scope: dict, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    raise RuntimeError("mid-body")


def test_a_request_the_proxy_leaves_unanswered_gets_a_503_to_retry() -> None:
    """A replica that died mid-request: Serve's proxy sent nothing, and uvicorn a bare 500
    that clients do not retry (the probe: 8 of 120 batches when the ingress was killed)."""
    from smartsched.listen import AnswerWhenSilent

    for app in (_silent_app, _failing_app):
        start, body = asgi_call(AnswerWhenSilent(app), "DELETE", "/v1/reservations/r1")
        assert start["status"] == 503, app
        assert (b"retry-after", b"5") in start["headers"]
        assert json.loads(body)["detail"][0]["loc"] == ["service"]
    start, body = asgi_call(AnswerWhenSilent(_ok_app), "GET", "/healthz")
    assert (start["status"], body) == (200, b"ok")
    with pytest.raises(RuntimeError, match="mid-body"):  # an answer begun is not replaced
        asgi_call(AnswerWhenSilent(_fails_late_app), "GET", "/x")


def _head_answer(port: int, head: bytes) -> bytes:
    """What the server answers to ``head`` (no body is ever sent): the status head, and
    the answer's body when it declares one (the server may send the two in separate
    segments, so one ``recv`` is not enough)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head)
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = s.recv(65536)
            if not chunk:
                return got
            got += chunk
        top, _, body = got.partition(b"\r\n\r\n")
        if top.startswith(b"HTTP/1.1 100"):
            return got  # an interim answer has no body, and the final one waits for ours
        length = re.search(rb"(?im)^content-length:\s*(\d+)", top)
        while length is not None and len(body) < int(length.group(1)):
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
        return top + b"\r\n\r\n" + body


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


@pytest.mark.parametrize(("pod", "field"), [
    # looks like tenant "bank" in a log, an audit record, a compliance decision
    ({"id": "p", "tenant": "ba\u200bnk"}, "tenant"),
    ({"id": "p", "tenant": "Bank"}, "tenant"),
    ({"id": "p", "tenant": "b\u0430nk"}, "tenant"),  # a Cyrillic a
    ({"id": "p", "tenant": "bank "}, "tenant"),
    ({"id": "a\u00a0b"}, "id"),  # a no-break space
    ({"id": "a\ufeffb"}, "id"),
    ({"id": "p", "app": "shop\u2060"}, "app"),
    ({"id": "a\u3164b"}, "id"),  # a Hangul filler draws nothing
    ({"id": "a\u2800b"}, "id"),  # the Braille blank
    ({"id": "a\u034fb"}, "id"),  # the combining grapheme joiner
    # selectors hold to the labels' rules (values at most 63 characters)
    ({"id": "p", "node_selector": {"k0": "v" * 15000}}, "node_selector"),
    ({"id": "p", "node_selector": {"k" * 64: "v"}}, "node_selector"),
    ({"id": "p", "gpu_models": ["A" * 254]}, "gpu_models"),
    ({"id": "p", "allowed_regions": ["r" * 254]}, "allowed_regions"),
    ({"id": "p", "origin_site": "m" * 254}, "origin_site"),
])
def test_pod_fields_refuse_lookalikes_and_unbounded_text(pod: dict, field: str) -> None:
    from tests.serving.test_probe_http_surface import FakeIngress, _auth, call

    ing = FakeIngress()
    status, _, body = call(ing, "POST", "/v1/placements", json.dumps({"pod": pod}).encode(),
                           [_auth(), ("Content-Type", "application/json")])
    assert status == 422, body
    assert body["detail"][0]["loc"][:3] == ["body", "pod", field], body
    assert not ing.placed


def test_what_stays_allowed_in_pod_text() -> None:
    from smartsched.serving.schemas import PodSpec

    ok = PodSpec.model_validate({"id": "café-1 a", "tenant": "bank-2.eu_x", "app": "Ω shop",
                                 "node_selector": {"example.com/zone": "a-1",
                                                   "gpu": ""}})
    assert (ok.id, ok.tenant) == ("café-1 a", "bank-2.eu_x")


def test_a_sites_recent_pods_answer_is_bounded_in_bytes() -> None:
    """Each site kept its last 2,000 pods and sent them whole: with long selectors the
    answer passed the 4 MiB Serve allows between replicas, and the operator's experience
    feed was a bare 500. The newest pods that fit are sent, oldest first."""
    from types import SimpleNamespace

    from smartsched.model.pod import Pod
    from smartsched.serving.tiers import SiteTier

    pods = [Pod(id=f"p{i}", cpu_milli=100, memory_mib=64,
                node_selector=tuple((f"k{j}", "v" * 63) for j in range(64)))
            for i in range(2000)]
    tier = SiteTier.__new__(SiteTier)
    tier.placer = SimpleNamespace(recent_pods=lambda n: pods[-n:])
    ans = tier.recent(2000)
    got = ans["pods"]
    assert 0 < len(got) < 2000
    assert ans["omitted"] == 2000 - len(got)  # the cut is said, not silent
    assert len(json.dumps(got)) <= 2 * 1024 * 1024
    assert [d["id"] for d in got] == [p.id for p in pods[-len(got):]]  # the newest, in order
    assert tier.recent(3)["omitted"] == 0
    assert [d["id"] for d in tier.recent(3)["pods"]] == ["p1997", "p1998", "p1999"]
    assert tier.recent(2000, max_bytes=10) == {"pods": [], "omitted": 2000}


def test_the_experience_answer_names_the_sites_whose_window_was_cut() -> None:
    """A site's 2 MiB cut was silent: a learner read a short window as a quiet site."""
    from tests.serving.test_probe_http_surface import OPERATOR, FakeIngress, Handle, call

    site = type("Site", (), {})()
    site.recent = Handle(lambda limit: {"pods": [], "omitted": limit})
    auth = [("Authorization", f"Bearer {OPERATOR}")]
    status, _, body = call(FakeIngress(site=site), "GET", "/v1/admin/experience?limit=7",
                           headers=auth)
    assert status == 200, body
    assert body["omitted"] and set(body["omitted"].values()) == {7}, body
    assert set(body["omitted"]) <= set(body["sites"])
    site.recent = Handle(lambda limit: {"pods": [], "omitted": 0})
    _, _, body = call(FakeIngress(site=site), "GET", "/v1/admin/experience", headers=auth)
    assert body["omitted"] == {}, body


def test_a_hop_too_large_for_grpc_is_a_4xx_and_an_unreachable_one_a_503() -> None:
    import grpc

    from tests.serving.test_probe_http_surface import (
        BODY,
        OPERATOR,
        FakeIngress,
        Handle,
        _auth,
        call,
    )

    def error(code: grpc.StatusCode) -> Exception:
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                    details="Received message larger than max")

    def failing(code: grpc.StatusCode):
        def recent(limit: int) -> dict:
            raise error(code)
        site = type("Site", (), {})()
        site.recent = Handle(recent)
        return site

    auth = [("Authorization", f"Bearer {OPERATOR}")]
    status, _, body = call(FakeIngress(site=failing(grpc.StatusCode.RESOURCE_EXHAUSTED)),
                           "GET", "/v1/admin/experience?limit=5", headers=auth)
    assert status == 422 and body["detail"][0]["loc"] == ["limit"], body
    assert "larger than max" not in json.dumps(body)
    status, headers, body = call(FakeIngress(site=failing(grpc.StatusCode.UNAVAILABLE)),
                                 "GET", "/v1/admin/experience", headers=auth)
    assert status == 503 and headers["retry-after"] == "5", body

    class Ingress(FakeIngress):  # a batch whose share for one site passes 4 MiB
        async def place(self, specs, ttl_s, rid, validate=False, who=None):
            raise error(grpc.StatusCode.RESOURCE_EXHAUSTED)

    status, _, body = call(Ingress(), "POST", "/v1/placements", BODY,
                           [_auth(), ("Content-Type", "application/json")])
    assert status == 413 and body["detail"][0]["loc"] == ["body"], body


@pytest.mark.parametrize("profile", ["fgd?x=1", "composite:{}", "rl:", ":", "nope"])
def test_a_reload_to_a_bad_profile_is_a_422_naming_it(profile: str, tmp_path) -> None:
    """The site and the route exist; the body's value is wrong: 422, not the 404 of a
    missing site (probe round 6)."""
    from smartsched.model.errors import UnknownReferenceError
    from tests.serving.test_probe_http_surface import OPERATOR, FakeIngress, Handle, call

    def set_profile(path: str, shown: str) -> str:  # the site's loader refuses it
        raise UnknownReferenceError("scheduler", "unknown scheduler")

    site = type("Site", (), {})()
    site.set_profile = Handle(set_profile)
    ing = FakeIngress(models_dir=str(tmp_path), site=site)
    ing.trail.guard = lambda: None
    status, _, body = call(ing, "PUT", "/v1/admin/sites/region-a/profile",
                           json.dumps({"profile": profile}).encode(),
                           [("Authorization", f"Bearer {OPERATOR}"),
                            ("Content-Type", "application/json")])
    assert status == 422, body
    assert body["detail"][0]["loc"][-1] == "profile", body


@pytest.mark.parametrize(("headers", "status", "field"), [
    # read as chunked by h11 behind a proxy that trusts Content-Length: smuggling
    ([("Transfer-Encoding", "chunked"), ("Content-Length", "5")], 400, "transfer-encoding"),
    ([("Transfer-Encoding", "gzip, chunked")], 400, "transfer-encoding"),  # read as plain
    ([("Expect", "200-ok")], 417, "expect"),
])
def test_framing_two_readers_could_read_differently_is_refused(
        headers: list, status: int, field: str) -> None:
    from tests.serving.test_probe_http_surface import BODY, FakeIngress, _auth, call_raw

    ing = FakeIngress()
    got, answer, body = call_raw(ing, "POST", "/v1/placements", BODY,
                                 [_auth(), ("Content-Type", "application/json"), *headers])
    assert got == status, body
    assert json.loads(body)["detail"][0]["loc"] == ["headers", field]
    assert answer["connection"] == "close"
    assert not ing.placed


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32", "utf-32-be"])
def test_a_json_body_that_is_not_utf8_is_refused(encoding: str) -> None:
    """Python's JSON reader took UTF-16 and UTF-32 bodies; another reader in front (a WAF,
    an audit tap) would see other bytes than the service placed (RFC 8259: UTF-8)."""
    from tests.serving.test_probe_http_surface import FakeIngress, _auth, call_raw

    body = json.dumps({"pod": {"id": "p", "cpu_milli": 100}}).encode(encoding)
    ing = FakeIngress()
    status, _, answer = call_raw(ing, "POST", "/v1/placements", body,
                                 [_auth(), ("Content-Type", "application/json")])
    assert status == 400 and json.loads(answer)["detail"][0]["loc"] == ["body"], answer
    assert not ing.placed


def test_the_extender_refuses_the_same_framing_and_encodings() -> None:
    from smartsched.k8s.extender import Extender, make_app

    app = make_app(Extender("k8s-default"))
    start, body = asgi_call(app, "POST", "/filter", headers=[
        (b"transfer-encoding", b"chunked"), (b"content-length", b"2")])
    assert start["status"] == 400 and "Transfer-Encoding" in json.loads(body)["Error"]
    start, body = asgi_call(app, "POST", "/filter", headers=[(b"expect", b"200-ok")])
    assert start["status"] == 417
    for encoding in ("utf-16", "utf-32"):  # parsed by Python's reader before
        raw = json.dumps({"Pod": {}, "NodeNames": []}).encode(encoding)
        start, body = asgi_call(app, "POST", "/filter", body=raw, headers=[
            (b"content-type", b"application/json"),
            (b"content-length", str(len(raw)).encode())])
        assert start["status"] == 400 and "UTF-8" in json.loads(body)["Error"], body
    from smartsched.listen import utf16_or_32

    assert utf16_or_32('{"a": 1}'.encode("utf-16")) and utf16_or_32(b'{\x00"\x00')
    assert not utf16_or_32('{"é": "ü"}'.encode()) and not utf16_or_32(b"")


@pytest.mark.slow
def test_a_chunked_body_still_places_through_serves_proxy(service: str, auth: dict) -> None:
    """What the proxy hands the replica for a chunked body is not refused as framing."""
    import requests

    body = json.dumps({"pod": {"id": "chunked-ok", "cpu_milli": 100, "memory_mib": 64}})

    def chunks():
        yield body[:10].encode()
        yield body[10:].encode()

    r = requests.post(f"{service}/v1/placements", data=chunks(), timeout=60,
                      headers={**auth, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text[:300]


def test_a_placement_without_ttl_gets_the_configured_default() -> None:
    """``default_ttl_s`` was checked at start and never used: the request's own default of
    60 s won (the round-6 check of the fixes found it)."""
    from tests.serving.test_probe_http_surface import BODY, FakeIngress, _auth, call_raw

    got: list[float] = []

    class Ingress(FakeIngress):
        async def place(self, specs, ttl_s, rid, validate=False, who=None):
            got.append(ttl_s)
            return await super().place(specs, ttl_s, rid, validate, who)

    ing = Ingress()
    ing.cfg.default_ttl_s = 600.0
    headers = [_auth(), ("Content-Type", "application/json")]
    with_ttl = json.dumps({"pod": {"id": "p", "cpu_milli": 1}, "ttl_s": 5}).encode()
    batch = json.dumps({"pods": [{"id": "p", "cpu_milli": 1}]}).encode()
    assert call_raw(ing, "POST", "/v1/placements", BODY, headers)[0] == 200
    assert call_raw(ing, "POST", "/v1/placements", with_ttl, headers)[0] == 200
    assert call_raw(ing, "POST", "/v1/placements:batch", batch, headers)[0] == 200
    assert got == [600.0, 5.0, 600.0]
