"""One simulation run end to end: cluster + workload + scheduler -> report folder.

Owns the composition behind ``smartsched simulate`` and the demo, so the CLI,
tests and benchmarks run the exact same path.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from smartsched.model.presets import load_cluster
from smartsched.scheduling.base import make_scheduler
from smartsched.scheduling.runner import run
from smartsched.twin.engine import Engine, EngineConfig
from smartsched.workloads.resolve import load_workload

DEFAULT_GENERATOR_HOURS = 24.0


def simulate(
    cluster: str,
    workload: str,
    scheduler: str,
    *,
    mode: str = "replay",
    inflate: float = 1.3,
    seed: int = 0,
    hours: float | None = None,
    warmup_hours: float = 0.0,
    start_hours: float | None = None,
    out: Path | None = None,
    plots: bool = True,
    progress: bool = False,
    engine_overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run one simulation; write ``out`` if given; return the report dict.

    ``hours``: span of generated workloads and the replay horizon (None: 24 h
    for generators, the whole trace for files). ``warmup_hours``: simulate this
    long first and measure only after it (the cluster is not empty at the start
    of the measured window). ``start_hours``: replay a trace from that moment
    (see ``workloads.window``).
    """
    t0 = time.perf_counter()
    spec = load_cluster(cluster)
    is_generator = workload.split(":", 1)[0] == "mixed"
    gen_hours = hours if hours is not None else DEFAULT_GENERATOR_HOURS
    warm = warmup_hours if mode == "replay" else 0.0
    pods = load_workload(workload, spec, gen_hours + (warm if is_generator else 0.0), seed)
    if start_hours:
        from smartsched.workloads.window import window_pods

        pods = window_pods(pods, start_hours * 3600.0)
    horizon = None
    if mode == "replay" and (hours is not None or is_generator):
        horizon = (warm + gen_hours) * 3600.0
    config = EngineConfig(mode=mode, seed=seed, inflate=inflate, horizon_s=horizon,
                          warmup_s=warm * 3600.0, **(engine_overrides or {}))
    engine = Engine(spec, pods, config)
    sched = make_scheduler(scheduler, seed)
    forecaster = getattr(sched, "forecaster", None)
    if forecaster is not None and mode == "replay":  # the profile plans on predicted usage
        from smartsched.forecast.node_predictor import NodeUsagePredictor

        engine.usage_predictor = NodeUsagePredictor.load(forecaster, config.tick_s)
    telemetry = getattr(sched, "telemetry", None)
    if telemetry is not None:  # a policy that observes reduced telemetry
        from smartsched.twin.telemetry.reduction import TelemetryFeatures, TelemetryProjection

        engine.telemetry_features = TelemetryFeatures(TelemetryProjection.load(telemetry),
                                                      spec, seed)
        sched.telemetry_attached = True
    metrics = run(engine, sched, progress=progress)
    settings = {
        "scheduler": scheduler,
        "mode": mode,
        "seed": seed,
        "cluster": cluster,
        "nodes": len(spec.nodes),
        "workload": workload,
        "inflate": inflate if mode == "fill" else None,
        "hours": gen_hours if horizon is not None else None,
        "warmup_hours": warm,
        "start_hours": start_hours,
    }
    report = {**settings, "metrics": metrics, "decisions": len(engine.metrics.decision_seconds)}
    weights_log = getattr(sched, "weights_log", None)
    if weights_log is not None:  # a weight-conditioned scheduler: when and why weights moved
        report["weights_log"] = weights_log
    if out is not None:
        from smartsched.bench.report import write_report

        write_report(out, engine, report, plots=plots)
    report["wall_seconds"] = time.perf_counter() - t0
    report["peak_rss_mib"] = peak_rss_mib()
    if out is not None:
        from smartsched.bench.report import write_report_json

        write_report_json(out, report)
    return report


def peak_rss_mib() -> float | None:
    """This process's peak resident memory (VmHWM: since exec, unlike ru_maxrss)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None
