"""The service fails closed when its audit log stops (issue 19): no decision without its
record, unless the operator chose ``on_failure: continue``."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from smartsched.audit.keys import generate_key
from smartsched.audit.log import AuditWriteError
from smartsched.model.errors import ServiceUnavailableError
from smartsched.serving.app import make_fastapi
from smartsched.serving.audit_trail import CLIENT_PRINCIPAL, Trail
from smartsched.serving.config import Audit


def _trail(tmp_path: Path, on_failure: str) -> Trail:
    key = tmp_path / "audit.key"
    generate_key(key)
    return Trail(Audit(dir=str(tmp_path / "log"), heads=str(tmp_path / "heads.jsonl"),
                       key_file=str(key), fsync=False, on_failure=on_failure))


def _break(trail: Trail) -> None:
    """A full disk under the log: the next block's head cannot be written."""
    def full_disk(*_: object) -> None:
        raise OSError(28, "No space left on device")

    trail.log._make_durable = full_disk  # type: ignore[union-attr,method-assign]
    trail.placements(CLIENT_PRINCIPAL, "r1", [{"pod_id": "p", "placed": True}])
    with pytest.raises(AuditWriteError):
        trail.log.flush()  # type: ignore[union-attr]


@pytest.mark.parametrize("on_failure", ["refuse", "continue"])
def test_a_stopped_log_refuses_decisions_unless_told_to_continue(tmp_path: Path,
                                                                 on_failure: str) -> None:
    trail = _trail(tmp_path, on_failure)
    try:
        trail.guard()  # a working log lets requests through
        _break(trail)
        if on_failure == "refuse":
            with pytest.raises(ServiceUnavailableError, match="audit log stopped"):
                trail.guard()
            with pytest.raises(ServiceUnavailableError):  # and stays refused
                trail.guard()
        else:
            trail.guard()
            trail.placements(CLIENT_PRINCIPAL, "r2", [{"pod_id": "q", "placed": True}])
        assert trail.broken
    finally:
        with contextlib.suppress(OSError):  # a stopped log raises its failure on close
            trail.close()


def test_refused_for_the_service_is_a_503_naming_no_internals() -> None:
    app = make_fastapi()

    @app.post("/boom")
    async def boom() -> None:
        raise ServiceUnavailableError("the audit log stopped after a failed write")

    from tests.builders import asgi_call

    start, body = asgi_call(app, "POST", "/boom")
    assert start["status"] == 503
    assert (b"retry-after", b"60") in start["headers"]
    assert json.loads(body)["detail"][0]["loc"] == ["service"]
