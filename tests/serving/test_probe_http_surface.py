"""A hostile probe of the placement service's HTTP surface: what headers and live reloads
still got wrong. Driven over ASGI against the cloud ingress's app, with an in-process
stand-in for the ingress (the real ``Authorizer`` and, for reloads, a real site): no Ray.

Found against ``smartsched serve`` (medium cluster, tokens, models_dir):

- a JSON body sent without a Content-Type (``requests.post(data=json.dumps(...))``) was a
  422 saying the body is not an object: FastAPI's strict Content-Type default, against
  the documented "read as JSON";
- a body with ``Content-Encoding: gzip`` was a 400 "not parseable as JSON" (and a plain
  body labelled gzip was placed); two Content-Type headers were read differently by the
  media-type check (the last) and FastAPI (the first); two Authorization headers: the
  first counted, whatever the second said;
- a reload naming a symlink loop in the models_dir was a 500; ``sandboxed:fgd`` (the
  documented example) was refused live as "unknown scheduler 'fgd'"; a reload error
  named the field ``scheduler`` or a file path split at its dots, and for a name with a
  colon or one ``repr`` escapes it published the server's models_dir;
- with ``service.preemption``, two requests' gangs under one gang id (the shared token's
  clients share the namespace) were evicted as one gang: a pod that needed one member's
  room preempted both requests.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from smartsched.model.errors import ValidationError
from smartsched.model.presets import load_cluster
from smartsched.serving import replica
from smartsched.serving.app import Authorizer, app_api
from smartsched.serving.audit_trail import Trail
from smartsched.serving.config import Credentials, resolve_reload_profile
from smartsched.serving.hierarchy import Hierarchy
from smartsched.serving.metrics import ServiceMetrics
from smartsched.serving.schemas import PlacementResponse
from smartsched.serving.tiers import SiteTier

CLIENT = "probe-client-token-0123456789"
OPERATOR = "probe-operator-token-0123456789"
BODY = json.dumps({"pod": {"id": "p", "cpu_milli": 100, "memory_mib": 64}}).encode()


class Handle:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    async def remote(self, *args: Any) -> Any:
        return self.fn(*args)


class FakeIngress(Authorizer):
    """What the routes and middlewares ask of the ingress; ``place`` records the pods."""

    def __init__(self, models_dir: str | None = None, site: Any = None) -> None:
        from types import SimpleNamespace

        self.creds = Credentials(CLIENT, OPERATOR)
        self.trail = Trail(None)
        self.metrics = ServiceMetrics()
        self.cfg = SimpleNamespace(max_body_bytes=1 << 20, models_dir=models_dir,
                                   max_body_reads_per_credential=1024,
                                   max_body_reads_per_address=256,
                                   default_ttl_s=60.0)
        self.sites = {} if site is None else {"region-a": site}
        self.placed: list[Any] = []

    async def place(self, specs: list, ttl_s: float, rid: str | None,
                    validate: bool = False, who: Any = None) -> PlacementResponse:
        self.placed.extend(specs)
        return PlacementResponse(request_id=rid, placements=[])


def call_raw(ing: Any, method: str, path: str, body: bytes = b"",
             headers: list[tuple[str, str]] = (), host: str = "t",
             receive_body: Any = None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, raw body) of one request through the app's whole stack.
    ``receive_body``: an ASGI receive of the client's own making (a body that trickles),
    instead of ``body`` in one message."""
    raw = [(b"host", host.encode())]
    if not any(k.lower() == "transfer-encoding" for k, _ in headers):  # (a chunked body
        raw.append((b"content-length", str(len(body)).encode()))  # declares no length)
    raw += [(k.lower().encode(), v.encode("latin-1")) for k, v in headers]
    name, _, port = host.partition(":")
    path, _, query = path.partition("?")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": query.encode(), "headers": raw,
             "client": ("127.0.0.1", 1), "server": (name, int(port or 80))}
    msgs = [{"type": "http.request", "body": body, "more_body": False}]
    out: list[dict] = []

    async def receive() -> dict:
        if receive_body is not None:
            return await receive_body()
        return msgs.pop(0) if msgs else {"type": "http.disconnect"}

    async def send(m: dict) -> None:
        out.append(m)

    before = replica.current()
    replica.set_current(ing)
    try:
        asyncio.run(asyncio.wait_for(app_api(scope, receive, send), 30))
    finally:
        replica.set_current(before)
    got = {k.decode().lower(): v.decode() for k, v in out[0].get("headers", [])}
    return out[0]["status"], got, b"".join(m.get("body", b"") for m in out[1:])


def call(ing: Any, method: str, path: str, body: bytes = b"",
         headers: list[tuple[str, str]] = ()) -> tuple[int, dict, Any]:
    status, got, text = call_raw(ing, method, path, body, headers)
    return status, got, json.loads(text)


def _auth(token: str = CLIENT) -> tuple[str, str]:
    return ("Authorization", f"Bearer {token}")


def test_a_json_body_without_a_content_type_is_read_as_json() -> None:
    """Before: 422 ``body``: "Input should be a valid dictionary" (the body is one)."""
    for headers in ([_auth()], [_auth(), ("Content-Type", "")]):
        ing = FakeIngress()
        status, _, body = call(ing, "POST", "/v1/placements", BODY, headers)
        assert status == 200, body
        assert [p.id for p in ing.placed] == ["p"]


def test_a_body_with_a_content_encoding_is_a_415_naming_it() -> None:
    """Before: gzip was a 400 "not parseable as JSON", and a plain body labelled gzip (or
    any other coding) was placed as if it had been decoded."""
    json_type = ("Content-Type", "application/json")
    for coding, data in (("gzip", gzip.compress(BODY)), ("gzip", BODY), ("br", BODY),
                         ("identity, gzip", BODY)):
        ing = FakeIngress()
        status, headers, body = call(ing, "POST", "/v1/placements", data,
                                     [_auth(), json_type, ("Content-Encoding", coding)])
        assert status == 415, (coding, body)
        assert body["detail"][0]["loc"] == ["headers", "content-encoding"]
        assert headers["accept-encoding"] == "identity"
        assert ing.placed == []
    ing = FakeIngress()  # identity is no encoding
    assert call(ing, "POST", "/v1/placements", BODY,
                [_auth(), json_type, ("Content-Encoding", "identity")])[0] == 200
    # Without the token the answer is still about the token.
    assert call(FakeIngress(), "POST", "/v1/placements", BODY,
                [json_type, ("Content-Encoding", "gzip")])[0] == 401


def test_two_content_types_or_two_authorizations_are_a_400_naming_the_header() -> None:
    """Before: text/plain then application/json was FastAPI's 422 about a "valid
    dictionary" (the check read the last, FastAPI the first), the other order a 415; a
    good token then a wrong one was placed (the first counted)."""
    types = [("Content-Type", "text/plain"), ("Content-Type", "application/json")]
    for order in (types, types[::-1]):
        ing = FakeIngress()
        status, _, body = call(ing, "POST", "/v1/placements", BODY, [_auth(), *order])
        assert status == 400, body
        assert body["detail"][0]["loc"] == ["headers", "content-type"]
        assert ing.placed == []
    json_type = ("Content-Type", "application/json")
    for tokens in ((CLIENT, "wrong"), ("wrong", CLIENT), (CLIENT, CLIENT)):
        ing = FakeIngress()
        status, _, body = call(ing, "POST", "/v1/placements", BODY,
                               [_auth(tokens[0]), _auth(tokens[1]), json_type])
        assert status == 400, (tokens, body)
        assert body["detail"][0]["loc"] == ["headers", "authorization"]
        assert CLIENT not in json.dumps(body) and ing.placed == []
    # One of each is as before.
    assert call(FakeIngress(), "POST", "/v1/placements", BODY, [_auth(), json_type])[0] == 200


def test_a_symlink_loop_in_the_models_dir_is_a_422_not_a_500(tmp_path: Path) -> None:
    """Before: Path.resolve raises RuntimeError for a loop (Python < 3.13), past the
    except clause: the ingress answered 500."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for profile in ("loop", "rl:loop/x", "sandboxed:fgd?config=loop/x.yaml"):
        with pytest.raises(ValidationError) as e:
            resolve_reload_profile(profile, str(tmp_path))
        assert e.value.field == "profile", profile


def test_a_wrappers_packaged_base_reloads_live(tmp_path: Path) -> None:
    """Before: ``sandboxed:fgd`` was resolved to ``sandboxed:<models_dir>/fgd`` and
    refused: "unknown scheduler 'fgd'". A base that names a file is still held to the
    models_dir, and ``rl:``'s rest is a path as ever."""
    root = str(tmp_path)
    assert resolve_reload_profile("sandboxed:fgd", root) == "sandboxed:fgd"
    assert resolve_reload_profile("lookahead:fgd", root) == "lookahead:fgd"
    assert resolve_reload_profile("sandboxed:rl:p", root) == \
        f"sandboxed:rl:{tmp_path.resolve() / 'p'}"
    assert resolve_reload_profile("rl:fgd", root) == f"rl:{tmp_path.resolve() / 'fgd'}"
    for outside in ("sandboxed:rl:../x", "sandboxed:/etc/x.yaml", "lookahead:rl:/etc"):
        with pytest.raises(Exception, match="inside the service's models_dir"):
            resolve_reload_profile(outside, root)
    tier = SiteTier(Hierarchy.from_spec(load_cluster("medium")), "region-a", "k8s-default")
    ing = FakeIngress(root, site=_site_handles(tier))
    status, _, body = call(ing, "PUT", "/v1/admin/sites/region-a/profile",
                           json.dumps({"profile": "sandboxed:fgd"}).encode(),
                           [_auth(OPERATOR), ("Content-Type", "application/json")])
    assert status == 200, body
    assert body["profile"] == "sandboxed:fgd" and tier.placer.profile == "sandboxed:fgd"


def _site_handles(tier: SiteTier) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(set_profile=Handle(tier.set_profile))


@pytest.mark.parametrize("profile", [
    "\u202e",  # repr escapes it: the site's rewriting missed the path
    "sandboxed:x y:z",  # a colon in the path: the site split it at the wrong one
    "sandboxed:rl:nope",
    "{root}/odd.yaml",  # its own field was the file's path, split at the dots
    "{root}/nope",  # named ``scheduler``
    "odd.yaml",
])
def test_a_refused_reload_names_profile_and_never_the_models_dir(tmp_path: Path,
                                                                 profile: str) -> None:
    models = tmp_path / "models-secret-dir"
    models.mkdir()
    (models / "odd.yaml").write_text("plugins: 5\n")
    profile = profile.format(root=models)
    tier = SiteTier(Hierarchy.from_spec(load_cluster("medium")), "region-a", "k8s-default")
    ing = FakeIngress(str(models), site=_site_handles(tier))
    status, _, body = call(ing, "PUT", "/v1/admin/sites/region-a/profile",
                           json.dumps({"profile": profile}).encode(),
                           [_auth(OPERATOR), ("Content-Type", "application/json")])
    assert status in (404, 422), body
    (detail,) = body["detail"]
    # (An RTL override is refused by the body's own schema since probe round 5.)
    assert detail["loc"] in (["profile"], ["body", "profile"]), body
    if not profile.startswith(str(models)):  # the operator did not name it: not shown
        assert "models-secret-dir" not in json.dumps(body), body
    assert tier.placer.profile == "k8s-default"


def test_one_gang_id_booked_by_two_requests_is_not_preempted_as_one_gang() -> None:
    """Before: ``high`` (2000m) preempted both reservations, four pods of two requests,
    because the twin evicts a victim's gang whole and both gangs were called ``g``."""
    from smartsched.model.pod import Pod
    from smartsched.serving.site import SitePlacer
    from tests.builders import cluster, node

    def pod(pid: str, priority: int, gang: str | None = None) -> Pod:
        return Pod(id=pid, cpu_milli=2000, memory_mib=64, priority=priority, gang_id=gang,
                   gang_size=2 if gang else 1)

    site = SitePlacer(cluster(node("n1", cpu=4000, mem=65536),
                              node("n2", cpu=4000, mem=65536)), "k8s-default", preemption=True)
    a = site.place([pod("a0", 100, "g"), pod("a1", 100, "g")], 500, "rA")
    b = site.place([pod("b0", 100, "g"), pod("b1", 100, "g")], 500, "rB")
    assert all(r.placed for r in a + b)
    high = site.place([pod("high", 1000)], 500, "rH")[0]
    assert not high.placed and high.preempted == ()
    assert "several requests" in high.reason
    assert set(site.reservations) == {a[0].reservation_id, b[0].reservation_id}
    assert site.place([pod("a0", 100, "g"), pod("a1", 100, "g")], 500, "rA") == a
    # Gangs of their own ids: one is preempted whole, the other stays (as before).
    site = SitePlacer(cluster(node("n1", cpu=4000, mem=65536),
                              node("n2", cpu=4000, mem=65536)), "k8s-default", preemption=True)
    a = site.place([pod("a0", 100, "g"), pod("a1", 100, "g")], 500, "rA")
    b = site.place([pod("b0", 100, "h"), pod("b1", 100, "h")], 500, "rB")
    high = site.place([pod("high", 1000)], 500, "rH")[0]
    assert high.placed and len(high.preempted) == 1 and len(site.reservations) == 2
