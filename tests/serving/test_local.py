"""`smartsched serve` as an operator starts it: its own Ray, locked down, and private state.

Runs the real command in a subprocess (its own embedded Ray, not the test session's) and
probes it from outside: Ray's servers answer on loopback only and refuse a driver without
Ray's token; the tokens are generated into private files and never printed; the journal
lives in the state directory; `serve reload` works from any directory with the operator
token file.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.builders import free_port, wait_healthy

pytestmark = pytest.mark.slow


def _outward_ip() -> str | None:
    """This machine's address as other hosts see it (None when it only has loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def _connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


_PROCS: dict[str, subprocess.Popen] = {}  # state dir -> its `smartsched serve`


@pytest.fixture(scope="module")
def local_service():
    import shutil
    import tempfile

    # Short enough for Ray's socket paths under <state>/ray (a deeper one gets a temp dir).
    root = Path(tempfile.mkdtemp(prefix="ss-", dir="/tmp"))
    state = root / "s"
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "SMARTSCHED_API", "SMARTSCHED_OPERATOR"))}
    log = root / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "smartsched.cli", "serve", "--cluster", "small",
             "--port", str(port), "--state-dir", str(state)],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    _PROCS[str(state)] = proc
    try:
        if not wait_healthy(url, 180, alive=lambda: proc.poll() is None):
            pytest.fail(f"smartsched serve did not start:\n{log.read_text()[-3000:]}")
        yield url, state, log
    finally:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(root, ignore_errors=True)


def test_tokens_are_private_files_never_printed(local_service) -> None:
    url, state, log = local_service
    printed = log.read_text()
    for name in ("token", "operator_token", "ray_token"):
        f = state / name
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, name
        assert f.read_text().strip() not in printed, name
    assert str(state / "token") in printed  # where to find it is said
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    client, operator = ((state / n).read_text().strip() for n in ("token", "operator_token"))
    assert client != operator
    pod = {"pod": {"id": "p", "cpu_milli": 100, "memory_mib": 64}, "ttl_s": 60}
    r = requests.post(f"{url}/v1/placements", json=pod, timeout=30,
                      headers={"Authorization": f"Bearer {client}"})
    assert r.status_code == 200 and r.json()["placements"][0]["placed"], r.text
    # The reservation is journaled under this instance's state directory, privately.
    journals = list((state / "journal").glob("*.jsonl"))
    assert journals and all(stat.S_IMODE(j.stat().st_mode) == 0o600 for j in journals)


def test_reload_from_any_directory_with_the_operator_token(local_service, tmp_path,
                                                           monkeypatch) -> None:
    from click.testing import CliRunner

    from smartsched.cli import main

    url, state, _ = local_service
    monkeypatch.chdir(tmp_path)  # not the repository root: no serve_apps/ here
    args = ["serve", "reload", "--url", url, "--site", "region-a", "--profile", "fgd"]
    r = CliRunner().invoke(main, [*args, "--operator-token-file", str(state / "token")])
    assert r.exit_code != 0 and "403" in r.output  # the client token cannot reload
    r = CliRunner().invoke(main, [*args, "--operator-token-file",
                                  str(state / "operator_token")])
    assert r.exit_code == 0 and "region-a: now deciding with fgd" in r.output, r.output


def test_the_embedded_ray_listens_on_loopback_and_wants_its_token(local_service) -> None:
    _, state, _ = local_service
    ray_dir = state / "smartsched-ray"
    assert stat.S_IMODE(ray_dir.stat().st_mode) == 0o700  # Ray's own 0777 dir is inside
    port_file = next((ray_dir / "r" / "session_latest").glob("gcs_server_port_*"))
    gcs = int(port_file.read_text().strip())
    assert _connects("127.0.0.1", gcs)
    outward = _outward_ip()
    if outward is not None:  # a machine with only loopback has nothing to check here
        assert not _connects(outward, gcs), f"GCS answers on {outward}:{gcs}"
    # The probe connects to loopback as given (Ray would swap in the outward address).
    probe = ("import ray, ray._private.services as s; s.resolve_ip_for_localhost = lambda h: h;"
             f" ray.init(address='127.0.0.1:{gcs}', log_to_driver=False); print('CONNECTED')")

    def knock(mode: dict) -> subprocess.CompletedProcess:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, **mode}
        return subprocess.run([sys.executable, "-c", probe], env=env, timeout=120,
                              capture_output=True, text=True)

    for mode in ({"RAY_AUTH_MODE": "disabled"},
                 {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "not-the-token-0123456789"}):
        r = knock(mode)
        assert r.returncode != 0 and "CONNECTED" not in r.stdout, mode
        assert "InvalidAuthToken" in r.stderr or "token" in r.stderr.lower(), r.stderr[-500:]
    # With Ray's token the same probe gets in: the refusals above were about the token.
    r = knock({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(state / "ray_token")})
    assert "CONNECTED" in r.stdout, r.stderr[-1000:]


def test_sigterm_stops_the_service_as_ctrl_c_does(local_service) -> None:
    """Last in this module: it stops the service. SIGTERM (a service manager, `kill`, a
    container runtime) used to end it at once with a crash's exit status, skipping Serve's
    shutdown and the learning loop's stop; now it takes the Ctrl-C path, and the embedded
    Ray's processes go with it."""
    import time

    _, state, log = local_service
    proc = _PROCS[str(state)]
    proc.send_signal(signal.SIGTERM)  # the service alone, not its process group
    assert proc.wait(timeout=90) == 0, log.read_text()[-2000:]
    deadline = time.monotonic() + 60
    while True:
        left = subprocess.run(["pgrep", "-f", str(state)], capture_output=True, text=True)
        if not left.stdout.strip() or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not left.stdout.strip(), f"processes of the embedded Ray left: {left.stdout}"
