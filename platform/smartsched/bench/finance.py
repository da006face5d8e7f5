"""``smartsched bench finance``: the finance case of issue 19, against k8s-default.

Owns the comparison the issue asks for: a nightly batch run on a dedicated pool
beside an online core system (``workloads.finance`` on the ``finance`` preset,
bound by the case's compliance policy), node failures injected at a configured
rate and repair time, the same failures for every scheduler (they are drawn from
the run's seed, never from its decisions). Each variant runs the same seeds:

- ``k8s-default``: kube-scheduler's profile with Kubernetes' failure timing (the
  node is NotReady 40 s after it fails, its pods are evicted 300 s later);
- ``k8s-default+10s``: the same with pods tolerating NotReady for 10 s (what the
  failover lever alone is worth);
- ``composite``: the strongest heuristic profile, Kubernetes' queue and timing;
- ``finance``: the composite with the least-slack queue and the 10 s toleration.

Figures per variant, pooled over seeds: the batch window (first release to last
finish of each night's run; mean and max over nights), its lower bound (what no
scheduler can beat on those jobs: the latest release plus length of any job, and
each wave's release plus the work released from then on over the pool's
capacity), deadline misses, online availability (replica-time served after first
start, pooled), and how long a failed node's pods took to be bound and to run
again (the maximum over every such pod of every seed). The metrics are the twin's,
the same for every scheduler.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from smartsched.model.pod import Pod, PodClass

COMPLIANCE = ("smartsched.workloads", "profiles_data/finance-compliance.yaml")


@dataclass(frozen=True)
class Variant:
    name: str
    scheduler: str
    toleration_s: float | None = None  # overrides what the scheduler sets (None: keep)


VARIANTS = (
    Variant("k8s-default", "k8s-default"),
    Variant("k8s-default+10s", "k8s-default", 10.0),
    Variant("composite", "composite"),
    Variant("finance", "finance"),
)


@dataclass(frozen=True)
class Job:
    variant: Variant
    seed: int
    nights: int
    mtbf_hours: float | None
    repair_hours: float
    cluster: str
    workload: str


def _run(job: Job) -> dict[str, Any]:
    from smartsched.model.configfile import read_resource
    from smartsched.scheduling.base import make_scheduler
    from smartsched.scheduling.run import build_run

    sched = make_scheduler(job.variant.scheduler, job.seed)
    if job.variant.toleration_s is not None:
        sched.failure_toleration_s = job.variant.toleration_s  # type: ignore[attr-defined]
    policy = read_resource(*COMPLIANCE, "compliance")
    overrides: dict[str, Any] = {"repair_s": job.repair_hours * 3600.0,
                                 "power_management": False}  # a core system stays up
    if job.mtbf_hours is not None:
        overrides["node_mtbf_hours"] = job.mtbf_hours
    run = build_run(job.cluster, job.workload, sched, seed=job.seed, hours=24.0 * job.nights,
                    warmup_hours=12.0, engine_overrides=overrides, compliance=policy)
    run.drive()
    m = run.engine.run_report()
    bounds = window_bounds(run.engine.table.pods, run.engine.spec)
    return {"variant": job.variant.name, "seed": job.seed, "metrics": m, "bounds": bounds}


def window_bounds(pods: Sequence[Pod], spec: Any) -> dict[str, float]:
    """Per nightly run (batch pods by app): a lower bound on its window in hours.

    No schedule finishes a run before ``max(release + length)`` of its jobs, nor before
    any release time plus the work released from then on divided by the capacity of the
    nodes those jobs may use (cpu and memory alike), measured from its first release.
    """
    runs: dict[str, list[Pod]] = {}
    for p in pods:
        if p.pod_class == PodClass.BATCH and p.app:
            runs.setdefault(p.app, []).append(p)
    out = {}
    for app, jobs in runs.items():
        sel = dict(jobs[0].node_selector)
        nodes = [n for n in spec.nodes if all(n.labels.get(k) == v for k, v in sel.items())]
        cap = np.array([sum(n.cpu_milli for n in nodes), sum(n.memory_mib for n in nodes)],
                       dtype=np.float64)
        r = np.array([p.arrival for p in jobs])
        d = np.array([p.duration or 0.0 for p in jobs])
        work = np.array([[p.cpu_milli * (p.duration or 0.0), p.memory_mib * (p.duration or 0.0)]
                         for p in jobs])
        first = float(r.min())
        bound = float((r + d).max()) - first
        for t in np.unique(r):
            later = r >= t
            bound = max(bound, float(t - first + (work[later].sum(axis=0) / cap).max()))
        out[app] = bound / 3600.0
    return out


def run_finance(variants: Sequence[Variant] = VARIANTS, seeds: Sequence[int] = (0, 1, 2),
                nights: int = 3, mtbf_hours: float | None = 720.0, repair_hours: float = 1.0,
                cluster: str = "finance", workload: str = "finance",
                workers: int | None = None, echo: Callable[[str], Any] = print
                ) -> dict[str, Any]:
    """Run every variant on every seed; print the table; return the figures."""
    from smartsched.pool import map_jobs

    jobs = [Job(v, s, nights, mtbf_hours, repair_hours, cluster, workload)
            for v in variants for s in seeds]
    results = map_jobs(_run, jobs, workers)
    rows = {v.name: summarize([r for r in results if r["variant"] == v.name])
            for v in variants}
    base = rows[variants[0].name]["window_h_mean"]
    for row in rows.values():
        w = row["window_h_mean"]
        row["window_vs_first_pct"] = (100.0 * (w - base) / base
                                      if w is not None and base else None)
    echo(format_table(rows, seeds, nights, mtbf_hours, repair_hours))
    return {"seeds": list(seeds), "nights": nights, "mtbf_hours": mtbf_hours,
            "repair_hours": repair_hours, "rows": rows}


def summarize(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One variant's figures pooled over its seeds."""
    windows, bounds, misses, fails = [], [], 0, 0
    down = life = 0.0
    to_bound: list[float] = []
    to_run: list[float] = []
    online_to_run: list[float] = []
    censored = 0
    for r in results:
        m = r["metrics"]
        for run in m["batch_runs"]["each"]:
            windows.append(run["window_h"])
            bounds.append(r["bounds"].get(run["app"], math.nan))
        misses += m["pods"]["deadline_missed"]
        online = m["availability"].get("online", {})
        down += online.get("downtime_s", 0.0)
        life += online.get("lifetime_s", 0.0)
        f = m["failures"]
        fails += f["node_failures"]
        censored += f["not_running_at_end"]
        if f["pods_stopped"]:
            to_run.append(f["max_to_running_s"])
            if f["to_bound_s"]["p95"] is not None:
                to_bound.append(f["to_bound_s"]["p95"])
            o = f["classes"].get("online")
            if o and o["pods_stopped"]:
                online_to_run.append(o["max_to_running_s"])
    w = np.array(windows)
    return {
        "nights": len(windows),
        "window_h_mean": float(w.mean()) if w.size else None,
        "window_h_max": float(w.max()) if w.size else None,
        "bound_h_mean": float(np.nanmean(bounds)) if bounds else None,
        "deadline_missed": misses,
        "online_availability_pct": 100.0 * (1 - down / life) if life > 0 else None,
        "online_downtime_s": down,
        "node_failures": fails,
        "to_bound_p95_max_s": max(to_bound) if to_bound else None,
        "to_running_max_s": max(to_run) if to_run else None,
        "online_to_running_max_s": max(online_to_run) if online_to_run else None,
        "not_running_at_end": censored,
    }


def format_table(rows: dict[str, dict[str, Any]], seeds: Sequence[int], nights: int,
                 mtbf_hours: float | None, repair_hours: float) -> str:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else fmt.format(v)

    head = (f"finance case: {len(seeds)} seeds x {nights} nights, node MTBF "
            f"{mtbf_hours if mtbf_hours is not None else 'inf'} h, repair {repair_hours} h")
    cols = ("variant", "window h", "vs first", "bound h", "max h", "missed", "online avail %",
            "failures", "bound p95 s", "run max s", "online run max s")
    lines = [head, " | ".join(cols)]
    for name, r in rows.items():
        lines.append(" | ".join([
            name, f(r["window_h_mean"], "{:.2f}"), f(r["window_vs_first_pct"], "{:+.1f} %"),
            f(r["bound_h_mean"], "{:.2f}"), f(r["window_h_max"], "{:.2f}"),
            str(r["deadline_missed"]), f(r["online_availability_pct"], "{:.4f}"),
            str(r["node_failures"]), f(r["to_bound_p95_max_s"], "{:.0f}"),
            f(r["to_running_max_s"], "{:.0f}"), f(r["online_to_running_max_s"], "{:.0f}"),
        ]))
    return "\n".join(lines)
