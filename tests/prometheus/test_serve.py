"""The ``telemetry serve`` lifecycle without the CLI: warm start, /metrics while waiting,
the twin's error surfaced, and the port always freed (sleep and clock injected)."""

from __future__ import annotations

import re
import socket
import time

import pytest
import requests

from smartsched.model.errors import ValidationError
from smartsched.prometheus.exporter import LiveTwin
from smartsched.prometheus.serve import (
    ServeSummary,
    TelemetryServer,
    TwinStopped,
    serve_live_twin,
)


def _twin(**kw: float) -> LiveTwin:
    return LiveTwin("small", "mixed", "k8s-default", hours=2, seed=1, speed=600.0, **kw)


def _port(serving_line: str) -> int:
    """The port in "serving ... at http://host:PORT/metrics ..."."""
    m = re.search(r"http://[^:]+:(\d+)/metrics", serving_line)
    assert m, serving_line
    return int(m[1])


def _refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_serves_metrics_until_the_duration_then_frees_the_port() -> None:
    twin = _twin()
    lines: list[str] = []
    now = [0.0]
    scraped: list[str] = []

    def sleep(s: float) -> None:  # each poll: scrape once, then let 0.5 s pass
        scraped.append(requests.get(f"http://127.0.0.1:{_port(lines[0])}/metrics",
                                    timeout=10).text)
        now[0] += s

    summary = serve_live_twin(twin, port=0, warm_hours=0.5, duration=2.0, echo=lines.append,
                              sleep=sleep, clock=lambda: now[0])
    assert len(scraped) == 4  # 2 s of 0.5 s polls
    assert "DCGM_FI_DEV_GPU_UTIL{" in scraped[0] and 'node="' in scraped[0]
    assert lines[0].startswith("serving 16 nodes x ")
    assert lines[0].endswith("/metrics (600x clock, scheduler k8s-default)")
    assert isinstance(summary, ServeSummary) and summary.scrapes == 4
    assert summary.sim_hours >= 0.5 and summary.restarts == 0  # warmed up first
    assert lines[1] == summary.line() and lines[1].startswith("stopped at simulated ")
    assert _refused(_port(lines[0])) and not twin._thread.is_alive()


def test_a_port_in_use_is_named() -> None:
    twin = _twin()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ValidationError, match=f"cannot listen on 127.0.0.1:{port}") as e:
            serve_live_twin(twin, port=port, duration=1.0, echo=lambda _: None)
    assert e.value.field == "port"
    assert twin._thread is None  # never started


def test_the_twins_error_is_surfaced_and_everything_stops() -> None:
    twin = _twin()

    def broken() -> None:
        raise RuntimeError("engine exploded")

    twin._episode = broken  # type: ignore[method-assign]
    lines: list[str] = []
    with pytest.raises(TwinStopped, match="the live twin stopped: engine exploded") as e:
        serve_live_twin(twin, port=0, duration=30.0, echo=lines.append, poll_s=0.01)
    assert isinstance(e.value.__cause__, RuntimeError)
    assert len(lines) == 1  # the address; no summary after a failure
    assert _refused(_port(lines[0]))


def test_ctrl_c_stops_cleanly_with_a_summary() -> None:
    twin = _twin()

    def interrupt(_: float) -> None:
        raise KeyboardInterrupt

    with TelemetryServer(twin, port=0) as server:
        port = server.port
        assert server.url == f"http://127.0.0.1:{port}/metrics"
        assert requests.get(server.url, timeout=10).status_code == 200
        t0 = time.monotonic()
        server.wait(None, sleep=interrupt)  # forever, but for Ctrl-C
        assert time.monotonic() - t0 < 5
    assert _refused(port) and not twin._thread.is_alive()
    assert server.summary().scrapes == 1
