"""``smartsched bench speed``: whole-process wall time, throughput and peak memory.

Owns the reference speed cases. Each runs ``smartsched simulate`` in a child
process (so start-up, imports and loading count, as a user sees them) and
reads peak RSS from the child's resource usage. The day on ``large`` (24 h of
the mixed workload, 1,848 nodes) runs once per packaged profile, each against
the 5-minute target; a child that passes twice the target is stopped and
reported as timed out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

CASES: tuple[tuple[str, list[str], float], ...] = (
    ("openb fill 1.3 on openb-gpu (default trace, first-fit)",
     ["--cluster", "openb-gpu", "--workload", "openb:default", "--mode", "fill",
      "--inflate", "1.3", "--seed", "42", "--no-plots", "--scheduler", "first-fit"], 5.0),
    ("openb fill 1.3 on openb-gpu (default trace, fgd)",
     ["--cluster", "openb-gpu", "--workload", "openb:default", "--mode", "fill",
      "--inflate", "1.3", "--seed", "42", "--no-plots", "--scheduler", "fgd"], 5.0),
)
DAY_ON_LARGE_ARGS = ["--cluster", "large", "--workload", "mixed", "--hours", "24", "--no-plots"]
DAY_ON_LARGE_TARGET_S = 300.0


class CaseTimeout(RuntimeError):
    """A speed case ran past its time limit and was stopped."""


def run_case(args: list[str], timeout_s: float | None = None) -> dict[str, Any]:
    """Run one ``smartsched simulate`` child; return wall, decisions/s and peak RSS.
    Past ``timeout_s`` the child is killed and ``CaseTimeout`` raised."""
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
            while True:
                pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                    proc.kill()
                    os.wait4(proc.pid, 0)
                    raise CaseTimeout(f"stopped after {timeout_s:.0f} s")
                time.sleep(0.05)
            wall = time.perf_counter() - t0
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
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
        # The child's own VmHWM: ru_maxrss would include the parent's pages before exec.
        "peak_rss_mib": rep.get("peak_rss_mib"),
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


def replicated_cluster(base: str, nodes: int) -> Any:
    """``base``'s nodes repeated (renamed) until the cluster has ``nodes`` nodes."""
    import dataclasses

    from smartsched.model.cluster import ClusterSpec
    from smartsched.model.presets import load_cluster

    spec = load_cluster(base)
    out = [
        dataclasses.replace(spec.nodes[i % len(spec.nodes)], name=f"n{i:05d}")
        for i in range(nodes)
    ]
    return ClusterSpec(f"{base}-x{nodes}", spec.sites, spec.zones, tuple(out))


def profile_throughput(scheduler: str, nodes: int, seed: int = 42) -> dict[str, Any]:
    """In-process decisions/s of ``scheduler`` placing the openb default trace in fill mode
    (inflated to 1.3 x the GPU of an openb-all cluster replicated to ``nodes`` nodes)."""
    from smartsched.scheduling.run import build_run

    spec = replicated_cluster("openb-all", nodes)
    run = build_run(spec, "openb:default", scheduler, mode="fill", seed=seed, inflate=1.3)
    t0 = time.perf_counter()
    run.drive()
    m = run.report()
    wall = time.perf_counter() - t0
    return {"scheduler": scheduler, "nodes": nodes, "decisions": len(run.engine.table),
            "decisions_per_second": m["decisions_per_second"],
            "decision_latency_us": m["decision_latency_us"], "loop_wall_seconds": wall}


def day_on_large(profiles: Sequence[str], echo: Callable[[str], Any] = print
                 ) -> dict[str, Any]:
    """A day of the mixed workload on ``large`` per profile, against the 5-minute target."""
    results: dict[str, Any] = {}
    target = DAY_ON_LARGE_TARGET_S
    for p in profiles:
        name = f"mixed 24 h on large ({p})"
        try:
            r = run_case([*DAY_ON_LARGE_ARGS, "--scheduler", p], timeout_s=2 * target)
        except CaseTimeout as e:
            results[name] = {"timed_out": True, "wall_seconds": None, "target_seconds": target,
                             "within_target": False}
            echo(f"{name}: {e} (target {target:g} s)")
            continue
        r.update(target_seconds=target, within_target=r["wall_seconds"] <= target)
        results[name] = r
        echo(f"{name}: {r['wall_seconds']:.1f} s wall (target {target:g} s), "
             f"{r['decisions']} decisions, peak RSS {r['peak_rss_mib']:.0f} MiB")
    return results


def run_speed_suite(skip_large: bool = False, echo: Callable[[str], Any] = print,
                    profiles: Sequence[str] | None = None) -> dict[str, Any]:
    """Every case; ``profiles``: the day on large for these (default: every packaged
    profile); ``skip_large`` skips that day altogether."""
    from smartsched.scheduling.base import scheduler_names

    results: dict[str, Any] = {}
    for name, args, target in CASES:
        r = run_case(args)
        r["target_seconds"] = target
        r["within_target"] = r["wall_seconds"] <= target
        results[name] = r
        rss = "n/a" if r["peak_rss_mib"] is None else f"{r['peak_rss_mib']:.0f} MiB"
        echo(
            f"{name}: {r['wall_seconds']:.2f} s wall (target {target:g} s), "
            f"{r['decisions']} decisions, {r['decisions_per_second_end_to_end']:.0f}/s end to end, "
            f"{r['decisions_per_second_scheduler']:.0f}/s in the scheduler loop, peak RSS {rss}"
        )
    if not skip_large:
        results.update(day_on_large(scheduler_names() if profiles is None else profiles, echo))
    for sched in ("k8s-default", "fgd"):
        for nodes in (1500, 5000):
            r = profile_throughput(sched, nodes)
            results[f"throughput {sched} {nodes} nodes"] = r
            echo(f"{sched} at {nodes} nodes: {r['decisions_per_second']:.0f} decisions/s "
                 f"in the scheduler loop (p50 {r['decision_latency_us']['p50']:.0f} us, "
                 f"p99 {r['decision_latency_us']['p99']:.0f} us; {r['decisions']} pods, "
                 f"fill 1.3)")
    fk = fork_cost()
    results["fork"] = fk
    echo(f"ClusterState.fork() on {fk['cluster']} ({fk['nodes']} nodes): {fk['fork_us']:.1f} us")
    return results
