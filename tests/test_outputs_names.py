"""``outputs`` spells the names of other layers' files (it sits below them): held equal."""

from __future__ import annotations

import json


def test_the_state_names_outputs_refuses_are_the_writers_own() -> None:
    from smartsched import outputs
    from smartsched.audit.store import LOG_ID_FILE, SignedHead
    from smartsched.rl.versions import CANDIDATES, LOG, POINTER, VERSIONS

    assert set(outputs.STORE_FILES) == {POINTER, LOG}
    assert set(outputs.STORE_FOLDERS) == {VERSIONS, CANDIDATES}
    assert outputs.AUDIT_LOG_FILE == LOG_ID_FILE
    from smartsched.audit.store import Head

    head = SignedHead(Head(1, 0, 3, 1.0, b"\0" * 32, b"\0" * 32, b"\0" * 32, b"\0" * 16),
                      "k", b"\0" * 64)
    assert json.loads(head.to_json()).keys() >= outputs.HEAD_FIELDS
