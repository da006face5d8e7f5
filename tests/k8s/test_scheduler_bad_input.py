"""`smartsched k8s scheduler` with bad input: a malformed kubeconfig, an API server nobody
answers at, names that are not Kubernetes names -- one line each, never a traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from smartsched.cli import main
from smartsched.k8s.daemon import api_failure, kube_clients
from smartsched.k8s.names import check_name
from smartsched.model.errors import ValidationError
from tests.k8s.test_scheduler import write_kubeconfig


def _free_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connecting is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scheduler(*args: str) -> object:
    return CliRunner().invoke(main, ["k8s", "scheduler", "--once", *args])


@pytest.mark.parametrize(("text", "says"), [
    ("garbage: [\n", "not valid YAML"),
    ("- 1\n- 2\n", "not a usable kubeconfig"),
    ("garbage: [1]\n", "current-context"),
    ("", "empty"),
])
def test_a_malformed_kubeconfig_is_one_line_exit_2(tmp_path: Path, text: str,
                                                   says: str) -> None:
    kc = tmp_path / "kc"
    kc.write_text(text)
    with pytest.raises(ValidationError) as e:
        kube_clients(str(kc))
    assert e.value.field == "kubeconfig" and says in e.value.message
    r = _scheduler("--kubeconfig", str(kc))
    assert r.exit_code == 2 and r.output.startswith("error: ") and "kubeconfig: " in r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_a_server_that_is_not_a_url_is_named(tmp_path: Path) -> None:
    kc = write_kubeconfig(tmp_path / "kc", "not a url")
    with pytest.raises(ValidationError) as e:
        kube_clients(str(kc))
    assert e.value.field == "kubeconfig" and "http(s) URL" in e.value.message


def test_an_unreachable_api_server_is_one_line_and_a_failure(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    kc = write_kubeconfig(tmp_path / "kc", url)
    r = _scheduler("--kubeconfig", str(kc))
    assert r.exit_code == 1, r.output
    assert r.output.startswith(f"error: cannot reach the Kubernetes API at {url}: ")
    assert "refused" in r.output.lower() and len(r.output.strip().splitlines()) == 1


def test_an_api_server_that_refuses_is_one_line() -> None:
    from kubernetes.client.rest import ApiException

    msg = api_failure(ApiException(status=403, reason="Forbidden"), "https://k:6443")
    assert msg is not None and "answered 403 Forbidden" in msg and "RBAC" in msg
    assert api_failure(RuntimeError("a bug"), "https://k:6443") is None


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--scheduler-name", "", "must not be empty"),
    ("--scheduler-name", "Bad Name!", "not a Kubernetes name"),
    ("--scheduler-name", "a" * 254, "at most 253"),
    ("--lease-namespace", "", "must not be empty"),
    ("--lease-namespace", "Bad NS!", "not a Kubernetes name"),
    ("--lease-namespace", "a.b", "not a Kubernetes name"),
    ("--lease-namespace", "a" * 64, "at most 63"),
    ("--identity", "", "must not be empty"),
    ("--identity", "a b", "not a Kubernetes name"),
])
def test_names_that_go_into_api_paths_are_checked(option: str, value: str, says: str) -> None:
    # No kubeconfig is read: the option fails as the command line is.
    r = _scheduler(option, value)
    assert r.exit_code == 2, r.output
    assert f"'{option}'" in r.output and says in r.output


@pytest.mark.parametrize(("value", "kind"), [
    ("smartsched", "subdomain"), ("my.scheduler-2", "subdomain"), ("kube-system", "label"),
    ("node-1", "identity"), ("Host_0f8e1c2a-7b6d", "identity"), ("a" * 63, "label"),
])
def test_kubernetes_names_pass(value: str, kind: str) -> None:
    assert check_name("--x", value, kind) == value


def test_a_kubeconfig_that_runs_a_command_needs_allow_exec_auth(tmp_path: Path) -> None:
    """A --kubeconfig whose user has an exec credential ran its command while it was
    loaded (the kubernetes client's way): a kubeconfig handed over is code (probe round
    8). It is refused unless --allow-exec-auth says so."""
    import yaml

    flag = tmp_path / "ran"
    kc = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{_free_port()}")
    doc = yaml.safe_load(kc.read_text())
    doc["users"][0]["user"] = {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/sh",
        "args": ["-c", f"touch {flag}; echo '{{\"apiVersion\": "
                 "\"client.authentication.k8s.io/v1\", \"kind\": \"ExecCredential\", "
                 "\"status\": {\"token\": \"t\"}}'"]}}
    kc.write_text(yaml.safe_dump(doc))
    r = _scheduler("--kubeconfig", str(kc))
    assert r.exit_code == 2 and "--allow-exec-auth" in r.output and not flag.exists()
    r = _scheduler("--kubeconfig", str(kc), "--allow-exec-auth")
    assert r.exit_code == 1 and "cannot reach" in r.output  # loaded, the command run
    assert flag.exists()
    flag.unlink()  # a user no context uses is never loaded: its plugin does not count
    doc["users"].append({"name": "unused", "user": doc["users"][0]["user"]})
    doc["users"][0]["user"] = {"token": "t"}
    kc.write_text(yaml.safe_dump(doc))
    r = _scheduler("--kubeconfig", str(kc))
    assert r.exit_code == 1 and "cannot reach" in r.output and not flag.exists(), r.output


def test_a_kubeconfigs_token_file_must_be_a_small_regular_file(tmp_path: Path) -> None:
    import yaml

    kc = write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:1")
    doc = yaml.safe_load(kc.read_text())
    doc["users"][0]["user"] = {"tokenFile": "/dev/zero"}  # the client read it whole
    kc.write_text(yaml.safe_dump(doc))
    with pytest.raises(ValidationError, match="tokenFile '/dev/zero': not a regular file"):
        kube_clients(str(kc))


def test_an_api_answer_nested_too_deep_is_one_line(tmp_path: Path, monkeypatch) -> None:
    """An API server (or proxy) answering JSON nested 30,000 deep gave a RecursionError
    traceback (probe round 8). (A trickling answer is cut by ``read_json_answer`` where the
    scheduler reads lists itself; the client's own reads, the Lease's, are not.)"""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import smartsched.k8s.scheduler as scheduler

    monkeypatch.setattr(scheduler, "API_ANSWER_DEADLINE_S", 1.0)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"[" * 30_000 + b"]" * 30_000)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        kc = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{srv.server_address[1]}")
        t0 = time.monotonic()
        r = _scheduler("--kubeconfig", str(kc))
        assert r.exit_code == 1 and "Traceback" not in r.output, r.output
        assert r.output.startswith("error: the Kubernetes API at ") and \
            len(r.output.strip().splitlines()) == 1, r.output
        assert time.monotonic() - t0 < 20
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_list_answer_is_read_within_its_size_and_time(monkeypatch) -> None:
    """Where the scheduler reads the API's lists itself: an endless body was read whole
    into memory, and a trickle held the pass for ever (probe round 8)."""
    import time

    import smartsched.k8s.scheduler as scheduler

    class Resp:
        def __init__(self, chunk: bytes, every_s: float = 0.0) -> None:
            self.chunk, self.every_s, self.released = chunk, every_s, ""

        def read1(self, n: int, **_: object) -> bytes:
            time.sleep(self.every_s)
            return self.chunk

        def release_conn(self) -> None:
            self.released = "pool"

        def close(self) -> None:
            self.released = "closed"

    monkeypatch.setattr(scheduler, "MAX_API_ANSWER_BYTES", 1 << 20)
    monkeypatch.setattr(scheduler, "API_ANSWER_DEADLINE_S", 0.5)
    big = Resp(b"x" * 65536)
    with pytest.raises(scheduler.ApiAnswerError, match="more than 1,048,576 bytes"):
        scheduler.read_json_answer(big)
    slow = Resp(b" ", every_s=0.1)
    with pytest.raises(scheduler.ApiAnswerError, match=r"within 0\.5 s"):
        scheduler.read_json_answer(slow)
    assert big.released == slow.released == "closed"  # a half-read one is not reused
