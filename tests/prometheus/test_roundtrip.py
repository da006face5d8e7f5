"""The twin's telemetry through a real Prometheus server and back through PrometheusSource."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from smartsched.model.resources import CPU, GPU, MEM
from smartsched.prometheus.exporter import LiveTwin, serve_telemetry
from smartsched.prometheus.source import PrometheusQueryError, PrometheusSource
from tests.builders import free_port

pytestmark = pytest.mark.slow  # a real Prometheus server and a few seconds of scrapes

RULES = Path(__file__).parents[2] / "infra" / "prometheus" / "telemetry-rules.yml"


@pytest.fixture
def frozen_twin():
    """The twin a few hours into a mixed workload on the GPU-bearing ``small`` cluster,
    not advancing: what Prometheus scrapes must equal its state."""
    twin = LiveTwin("small", "mixed", "k8s-default", hours=4, seed=3)
    twin.advance(2 * 3600.0)
    # The twin's usage arrays are sampled at its metric ticks; sample them now so they
    # describe the same moment the exporter serves.
    e = twin.engine
    e.sample_usage()
    assert twin.engine.state.usage[:, GPU].sum() > 0  # GPU pods are running
    port = free_port()
    server = serve_telemetry(twin, port)
    yield twin, port, server
    server.shutdown()
    server.server_close()


def test_usage_read_back_from_prometheus_matches_the_twin(prometheus, frozen_twin,
                                                          tmp_path: Path) -> None:
    twin, port, _ = frozen_twin
    prom = prometheus([f"127.0.0.1:{port}"], rules=[RULES])
    prom.wait_for('count(rate(smartsched_node_pod_cpu_seconds_total[5s]) > 0)')
    # rate() over a window that samples do not yet cover under-reads (Prometheus only
    # extrapolates half a scrape past the first sample): wait until 5 s are covered.
    time.sleep(6.5)
    st = twin.engine.state
    src = PrometheusSource.for_state(prom.url, st, rate_window="5s", stale_after_s=10)
    reading = src.read_usage()
    assert reading.errors == [] and reading.unknown_nodes == []
    assert reading.fresh.all(), reading.stale_nodes(src.names)
    # What the pods use, up to the synthesizer's 1 % measurement noise.
    np.testing.assert_allclose(reading.values[:, 1], st.usage[:, MEM], rtol=0.012, atol=1.0)
    # CPU comes back through rate() over a counter the exporter integrates per scrape.
    np.testing.assert_allclose(reading.values[:, 0], st.usage[:, CPU], rtol=0.02, atol=5.0)
    gpu_nodes = st.capacity[:, GPU] > 0
    np.testing.assert_allclose(reading.values[gpu_nodes, 2], st.usage[gpu_nodes, GPU],
                               rtol=0.02, atol=5.0)
    assert (reading.values[~gpu_nodes, 2] == 0).all()

    # Into a ClusterState: the same numbers land in its usage array.
    fresh_state = type(st)(st.spec)
    src.apply(fresh_state)
    np.testing.assert_allclose(fresh_state.usage[:, MEM], reading.values[:, 1], rtol=1e-6)

    # A range query gives the scraped history of one node.
    name = src.names[0]
    now = time.time()
    series = src.range(f'node_memory_MemAvailable_bytes{{node="{name}"}}', now - 4, now, 1)
    assert len(series) == 1 and len(series[0][1]) >= 3

    # The wide vector comes back too: every column the twin exports for the node.
    dims = twin.collector.dims
    X, errors = src.read_vector(dims, rate_window="5s")
    assert errors == []
    with twin.lock:
        mine = twin.collector.synth.sample(twin.engine, 0.0)
    gauges = np.array([d.metric.kind == "gauge" for d in dims])
    present = ~np.isnan(mine)
    assert (np.isnan(X) == ~present).all()  # absent instances are absent in Prometheus too
    np.testing.assert_allclose(X[:, gauges], mine[:, gauges], rtol=1e-6, atol=1e-6)

    # The policy's reduced features, read from Prometheus: the standard layout's columns
    # (slots this cluster lacks are absent, i.e. mean-imputed) projected.
    from smartsched.prometheus.features import features_from_prometheus
    from smartsched.twin.telemetry.catalogue import Layout
    from smartsched.twin.telemetry.reduction import fit_projection
    from smartsched.twin.telemetry.synth import column_names

    std = column_names(Layout.STANDARD)
    proj = fit_projection(np.random.default_rng(0).normal(size=(50, len(std))), std, 3)
    feats, errors = features_from_prometheus(src, proj)
    assert errors == [] and feats.shape == (st.num_nodes, 3) and np.isfinite(feats).all()

    # The operator view's recording rules evaluate on these series: one row per zone, and
    # the twin's queue by class.
    zones = {x.zone for x in st.spec.nodes}
    rows = prom.wait_for("zone:smartsched_cpu_utilization:avg")
    assert {r["metric"]["zone"] for r in rows} == zones
    for r in rows:
        assert 0.0 <= float(r["value"][1]) <= 1.0
    pending = prom.wait_for("class:smartsched_twin_pending_pods:sum")
    assert sum(float(r["value"][1]) for r in pending) == twin.engine.queue_length
    import yaml

    recorded = [r["record"] for g in yaml.safe_load(RULES.read_text())["groups"]
                for r in g["rules"]]
    for name in recorded:
        if "twin_online" in name or "twin_power" in name or "carbon" in name:
            continue  # delta() over a frozen twin has no simulated time to divide by
        assert prom.wait_for(name), name

    # A dashboard panel's data, rendered from this Prometheus without Grafana.
    from smartsched.model.errors import ValidationError
    from smartsched.prometheus.panel import render_panel

    dash = RULES.parents[1] / "grafana" / "smartsched-cluster.json"
    res = render_panel(prom.url, dash, "CPU utilization by zone", tmp_path / "p.png",
                       minutes=0.5, step_s=1.0)
    assert res["series"] == len(zones) and (tmp_path / "p.png").stat().st_size > 1000
    with pytest.raises(ValidationError, match="no panel"):
        render_panel(prom.url, dash, "nope", tmp_path / "q.png")


def test_stale_and_failed_queries_keep_the_last_good_value(prometheus, frozen_twin) -> None:
    twin, port, server = frozen_twin
    prom = prometheus([f"127.0.0.1:{port}"])
    prom.wait_for("count(node_memory_MemAvailable_bytes)")
    time.sleep(2.5)
    st = twin.engine.state
    src = PrometheusSource.for_state(prom.url, st, rate_window="5s", stale_after_s=3,
                                     timeout_s=1, retries=1, backoff_s=0.1)
    good = src.read_usage()
    assert good.fresh[:, 1].all()

    # The exporter goes away: Prometheus marks its series stale, the source keeps the
    # last good values and reports their growing age -- never zeros.
    server.shutdown()
    server.server_close()
    time.sleep(5)
    later = src.read_usage()
    np.testing.assert_array_equal(later.values[:, 1], good.values[:, 1])
    assert not later.fresh[:, 1].any() and (later.age_s[:, 1] > 3).all()
    assert set(later.stale_nodes(src.names)) == set(src.names)

    # A query Prometheus rejects names the problem and is not retried.
    with pytest.raises(PrometheusQueryError, match="bad_data") as e:
        src.instant("sum(")
    assert e.value.attempts == 1

    # Prometheus itself stops: a clear error per query, the last good values kept.
    prom.stop()
    with pytest.raises(PrometheusQueryError, match="connection") as e:
        src.instant("up")
    assert e.value.attempts == 2
    down = src.read_usage()
    assert len(down.errors) == 3 and all("connection" in x for x in down.errors)
    np.testing.assert_array_equal(down.values[:, 1], good.values[:, 1])
    assert not down.fresh[:, 1].any()
