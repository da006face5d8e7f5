"""Prometheus as the resource-use collector (issue 19, part 3), against a real server."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from smartsched.audit.log import AuditLog
from smartsched.audit.store import read_segment, segment_files
from smartsched.audit.usage import audit_usage


def _log_rows(root: Path) -> dict:
    return pa.concat_tables([read_segment(p) for p in segment_files(root / "log")]).to_pydict()


def test_the_prometheus_collector_reads_cadvisor_counters(prometheus, tmp_path: Path) -> None:
    """A real Prometheus scraping cAdvisor-named series for two pods: CPU as a rate in
    millicores (one pod burns half a core), memory in MiB, the namespace as the tenant."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

    from smartsched.prometheus.pod_usage import PrometheusPodUsage
    from tests.builders import free_port

    reg = CollectorRegistry()
    cpu = Counter("container_cpu_usage_seconds", "cpu", ["namespace", "pod", "container",
                                                          "node"], registry=reg)
    mem = Gauge("container_memory_working_set_bytes", "mem",
                ["namespace", "pod", "container", "node"], registry=reg)
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=reg)
    stop = threading.Event()

    def burn() -> None:  # half a core for bank/web-1 (by the clock), none for retail/etl-1
        t0 = last = time.monotonic()
        while not stop.wait(0.1):
            now = time.monotonic()
            cpu.labels("bank", "web-1", "app", "n1").inc(0.5 * (now - last))
            cpu.labels("retail", "etl-1", "app", "n2").inc(0.0)
            last = now
        assert last >= t0

    mem.labels("bank", "web-1", "app", "n1").set(256 * 1048576)
    mem.labels("retail", "etl-1", "app", "n2").set(64 * 1048576)
    t = threading.Thread(target=burn, daemon=True)
    t.start()
    try:
        prom = prometheus([f"127.0.0.1:{port}"])
        prom.wait_for('count_over_time(container_cpu_usage_seconds_total[10s]) >= 9',
                      timeout=40)  # a full window of samples: rate() needs no extrapolation
        col = PrometheusPodUsage(prom.url, rate_window="10s", gpu=False)
        got = {s.pod: s for s in col.sample()}
        assert set(got) == {"bank/web-1", "retail/etl-1"}
        web = got["bank/web-1"]
        assert web.tenant == "bank" and web.node == "n1" and web.memory_mib == 256
        assert 350 <= web.cpu_milli <= 650, web  # 0.5 cores, scrape jitter allowed
        assert got["retail/etl-1"].cpu_milli == 0
        key = Ed25519PrivateKey.generate()
        with AuditLog(tmp_path / "log", tmp_path / "heads.jsonl", key, fsync=False) as log:
            assert audit_usage(log, col) == 2
        rows = _log_rows(tmp_path)
        assert rows["principal"] == ["collector:prometheus"] * 2
        assert sorted(rows["tenant"]) == ["bank", "retail"]
    finally:
        stop.set()
        server.shutdown()


def test_a_failing_prometheus_is_an_error_not_an_empty_sample() -> None:
    from smartsched.prometheus.pod_usage import PrometheusPodUsage
    from smartsched.prometheus.source import PrometheusQueryError
    from tests.builders import free_port

    col = PrometheusPodUsage(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(PrometheusQueryError):
        col.sample()


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-250"])
def test_a_value_that_is_no_usage_is_an_error_naming_the_pod(value: str) -> None:
    """A NaN was written to the audit log as null, a negative as negative use."""
    from smartsched.prometheus.pod_usage import PrometheusPodUsage
    from smartsched.prometheus.source import PrometheusQueryError, PrometheusSource, Sample

    class Fake(PrometheusSource):
        def instant(self, expr: str, at: float | None = None) -> list[Sample]:
            v = float(value) if "cpu" in expr else 1.0
            return [Sample({"namespace": "t", "pod": "p", "node": "n"}, v, 0.0)]

    col = PrometheusPodUsage("http://x", source=Fake("http://x", []))
    with pytest.raises(PrometheusQueryError, match="pod t/p: cpu_milli") as e:
        col.sample()
    assert e.value.reason == "bad_data"
