"""PrometheusSource against a scripted HTTP server: retries, timeouts, rejected queries."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from smartsched.model.errors import ValidationError
from smartsched.prometheus.source import PrometheusQueryError, PrometheusSource


class Scripted:
    """Answers /api/v1/query with the next scripted (status, body, delay)."""

    def __init__(self, script: list[tuple[int, dict, float]]) -> None:
        self.script, self.calls = list(script), 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.calls += 1
                status, body, delay = owner.script.pop(0) if owner.script else owner.last
                owner.last = (status, body, delay)
                time.sleep(delay)
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.last = script[-1]
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def vector(*pairs: tuple[str, float], t: float = 1000.0) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"node": n}, "value": [t, str(v)]} for n, v in pairs]}}


def test_retries_on_5xx_then_succeeds() -> None:
    s = Scripted([(503, {"status": "error", "error": "busy"}, 0.0),
                  (200, vector(("a", 1.5)), 0.0)])
    try:
        src = PrometheusSource(s.url, ["a"], retries=2, backoff_s=0.01)
        out = src.instant("x")
        assert out[0].value == 1.5 and s.calls == 2
    finally:
        s.close()


def test_a_slow_server_times_out_with_a_clear_error() -> None:
    s = Scripted([(200, vector(("a", 1.0)), 1.5)])
    try:
        src = PrometheusSource(s.url, ["a"], timeout_s=0.3, retries=1, backoff_s=0.01)
        with pytest.raises(PrometheusQueryError, match="timeout") as e:
            src.instant("x")
        assert e.value.attempts == 2
    finally:
        s.close()


def test_rejected_query_is_not_retried_and_names_the_error() -> None:
    s = Scripted([(400, {"status": "error", "errorType": "bad_data",
                         "error": "parse error at char 5"}, 0.0)])
    try:
        src = PrometheusSource(s.url, ["a"], retries=3)
        with pytest.raises(PrometheusQueryError, match="parse error") as e:
            src.instant("sum(")
        assert e.value.attempts == 1 and s.calls == 1
    finally:
        s.close()


def test_stale_samples_keep_the_last_good_value_with_its_age() -> None:
    """The usage read: values land with their measurement time (the freshness series'
    timestamp on the node); an old sample is kept but flagged stale with its real age; a
    node with a value but no freshness sample is not 'measured now'; a node never seen is
    NaN; unknown nodes are listed."""
    now = [1000.0]
    answers: list[tuple[int, dict, float]] = []
    for _ in range(2):  # cpu, mem, gpu queries + one freshness query per selector
        answers += [
            (200, vector(("a", 2.0), ("b", 3.0), ("d", 5.0), ("ghost", 1.0)), 0.0),  # cpu
            (200, vector(("a", 1000.0), ("b", 980.0), t=1000.0), 0.0),  # freshness: no d
            (200, vector(("a", 2 * 1048576.0), ("b", 4 * 1048576.0)), 0.0),  # mem
            (200, vector(("a", 50.0)), 0.0),  # gpu
            (200, vector(("a", 1000.0)), 0.0),  # gpu freshness
        ]
    s = Scripted(answers)
    try:
        src = PrometheusSource(s.url, ["a", "b", "c", "d"], stale_after_s=10,
                               clock=lambda: now[0])
        r = src.read_usage()
        np.testing.assert_allclose(r.values[0], [2000.0, 2.0, 500.0])
        assert r.fresh[0].all() and (r.age_s[0] == 0).all()
        # b: 20 s old -- kept, reported stale with that age (its GPU never reported).
        np.testing.assert_allclose(r.values[1, :2], [3000.0, 4.0])
        assert (r.age_s[1, :2] == 20.0).all() and not r.fresh[1].any()
        assert np.isnan(r.values[2]).all() and (r.age_s[2] == np.inf).all()
        assert np.isnan(r.values[3, 0]) and r.age_s[3, 0] == np.inf  # no freshness sample
        assert r.unknown_nodes == ["ghost"]
        assert set(r.stale_nodes(src.names)) == {"b", "c", "d"}
        now[0] = 1005.0  # the same samples 5 s later: a still fresh, ages grow
        r = src.read_usage()
        assert r.fresh[0].all() and (r.age_s[0] == 5.0).all()
        assert (r.age_s[1, :2] == 25.0).all()
    finally:
        s.close()


def test_a_malformed_url_is_a_query_error_not_a_traceback() -> None:
    with (PrometheusSource("http://:9090", ["a"], retries=0) as src,
          pytest.raises(PrometheusQueryError, match="request")):
        src.instant("up")


def test_bad_settings_are_named() -> None:
    with pytest.raises(ValidationError, match="url"):
        PrometheusSource("localhost:9090", ["a"])
    with pytest.raises(ValidationError, match="expected"):
        PrometheusSource("http://x", ["a", "b"], expected=np.ones((3, 3), bool))
    with pytest.raises(ValidationError, match=r"queries\.gpu"):
        from smartsched.prometheus.source import DEFAULT_QUERIES

        PrometheusSource("http://x", ["a"], queries={k: v for k, v in DEFAULT_QUERIES.items()
                                                    if k != "gpu"})


def test_the_node_label_is_used_in_the_default_queries() -> None:
    seen: list[str] = []

    class Recording(PrometheusSource):
        def instant(self, expr: str, at: float | None = None) -> list:
            seen.append(expr)
            return []

    Recording("http://x", ["a"], node_label="instance").read_usage()
    assert seen and all("by (instance)" in q for q in seen), seen


def test_written_usage_counts_the_current_allocation_as_measured() -> None:
    """LoadAware estimates usage as measured + what was placed since the measurement; a
    reading from Prometheus already includes the pods running now."""
    from smartsched.model.presets import load_cluster
    from smartsched.prometheus.source import UsageReading, write_usage
    from smartsched.twin.state import ClusterState
    from smartsched.workloads.resolve import load_workload

    spec = load_cluster("small")
    st = ClusterState(spec)
    pod = next(p for p in load_workload("mixed", spec, 1, 0) if p.num_gpu == 0)
    req = st.compile(pod)
    st.allocate(0, req, ())
    st.allocate(1, req, ())
    values = np.full((st.num_nodes, 3), np.nan)
    values[0] = (500.0, 100.0, 0.0)  # node 0 measured, node 1 not
    write_usage(st, UsageReading(0.0, values, np.zeros_like(values), np.isfinite(values)))
    np.testing.assert_array_equal(st.usage_allocated[0], st.allocated[0])
    assert (st.usage_allocated[1] == 0).all() and st.usage[0, 0] == 500.0
