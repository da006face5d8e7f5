"""Side-by-side tables of runs: the same metrics, one column per scheduler.

Owns which headline figures a comparison shows and how they print. Values
come from report dicts; nothing is recomputed here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Row = tuple[str, Callable[[dict[str, Any]], float], str]


def _cls(name: str, key: str, stat: str) -> Callable[[dict[str, Any]], float]:
    return lambda m: m["classes"].get(name, {}).get(key, {}).get(stat, float("nan"))


ROWS: tuple[Row, ...] = (
    ("GPU allocation rate %", lambda m: m["gpu_allocation_rate"], "{:.1f}"),
    ("CPU allocated % (all capacity)", lambda m: m["allocation_pct"]["cpu"], "{:.1f}"),
    ("CPU allocated % (powered-on)", lambda m: m["allocation_on_pct"]["cpu"], "{:.1f}"),
    ("CPU used % (powered-on)", lambda m: m["usage_on_pct"]["cpu"], "{:.1f}"),
    ("GPU used %", lambda m: m["usage_pct"]["gpu"], "{:.1f}"),
    ("GPU fragmentation % of total", lambda m: m["gpu_fragmentation_pct"], "{:.1f}"),
    ("powered-on nodes (avg)", lambda m: m["powered_on_nodes_avg"], "{:.1f}"),
    ("pods placed", lambda m: m["pods"]["placed"], "{:.0f}"),
    ("pods failed", lambda m: m["pods"]["failed"], "{:.0f}"),
    ("pods pending at end", lambda m: m["pods"]["pending_at_end"], "{:.0f}"),
    ("ai-train start p95 (s)", _cls("ai-train", "start_latency_s", "p95"), "{:.0f}"),
    ("online start p95 (s)", _cls("online", "start_latency_s", "p95"), "{:.0f}"),
    ("online contended time %", lambda m: m["slo"]["online_contended_time_pct"], "{:.2f}"),
    ("latency SLO violations", lambda m: m["slo"]["latency_violations"], "{:.0f}"),
    ("online availability %", lambda m: m["slo"]["online_availability_pct"], "{:.4f}"),
    ("batch run window h (mean)", lambda m: m["batch_runs"]["window_h_mean"], "{:.2f}"),
    ("deadline misses", lambda m: m["pods"]["deadline_missed"], "{:.0f}"),
    ("node failures", lambda m: m["failures"]["node_failures"], "{:.0f}"),
    ("failed node's pods running again max (s)",
     lambda m: m["failures"]["max_to_running_s"] if m["failures"]["pods_stopped"] else None,
     "{:.0f}"),
    ("cross-zone GB/h", lambda m: m["cross_zone_gb_per_h"], "{:.0f}"),
    ("energy kWh", lambda m: m["energy_kwh"], "{:.0f}"),
    ("carbon kg", lambda m: m["carbon_kg"], "{:.0f}"),
    ("cost USD", lambda m: m["cost_usd"], "{:.0f}"),
    ("fairness (Jain)", lambda m: m["fairness_jain"], "{:.3f}"),
    ("decisions / s", lambda m: m["decisions_per_second"], "{:.0f}"),
)


def comparison_table(reports: Sequence[dict[str, Any]]) -> str:
    """Plain-text table: one row per metric, one column per report's scheduler."""
    heads = [str(r["scheduler"]) for r in reports]
    lines = []
    for label, get, fmt in ROWS:
        cells = []
        for r in reports:
            try:
                cells.append(fmt.format(get(r["metrics"])))
            except (KeyError, TypeError, ValueError):
                cells.append("-")
        lines.append((label, cells))
    w0 = max(len(label) for label, _ in lines)
    ws = [max(len(h), *(len(c[i]) for _, c in lines)) for i, h in enumerate(heads)]
    out = [" " * w0 + "  " + "  ".join(h.rjust(w) for h, w in zip(heads, ws, strict=True))]
    out.append("-" * len(out[0]))
    for label, cells in lines:
        out.append(label.ljust(w0) + "  " + "  ".join(
            c.rjust(w) for c, w in zip(cells, ws, strict=True)))
    return "\n".join(out)
