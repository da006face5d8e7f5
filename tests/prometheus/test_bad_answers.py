"""PrometheusSource against a hostile server: malformed answers are query errors naming the
field (never a KeyError or IndexError traceback), and values that are no measurement are
skipped, named in the reading's errors, with the last good value kept."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

from smartsched.prometheus.source import PrometheusQueryError, PrometheusSource


class Answering:
    """Answers every GET with ``answer(path, query)`` -> (status, raw body bytes)."""

    def __init__(self, answer: Callable[[str, str], tuple[int, bytes]]) -> None:
        self.answer = answer
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                u = urlparse(self.path)
                status, body = owner.answer(u.path, parse_qs(u.query).get("query", [""])[0])
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def ok(data: object) -> bytes:
    return json.dumps({"status": "success", "data": data}).encode()


def vec(*result: object) -> bytes:
    return ok({"resultType": "vector", "result": list(result)})


def mat(*result: object) -> bytes:
    return ok({"resultType": "matrix", "result": list(result)})


MALFORMED = [
    ("instant", ok(None), "'data'"),  # "success" without data was a KeyError
    ("instant", json.dumps({"status": "success"}).encode(), "'data'"),
    ("instant", ok([1, 2]), "'data'"),  # an AttributeError
    ("instant", ok({"resultType": "vector"}), "data.result"),  # a KeyError
    ("instant", ok({"resultType": "vector", "result": 5}), "data.result"),  # a TypeError
    ("instant", vec(7), r"data.result\[0\]"),
    ("instant", vec({"metric": {"node": "a"}}), r"data.result\[0\].value"),  # a KeyError
    ("instant", vec({"metric": {"node": "a"}, "value": "1"}), r"result\[0\].value"),  # Index
    ("instant", vec({"metric": {"node": "a"}, "value": ["x", "1"]}), r"time 'x'"),  # Value
    ("instant", vec({"metric": ["node"], "value": [1, "1"]}), r"result\[0\].metric"),
    ("instant", ok({"resultType": "scalar", "result": [1]}), "data.result"),  # unpacking
    ("range", mat({"metric": {}}), r"result\[0\].values"),  # a KeyError
    ("range", mat({"metric": {}, "values": [[1]]}), r"values\[0\]"),  # an IndexError
    ("range", mat({"metric": {}, "values": [["x", "1"]]}), r"time 'x'"),  # a ValueError
    ("range", mat({"metric": {}, "values": "abc"}), r"result\[0\].values"),  # a TypeError
    ("range", ok({"resultType": "matrix", "result": None}), "data.result"),  # a TypeError
    ("range", vec({"metric": {}, "value": [1, "2"]}), "expected a matrix"),  # a KeyError
]


@pytest.mark.parametrize(("call", "body", "field"), MALFORMED,
                         ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(MALFORMED)])
def test_a_malformed_answer_is_a_query_error_naming_the_field(call: str, body: bytes,
                                                               field: str) -> None:
    s = Answering(lambda path, q: (200, body))
    try:
        with PrometheusSource(s.url, ["a"], retries=0) as src:
            with pytest.raises(PrometheusQueryError, match=field) as e:
                if call == "instant":
                    src.instant("up")
                else:
                    src.range("up", 0.0, 10.0, 1.0)
            assert e.value.reason == "bad_data"
    finally:
        s.close()


def test_a_malformed_answer_keeps_the_last_good_usage() -> None:
    """read_usage reports the broken field and keeps what it had, as for a failed query."""
    now = 1000.0
    broken = [False]

    def answer(path: str, q: str) -> tuple[int, bytes]:
        if broken[0] and "cpu" in q:
            return 200, ok({"resultType": "vector"})
        v = now if "timestamp" in q else 2.0
        return 200, vec({"metric": {"node": "a"}, "value": [now, str(v)]})

    s = Answering(answer)
    try:
        with PrometheusSource(s.url, ["a"], retries=0, clock=lambda: now) as src:
            first = src.read_usage()
            broken[0] = True
            r = src.read_usage()
        np.testing.assert_array_equal(r.values, first.values)
        assert len(r.errors) == 1 and r.errors[0].startswith("cpu:") and "data.result" in \
            r.errors[0]
    finally:
        s.close()


def test_values_that_are_no_measurement_are_skipped_named_and_the_last_good_kept() -> None:
    """Negative, NaN, +Inf, 1e308 (inf once scaled to milli), absurdly over capacity, two
    series for one node, a series without the node label, a measurement time far in the
    future: each was taken as usage (or silently dropped, or lost the last good value, or,
    for the future time, froze the node's value for good); now each is skipped and named."""
    now = [1000.0]
    bad: dict[str, str] = {}  # node -> the cpu value it sends on the second read
    future: set[str] = set()
    names = ["neg", "nan", "inf", "huge", "over", "dup", "later", "good"]

    def answer(path: str, q: str) -> tuple[int, bytes]:
        res = []
        for n in names:
            if "timestamp" in q:  # the freshness selector: when each node was measured
                t = 1e12 if n in future else now[0]
                res.append({"metric": {"node": n}, "value": [now[0], str(t)]})
            else:
                v = bad.get(n, "1.5") if "cpu" in q else "1.5"
                res.append({"metric": {"node": n}, "value": [now[0], v]})
                if n == "dup" and "cpu" in q and bad:
                    res.append({"metric": {"node": n, "pod": "x"}, "value": [now[0], "9"]})
        if "cpu" in q and bad and "timestamp" not in q:
            res.append({"metric": {"instance": "x"}, "value": [now[0], "3"]})
        return 200, vec(*res)

    s = Answering(answer)
    cap = np.full((len(names), 3), 16_000.0)
    try:
        with PrometheusSource(s.url, names, retries=0, capacity=cap,
                              clock=lambda: now[0]) as src:
            first = src.read_usage()
            assert not first.errors and (first.values[:, 0] == 1500.0).all()
            bad.update(neg="-5", nan="NaN", inf="+Inf", huge="1e308", over="1e7",
                       later="2.5", good="2.5")
            future.add("later")
            now[0] = 1010.0
            r = src.read_usage()
            cpu = r.values[:, 0]
            assert cpu[names.index("good")] == 2500.0  # the one good new value lands
            for n in names[:-1]:  # every other keeps its last good value, with its age
                assert cpu[names.index(n)] == 1500.0, n
                assert r.age_s[names.index(n), 0] == 10.0, n
            errors = "\n".join(e for e in r.errors if e.startswith("cpu:"))
            for needle in ("negative: neg (-5000)", "not a finite number: nan (nan), inf (inf)",
                           "not finite in twin units: huge (inf)",
                           "over 100x the node's capacity: over (1e+10)",
                           "several series for one node", "dup (2 series)",
                           "1 series without the 'node' label", "measured in the future",
                           "later ("):
                assert needle in errors, (needle, errors)
            assert not any(e.startswith(("mem:", "gpu:")) for e in r.errors
                           if "future" not in e), r.errors
            # A later good measurement replaces the value once the time is sane again.
            future.clear()
            now[0] = 1020.0
            r = src.read_usage()
            assert r.values[names.index("later"), 0] == 2500.0
    finally:
        s.close()


def test_for_state_bounds_values_by_the_nodes_capacity() -> None:
    from smartsched.model.presets import load_cluster
    from smartsched.model.resources import CPU, GPU, MEM
    from smartsched.twin.state import ClusterState

    st = ClusterState(load_cluster("small"))
    src = PrometheusSource.for_state("http://127.0.0.1:1", st)
    np.testing.assert_array_equal(src.capacity, st.capacity[:, [CPU, MEM, GPU]])
    assert PrometheusSource.for_state("http://127.0.0.1:1", st, reuse=src) is src


class _Streaming:
    """A server whose answer streams: ``size`` bytes of JSON text at once, or one byte every
    ``every_s`` (never ending)."""

    def __init__(self, size: int = 0, every_s: float = 0.0) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                try:
                    self.wfile.write(b'{"status":"success","data":{"x":"')
                    if every_s:
                        for _ in range(1000):
                            self.wfile.write(b"A")
                            self.wfile.flush()
                            time.sleep(every_s)
                    else:
                        for _ in range(size // 65536 + 1):
                            self.wfile.write(b"A" * 65536)
                except OSError:  # the client stopped reading
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_an_answer_past_the_byte_cap_is_refused_not_read_whole(monkeypatch) -> None:
    """A 200 whose body never ends (a URL that is not Prometheus's) was read whole into
    memory: 2 GB and climbing (probe round 8)."""
    import smartsched.prometheus.source as source

    monkeypatch.setattr(source, "MAX_ANSWER_BYTES", 1 << 20)
    srv = _Streaming(size=8 << 20)
    try:
        with PrometheusSource(srv.url, ["a"], timeout_s=2.0) as src, \
                pytest.raises(PrometheusQueryError, match="passed 1,048,576 bytes") as e:
            src.instant("up")
        assert e.value.reason == "too_large" and e.value.attempts == 1
    finally:
        srv.close()


def test_an_answer_that_trickles_is_cut_at_its_deadline() -> None:
    """One byte every few seconds kept each socket read under its timeout and held the
    command for ever (probe round 8)."""
    srv = _Streaming(every_s=0.1)
    try:
        t0 = time.monotonic()
        with PrometheusSource(srv.url, ["a"], timeout_s=0.5, retries=1,
                              backoff_s=0.01) as src, \
                pytest.raises(PrometheusQueryError, match="did not end within 2 s") as e:
            src.instant("up")
        assert e.value.reason == "timeout" and time.monotonic() - t0 < 10
    finally:
        srv.close()


def test_an_answer_that_stalls_or_breaks_midway_is_a_query_error() -> None:
    """Read raw, urllib3's own errors (a read timeout mid-body, a cut connection) escaped
    as themselves and ended a whole usage read (review of round 8's fix)."""
    srv = _Streaming(every_s=3.0)  # the first byte, then nothing for longer than the timeout
    try:
        with PrometheusSource(srv.url, ["a"], timeout_s=0.5, retries=0) as src, \
                pytest.raises(PrometheusQueryError) as e:
            src.instant("up")
        assert e.value.reason == "timeout"
    finally:
        srv.close()
