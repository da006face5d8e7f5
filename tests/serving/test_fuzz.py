"""Property-based probes of every endpoint, generated from the OpenAPI document (schemathesis).

A second copy of the service runs beside the session's under its own route prefix and
journal, so whatever the fuzzer books, registers or reloads cannot disturb the other
tests. Each operation gets ``SMARTSCHED_FUZZ_EXAMPLES`` generated requests (valid and
invalid bodies, paths, headers), sent with the operator token so they reach validation;
the property is that none is answered with a server error. A second pass sends the same
kind of requests without a token: every mutating one must be refused (401), whatever
its body.
"""

from __future__ import annotations

import os

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from tests.builders import free_port, wait_healthy  # noqa: E402
from tests.serving.conftest import OPERATOR_TOKEN  # noqa: E402

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("SMARTSCHED_FUZZ_EXAMPLES", "40"))
PREFIX = "/fuzz"


@pytest.fixture(scope="module")
def fuzz_service(service: str, serve_args: dict, tmp_path_factory: pytest.TempPathFactory):
    from ray import serve

    from smartsched.serving.app import build_app

    journal = tmp_path_factory.mktemp("fuzz-journal")
    audit = {**serve_args["audit"], "dir": str(journal / "audit"),  # one writer per log
             "heads": str(journal.parent / "fuzz-audit-heads.jsonl")}
    entry_port = free_port()  # its own mec-0 entry (the session's holds another port)
    serve.run(build_app({**serve_args, "journal_dir": str(journal), "audit": audit,
                         "edge_entry": {"ports": {"mec-0": entry_port}}}),
              name="fuzz", route_prefix=PREFIX)
    url = service + PREFIX
    assert wait_healthy(url)
    assert wait_healthy(f"http://127.0.0.1:{entry_port}")
    yield url, f"http://127.0.0.1:{entry_port}"
    serve.delete("fuzz")


def _operations(url: str, at_least: int) -> list:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    assert len(ops) >= at_least  # every endpoint of the document, reads and writes
    return ops


@pytest.fixture(scope="module")
def operations(fuzz_service: tuple[str, str]) -> list:
    return _operations(fuzz_service[0], 8)


# Hypothesis drives schemathesis's strategies directly (its pytest plugin needs pytest < 9).
_budget = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                   suppress_health_check=list(HealthCheck))
_modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)


def _each(operations: list, check) -> None:
    """Run ``check(case)`` over generated cases of every operation, both modes (an
    operation with nothing to get wrong, e.g. GET /healthz, has no negative cases)."""
    calls = 0
    for op in operations:
        for mode in _modes:
            @_budget
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case) -> None:
                nonlocal calls
                calls += 1
                check(case)

            try:
                run()
            except Unsatisfiable:
                assert not mode.is_positive, op.label
    assert calls >= 4 * len(operations), calls


def test_no_request_is_a_server_error(operations: list, fuzz_service: tuple[str, str]) -> None:
    auth = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    _each(operations, lambda case: case.call_and_validate(
        base_url=fuzz_service[0], headers=auth, checks=[not_a_server_error]))


def _no_mutation_without_a_token(operations: list, base_url: str) -> None:
    def check(case) -> None:
        case.headers = {k: v for k, v in (case.headers or {}).items()
                        if k.lower() != "authorization"}
        response = case.call(base_url=base_url)
        assert response.status_code < 500, response.text[:300]
        if case.method.upper() not in ("GET", "HEAD", "OPTIONS"):
            assert response.status_code == 401, (case.method, case.path, response.status_code)

    _each(operations, check)


def test_no_mutation_without_a_token(operations: list, fuzz_service: tuple[str, str]) -> None:
    _no_mutation_without_a_token(operations, fuzz_service[0])


def test_the_edge_entry_answers_no_server_error_and_nothing_without_a_token(
        fuzz_service: tuple[str, str]) -> None:
    """The MEC site's own entry (issue 22) under the same probes, on its own port."""
    entry = fuzz_service[1]
    ops = _operations(entry, 4)  # healthz, metrics, placements, placements:batch
    auth = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    _each(ops, lambda case: case.call_and_validate(base_url=entry, headers=auth,
                                                   checks=[not_a_server_error]))
    _no_mutation_without_a_token(ops, entry)
