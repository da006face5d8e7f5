"""``smartsched bench speed``: whole-process wall time, throughput and peak memory.

Owns the reference speed cases. Each runs ``smartsched simulate`` in a child
process (so start-up, imports and loading count, as a user sees them) and
reads peak RSS from the child's resource usage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CASES: tuple[tuple[str, list[str], float], ...] = (
    ("openb fill 1.3 on openb-gpu (default trace, first-fit)",
     ["--cluster", "openb-gpu", "--workload", "openb:default", "--mode", "fill",
      "--inflate", "1.3", "--seed", "42", "--no-plots"], 5.0),
    ("mixed 24 h on large (first-fit)",
     ["--cluster", "large", "--workload", "mixed", "--hours", "24", "--no-plots"], 300.0),
)


def run_case(args: list[str]) -> dict[str, Any]:
    """Run one ``smartsched simulate`` child; return wall, decisions/s and peak RSS."""
    with tempfile.TemporaryDirectory() as tmp:
        js = os.path.join(tmp, "r.json")
        err_path = os.path.join(tmp, "stderr")
        with open(err_path, "w") as err:
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                [sys.executable, "-m", "smartsched.cli", "simulate", *args, "--json", js,
                 "--no-progress"],
                stdout=subprocess.DEVNULL, stderr=err,
            )
            # wait4 gives this child's own peak RSS (RUSAGE_CHILDREN would mix runs).
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
        peak_kib = usage.ru_maxrss
        if os.waitstatus_to_exitcode(status) != 0:
            msg = Path(err_path).read_text().strip()[-500:]
            raise RuntimeError(f"simulate failed: {msg}")
        rep = json.loads(Path(js).read_text())
    m = rep["metrics"]
    return {
        "wall_seconds": wall,
        "decisions": rep["decisions"],
        "decisions_per_second_scheduler": m["decisions_per_second"],
        "decisions_per_second_end_to_end": rep["decisions"] / wall,
        "peak_rss_mib": peak_kib / 1024,
        "gpu_allocation_rate": m["gpu_allocation_rate"],
        "pods": m["pods"]["total"],
    }


def fork_cost(cluster: str = "openb-all", repeats: int = 2000) -> dict[str, Any]:
    """Mean wall time of ``ClusterState.fork()`` (the per-decision sandbox copy)."""
    from smartsched.model.presets import load_cluster
    from smartsched.twin.state import ClusterState

    state = ClusterState(load_cluster(cluster))
    t0 = time.perf_counter()
    for _ in range(repeats):
        state.fork()
    per = (time.perf_counter() - t0) / repeats
    return {"cluster": cluster, "nodes": state.num_nodes, "fork_us": per * 1e6}


def run_speed_suite(skip_large: bool = False, echo: Callable[[str], Any] = print) -> dict[str, Any]:
    results: dict[str, Any] = {}
    fk = fork_cost()
    results["fork"] = fk
    echo(f"ClusterState.fork() on {fk['cluster']} ({fk['nodes']} nodes): {fk['fork_us']:.1f} us")
    for name, args, target in CASES:
        if skip_large and "large" in args:
            continue
        r = run_case(args)
        r["target_seconds"] = target
        r["within_target"] = r["wall_seconds"] <= target
        results[name] = r
        echo(
            f"{name}: {r['wall_seconds']:.2f} s wall (target {target:g} s), "
            f"{r['decisions']} decisions, {r['decisions_per_second_end_to_end']:.0f}/s end to end, "
            f"{r['decisions_per_second_scheduler']:.0f}/s in the scheduler loop, "
            f"peak RSS {r['peak_rss_mib']:.0f} MiB"
        )
    return results
