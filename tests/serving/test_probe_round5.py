"""Round 5 of the placement service's probe: what round 4 found and left open.

- ``/docs`` and ``/redoc`` were served to anyone: FastAPI's pages load their scripts from
  a public CDN into the browser that holds the operator's token. They are off unless the
  config's ``api_docs`` asks for them; ``/openapi.json`` (what clients are generated from)
  is always served.
"""

from __future__ import annotations

import json

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
