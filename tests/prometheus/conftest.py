"""A real Prometheus server for the telemetry tests (Debian's ``prometheus`` package).

``make test`` installs the package when it is missing and we are root. Here the
fixture starts the binary on a free loopback port with a generated config that
scrapes the given targets every second, waits until it is ready, and stops it
at the end. Without the binary the tests skip with the install command, except
under CI=true, where they fail: CI must exercise the real server.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from tests.builders import free_port

SCRAPE_S = 1.0


class PrometheusServer:
    """One Prometheus process scraping ``targets`` (host:port) every second."""

    def __init__(self, binary: str, workdir: Path, targets: list[str],
                 rules: list[Path] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        rule_files = []
        for r in rules:  # evaluated every second here instead of the file's interval
            copy = workdir / r.name
            copy.write_text(re.sub(r"(?m)^(\s+interval:) .*$", r"\1 1s", r.read_text()))
            rule_files.append(str(copy))
        cfg = workdir / "prometheus.yml"
        cfg.write_text(
            "global:\n"
            f"  scrape_interval: {SCRAPE_S:.0f}s\n"
            f"  scrape_timeout: {SCRAPE_S:.0f}s\n"
            f"  evaluation_interval: {SCRAPE_S:.0f}s\n"
            f"rule_files: {rule_files!r}\n"
            "scrape_configs:\n"
            "  - job_name: smartsched-twin\n"
            "    static_configs:\n"
            f"      - targets: {targets!r}\n".replace("'", '"'))
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
             "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self._wait_ready(workdir)

    def _wait_ready(self, workdir: Path, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(workdir / 'prometheus.log').read_text()}")
            try:
                if requests.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("prometheus did not become ready in 30 s")

    def wait_for(self, promql: str, timeout: float = 20.0) -> list[dict]:
        """Poll until ``promql`` returns a non-empty vector (the first scrapes landed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = requests.get(self.url + "/api/v1/query", params={"query": promql}, timeout=2)
            res = r.json()["data"]["result"]
            if res:
                return res
            time.sleep(0.25)
        raise AssertionError(f"no data for {promql} within {timeout} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        msg = ("the prometheus binary is not installed: `make test` installs Debian's package "
               "when run as root, or run `apt-get install prometheus`")
        if os.environ.get("CI") == "true":
            pytest.fail(msg + " (required under CI)")
        pytest.skip(msg)
    return binary


@pytest.fixture
def prometheus(prometheus_binary: str, tmp_path: Path
               ) -> Iterator[Callable[..., PrometheusServer]]:
    """Start Prometheus servers scraping the given targets; all stopped afterwards."""
    started: list[PrometheusServer] = []

    def start(targets: list[str], rules: list[Path] = ()) -> PrometheusServer:
        server = PrometheusServer(prometheus_binary, tmp_path / f"prom{len(started)}", targets,
                                  rules)
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()
