"""A body that is not JSON, sent to a route that reads JSON: a 415 naming the media type
the route takes (it was a 422 about a "valid dictionary"), the body never echoed. Driven
over ASGI against the cloud ingress's app (no Ray: its routes answer 503 without an
ingress, which shows the request got past the media-type check)."""

from __future__ import annotations

import asyncio
import json

import pytest

from smartsched.serving.app import app_api

SECRET = "do-not-echo-7f3a"


def _call(method: str, path: str, body: bytes = b"", content_type: str | None = None,
          chunked: bool = False) -> tuple[int, dict, bytes]:
    headers = [(b"host", b"testserver")]
    if content_type is not None:
        headers.append((b"content-type", content_type.encode("latin-1")))
    if chunked:
        headers.append((b"transfer-encoding", b"chunked"))
    else:
        headers.append((b"content-length", str(len(body)).encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": b"", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("testserver", 80)}
    msgs = [{"type": "http.request", "body": body, "more_body": False}]
    read = []

    async def receive() -> dict:
        if msgs:
            read.append(True)
            return msgs.pop(0)
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    out: list[dict] = []

    async def send(m: dict) -> None:
        out.append(m)

    asyncio.run(app_api(scope, receive, send))
    start = out[0]
    got = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
    got["_read"] = bool(read)
    return start["status"], got, b"".join(m.get("body", b"") for m in out[1:])


BODY = json.dumps({"pod": {"id": SECRET, "cpu_milli": 100, "memory_mib": 64}}).encode()


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/placements"), ("POST", "/v1/placements:batch"), ("PUT", "/v1/nodes"),
    ("PUT", "/v1/admin/sites/region-a/profile")])
@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded",
                                   "application/xml", "text/json", "\u00e9/\u00ff"])
def test_a_body_that_is_not_json_is_a_415_naming_the_media_type(method: str, path: str,
                                                                  ctype: str | None) -> None:
    status, headers, body = _call(method, path, BODY, ctype)
    assert status == 415, body
    detail = json.loads(body)["detail"]
    assert detail[0]["loc"] == ["headers", "content-type"]
    assert "application/json" in detail[0]["msg"]
    assert SECRET.encode() not in body and b"valid dictionary" not in body
    assert not headers["_read"]  # answered without reading the body
    if method == "POST":
        assert headers["accept-post"] == "application/json"
    # Streamed (chunked) the same.
    status, headers, body = _call(method, path, BODY, ctype, chunked=True)
    assert status == 415 and not headers["_read"] and SECRET.encode() not in body


@pytest.mark.parametrize("ctype", ["application/json", "application/json; charset=utf-8",
                                   "Application/JSON", "application/merge-patch+json",
                                   "application/json;charset=UTF-8"])
def test_json_media_types_go_through(ctype: str) -> None:
    from smartsched.serving.app import is_json_media_type

    assert is_json_media_type(ctype.encode())
    status, _, body = _call("POST", "/v1/placements", BODY, ctype)
    assert status == 503, body  # the route ran (no ingress in this process)


def test_routes_without_a_body_and_unknown_routes_are_as_before() -> None:
    # Confirm (POST) and release (DELETE) read no body: a stray one is ignored, as ever.
    assert _call("POST", "/v1/reservations/x~y:confirm", b"hi", "text/plain")[0] == 503
    assert _call("DELETE", "/v1/reservations/x~y", b"hi", "text/plain")[0] == 503
    assert _call("POST", "/v1/no-such-route", b"hi", "text/plain")[0] == 404
    assert _call("GET", "/v1/placements", b"hi", "text/plain")[0] == 405
    # No body at all: not a 415 (the route answers it: here, without an ingress, a 503).
    assert _call("POST", "/v1/placements", b"", "text/plain")[0] == 503
    # JSON without a Content-Type (requests' data=json.dumps(...)): read as JSON, as
    # FastAPI reads it.
    assert _call("POST", "/v1/placements", BODY, None)[0] == 503
    assert _call("POST", "/v1/placements", BODY, "")[0] == 503

    from smartsched.serving.app import is_json_media_type

    assert not is_json_media_type(None) and not is_json_media_type(b"application/jsonx")
