"""Pod files for ``smartsched place``: read and checked before anything is sent, errors
naming the field."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from smartsched.client import pod_specs, read_pod_file
from smartsched.model.errors import ValidationError
from smartsched.serving.schemas import PodSpec
from tests.builders import free_port


def test_one_pod_or_a_list(tmp_path: Path) -> None:
    f = tmp_path / "pod.yaml"
    f.write_text("{id: p0, cpu_milli: 500, class: online, node_selector: {pool: fast}}\n")
    (spec,) = pod_specs(read_pod_file(f))
    assert isinstance(spec, PodSpec) and spec.id == "p0" and spec.pod_class.value == "online"
    assert spec.node_selector == {"pool": "fast"}
    f.write_text("- {id: a, cpu_milli: 1}\n- {id: b, gang_id: g, gang_size: 2}\n")
    assert [p["id"] for p in read_pod_file(f)] == ["a", "b"]
    assert [s.gang_size for s in pod_specs(read_pod_file(f))] == [1, 2]


@pytest.mark.parametrize(("text", "message", "row"), [
    ("{id: [", "not valid YAML", None),
    ("", "no pod", None),
    ("[]\n", "no pod", None),
    ("- {id: a}\n- just-a-name\n", "got str", 1),
    ("7\n", "got int", 0),
])
def test_a_bad_file_names_pod_file(text: str, message: str, row: int | None,
                                   tmp_path: Path) -> None:
    f = tmp_path / "pods.yaml"
    f.write_text(text)
    with pytest.raises(ValidationError, match=message) as e:
        read_pod_file(f)
    assert e.value.field == "pod_file" and e.value.row == row


@pytest.mark.parametrize(("pod", "field"), [
    ({"id": "p", "cpu_milli": -1}, "cpu_milli"),
    ({"id": "p", "node_selector": {"pool": ["fast"]}}, "node_selector.pool"),
    ({"id": "p", "bogus": 1}, "bogus"),
    ({"cpu_milli": 1}, "id"),
    ({"id": "p", "class": "vip"}, "class"),
    # a gang comes whole in one request, and a batch holds at most 1,000 pods
    ({"id": "p", "cpu_milli": 1, "gang_id": "g", "gang_size": 1001}, "gang_size"),
])
def test_an_invalid_pod_names_its_field(pod: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        pod_specs([{"id": "fine"}, pod], source="pods.yaml")
    assert e.value.field == field
    assert e.value.row == 1 and e.value.source == "pods.yaml"  # which pod, which file


def test_a_kubernetes_manifest_is_named_as_one() -> None:
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "c"}]}}
    with pytest.raises(ValidationError, match="Kubernetes manifest") as e:
        pod_specs([manifest])
    assert e.value.field == "pod_file" and e.value.row is None


def test_the_place_command_rejects_bad_files_before_sending(tmp_path: Path) -> None:
    from smartsched.cli import main

    url = f"http://127.0.0.1:{free_port()}"  # nobody listens: nothing may be sent
    f = tmp_path / "pods.yaml"
    for text, line in [("{id: [", "error: pod_file: not valid YAML"),
                       ("{id: p, cpu_milli: -5}\n", "error: cpu_milli: ")]:
        f.write_text(text)
        r = CliRunner().invoke(main, ["place", "--url", url, str(f)])
        assert r.exit_code == 2 and r.output.startswith(line), r.output


@pytest.mark.parametrize("ttl", ["inf", "1e308", "86401"])
def test_the_place_command_bounds_the_ttl_as_the_service_does(tmp_path: Path, ttl: str) -> None:
    """An infinite --ttl was sent, and failed as "error: InvalidJSONError" (JSON has no
    inf); one past a day was refused only by the service."""
    from smartsched.cli import main

    f = tmp_path / "pods.yaml"
    f.write_text("{id: p, cpu_milli: 1000, memory_mib: 1024}\n")
    r = CliRunner().invoke(main, ["place", "--url", f"http://127.0.0.1:{free_port()}",
                                  "--ttl", ttl, str(f)])
    assert r.exit_code == 2 and "Invalid value for '--ttl'" in r.output, r.output


def test_the_client_retries_unavailable_but_not_server_faults() -> None:
    """503 (restarting, overloaded) is worth a retry; a 500 would only fail again, and
    each retry would add load to a service already in trouble."""
    from smartsched.client import PlacementClient, PlacementError
    from tests.builders import serve_json

    answers: list[int] = []
    seen: list[tuple[str, str | None]] = []

    def handle(_method: str, path: str, _body: bytes, headers: Any) -> tuple:
        seen.append((path, headers.get("Authorization")))
        status = answers.pop(0)
        doc = ({"detail": [{"loc": ["x"], "msg": "no"}]} if status >= 400
               else {"site": "a", "profile": "fgd"})
        return status, doc, {"Retry-After": "1"} if status == 429 else None

    server = serve_json(handle)
    try:
        client = PlacementClient(f"http://127.0.0.1:{server.server_port}", "client-token",
                                 operator_token="operator-token")
        answers[:] = [500]
        with pytest.raises(PlacementError) as e:
            client.set_profile("a", "fgd")
        assert e.value.status == 500 and len(seen) == 1
        answers[:] = [503, 502, 200]
        assert client.set_profile("a", "fgd")["profile"] == "fgd"
        assert len(seen) == 4
        # A 429 (a credential's bodies in flight, Retry-After: 1) asks to come back: the
        # client raised it at once (probe round 7); it now waits as asked and retries.
        answers[:] = [429, 200]
        t0 = time.monotonic()
        assert client.set_profile("a", "fgd")["profile"] == "fgd"
        assert len(seen) == 6 and time.monotonic() - t0 >= 0.9
        # Reloads carry the operator token, not the client's.
        assert {auth for _, auth in seen} == {"Bearer operator-token"}
    finally:
        server.shutdown()


def test_a_retried_release_a_list_error_and_a_page_are_answers_not_crashes() -> None:
    """A release retried after a 503 that finds nothing (404) was released by the first
    try; an error body that is JSON but not an object, and a 2xx that is not JSON (a
    proxy's page), are PlacementErrors, not AttributeError / JSONDecodeError."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from smartsched.client import PlacementClient, PlacementError

    script: list[tuple[int, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            status, body = script.pop(0)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_DELETE = do_POST = _answer

        def log_message(self, *_: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = PlacementClient(f"http://127.0.0.1:{server.server_port}", "t")
        script[:] = [(503, b"{}"), (404, b'{"detail": "unknown"}')]
        assert client.release("region-a~r1")["released"] is True
        script[:] = [(404, b'{"detail": [{"loc": ["reservation"], "msg": "unknown"}]}')]
        with pytest.raises(PlacementError) as e:  # a first try's 404 is a real one
            client.release("region-a~r1")
        assert e.value.status == 404
        script[:] = [(400, b'["not", "an", "object"]')]
        with pytest.raises(PlacementError) as e:
            client.confirm("region-a~r1")
        assert e.value.status == 400
        script[:] = [(200, b"<html>proxy</html>")]
        with pytest.raises(PlacementError, match="not JSON"):
            client.confirm("region-a~r1")
    finally:
        server.shutdown()


@pytest.mark.parametrize(("url", "says"), [
    (None, "error: no answer from the placement service at"),  # nobody listens there
    ("notaurl", "error: url: not a service URL"),
    ("http://[::1", "error: url: not a service URL"),
])
def test_an_unreachable_or_malformed_service_url_is_one_line_not_a_traceback(
        tmp_path: Path, url: str | None, says: str) -> None:
    from smartsched.cli import main

    f = tmp_path / "pod.yaml"
    f.write_text("{id: p, cpu_milli: 100}\n")
    r = CliRunner().invoke(main, ["place", "--url", url or f"http://127.0.0.1:{free_port()}",
                                  str(f)])
    assert r.exit_code == 2 and r.output.startswith(says), r.output


def test_a_ttl_too_short_to_confirm_is_refused() -> None:
    from pydantic import ValidationError as Invalid

    from smartsched.serving.schemas import BatchPlacementRequest, PlacementRequest

    pod = {"id": "p", "cpu_milli": 100}
    for ttl in (1e-320, 0.0009):
        with pytest.raises(Invalid, match="ttl_s"):
            PlacementRequest.model_validate({"pod": pod, "ttl_s": ttl})
        with pytest.raises(Invalid, match="ttl_s"):
            BatchPlacementRequest.model_validate({"pods": [pod], "ttl_s": ttl})
    assert PlacementRequest.model_validate({"pod": pod, "ttl_s": 0.001}).ttl_s == 0.001


def test_the_client_leaves_the_ttl_to_the_service_unless_given() -> None:
    """It always sent ttl_s 60, so the service's default_ttl_s never applied."""
    from smartsched.client import PlacementClient

    sent: list[dict] = []
    client = PlacementClient("http://127.0.0.1:9", "client-token")
    client._call = lambda method, path, body=None: (  # type: ignore[method-assign]
        sent.append(body) or {"request_id": body["request_id"], "placements": []})
    client.place({"id": "p", "cpu_milli": 1})
    client.place_batch([{"id": "p", "cpu_milli": 1}])
    client.place({"id": "p", "cpu_milli": 1}, ttl_s=5.0)
    assert ["ttl_s" in b for b in sent] == [False, False, True] and sent[2]["ttl_s"] == 5.0
