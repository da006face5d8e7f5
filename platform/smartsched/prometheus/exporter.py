"""The twin's telemetry at ``/metrics``: a prometheus-client collector and a live twin.

Owns ``smartsched telemetry serve``. ``TelemetryCollector`` samples the twin's
wide per-node vector (twin.telemetry) at each scrape and writes every present
column as a Prometheus sample labelled ``node``, ``zone``, ``region`` plus the
dimension's own label (``gpu``, ``device``, ``socket``, ...; GPU series also
carry DCGM-exporter's ``device="nvidia<i>"`` and ``modelName``); absent
instances (NaN) are not exported. Counters are integrated over wall-clock seconds between
scrapes, so PromQL ``rate()`` gives per-second rates of the state being served
whatever the clock speed.

``LiveTwin`` runs the twin on an accelerated clock in a thread: simulated time
follows ``speed`` x wall time, one scheduler places the pods (the same
step-wise loop as ``smartsched simulate``), and the twin's state changes in
event batches (everything up to the next placement happens at once). Scrapes
and the simulation share one lock, so a scrape never sees half an update. When
the workload's horizon ends, the twin restarts with the next seed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from smartsched.scheduling.run import Run
from smartsched.twin.engine import Engine

log = logging.getLogger(__name__)

# Simulated seconds per wall second, at most: beyond what the twin simulates the clock is not
# kept, and a banner saying "1e+308x" would not be what is served.
MAX_SPEED = 86_400.0


class TelemetryCollector:
    """A prometheus-client collector over one engine (replaceable) and its synthesizer."""

    def __init__(self, engine: Engine, seed: int = 0, lock: threading.Lock | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lock = lock or threading.Lock()
        self.clock = clock
        self._bind(engine, seed)

    def _bind(self, engine: Engine, seed: int) -> None:
        from smartsched.twin.telemetry.catalogue import Layout, dimensions
        from smartsched.twin.telemetry.synth import TelemetrySynth

        spec = engine.state.spec
        self.engine = engine
        self.layout = Layout.for_cluster(spec)
        self.dims = dimensions(self.layout)
        self.synth = TelemetrySynth(spec, seed, self.layout)
        zone_site = spec.zone_site()
        self.node_labels = [(x.name, x.zone, zone_site[x.zone]) for x in spec.nodes]
        self.gpu_models = [x.gpu_model for x in spec.nodes]
        self._last_scrape: float | None = None
        self.samples = 0  # scrapes served

    def rebind(self, engine: Engine, seed: int) -> None:
        """Serve a new engine (a restarted twin); counters start again from zero."""
        with self.lock:
            self._bind(engine, seed)

    def sample(self) -> np.ndarray:
        """The vector now [N, D]; counters advanced by the wall seconds since the last one."""
        now = self.clock()
        dt = 0.0 if self._last_scrape is None else now - self._last_scrape
        self._last_scrape = now
        self.samples += 1
        return self.synth.sample(self.engine, dt)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            UnknownMetricFamily,
        )

        with self.lock:  # one section: node and cluster figures describe the same moment
            X = self.sample()
            dims, node_labels, gpu_models = self.dims, self.node_labels, self.gpu_models
            cluster = self._cluster_state()
        base = ["node", "zone", "region"]
        families: dict[str, Any] = {}
        for j, d in enumerate(dims):
            m = d.metric
            keys = [k for k, _ in d.labels]
            gpu = "gpu" in keys  # DCGM-exporter's own labels beside gpu="<index>"
            fam = families.get(m.name)
            if fam is None:
                labels = base + keys + (["device", "modelName"] if gpu else [])
                if m.kind == "counter" and m.name.endswith("_total"):
                    fam = CounterMetricFamily(m.name[: -len("_total")], m.help, labels=labels)
                elif m.kind == "counter":  # a standard name without _total (DCGM ECC, vmstat)
                    fam = UnknownMetricFamily(m.name, m.help, labels=labels)
                else:
                    fam = GaugeMetricFamily(m.name, m.help, labels=labels)
                families[m.name] = fam
            values = [v for _, v in d.labels]
            if gpu:
                values.append(f"nvidia{dict(d.labels)['gpu']}")
            col = X[:, j]
            for i in np.flatnonzero(~np.isnan(col)):
                extra = [gpu_models[i]] if gpu else []
                fam.add_metric([*node_labels[i], *values, *extra], float(col[i]))
        yield from families.values()
        yield from self._cluster_families(*cluster)

    def _cluster_state(self) -> tuple[np.ndarray, float, dict[str, float]]:
        """Queue by class, GPU fragmentation, metric totals (call under the lock)."""
        from smartsched.model.pod import POD_CLASS_IDS
        from smartsched.twin.podtable import PENDING

        e = self.engine
        tb = e.table
        queue = np.bincount(tb.cls[tb.status == PENDING], minlength=len(POD_CLASS_IDS))
        # The twin's own measure (FGD's, sampled at its metric ticks), not a second one.
        frag = e.metrics.frag[-1] / 100.0 if e.metrics.frag else 0.0
        return queue, frag, e.metrics.snapshot()

    @staticmethod
    def _cluster_families(queue: np.ndarray, frag: float, snap: dict[str, float]
                          ) -> Iterator[Any]:
        """The twin's own view of the cluster, beside the node metrics: queue by class,
        GPU fragmentation, and its running totals in simulated time (divide their
        ``delta`` by that of ``smartsched_twin_simulated_seconds`` for simulated rates)."""
        from prometheus_client.core import GaugeMetricFamily

        from smartsched.model.pod import POD_CLASS_IDS

        q = GaugeMetricFamily("smartsched_twin_pending_pods", "Pods waiting, by class.",
                              labels=["class"])
        for cls, n in zip(POD_CLASS_IDS, queue, strict=True):
            q.add_metric([str(cls)], float(n))
        yield q
        yield GaugeMetricFamily(
            "smartsched_twin_gpu_fragmentation_ratio",
            "GPU fragmentation as the twin reports it (FGD's measure, share of all GPU "
            "capacity, at the last metric tick).", value=float(frag))
        totals = {
            "smartsched_twin_simulated_seconds": ("Simulated time of the twin.", snap["time_s"]),
            "smartsched_twin_online_contended_pod_seconds": (
                "Online pod-seconds on nodes whose CPU or memory use exceeded capacity.",
                snap["contended_s"]),
            "smartsched_twin_pending_pod_seconds": ("Pod-seconds spent waiting.",
                                                    snap["pending_s"]),
            "smartsched_twin_energy_joules": ("Energy drawn, PUE included.", snap["energy_j"]),
            "smartsched_twin_carbon_grams": ("CO2e emitted.", snap["carbon_g"]),
        }
        for name, (help_text, value) in totals.items():
            yield GaugeMetricFamily(name, help_text + " Running total in simulated time.",
                                    value=float(value))

    def describe(self) -> list[Any]:
        return []  # unchecked collector: families are built per scrape


class LiveTwin:
    """Runs an engine under a scheduler on an accelerated clock, in a thread."""

    def __init__(self, cluster: str, workload: str, scheduler: str, *, speed: float = 60.0,
                 hours: float = 24.0, seed: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from smartsched.model.errors import ValidationError

        if not (math.isfinite(speed) and 0 < speed <= MAX_SPEED):
            raise ValidationError("speed", f"must be > 0 and at most {MAX_SPEED:g} (a "
                                  f"simulated day per second), got {speed}")
        if not (math.isfinite(hours) and hours > 0):
            raise ValidationError("hours", f"must be > 0, got {hours}")
        if hours * 3600.0 / speed < 1.0:  # 1e-9 h restarted the twin in a tight loop
            raise ValidationError("hours", f"a span of {hours:g} h at {speed:g}x ends in "
                                  "under a wall-clock second: the twin would restart over "
                                  "and over; give at least speed / 3600 hours")
        self.cluster, self.workload, self.scheduler_name = cluster, workload, scheduler
        self.speed, self.hours, self.seed = speed, hours, seed
        self.clock = clock
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.episodes = 0
        self.error: BaseException | None = None
        self.run = self._new_run(seed)  # validates names before serving
        self.collector = TelemetryCollector(self.engine, seed, self.lock, clock)

    def _new_run(self, seed: int) -> Run:
        from smartsched.scheduling.run import build_run

        # The same run builder as `smartsched simulate`: the scheduler gets every hook it
        # asks for (a load-aware-forecast profile runs with its forecaster here too).
        return build_run(self.cluster, self.workload, self.scheduler_name, seed=seed,
                         hours=self.hours)

    @property
    def engine(self) -> Engine:
        return self.run.engine

    @property
    def sched(self) -> Any:
        return self.run.scheduler

    @property
    def sim_now(self) -> float:
        return float(self.engine.now)

    def advance(self, until_s: float) -> None:
        """Place pods without pacing until simulated time reaches ``until_s`` (a warm start,
        or a frozen state for tests)."""
        with self.lock:
            self.run.drive(until_s=until_s)

    def start(self) -> LiveTwin:
        self._thread = threading.Thread(target=self._run, name="live-twin", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            seed = self.seed
            while not self._stop.is_set():
                self._episode()
                if self._stop.is_set():
                    break
                seed += 1
                self.episodes += 1
                run = self._new_run(seed)
                with self.lock:
                    self.run = run
                self.collector.rebind(run.engine, seed)
        except BaseException as e:  # surfaced by the serve command, never swallowed
            self.error = e
            log.exception("live twin stopped")

    def _episode(self) -> None:
        """Place pods as simulated time catches up with the accelerated wall clock."""
        wall0 = self.clock()
        run = self.run
        sim0 = float(run.engine.now)  # after a warm start, pacing begins where the twin is
        while not self._stop.is_set():
            with self.lock:
                req = run.next_decision()
                if req is None:
                    return
                due = wall0 + (req.time - sim0) / self.speed
            while (wait := due - self.clock()) > 0:  # re-read the clock: it may jump
                if self._stop.wait(min(wait, 0.2)):
                    return
            with self.lock:  # the drive loop's own step, paced by the wall clock
                run.decide(req)


def serve_telemetry(twin: LiveTwin, port: int, addr: str = "127.0.0.1") -> Any:
    """Expose the twin's collector over HTTP (a thread); returns the server -- call its
    ``shutdown()`` and ``server_close()`` to stop it and free the port."""
    from prometheus_client import CollectorRegistry

    from smartsched.prometheus.http import serve_registry

    registry = CollectorRegistry()
    registry.register(twin.collector)
    return serve_registry(registry, port, addr)
