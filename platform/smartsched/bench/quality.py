"""``smartsched bench quality``: every profile through the same twin, one table.

Owns the side-by-side quality comparison. Each (workload, cluster) pair runs
every scheduler on the same seeds; metrics come from the twin's reports
unchanged, the median over seeds is shown. ``mixed`` (and other generated or
timed workloads) replay a simulated day after a warm-up; ``openb:*`` runs the
FGD paper's fill method, because the trace's timestamps put under 1 % GPU load
on the cluster at any moment (measured on the default trace).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_SCHEDULERS = (
    "first-fit", "random", "k8s-default", "k8s-default-v1.20", "binpack", "dotprod",
    "gpu-clustering", "gpu-packing", "bestfit", "fgd", "numa-aware", "load-aware",
    "online-batch", "composite",
)


def _mode(workload: str) -> str:
    return "fill" if workload.startswith("openb:") else "replay"


# (workload, cluster, scheduler, seed, hours, warm-up, twin settings: {} for defaults)
Job = tuple[str, str, str, int, float, float, dict[str, Any]]


def _one(job: Job) -> dict[str, Any]:
    workload, cluster, scheduler, seed, hours, warmup, engine = job
    from smartsched.bench.simulate import simulate

    mode = _mode(workload)
    rep = simulate(cluster, workload, scheduler, mode=mode, seed=seed,
                   hours=hours if mode == "replay" else None,
                   warmup_hours=warmup if mode == "replay" else 0.0, plots=False,
                   engine_overrides=engine or None)
    return {"workload": workload, "cluster": cluster, "scheduler": scheduler, "seed": seed,
            "mode": mode, "metrics": rep["metrics"], "wall_seconds": rep["wall_seconds"]}


def _g(m: dict[str, Any], *path: str) -> float | None:
    cur: Any = m
    for k in path:
        if not isinstance(cur, dict) or k not in cur:
            return None
        cur = cur[k]
    return None if cur is None else float(cur)


# (column header, path into metrics, format)
COLUMNS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("CPU used %", ("usage_pct", "cpu"), "{:.1f}"),
    ("CPU alloc %", ("allocation_pct", "cpu"), "{:.1f}"),
    ("GPU used %", ("usage_pct", "gpu"), "{:.1f}"),
    ("GPU alloc rate %", ("gpu_allocation_rate",), "{:.1f}"),
    ("GPU frag %", ("gpu_fragmentation_pct",), "{:.1f}"),
    ("online queue p95 s", ("classes", "online", "queueing_delay_s", "p95"), "{:.0f}"),
    ("batch queue p95 s", ("classes", "batch", "queueing_delay_s", "p95"), "{:.0f}"),
    ("image pull p95 s", ("images", "pull_s", "p95"), "{:.0f}"),
    ("AI start p50 s", ("classes", "ai-train", "start_latency_s", "p50"), "{:.0f}"),
    ("AI start p95 s", ("classes", "ai-train", "start_latency_s", "p95"), "{:.0f}"),
    ("AI start p95 s (waiting incl.)", ("classes", "ai-train", "start_latency_all_s", "p95"),
     "{:.0f}"),
    ("failed pods", ("pods", "failed"), "{:.0f}"),
    ("waiting pod-h", ("pods", "waiting_pod_hours"), "{:.0f}"),
    ("preemptions", ("pods", "preemptions"), "{:.0f}"),
    ("migrations", ("pods", "migrations"), "{:.0f}"),
    ("lost pod-h", ("pods", "lost_pod_hours"), "{:.1f}"),
    ("nodes on", ("powered_on_nodes_avg",), "{:.1f}"),
    ("online contended %", ("slo", "online_contended_time_pct"), "{:.2f}"),
    ("latency SLO viol.", ("slo", "latency_violations"), "{:.0f}"),
    ("latency pods within SLO %", ("slo", "latency_within_slo_pct"), "{:.1f}"),
    ("cross-zone GB/h", ("cross_zone_gb_per_h",), "{:.0f}"),
    ("energy kWh", ("energy_kwh",), "{:.0f}"),
    ("multi-GPU cross-socket %", ("device_locality", "cross_socket_pct"), "{:.1f}"),
    ("multi-GPU costly cross-socket %", ("device_locality", "costly_cross_socket_pct"),
     "{:.1f}"),
    ("GreenScore", ("green", "score"), "{:.3f}"),
    ("fairness", ("fairness_jain",), "{:.3f}"),
    ("decisions/s", ("decisions_per_second",), "{:.0f}"),
)


def run_jobs(jobs: Sequence[Job], workers: int | None = None) -> list[dict[str, Any]]:
    """Run ``Job``s, each in its own process from a pool sized to the machine's cores
    (one in this process if 1)."""
    from smartsched.pool import map_jobs

    return map_jobs(_one, jobs, workers)


def run_quality_bench(
    pairs: Sequence[tuple[str, str]],
    schedulers: Sequence[str],
    seeds: Sequence[int],
    hours: float = 24.0,
    warmup_hours: float = 6.0,
    workers: int | None = None,
    echo: Callable[[str], Any] = print,
    engine: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``engine``: twin settings for every run (``EngineConfig`` fields, e.g.
    ``{"gpu_comm_share": 0.3}``); the defaults otherwise."""
    jobs: list[Job] = [(w, c, s, seed, hours, warmup_hours, dict(engine or {}))
                       for w, c in pairs for s in schedulers for seed in seeds]
    runs = run_jobs(jobs, workers)
    tables = []
    medians: dict[str, dict[str, dict[str, float | None]]] = {}
    for w, c in pairs:
        key = f"{w} on {c} ({_mode(w)})"
        medians[key] = {}
        for s in schedulers:
            ms = [r["metrics"] for r in runs if (r["workload"], r["cluster"], r["scheduler"])
                  == (w, c, s)]
            row: dict[str, float | None] = {}
            for head, path, _ in COLUMNS:
                vals = [v for v in (_g(m, *path) for m in ms) if v is not None]
                row[head] = statistics.median(vals) if vals else None
            medians[key][s] = row
        tables.append(format_table(key, medians[key], len(seeds)))
    text = "\n\n".join(tables)
    echo(text)
    return {"seeds": list(seeds), "hours": hours, "warmup_hours": warmup_hours,
            "engine": dict(engine or {}), "medians": medians, "runs": runs, "table": text}


def format_table(title: str, rows: dict[str, dict[str, float | None]], n_seeds: int) -> str:
    heads = [h for h, _, _ in COLUMNS]
    fmts = {h: f for h, _, f in COLUMNS}
    out = [f"**{title}**, median of {n_seeds} seed(s)", "",
           "| scheduler | " + " | ".join(heads) + " |",
           "|---|" + "---:|" * len(heads)]
    for s, row in rows.items():
        cells = ["-" if row[h] is None else fmts[h].format(row[h]) for h in heads]
        out.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(out)
