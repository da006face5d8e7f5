"""Round 3 of the hostile probe of the placement service's HTTP surface. Driven over ASGI
against the cloud ingress's app with an in-process stand-in for the ingress (the real
``Authorizer``), and the cloud tier in process: no Ray.

Found against ``smartsched serve`` (medium cluster, generated tokens, loopback):

- a JSON object with a key given twice was read with the last value (``{"pod": {...,
  "cpu_milli": 100, "cpu_milli": 1}}`` placed one millicore; another reader -- a proxy, an
  audit -- keeps the first): now a 400 naming the key;
- ``POST /v1/placements/`` (a trailing slash) was a 307 whose Location was built from the
  request's Host header (``Host: evil.example`` -> ``Location: http://evil.example/...``);
  ``PUT /v1/nodes/`` was let through the authorization as a client call before that
  redirect: now 404s;
- ``HEAD /healthz`` (and every other GET route) was a 405, though RFC 9110 has a server
  support HEAD wherever it supports GET;
- a pod whose ``allowed_regions`` named only an MEC site (``["mec-1"]``), sent without
  ``origin_site`` there, was refused with "no allowed region exists: mec-1": the site
  exists; the reason now says why it is not tried;
- ``NaN`` or ``Infinity`` as ``ttl_s``, ``duration_s`` or ``latency_slo_ms`` were refused
  as out of range ("less than or equal to 86400"): now "a finite number".

Found by ``tests/serving/test_http.py::test_region_restart_recovers_reservations``: a
release sent while region-a's replica restarted reached the dead replica and Ray's
``ActorUnavailableError`` was a bare 500, which the client does not retry: now a 503 with
``Retry-After`` (and neither Ray's message nor the actor id).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from smartsched.model.pod import Pod
from smartsched.model.presets import load_cluster
from smartsched.serving.hierarchy import Hierarchy
from smartsched.serving.tiers import CloudTier, SiteTier
from tests.serving import test_probe_http_surface as surface

CLIENT, OPERATOR = surface.CLIENT, surface.OPERATOR
FakeIngress = surface.FakeIngress


def call(ing: Any, method: str, path: str, body: bytes = b"",
         headers: list[tuple[str, str]] = ()) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, raw body) of one request through the app's whole stack."""
    return surface.call_raw(ing, method, path, body, headers, host="svc.internal:8000")


def _auth(token: str = CLIENT) -> tuple[str, str]:
    return ("Authorization", f"Bearer {token}")


JSON = ("Content-Type", "application/json")


def test_a_key_given_twice_is_a_400_naming_it_and_nothing_is_placed() -> None:
    """Before: 200, the pod placed with the last ``cpu_milli`` (1), whatever the first
    said; two ``pod`` objects: the second placed."""
    bodies = {
        b'{"pod": {"id": "p", "cpu_milli": 100, "memory_mib": 64, "cpu_milli": 1}}':
            "cpu_milli",
        b'{"pod": {"id": "a", "cpu_milli": 1}, "pod": {"id": "b", "cpu_milli": 1}}': "pod",
        b'{"pod": {"id": "p", "cpu_milli": 1, "tenant": "bank", "tenant": "default"}}':
            "tenant",
        b'{"pod": {"id": "p", "cpu_milli": 1, "\\u202e": 1, "\\u202e": 2}}': "<key>",
    }
    for data, key in bodies.items():
        ing = FakeIngress()
        status, _, body = call(ing, "POST", "/v1/placements", data, [_auth(), JSON])
        assert status == 400, (data, body)
        assert json.loads(body)["detail"][0]["loc"] == ["body", key]
        assert b"bank" not in body and ing.placed == []
    batch = b'{"pods": [{"id": "a", "cpu_milli": 1, "id": "b"}]}'
    status, _, body = call(FakeIngress(), "POST", "/v1/placements:batch", batch,
                           [_auth(), JSON])
    assert status == 400 and json.loads(body)["detail"][0]["loc"] == ["body", "id"]
    # The same keys in different objects are not duplicates; one of each is placed.
    ing = FakeIngress()
    ok = b'{"pod": {"id": "p", "cpu_milli": 1, "node_selector": {"id": "x"}}}'
    assert call(ing, "POST", "/v1/placements", ok, [_auth(), JSON])[0] == 200
    assert [p.id for p in ing.placed] == ["p"]
    # Without the token the answer is still about the token (the body is not read).
    dup = b'{"pod": {"id": "a"}, "pod": {"id": "b"}}'
    assert call(FakeIngress(), "POST", "/v1/placements", dup, [JSON])[0] == 401


def test_a_trailing_slash_is_a_404_not_a_redirect_to_the_callers_host() -> None:
    """Before: 307 with ``location: http://evil.example:1/v1/placements`` (the request's
    Host header), and for ``PUT /v1/nodes/`` after a client token passed as enough."""
    body = b'{"pod": {"id": "p", "cpu_milli": 1}}'
    for method, path, token in (("POST", "/v1/placements/", CLIENT),
                                ("POST", "/v1/placements:batch/", CLIENT),
                                ("PUT", "/v1/nodes/", CLIENT),
                                ("GET", "/healthz/", None),
                                ("GET", "/v1/clusters/region-a/summary/", None)):
        ing = FakeIngress()
        headers = [("Host", "evil.example:1"), JSON] + ([_auth(token)] if token else [])
        status, got, _ = call(ing, method, path, body, headers)
        assert status == 404, (method, path, status)
        assert "location" not in got and ing.placed == []


def test_head_is_answered_as_get_without_a_body() -> None:
    """Before: ``HEAD /healthz`` 405 (``allow: GET``)."""
    ing = FakeIngress()
    status, got, body = call(ing, "GET", "/healthz")
    h_status, h_got, h_body = call(ing, "HEAD", "/healthz")
    assert (status, h_status) == (200, 200) and body == b'{"status":"ok"}' and h_body == b""
    assert h_got["content-length"] == got["content-length"]
    # The same rules as GET: an operator route without the token, a route without GET.
    assert call(ing, "HEAD", "/v1/admin/experience")[0] == 401
    assert call(ing, "HEAD", "/v1/admin/experience", headers=[_auth()])[0] == 403
    status, got, body = call(ing, "HEAD", "/v1/placements", headers=[_auth()])
    assert status == 405 and got["allow"] == "POST" and body == b""
    assert call(ing, "HEAD", "/openapi.json")[0] == 200


def test_allowed_regions_naming_only_an_mec_site_says_why_it_is_not_tried() -> None:
    """Before: "no allowed region exists: mec-1", of a site that exists."""
    h = Hierarchy.from_spec(load_cluster("medium"))
    sites = {r: SiteTier(h, r, "k8s-default") for r in h.regions}
    for e in h.edges:
        sites[e] = SiteTier(h, e, "k8s-default", parent=sites[h.parent[e]].place)

    async def free() -> dict[str, dict[str, float]]:
        return {r: sites[r].free() for r in h.regions}

    cloud = CloudTier(h, {r: sites[r].place for r in h.regions},
                      {e: sites[e].place for e in h.edges}, free)
    pod = Pod(id="p", cpu_milli=100, memory_mib=64, allowed_regions=("mec-1",))
    r = asyncio.run(cloud.place([pod], 60, None))[0]
    assert not r["placed"]
    reason = r["reasons"][-1]["reason"]
    assert "exists" not in reason and "only MEC sites (mec-1)" in reason
    assert "origin_site" in reason
    # From that site, latency-bound, it is placed there.
    pod = Pod(id="q", cpu_milli=100, memory_mib=64, allowed_regions=("mec-1",),
              origin_site="mec-1", latency_slo_ms=5.0)
    r = asyncio.run(cloud.place([pod], 60, None))[0]
    assert r["placed"] and r["site"] == "mec-1"


def test_nan_and_infinity_are_refused_as_not_finite_not_as_out_of_range() -> None:
    """Before: ``"ttl_s": NaN`` was a 422 "less than or equal to 86400", ``-Infinity`` one
    "greater than or equal to 0.001" (NaN is neither); ``1e400`` likewise."""
    pod = '"id": "p", "cpu_milli": 1'
    for data, loc in (
            (f'{{"pod": {{{pod}}}, "ttl_s": NaN}}', ["body", "ttl_s"]),
            (f'{{"pod": {{{pod}}}, "ttl_s": 1e400}}', ["body", "ttl_s"]),
            (f'{{"pod": {{{pod}, "duration_s": NaN}}}}', ["body", "pod", "duration_s"]),
            (f'{{"pod": {{{pod}, "latency_slo_ms": Infinity}}}}',
             ["body", "pod", "latency_slo_ms"])):
        ing = FakeIngress()
        status, _, body = call(ing, "POST", "/v1/placements", data.encode(), [_auth(), JSON])
        assert status == 422, (data, body)
        detail = json.loads(body)["detail"][0]
        assert detail["loc"] == loc and detail["type"] == "finite_number", detail
        assert ing.placed == []
    batch = f'{{"pods": [{{{pod}}}], "ttl_s": -Infinity}}'.encode()
    status, _, body = call(FakeIngress(), "POST", "/v1/placements:batch", batch,
                           [_auth(), JSON])
    assert status == 422 and json.loads(body)["detail"][0]["type"] == "finite_number"


class _DownSite:
    """A site handle whose replica is gone: every call raises what Serve raises then."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Any:
        error = self.error

        class _Method:
            async def remote(self, *args: Any) -> Any:
                raise error

        return _Method()


def test_a_site_whose_replica_is_down_is_a_503_to_retry_not_a_500() -> None:
    """Before: 500 "Internal Server Error" (the client retries 502/503/504 only)."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError
    from ray.serve.exceptions import BackPressureError

    actor = "a6f34bf255ca604e8a88bb5701000000"
    for error in (ActorUnavailableError("Actor is unavailable.", bytes.fromhex(actor)),
                  ActorDiedError(), BackPressureError(num_queued_requests=9,
                                                      max_queued_requests=8)):
        ing = FakeIngress()
        ing.site_of = lambda rid, e=error: (_DownSite(e), rid.partition("~")[2])
        for method, path in (("DELETE", "/v1/reservations/region-a~abc"),
                             ("POST", "/v1/reservations/region-a~abc:confirm")):
            status, got, body = call(ing, method, path, headers=[_auth()])
            assert status == 503, (type(error).__name__, method, body)
            assert got["retry-after"] == "5"
            assert json.loads(body)["detail"][0]["loc"] == ["service"]
            assert actor not in body.decode() and "actor" not in body.decode().lower()


def test_a_body_that_stops_arriving_is_a_408(monkeypatch) -> None:
    """Before: a client that declared more bytes than it sent, or stalled mid-chunk, held
    its request open until the proxy's own limits (70 s and more)."""
    import asyncio

    from smartsched.serving import app as app_module
    from smartsched.serving import replica
    from smartsched.serving.app import app_api

    monkeypatch.setattr(app_module, "BODY_IDLE_TIMEOUT_S", 0.2)
    ing = FakeIngress()
    for declared in (b"100", None):
        headers = [(b"host", b"t"), (b"content-type", b"application/json"),
                   (b"authorization", f"Bearer {CLIENT}".encode())]
        if declared:
            headers.append((b"content-length", declared))
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/v1/placements",
                 "raw_path": b"/v1/placements", "root_path": "", "query_string": b"",
                 "headers": headers, "client": ("127.0.0.1", 1), "server": ("t", 80)}
        first = [{"type": "http.request", "body": b'{"pod": {', "more_body": True}]
        out: list[dict] = []

        async def receive(first: list[dict] = first) -> dict:
            if first:
                return first.pop(0)
            await asyncio.sleep(3600)  # the rest never comes
            return {"type": "http.disconnect"}

        async def send(m: dict, out: list[dict] = out) -> None:
            out.append(m)

        before = replica.current()
        replica.set_current(ing)
        try:
            asyncio.run(asyncio.wait_for(app_api(scope, receive, send), 10))
        finally:
            replica.set_current(before)
        assert out[0]["status"] == 408, out[:1]
        assert json.loads(b"".join(m.get("body", b"") for m in out[1:]))["detail"][0][
            "loc"] == ["body"]
        assert ing.placed == []
