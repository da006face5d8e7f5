"""One simulation run end to end: cluster + workload + scheduler -> report folder.

Owns ``smartsched simulate``'s report: the run comes from
``scheduling.run.build_run`` (as for every other driver), and this adds the
settings, timings, peak memory and the report folder (JSON, time series,
plots).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from smartsched.scheduling.run import DEFAULT_GENERATOR_HOURS, build_run

__all__ = ["DEFAULT_GENERATOR_HOURS", "peak_rss_mib", "simulate"]


@runtime_checkable
class WeightsLogging(Protocol):
    """A scheduler whose reward weights move during the run (``rl:...&dynamic=true``)."""

    weights_log: list[dict[str, Any]]


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
    compliance: str | Path | None = None,
) -> dict[str, Any]:
    """Run one simulation; write ``out`` if given; return the report dict.

    ``hours``: span of generated workloads and the replay horizon (None: 24 h
    for generators, the whole trace for files). ``warmup_hours``: simulate this
    long first and measure only after it (the cluster is not empty at the start
    of the measured window). ``start_hours``: replay a trace from that moment
    (see ``workloads.window``).
    """
    t0 = time.perf_counter()
    run = build_run(cluster, workload, scheduler, mode=mode, seed=seed, hours=hours,
                    warmup_hours=warmup_hours, start_hours=start_hours, inflate=inflate,
                    engine_overrides=engine_overrides, compliance=compliance)
    run.drive(progress=progress)
    engine, sched = run.engine, run.scheduler
    report = {**run.settings, "scheduler": scheduler, "metrics": run.report(),
              "decisions": len(engine.metrics.decision_seconds)}
    if isinstance(sched, WeightsLogging):  # weight-conditioned: when and why weights moved
        report["weights_log"] = sched.weights_log
    if out is None:
        report["wall_seconds"] = time.perf_counter() - t0
        report["peak_rss_mib"] = peak_rss_mib()
        return report
    from smartsched.bench.report import staged_report, write_report, write_report_json

    with staged_report(Path(out)) as stage:  # an earlier report stays until this one is whole
        write_report(stage, engine, report, plots=plots)
        report["wall_seconds"] = time.perf_counter() - t0
        report["peak_rss_mib"] = peak_rss_mib()
        write_report_json(stage, report)
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
