"""An unknown reservation id is answered (404) under one field, ``reservation_id`` (the
API's name for it), on every path: the ingress routing it by its site prefix, and a site's
confirm (its lookup, expiry included) and release. It was ``reservation_id`` at the
ingress and ``reservation`` at the sites."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from smartsched.model.errors import UnknownReferenceError
from smartsched.model.pod import Pod
from smartsched.model.presets import load_cluster
from smartsched.serving.hierarchy import Hierarchy
from smartsched.serving.site import SitePlacer, site_subspec
from smartsched.serving.tiers import SiteTier
from tests.serving.test_gang_room import Clock

FIELD = "reservation_id"


@pytest.fixture(scope="module")
def medium() -> Hierarchy:
    return Hierarchy.from_spec(load_cluster("medium"))


def _pod(pid: str, **kw: Any) -> Pod:
    return Pod(id=pid, cpu_milli=500, memory_mib=256, **kw)


def test_a_site_names_the_same_field_on_every_path(medium: Hierarchy) -> None:
    clock = Clock()
    site = SitePlacer(site_subspec(medium.spec, ["region-a"]), "k8s-default", clock=clock)
    for op in (site.confirm, site.release, site._get):
        with pytest.raises(UnknownReferenceError) as e:
            op("no-such-id")
        assert e.value.field == FIELD, op.__name__
    # Another tenant's reservation reads as unknown, under the same field.
    mine = site.place([_pod("bank-pod", tenant="bank")], ttl_s=5)[0]
    for op in (site.confirm, site.release):
        with pytest.raises(UnknownReferenceError) as e:
            op(mine.reservation_id, "retail")
        assert e.value.field == FIELD
    # Expired: confirm looks it up after the sweep; release after it was swept.
    clock.t += 10
    for op in (site.confirm, site.release):
        with pytest.raises(UnknownReferenceError) as e:
            op(mine.reservation_id)
        assert e.value.field == FIELD


def test_the_ingress_answers_every_unknown_id_under_the_same_field(medium: Hierarchy) -> None:
    """Through the cloud ingress's routes (ASGI, the real ``Ingress.site_of``, sites in
    process): a malformed id or an unknown site (the ingress's check) and an unknown id at
    a known site (the site's), for confirm and release alike."""
    from smartsched.serving import replica
    from smartsched.serving.app import Ingress, app_api
    from smartsched.serving.audit_trail import ANONYMOUS, Trail
    from smartsched.serving.metrics import ServiceMetrics

    tier = SiteTier(medium, "region-a", "k8s-default")

    class Handle:
        def __init__(self, fn: Any) -> None:
            self.fn = fn

        async def remote(self, *args: Any) -> Any:
            return self.fn(*args)

    site = SimpleNamespace(confirm=Handle(tier.confirm), release=Handle(tier.release))

    class FakeIngress:
        site_of = Ingress.func_or_class.site_of

        def __init__(self) -> None:
            self.sites = {"region-a": site}
            self.cfg = SimpleNamespace(max_body_bytes=1 << 20, default_ttl_s=60.0,
                                       max_body_reads_per_credential=1024,
                                       max_body_reads_per_address=256)
            self.trail = Trail(None)
            self.metrics = ServiceMetrics()

        def authorize(self, request: Any, role: str = "client") -> None:
            request.state.principal = ANONYMOUS
            return None

    def call(method: str, path: str) -> tuple[int, Any]:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": path,
                 "raw_path": path.encode(), "root_path": "", "query_string": b"",
                 "headers": [(b"host", b"t")], "client": ("127.0.0.1", 1),
                 "server": ("t", 80)}
        out: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(m: dict) -> None:
            out.append(m)

        asyncio.run(app_api(scope, receive, send))
        return out[0]["status"], json.loads(b"".join(m.get("body", b"") for m in out[1:]))

    before = replica.current()
    replica.set_current(FakeIngress())
    try:
        placed = asyncio.run(tier.place([_pod("p")], 60, None))[0]
        assert placed["placed"]
        for rid in ("no-separator", "no-such-site~abc", "region-a~no-such-id"):
            for method, path in (("POST", f"/v1/reservations/{rid}:confirm"),
                                 ("DELETE", f"/v1/reservations/{rid}")):
                status, body = call(method, path)
                assert status == 404, (method, rid, body)
                assert body["detail"][0]["loc"] == [FIELD], (method, rid, body)
        status, body = call("POST", f"/v1/reservations/{placed['reservation_id']}:confirm")
        assert status == 200 and body["confirmed"]
        status, body = call("DELETE", f"/v1/reservations/{placed['reservation_id']}")
        assert status == 200 and body["released"]
        status, body = call("DELETE", f"/v1/reservations/{placed['reservation_id']}")
        assert status == 404 and body["detail"][0]["loc"] == [FIELD]  # released already
    finally:
        replica.set_current(before)
