"""``smartsched bench telemetry``: what the wide telemetry costs per sample and per scrape.

Owns the speed figures of the telemetry layer: for each cluster, the twin runs
a few hours under k8s-default, then the synthesizer samples the full vector
(median of repeated samples), the projection reduces it, and the exporter
renders one ``/metrics`` exposition (the cost of a Prometheus scrape).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def run_telemetry_bench(clusters: Sequence[str], hours: float = 2.0, repeats: int = 20,
                        echo: Callable[[str], Any] = print) -> dict[str, Any]:
    from prometheus_client import CollectorRegistry, generate_latest

    from smartsched.prometheus.exporter import LiveTwin
    from smartsched.twin.telemetry.catalogue import column_names, dimensions
    from smartsched.twin.telemetry.reduction import counter_mask, fit_projection

    out: dict[str, Any] = {"hours": hours, "repeats": repeats, "clusters": {}}
    for name in clusters:
        twin = LiveTwin(name, "mixed", "k8s-default", hours=hours, seed=0)
        twin.advance(hours * 3600.0 * 0.9)
        e, col = twin.engine, twin.collector
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            X = col.synth.sample(e, 1.0)
            times.append(time.perf_counter() - t0)
        layout = col.layout
        proj = fit_projection(np.where(counter_mask(dimensions(layout)), 0.0, X),
                              column_names(layout), min(8, X.shape[0]))
        t0 = time.perf_counter()
        for _ in range(repeats):
            proj.transform(X)
        t_proj = (time.perf_counter() - t0) / repeats
        reg = CollectorRegistry()
        reg.register(col)
        t0 = time.perf_counter()
        body = generate_latest(reg)
        t_scrape = time.perf_counter() - t0
        row = {"nodes": int(X.shape[0]), "dimensions": int(X.shape[1]),
               "present_cells": int((~np.isnan(X)).sum()),
               "sample_ms_p50": 1e3 * float(np.median(times)),
               "sample_ms_max": 1e3 * float(np.max(times)),
               "project_ms": 1e3 * t_proj, "scrape_ms": 1e3 * t_scrape,
               "scrape_bytes": len(body)}
        out["clusters"][name] = row
        echo(f"{name}: {row['nodes']} nodes x {row['dimensions']} dims "
             f"({row['present_cells']:,} series): sample p50 {row['sample_ms_p50']:.1f} ms, "
             f"project {row['project_ms']:.2f} ms, /metrics {row['scrape_ms']:.0f} ms "
             f"({row['scrape_bytes'] / 1e6:.1f} MB)")
    return out
