"""``smartsched bench sandbox``: what sandbox validation costs and what it refuses.

Two measurements (issue 18):

* the time to validate one decision on a loaded 1,500-node region (the service
  benchmark's ``regional`` shape, filled to ~60 % with a mix of pods; the
  decisions validated are k8s-default's for the next pods), p50/p95;
* on the twin (``mixed`` on ``medium`` by default), each profile run as it is and
  as ``sandboxed:<profile>`` on the same seed: how many decisions were validated
  and refused, of which kind, why (the first reasons), and what the refusals
  changed in the run's figures (the held-out benchmark's six figures).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from smartsched.bench.heldout import FIGURES


def validation_latency(nodes: int = 1500, decisions: int = 200, seed: int = 0,
                       load: float = 0.6) -> dict[str, Any]:
    """Seconds per validation of k8s-default's decisions on a loaded ``regional`` region."""
    from smartsched.model.pod import Pod, PodClass, UsageProfile
    from smartsched.model.presets import regional
    from smartsched.scheduling.sandbox import Placement, Proposal, Sandbox
    from smartsched.serving.site import SitePlacer, site_subspec

    site = SitePlacer(site_subspec(regional(nodes), ["region-a"]), "k8s-default",
                      sandbox_mode="off")
    rng = np.random.default_rng(seed)

    def pod(i: int) -> Pod:
        online = rng.random() < 0.4
        return Pod(id=f"p{i}", cpu_milli=int(rng.choice([500, 1000, 2000, 4000, 8000])),
                   memory_mib=int(rng.choice([1024, 4096, 16384])),
                   pod_class=PodClass.ONLINE if online else PodClass.BATCH,
                   app=f"app{i % 20}" if online else None,
                   duration=float(rng.integers(300, 4 * 3600)),
                   usage=UsageProfile(mean=float(rng.uniform(0.3, 0.9))))

    cpu_total = float(site.state.capacity[:, 0].sum())
    pods, used, i = [], 0.0, 0
    while used < load * cpu_total:
        p = pod(i)
        pods.append(p)
        used += p.cpu_milli
        i += 1
    site.place(pods, ttl_s=86_400)
    sandbox = Sandbox()
    for k, p in enumerate(pods[-2000:]):  # the recent pods, one every 2 s
        sandbox.observe(p, 2.0 * k)
    times, refused, arrivals, horizon = [], 0, [], []
    for k in range(decisions):
        p = pod(i + k)
        req = site.state.compile(p)
        d = site.scheduler.decide(site.state, req)
        if d.node is None:
            continue
        v = sandbox.validate(site.state, Proposal((Placement(req, d.node, d.devices),)))
        times.append(v.seconds)
        refused += not v.accepted
        arrivals.append(v.arrivals)
        horizon.append(v.horizon_s)
    ms = np.array(times) * 1000
    return {"nodes": nodes, "bound_pods": len(site.state.bound), "validations": len(times),
            "refused": refused, "p50_ms": float(np.percentile(ms, 50)),
            "p95_ms": float(np.percentile(ms, 95)), "max_ms": float(ms.max()),
            "arrivals_per_sample": float(np.mean(arrivals)),
            "horizon_s": float(np.median(horizon))}


def _twin_job(job: tuple[str, str, str, int, float, float]) -> dict[str, Any]:
    """One run: the report's metrics, and the sandbox's counters when it is sandboxed."""
    from smartsched.scheduling.run import build_run

    workload, cluster, scheduler, seed, hours, warmup = job
    from smartsched.scheduling.base import make_scheduler

    sched = make_scheduler(scheduler, seed)
    run = build_run(cluster, workload, sched, seed=seed, hours=hours, warmup_hours=warmup)
    t0 = time.perf_counter()
    run.drive()
    out: dict[str, Any] = {"scheduler": scheduler, "wall_s": time.perf_counter() - t0,
                           "metrics": run.report()}
    sandbox = getattr(sched, "sandbox", None)
    if sandbox is not None:
        ms = np.array(sandbox.seconds or [0.0]) * 1000
        out.update(validated=dict(sched.validated), refused=dict(sched.refused),
                   reasons=[r["reasons"][0] for r in list(sched.refusals)[:5]],
                   validate_p50_ms=float(np.percentile(ms, 50)),
                   validate_p95_ms=float(np.percentile(ms, 95)))
    return out


def refusal_costs(profiles: Sequence[str], *, cluster: str = "medium", workload: str = "mixed",
                  hours: float = 24.0, warmup_hours: float = 6.0, seed: int = 30000,
                  options: str = "", workers: int | None = None) -> list[dict[str, Any]]:
    """Each profile as it is and sandboxed (``options``: the wrapper's query string)."""
    from smartsched.pool import map_jobs

    jobs = []
    for p in profiles:
        wrapped = f"sandboxed:{p}" + (f"?{options}" if options else "")
        jobs += [(workload, cluster, p, seed, hours, warmup_hours),
                 (workload, cluster, wrapped, seed, hours, warmup_hours)]
    runs = map_jobs(_twin_job, jobs, workers)
    rows = []
    for k, p in enumerate(profiles):
        base, boxed = runs[2 * k], runs[2 * k + 1]
        rows.append({"profile": p, "base": base, "sandboxed": boxed,
                     "figures": {f.name: (f.value(base["metrics"]), f.value(boxed["metrics"]))
                                 for f in FIGURES}})
    return rows


def run_sandbox_bench(profiles: Sequence[str], *, nodes: int = 1500, decisions: int = 200,
                      cluster: str = "medium", workload: str = "mixed", hours: float = 24.0,
                      warmup_hours: float = 6.0, seed: int = 30000, options: str = "",
                      workers: int | None = None, skip_twin: bool = False,
                      echo: Callable[[str], Any] = print) -> dict[str, Any]:
    echo(f"validating {decisions} decisions on a loaded {nodes}-node region ...")
    lat = validation_latency(nodes, decisions)
    echo(f"validation at {nodes} nodes ({lat['bound_pods']} bound pods, "
         f"{lat['arrivals_per_sample']:.0f} arrivals per draw over {lat['horizon_s']:.0f} s): "
         f"p50 {lat['p50_ms']:.1f} ms, p95 {lat['p95_ms']:.1f} ms, max {lat['max_ms']:.1f} ms; "
         f"{lat['refused']} of {lat['validations']} refused")
    res: dict[str, Any] = {"latency": lat}
    if skip_twin:
        return res
    echo(f"{workload} on {cluster}, seed {seed}, {hours:g} h after {warmup_hours:g} h: "
         f"{', '.join(profiles)} as they are and sandboxed ...")
    rows = refusal_costs(profiles, cluster=cluster, workload=workload, hours=hours,
                         warmup_hours=warmup_hours, seed=seed, options=options,
                         workers=workers)
    res["twin"] = rows
    for line in format_refusals(rows):
        echo(line)
    return res


def format_refusals(rows: Sequence[dict[str, Any]]) -> list[str]:
    names = [f.name for f in FIGURES]
    lines = ["| profile | validated | refused | validation p50 / p95 ms | "
             + " | ".join(names) + " |", "|---|---:|---:|---:|" + "---:|" * len(names)]
    for r in rows:
        b = r["sandboxed"]
        val = ", ".join(f"{k} {v}" for k, v in sorted(b.get("validated", {}).items())) or "0"
        ref = ", ".join(f"{k} {v}" for k, v in sorted(b.get("refused", {}).items())) or "0"
        cells = []
        for name in names:
            f = next(x for x in FIGURES if x.name == name)
            before, after = r["figures"][name]
            cells.append(f"{f.fmt.format(before)} -> {f.fmt.format(after)}")
        lines.append(f"| {r['profile']} | {val} | {ref} | {b.get('validate_p50_ms', 0):.1f} / "
                     f"{b.get('validate_p95_ms', 0):.1f} | " + " | ".join(cells) + " |")
    for r in rows:
        for why in r["sandboxed"].get("reasons", [])[:3]:
            lines.append(f"  {r['profile']} refusal: {why}")
    return lines
