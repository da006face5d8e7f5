"""`ray job submit` of a training run to a Ray cluster of two nodes, as the README shows.

A head and a worker are started on this machine with `ray start` (the worker joins
with `--address`), one CPU each, token auth on; the job is the README's command
with a tiny budget. Without `--working-dir`: both nodes run from this machine's
virtualenv, where smartsched is installed (as in the KubeRay image), and two nodes
on one machine share one session directory, where each node's runtime-env agent
unpacks and garbage-collects the same working-dir package: with `--working-dir`
the first job's driver died every time here (a oneMKL "cannot load
libtorch_cpu.so" exit, the agents' logs showing the package created by one and
dropped by the other meanwhile; later jobs ran).
PPO's two env runners cannot both fit on one node: the run's placement report must
show them on both nodes, and the policy is exported.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pids_mentioning(text: str) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if text.encode() in (proc / "cmdline").read_bytes():
                out.append(int(proc.name))
        except OSError:
            continue
    return out


def _stop(root: str) -> None:
    """Stop every process of this cluster (their command lines name its temp dir);
    `ray stop` would also stop the test session's own Ray."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        for pid in _pids_mentioning(root):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while _pids_mentioning(root) and time.monotonic() < deadline:
            time.sleep(0.2)


def _alive_nodes(env: dict[str, str], gcs: str) -> int:
    r = subprocess.run([str(BIN / "ray"), "status", "--address", gcs], env=env,
                       capture_output=True, text=True, timeout=60)
    active = r.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0]
    return active.count("node_")


@pytest.fixture
def two_node_cluster() -> Iterator[tuple[dict[str, str], str]]:
    root = tempfile.mkdtemp(prefix="ss2n-", dir="/tmp")  # short: Ray's socket paths
    token = Path(root) / "token"
    token.write_text(os.urandom(32).hex())
    token.chmod(0o600)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    gcs_port, dash_port = _free_port(), _free_port()
    common = ["--block", "--num-cpus", "1", "--disable-usage-stats",
              "--dashboard-agent-listen-port"]
    logs = [open(Path(root) / f"{n}.log", "w") for n in ("head", "worker")]  # noqa: SIM115
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(
            [str(BIN / "ray"), "start", "--head", "--port", str(gcs_port),
             *common, str(_free_port()), "--temp-dir", f"{root}/rt",
             "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
             "--dashboard-port", str(dash_port)],
            env=env, stdout=logs[0], stderr=subprocess.STDOUT, start_new_session=True))
        gcs = f"127.0.0.1:{gcs_port}"
        deadline = time.monotonic() + 90
        while _alive_nodes(env, gcs) < 1:
            assert time.monotonic() < deadline, (Path(root) / "head.log").read_text()[-2000:]
            time.sleep(1)
        procs.append(subprocess.Popen(
            [str(BIN / "ray"), "start", "--address", gcs, *common, str(_free_port())],
            env=env, stdout=logs[1], stderr=subprocess.STDOUT, start_new_session=True))
        while _alive_nodes(env, gcs) < 2:
            assert time.monotonic() < deadline, (Path(root) / "worker.log").read_text()[-2000:]
            time.sleep(1)
        env["SMARTSCHED_TEST_DASHBOARD"] = f"http://127.0.0.1:{dash_port}"
        yield env, root
    finally:
        # The worker's command line does not name ``root`` (no --temp-dir of its own), so
        # its `ray start --block` is stopped through its own process group as well.
        for p in procs:
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGTERM)
        _stop(root)
        for p in procs:  # reap them; what ignored SIGTERM goes now
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(p.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=5)
        for f in logs:
            f.close()
        shutil.rmtree(root, ignore_errors=True)


def test_ray_job_submit_trains_with_env_runners_on_both_nodes(
        two_node_cluster: tuple[dict[str, str], str]) -> None:
    env, root = two_node_cluster
    out = Path(root) / "out"
    config = Path(root) / "tiny.yaml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "env": {"cluster": "small", "workload": "mixed", "hours": 1, "max_decisions": 40},
        "env_runners": {"num_env_runners": 2, "num_envs_per_env_runner": 2,
                        "rollout_fragment_length": 20},
        "training": {"train_batch_size_per_learner": 80, "minibatch_size": 40,
                     "num_epochs": 1},
        "iterations": 1, "checkpoint_every": 1}))
    r = subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--address", env["SMARTSCHED_TEST_DASHBOARD"],
         "--",
         "smartsched", "train", "--config", str(config), "--output-dir", str(out)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "succeeded" in r.stdout + r.stderr
    placement = json.loads((out / "placement.json").read_text())
    assert placement["cluster_nodes"] == 2
    assert len(placement["env_runners"]) == 2
    assert placement["nodes"] == 2, placement  # one runner per node: sampling spans both
    assert (out / "policy" / "module_weights.pt").is_file()
    assert "2 env runner(s) on 2 node(s)" in r.stdout
