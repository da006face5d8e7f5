"""PrometheusSource: node metrics from a Prometheus server's HTTP API into the twin's arrays.

Owns the path a user takes against their production Prometheus: instant and
range PromQL queries over ``/api/v1/query`` and ``/api/v1/query_range`` (with a
timeout, retries with backoff on connection errors, timeouts and 5xx, and no
retry on a query Prometheus rejects), and the mapping of the answers onto the
cluster's nodes: ``ClusterState.usage`` (CPU milli, memory MiB, GPU milli) and
the wide telemetry vector the policy's reduced features come from.

Usage is never silently zero. Every usage value keeps the time it was measured
(the timestamp of the field's freshness series on that node): a node whose
series is missing (exporter gone, target down, relabelled away) or older than
``stale_after_s`` keeps its last measured value, flagged stale with its age; a
query that fails is reported in the reading and every field it feeds keeps its
values. Nodes never measured are NaN and listed. (``read_vector``, the wide
vector, is a plain read: absent series are NaN, which the projection fills
with the fitted mean.)

The default queries read what SmartSched's exporter serves (the ``node`` label
carries the node name, as a Kubernetes service-discovery relabel usually sets
it); pass other ``queries`` where a cluster's names or labels differ.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.exceptions import ReadTimeoutError

from smartsched.model.errors import SmartSchedError, ValidationError

log = logging.getLogger(__name__)

MIB: Final = 1024.0 * 1024.0
# A node's value above this many times its capacity is no measurement (the twin's own usage
# model reaches at most 40x: a mean of 4 x a burst of 10), and is skipped, named.
MAX_OVER_CAPACITY: Final = 100.0


class PrometheusQueryError(SmartSchedError):
    """A query that did not give an answer: Prometheus unreachable, too slow, or the query
    rejected. ``reason`` is short ("timeout", "connection", "http 503", "bad_data")."""

    def __init__(self, query: str, reason: str, detail: str, attempts: int) -> None:
        self.query, self.reason, self.detail, self.attempts = query, reason, detail, attempts
        super().__init__(f"prometheus query failed ({reason}) after {attempts} attempt(s): "
                         f"{detail} -- query: {query}")

    def __reduce__(self) -> tuple[object, ...]:
        return (PrometheusQueryError, (self.query, self.reason, self.detail, self.attempts))


@dataclass(frozen=True)
class FieldQuery:
    """How one usage field is read: a PromQL expression giving one value per node (by
    ``node_label``), the factor to the twin's units, and a plain selector (with the node
    label) whose sample timestamps tell how fresh the field is. ``freshness=None`` turns
    the staleness check off for the field: values count as measured when evaluated."""

    expr: str
    scale: float
    freshness: str | None


# ``{window}`` is replaced by the source's rate window, ``{node}`` by its node label.
# The twin's usage is what its pods use, so the defaults read the pod-level aggregates
# (in a production cluster the cAdvisor equivalents: ``container_cpu_usage_seconds_total``
# and ``container_memory_working_set_bytes`` summed by node) and DCGM's GPU utilization.
DEFAULT_QUERIES: Final[Mapping[str, FieldQuery]] = {
    "cpu": FieldQuery("sum by ({node}) (rate(smartsched_node_pod_cpu_seconds_total[{window}]))",
                      1000.0, "node_memory_MemTotal_bytes"),
    "mem": FieldQuery("sum by ({node}) (smartsched_node_pod_memory_working_set_bytes)",
                      1.0 / MIB, "node_memory_MemTotal_bytes"),
    "gpu": FieldQuery("sum by ({node}) (DCGM_FI_DEV_GPU_UTIL)", 10.0, "DCGM_FI_DEV_GPU_UTIL"),
}
USAGE_FIELDS: Final = ("cpu", "mem", "gpu")  # the columns of ClusterState.usage


@dataclass
class Sample:
    labels: dict[str, str]
    value: float
    t: float  # the sample's timestamp (evaluation time for computed expressions)


@dataclass
class UsageReading:
    """One read of the usage fields for a cluster's nodes (rows in the cluster's order).

    ``values`` [N, 3] in twin units (last good value where the latest is missing or
    stale; NaN if never measured); ``age_s`` [N, 3] seconds since that value was
    measured (inf if never); ``fresh`` [N, 3] whether it was measured within
    ``stale_after_s``. ``errors`` names each failed query and each value skipped, with why
    (negative, not finite in twin units, absurdly over capacity, measured in the future,
    several series for one node, series without the node label); ``unknown_nodes`` series
    whose node label is not in the cluster."""

    at: float
    values: np.ndarray
    age_s: np.ndarray
    fresh: np.ndarray
    errors: list[str] = field(default_factory=list)
    unknown_nodes: list[str] = field(default_factory=list)

    def stale_nodes(self, names: Sequence[str]) -> dict[str, dict[str, float]]:
        """{node: {field: age}} for every value that is not fresh."""
        out: dict[str, dict[str, float]] = {}
        for i, k in zip(*np.nonzero(~self.fresh), strict=True):
            out.setdefault(names[i], {})[USAGE_FIELDS[k]] = float(self.age_s[i, k])
        return out


class PrometheusSource:
    """Reads node metrics from one Prometheus server.

    Args:
        url: the server, e.g. ``http://prometheus:9090``.
        node_names: the cluster's nodes, in ``ClusterState`` order.
        expected: [N, 3] which usage fields each node has (a CPU-only node has no GPU
            series: its GPU usage is 0, not missing); default all. ``for_state`` sets it.
        capacity: [N, 3] the nodes' capacity in twin units; a value over
            ``MAX_OVER_CAPACITY`` times it is skipped. Default: no bound. ``for_state`` sets it.
        queries: field -> FieldQuery for ``cpu``, ``mem``, ``gpu`` (defaults above).
        node_label: the label that holds the node name.
        timeout_s: per HTTP request; also sent to Prometheus as the query timeout.
        retries: extra attempts on connection errors, timeouts and 5xx answers.
        stale_after_s: a value measured longer ago than this is stale.
        rate_window: the range of ``rate()`` in the default queries (a few scrape intervals).
    """

    def __init__(self, url: str, node_names: Sequence[str], *,
                 expected: np.ndarray | None = None, capacity: np.ndarray | None = None,
                 queries: Mapping[str, FieldQuery] | None = None, node_label: str = "node",
                 timeout_s: float = 2.0, retries: int = 2, backoff_s: float = 0.25,
                 stale_after_s: float = 30.0, rate_window: str = "15s",
                 clock: Any = time.time) -> None:
        import requests

        if not url.startswith(("http://", "https://")):
            raise ValidationError("prometheus.url", f"must be an http(s) URL, got {url!r}")
        if timeout_s <= 0 or retries < 0 or stale_after_s <= 0:
            raise ValidationError("prometheus", "timeout_s and stale_after_s must be > 0, "
                                  "retries >= 0")
        self.url = url.rstrip("/")
        self.names = list(node_names)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.queries = dict(DEFAULT_QUERIES if queries is None else queries)
        missing = [f for f in USAGE_FIELDS if f not in self.queries]
        if missing:
            raise ValidationError(f"prometheus.queries.{missing[0]}", "missing")
        self.node_label = node_label
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.stale_after_s = stale_after_s
        self.rate_window = rate_window
        self.clock = clock
        self.http = requests.Session()
        n = len(self.names)
        shape = (n, len(USAGE_FIELDS))
        self.expected = np.ones(shape, bool) if expected is None else np.asarray(expected, bool)
        if self.expected.shape != shape:
            raise ValidationError("prometheus.expected", f"shape {self.expected.shape}, "
                                  f"needs {shape}")
        self.capacity = None if capacity is None else np.asarray(capacity, float)
        if self.capacity is not None and self.capacity.shape != shape:
            raise ValidationError("prometheus.capacity", f"shape {self.capacity.shape}, "
                                  f"needs {shape}")
        self._last = np.where(self.expected, np.nan, 0.0)
        self._last_t = np.where(self.expected, -np.inf, np.inf)  # absent fields never age
        self.failures = 0  # queries that failed, over the source's life

    @classmethod
    def for_state(cls, url: str, state: Any, reuse: PrometheusSource | None = None,
                  **kw: Any) -> PrometheusSource:
        """A source for a ``ClusterState``'s nodes (names, and which have GPUs). ``reuse``
        is returned when it serves the same nodes, so its last good values carry over
        (a long-running caller re-reads every pass); otherwise it is closed."""
        from smartsched.model.resources import CPU, GPU, MEM

        names = [x.name for x in state.spec.nodes]
        capacity = state.capacity[:, [CPU, MEM, GPU]].astype(float)
        expected = capacity > 0
        if reuse is not None:
            if reuse.names == names and np.array_equal(reuse.expected, expected):
                reuse.capacity = capacity  # a resized node: its bound follows
                return reuse
            reuse.close()
        return cls(url, names, expected=expected, capacity=capacity, **kw)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> PrometheusSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- queries
    def instant(self, expr: str, at: float | None = None) -> list[Sample]:
        """An instant query; one Sample per series."""
        params = {"query": expr, "timeout": f"{max(1, round(self.timeout_s * 1000))}ms"}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params, expr)
        if data.get("resultType") == "scalar":
            t, v = _point(data.get("result"), "data.result", expr)
            return [Sample({}, v, t)]
        if data.get("resultType") != "vector":
            raise PrometheusQueryError(expr, "bad_data", f"expected a vector, got "
                                       f"{data.get('resultType')}", 1)
        out = []
        for i, r in enumerate(_series(data, expr)):
            t, v = _point(r.get("value"), f"data.result[{i}].value", expr)
            out.append(Sample(_labels(r, i, expr), v, t))
        return out

    def range(self, expr: str, start: float, end: float, step_s: float
              ) -> list[tuple[dict[str, str], np.ndarray, np.ndarray]]:
        """A range query; per series (labels, times [T], values [T])."""
        if not (end >= start and step_s > 0):
            raise ValidationError("prometheus.range", "needs end >= start and step > 0")
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                  "step": f"{step_s}", "timeout": f"{max(1, round(self.timeout_s * 1000))}ms"}
        data = self._get("/api/v1/query_range", params, expr)
        if data.get("resultType") != "matrix":
            raise PrometheusQueryError(expr, "bad_data", f"expected a matrix, got "
                                       f"{data.get('resultType')}", 1)
        out = []
        for i, r in enumerate(_series(data, expr)):
            values = r.get("values")
            if not isinstance(values, list):
                raise PrometheusQueryError(expr, "bad_data", f"data.result[{i}].values: not "
                                           "a list of [time, value] pairs", 1)
            if not values:
                continue
            points = [_point(p, f"data.result[{i}].values[{j}]", expr)
                      for j, p in enumerate(values)]
            out.append((_labels(r, i, expr), np.array([t for t, _ in points]),
                        np.array([v for _, v in points])))
        return out

    def _get(self, path: str, params: dict[str, str], expr: str) -> dict[str, Any]:
        import requests

        attempts = 0
        reason, detail = "connection", ""
        while attempts <= self.retries:
            if attempts:
                time.sleep(self.backoff_s * 2 ** (attempts - 1))
            attempts += 1
            try:
                r = self.http.get(self.url + path, params=params, timeout=self.timeout_s,
                                  stream=True)
                text = _bounded_body(r, time.monotonic() + ANSWER_DEADLINE_FACTOR
                                     * self.timeout_s)
            except AnswerTooLarge as e:  # not Prometheus, or a query far too wide
                self.failures += 1
                raise PrometheusQueryError(expr, "too_large", str(e), attempts) from None
            except requests.Timeout as e:
                reason, detail = "timeout", f"no answer within {self.timeout_s} s ({e})"
                continue
            except AnswerTooSlow:
                reason, detail = "timeout", (f"the answer did not end within "
                                             f"{ANSWER_DEADLINE_FACTOR * self.timeout_s:g} s")
                continue
            except ReadTimeoutError as e:  # (read raw: urllib3's own errors, not requests')
                reason, detail = "timeout", f"no answer within {self.timeout_s} s ({e})"
                continue
            except Urllib3Error as e:  # a connection cut mid-answer, a body that is not gzip
                reason, detail = "connection", f"the answer broke off ({_short(e)})"
                continue
            except requests.ConnectionError as e:
                reason, detail = "connection", f"cannot reach {self.url} ({_short(e)})"
                continue
            except requests.RequestException as e:  # a malformed URL, a broken stream
                self.failures += 1
                raise PrometheusQueryError(expr, "request", _short(e), attempts) from None
            body = _json(text)
            if r.status_code >= 500 or r.status_code == 429:
                reason = f"http {r.status_code}"
                detail = body.get("error", text[:200]) if body else text[:200]
                if body.get("errorType") == "timeout":
                    reason = "timeout"
                continue
            if r.status_code != 200 or body.get("status") != "success":
                self.failures += 1
                raise PrometheusQueryError(expr, body.get("errorType", f"http {r.status_code}"),
                                           body.get("error", text[:200]), attempts)
            if not isinstance(body.get("data"), dict):  # "success" without an answer
                self.failures += 1
                raise PrometheusQueryError(expr, "bad_data", "the answer has no 'data' object",
                                           attempts)
            return body["data"]
        self.failures += 1
        raise PrometheusQueryError(expr, reason, detail, attempts)

    # ------------------------------------------------------------- mapping
    def _per_node(self, samples: Sequence[Sample], unknown: set[str],
                  skipped: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Values [N] (NaN where absent) and sample times [N] (-inf where absent) by the node
        label. A node with
        several series is ambiguous (the query must give one per node): NaN, and named in
        ``skipped`` with the series that have no node label."""
        vals = np.full(len(self.names), np.nan)
        ts = np.full(len(self.names), -np.inf)
        seen = np.zeros(len(self.names), int)
        unlabelled = 0
        for s in samples:
            name = s.labels.get(self.node_label)
            if name is None:
                unlabelled += 1
                continue
            i = self.index.get(name)
            if i is None:
                unknown.add(str(name))
                continue
            seen[i] += 1
            vals[i], ts[i] = s.value, s.t  # NaN / inf too: the caller names them
        dup = seen > 1
        vals[dup], ts[dup] = np.nan, -np.inf
        if skipped is not None:
            if dup.any():
                skipped.append(_nodes(f"several series for one node (the query must give one "
                                      f"per {self.node_label!r})", self.names, dup, seen,
                                      "{:.0f} series"))
            if unlabelled:
                skipped.append(f"{unlabelled} series without the {self.node_label!r} label")
        return vals, ts

    def read_usage(self) -> UsageReading:
        """Query every usage field now; keep the last good value where a query fails or a
        node's series is missing or stale."""
        now = float(self.clock())
        errors: list[str] = []
        unknown: set[str] = set()
        fresh_cache: dict[str, np.ndarray] = {}
        for k, name in enumerate(USAGE_FIELDS):
            q = self.queries[name]
            skipped: list[str] = []
            try:
                expr = q.expr.format(window=self.rate_window, node=self.node_label)
                vals, evaluated = self._per_node(self.instant(expr), unknown, skipped)
                if q.freshness is None:  # no selector: the evaluation time (no staleness check)
                    measured = evaluated
                else:
                    if q.freshness not in fresh_cache:
                        fresh_cache[q.freshness] = self._per_node(self.instant(
                            f"max by ({self.node_label}) (timestamp({q.freshness}))"),
                            unknown)[0]
                    measured = fresh_cache[q.freshness]
            except PrometheusQueryError as e:
                errors.append(f"{name}: {e}")
                log.warning("usage field %s not read: %s", name, e)
                continue
            # Values that are no measurement are skipped, named, and the last good value
            # kept: negative, not finite once scaled (1e308 x 1000), absurdly over capacity,
            # or measured in the future (beyond a clock skew of stale_after_s: such a time
            # would let no later measurement replace the value).
            with np.errstate(over="ignore", invalid="ignore"):
                scaled = vals * q.scale
            ok = np.isfinite(vals) & self.expected[:, k]
            sent = np.isfinite(evaluated) & self.expected[:, k]  # a sample, maybe NaN
            checks = [(sent & ~np.isfinite(vals), "not a finite number", "{:g}"),
                      (ok & (scaled < 0), "negative", "{:g}"),
                      (ok & ~np.isfinite(scaled), "not finite in twin units", "{:g}")]
            if self.capacity is not None:
                with np.errstate(invalid="ignore"):
                    over = scaled > MAX_OVER_CAPACITY * self.capacity[:, k]
                checks.append((ok & np.isfinite(scaled) & over,
                               f"over {MAX_OVER_CAPACITY:g}x the node's capacity", "{:g}"))
            values_bad = np.zeros(len(self.names), bool)
            for bad, why, fmt in checks:
                if bad.any():
                    skipped.append(_nodes(why, self.names, bad, scaled, fmt))
                    values_bad |= bad
            future = ok & np.isfinite(measured) & (measured > now + self.stale_after_s)
            if future.any():
                skipped.append(_nodes("measured in the future (s ahead of now)", self.names,
                                      future, measured - now, "{:.3g}"))
            for why in skipped:
                errors.append(f"{name}: skipped {why}")
                log.warning("usage field %s: skipped %s", name, why)
            # A value lands only with a known measurement time newer than the one kept: a
            # node without a freshness sample is not "measured now", and a stale sample
            # still replaces an older one (it is then reported stale with its real age).
            newer = ok & ~values_bad & ~future & np.isfinite(measured)
            newer &= measured > self._last_t[:, k]
            self._last[newer, k] = scaled[newer]
            self._last_t[newer, k] = measured[newer]
        age = np.where(self.expected, now - self._last_t, 0.0)
        fresh = age <= self.stale_after_s
        return UsageReading(now, self._last.copy(), age, fresh, errors, sorted(unknown))

    def apply(self, state: Any) -> UsageReading:
        """Read and write ``state.usage`` where a value is known (fresh or last good);
        columns of nodes never measured keep what the state had."""
        if state.num_nodes != len(self.names):
            raise ValidationError("prometheus.node_names",
                                  f"{len(self.names)} names for {state.num_nodes} nodes")
        return write_usage(state, self.read_usage())

    def read_vector(self, dims: Sequence[Any], rate_window: str | None = None
                    ) -> tuple[np.ndarray, list[str]]:
        """The wide telemetry vector [N, D] for ``dims`` (twin.telemetry dimensions): one
        query per metric (counters as per-second ``rate``), columns filled by the
        dimension's labels; NaN where absent. Returns (X, errors)."""
        window = rate_window or self.rate_window
        X = np.full((len(self.names), len(dims)), np.nan)
        # Per metric: its label keys and the column of each instance's label values, so a
        # metric's answer is placed in one pass over its samples.
        by_metric: dict[str, tuple[Any, tuple[str, ...], dict[tuple[str, ...], int]]] = {}
        for j, d in enumerate(dims):
            keys = tuple(k for k, _ in d.labels)
            entry = by_metric.setdefault(d.metric.name, (d.metric, keys, {}))
            entry[2][tuple(v for _, v in d.labels)] = j
        errors: list[str] = []
        for name, (m, keys, col_of) in by_metric.items():
            expr = f"rate({name}[{window}])" if m.kind == "counter" else name
            try:
                samples = self.instant(expr)
            except PrometheusQueryError as e:
                errors.append(f"{name}: {e}")
                continue
            for smp in samples:
                i = self.index.get(smp.labels.get(self.node_label, ""))
                j = col_of.get(tuple(smp.labels.get(k) for k in keys))
                if i is not None and j is not None and math.isfinite(smp.value):
                    X[i, j] = smp.value
        return X, errors


def write_usage(state: Any, reading: UsageReading) -> UsageReading:
    """Put a reading's known values into ``state.usage``. The nodes it measured count as
    sampled with their current allocation (``usage_allocated``), so load-aware estimates
    add only what is placed after this reading, not every running pod a second time."""
    known = np.isfinite(reading.values)
    state.usage[known] = reading.values[known]
    rows = known.any(axis=1)
    state.usage_allocated[rows] = state.allocated[rows]
    return reading


def _float(v: Any) -> float:
    try:
        return float(v)  # Prometheus sends "NaN", "+Inf" as strings; float() reads them
    except (TypeError, ValueError):
        return math.nan


def _nodes(why: str, names: Sequence[str], mask: np.ndarray, values: np.ndarray,
           fmt: str, show: int = 5) -> str:
    """``why: a (v), b (v) and 3 more`` for the nodes in ``mask``."""
    idx = np.flatnonzero(mask)
    listed = ", ".join(f"{names[i]} ({fmt.format(values[i])})" for i in idx[:show])
    more = f" and {len(idx) - show} more" if len(idx) > show else ""
    return f"{why}: {listed}{more}"


def _series(data: dict[str, Any], expr: str) -> list[dict[str, Any]]:
    """``data.result`` as a list of series objects, or a query error naming the field."""
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusQueryError(expr, "bad_data", "data.result: not a list", 1)
    for i, r in enumerate(result):
        if not isinstance(r, dict):
            raise PrometheusQueryError(expr, "bad_data", f"data.result[{i}]: not an object", 1)
    return result


def _labels(r: dict[str, Any], i: int, expr: str) -> dict[str, str]:
    metric = r.get("metric", {})
    if not isinstance(metric, dict):
        raise PrometheusQueryError(expr, "bad_data", f"data.result[{i}].metric: not an "
                                   "object of labels", 1)
    return {str(k): str(v) for k, v in metric.items()}


def _point(p: Any, where: str, expr: str) -> tuple[float, float]:
    """A ``[time, "value"]`` pair -> (time, value); a malformed one is a query error naming
    ``where`` (the value may be "NaN" or "+Inf": Prometheus sends those; the time may not)."""
    if not (isinstance(p, list | tuple) and len(p) == 2):
        raise PrometheusQueryError(expr, "bad_data", f"{where}: not a [time, value] pair", 1)
    try:
        t = float(p[0])
    except (TypeError, ValueError):
        t = math.nan
    if not math.isfinite(t):
        raise PrometheusQueryError(expr, "bad_data", f"{where}: time {p[0]!r} is not a "
                                   "number", 1)
    return t, _float(p[1])


# The most of one answer this client reads (a whole cluster's per-pod range query is a
# few MB; a URL that is not Prometheus -- a log endpoint, a file server -- may never end),
# and how long the whole answer may take, in request timeouts (``timeout_s`` bounds each
# socket read only: a server sending a byte every few seconds held a command for ever).
MAX_ANSWER_BYTES = 64 * 1024 * 1024
ANSWER_DEADLINE_FACTOR = 4


class AnswerTooLarge(Exception):
    """An HTTP answer past the reader's byte limit."""


class AnswerTooSlow(Exception):
    """An HTTP answer not whole by the reader's deadline."""


def read_bounded(raw: Any, limit: int, deadline: float) -> bytes:
    """The body of the urllib3 response ``raw``, read one socket read at a time
    (``read1``: a fixed-size read waits to fill its chunk, and an answer without a
    length or chunks is read to its end by one call): ``AnswerTooLarge`` past ``limit``
    bytes, ``AnswerTooSlow`` past ``deadline`` (``time.monotonic``). A whole answer's
    connection goes back to the pool; a cut one is closed, never reused half-read.
    Shared by this client and the Kubernetes scheduler's own reads."""
    chunks, size = [], 0
    try:
        while chunk := raw.read1(1 << 16, decode_content=True):  # gzip undone
            size += len(chunk)
            if size > limit:
                raise AnswerTooLarge
            if time.monotonic() > deadline:
                raise AnswerTooSlow
            chunks.append(chunk)
    except BaseException:
        raw.close()
        raise
    raw.release_conn()
    return b"".join(chunks)


def _bounded_body(r: Any, deadline: float) -> str:
    """The answer's text: at most ``MAX_ANSWER_BYTES``, by ``deadline``."""
    import codecs

    try:
        body = read_bounded(r.raw, MAX_ANSWER_BYTES, deadline)
    except AnswerTooLarge:
        raise AnswerTooLarge(f"the answer passed {MAX_ANSWER_BYTES:,} bytes: narrow the "
                             "query (or the URL is not Prometheus's)") from None
    try:
        charset = codecs.lookup(r.encoding or "utf-8").name
    except LookupError:  # a charset nobody knows: Prometheus answers UTF-8
        charset = "utf-8"
    return body.decode(charset, errors="replace")


def _json(text: str) -> dict[str, Any]:
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested thousands deep
        return {}
    return body if isinstance(body, dict) else {}


def _short(e: Exception) -> str:
    s = str(e)
    return s if len(s) < 160 else s[:157] + "..."
