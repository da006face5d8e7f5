"""The /metrics exposition of the twin's telemetry and `smartsched telemetry serve`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from smartsched.model.errors import ValidationError
from smartsched.prometheus.exporter import LiveTwin, TelemetryCollector
from tests.builders import free_port


def test_every_present_column_is_exported_with_its_labels() -> None:
    twin = LiveTwin("small", "mixed", "k8s-default", hours=2, seed=1)
    twin.advance(3600.0)
    ticks = iter([100.0, 101.0, 103.0])
    col = TelemetryCollector(twin.engine, 1, clock=lambda: next(ticks))
    reg = CollectorRegistry()
    reg.register(col)
    generate_latest(reg)  # first scrape: counters start
    text = generate_latest(reg).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    spec = twin.engine.state.spec
    nodes = {x.name: x for x in spec.nodes}
    seen = 0
    for f in families.values():
        if f.name.startswith("smartsched_twin_"):
            continue  # the twin's cluster-level view, below
        for s in f.samples:
            node = nodes[s.labels["node"]]
            assert s.labels["zone"] == node.zone and s.labels["region"]
            seen += 1
    # As many samples as non-NaN cells of the vector (absent instances are not exported).
    with col.lock:
        X = col.synth.sample(twin.engine, 0.0)
    assert seen == int((~np.isnan(X)).sum())
    assert families["node_network_receive_bytes"].type == "counter"
    pending = {s.labels["class"]: s.value for s in families["smartsched_twin_pending_pods"].samples}
    assert sum(pending.values()) == twin.engine.queue_length and "online" in pending
    frag = families["smartsched_twin_gpu_fragmentation_ratio"].samples[0].value
    assert 0.0 <= frag <= 1.0
    sim = families["smartsched_twin_simulated_seconds"].samples[0].value
    assert sim == twin.engine.metrics.snapshot()["time_s"] > 0
    assert families["DCGM_FI_DEV_GPU_UTIL"].type == "gauge"
    gpu = [s for s in families["DCGM_FI_DEV_GPU_UTIL"].samples]
    gpu_nodes = {x.name for x in spec.nodes if x.num_gpu > 0}
    assert {s.labels["node"] for s in gpu} == gpu_nodes
    for s in gpu:
        assert int(s.labels["gpu"]) < nodes[s.labels["node"]].num_gpu
        assert s.labels["device"] == f"nvidia{s.labels['gpu']}"
        assert s.labels["modelName"] == nodes[s.labels["node"]].gpu_model


@pytest.mark.slow
def test_telemetry_serve_command_runs_the_twin_live() -> None:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "smartsched.cli", "telemetry", "serve", "--cluster", "small",
         "--speed", "600", "--hours", "2", "--warm-hours", "0.5", "--port", str(port),
         "--duration", "8"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env)
    try:
        deadline = time.monotonic() + 60
        body = ""
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                body = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                break
            except requests.ConnectionError:
                time.sleep(0.3)
        assert "DCGM_FI_DEV_GPU_UTIL{" in body and 'node="' in body
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "serving 16 nodes" in out and "stopped at simulated" in out


def test_telemetry_serve_names_bad_options() -> None:
    from click.testing import CliRunner

    from smartsched.cli import main

    r = CliRunner().invoke(main, ["telemetry", "serve", "--speed", "0"])
    assert r.exit_code == 2 and "speed" in r.output
    r = CliRunner().invoke(main, ["telemetry", "serve", "--cluster", "nope"])
    assert r.exit_code == 2 and "nope" in r.output
    import socket

    with socket.socket() as busy:  # a port already taken is named, not a traceback
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = CliRunner().invoke(main, ["telemetry", "serve", "--warm-hours", "0.1", "--port",
                                      str(port), "--duration", "1"])
    assert r.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in r.output


@pytest.mark.parametrize("speed", ["1e308", "86401", "0", "-1", "nan", "inf", "-inf"])
def test_an_absurd_speed_is_refused_naming_the_option(speed: str) -> None:
    """--speed 1e308 was accepted: an unpaced twin served under a "1e+308x clock" banner."""
    from click.testing import CliRunner

    from smartsched.cli import main

    r = CliRunner().invoke(main, ["telemetry", "serve", "--speed", speed, "--duration", "1",
                                  "--port", "0"])
    assert r.exit_code == 2 and "'--speed'" in r.output, r.output
    assert "serving" not in r.output
    with pytest.raises(ValidationError, match="speed"):
        LiveTwin("small", "mixed", "k8s-default", speed=float(speed))


def test_live_twin_follows_the_accelerated_clock() -> None:
    wall = [0.0]
    twin = LiveTwin("small", "mixed", "k8s-default", hours=6, seed=2, speed=360.0,
                    clock=lambda: wall[0])
    twin.advance(3600.0)
    sim0 = twin.sim_now
    twin.start()
    try:
        time.sleep(0.5)
        assert twin.sim_now < sim0 + 1800  # the wall clock has not moved: at most one event
        wall[0] = 10.0  # 10 s at 360x: one simulated hour
        deadline = time.monotonic() + 20
        while twin.sim_now < sim0 + 3000 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        assert sim0 + 3000 <= twin.sim_now < sim0 + 3600 + 1800
        assert twin.error is None
    finally:
        twin.stop()


@pytest.mark.parametrize("args", [["--hours", "1e-9"], ["--hours", "0.01", "--speed", "600"],
                                  ["--hours", "nan"], ["--hours", "1e308"]])
def test_a_span_the_twin_would_restart_in_a_loop_is_refused(args: list[str]) -> None:
    """--hours 1e-9 restarted the twin 65 times in 2 s, serving nothing."""
    from click.testing import CliRunner

    from smartsched.cli import main

    r = CliRunner().invoke(main, ["telemetry", "serve", *args, "--duration", "1",
                                  "--port", "0"])
    assert r.exit_code == 2 and "hours" in r.output, r.output
    assert "serving" not in r.output


def test_a_panel_window_past_a_year_is_refused_naming_the_option() -> None:
    from click.testing import CliRunner

    from smartsched.cli import main

    r = CliRunner().invoke(main, ["telemetry", "panel", "--prometheus", "http://127.0.0.1:1",
                                  "--title", "x", "--minutes", "1e308", "--out", "/tmp/x.png"])
    assert r.exit_code == 2 and "'--minutes'" in r.output, r.output


def test_panel_finds_the_shipped_dashboard_from_any_directory_and_checks_the_url_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run away from the repository root, the default dashboard was read relative to the
    working directory ("cannot read infra/grafana/..."), and a non-HTTP Prometheus URL
    was never named because the dashboard was read first (probe round 6b)."""
    from click.testing import CliRunner

    from smartsched.cli import main
    from smartsched.prometheus.panel import default_dashboard

    monkeypatch.chdir(tmp_path)
    assert default_dashboard().is_absolute() and default_dashboard().is_file()
    r = CliRunner().invoke(main, ["telemetry", "panel", "--prometheus", "file:///etc/passwd",
                                  "--out", str(tmp_path / "p.png")])
    assert r.exit_code != 0 and "prometheus.url" in r.output, r.output
    assert "dashboard" not in r.output
    # a real URL with nobody there: the shipped dashboard was found (the panel's query is
    # what fails), not a missing file
    r = CliRunner().invoke(main, ["telemetry", "panel", "--prometheus", "http://127.0.0.1:9",
                                  "--out", str(tmp_path / "p.png")])
    assert r.exit_code != 0 and "cannot read" not in r.output, r.output
    assert "prometheus" in r.output.lower(), r.output
    assert not (tmp_path / "p.png").exists()
