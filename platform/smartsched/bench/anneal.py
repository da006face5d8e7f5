"""``smartsched bench anneal``: the window placer against the exact optimum, the clock and fgd.

Owns issue 21's figures, in four parts:

* ``gap``: instances the exact solver can prove (``--nodes`` openb nodes drawn at
  random, filled by fgd to a random 50-95 % of their GPU with the shuffled,
  inflated openb trace, then a window of the next ``--pods`` pods). The exact
  optimum (HiGHS, 60 s) beside the annealer's objective at each sweep budget:
  the gap to the optimum (where proven), seconds (annealing, repair and
  polish), and that every answer is feasible. The time-quality curve is plotted from these.
* ``speed``: a window of ``--window`` pods on the whole 1,213-node openb cluster,
  at three fill levels (empty, ~35 %, ~85 % GPU allocated by fgd): wall seconds of
  the whole ``place_window`` (candidates, annealing, repair, the twin check) and
  of each step, for each way of choosing the pods' homes; each window is solved
  twice and the second call shown (the first also fills the profile's per-state
  caches; its time is shown beside).
* ``fill``: the FGD paper's fill experiment at 130 % with arrivals in windows
  (``anneal:fgd?...``; a pod is known only once its window arrives) beside
  sequential fgd, per trace variant and seed: the GPU allocation rate.
* ``gangs``: ``gap``'s windows with some GPU pods made into gangs (synthetic): the
  profile alone, gangs left to the profile after the window, and gangs in the
  model, by GPUs placed and gangs placed whole, with the gang model's gap to its
  exact optimum.

The same model, the same objective and the same twin check for every solver:
the exact solver and the annealer read one ``WindowProblem``.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from smartsched.model.errors import ValidationError

SWEEPS = (1, 2, 5, 10, 20, 40, 80)


def gap_instance(seed: int, nodes: int, pods: int) -> tuple[Any, Any, list[Any], float]:
    """(profile, state, window requests, GPU allocated before the window) for one seed."""
    from smartsched.model.presets import load_cluster
    from smartsched.scheduling.run import build_run
    from smartsched.workloads.resolve import load_workload

    rng = np.random.default_rng(seed)
    full = load_cluster("openb-gpu")
    pick = np.sort(rng.choice(len(full.nodes), size=min(nodes, len(full.nodes)),
                              replace=False))
    spec = dataclasses.replace(full, name=f"openb-{nodes}", nodes=tuple(full.nodes[i]
                                                                         for i in pick))
    # The trace's pods that some drawn node could hold (the others could never be placed).
    biggest = max(n.cpu_milli for n in spec.nodes)
    trace = [p for p in load_workload("openb:default", full, 0.0, seed)
             if p.cpu_milli <= biggest]
    run = build_run(spec, trace, "fgd", mode="fill", seed=seed, inflate=1.3)
    target = float(rng.uniform(0.5, 0.95))
    eng = run.engine
    cap = float(eng.state.capacity[:, 2].sum())
    arrived = 0.0
    while True:
        req = run.next_decision()
        if req is None:
            raise RuntimeError("the trace ran out before the window")
        if arrived >= target * cap:
            window = eng.fill_window(pods)
            break
        arrived += float(req.request.vector[2])
        run.decide(req)
    alloc = float(eng.state.allocated[:, 2].sum()) / max(cap, 1.0)
    return run.scheduler, eng.state, window, alloc


def _gap_one(args: tuple[int, int, int, tuple[int, ...], float, dict[str, Any]]
             ) -> dict[str, Any]:
    seed, nodes, pods, sweeps, limit, opts = args
    from smartsched.optimize.annealer import anneal
    from smartsched.optimize.candidates import Pruning, build_problem
    from smartsched.optimize.exact import solve_exact
    from smartsched.optimize.lns import ruin_recreate
    from smartsched.optimize.repair import polish, repair

    sched, state, window, alloc = gap_instance(seed, nodes, pods)
    problem, _ = build_problem(sched, state, window, Pruning(opts["k"], opts["d"]),
                               value=opts["value"], homes=opts["homes"])
    ex = solve_exact(problem, time_limit_s=limit)
    start = problem.start if problem.start is not None else np.zeros(problem.num_pods, int)
    rows = []
    for sw in sweeps:
        t0 = time.perf_counter()
        res = anneal(problem, sweeps=sw, replicas=opts["replicas"], method=opts["method"],
                     seed=seed)
        fixed, _ = repair(problem, res.assign)
        if opts["polish"]:
            fixed, _ = polish(problem, fixed, opts["polish"])
        if opts["lns"]:
            fixed, _ = ruin_recreate(problem, fixed, opts["lns"], seed=seed)
        obj = problem.objective(fixed)
        rows.append({"sweeps": sw, "seconds": time.perf_counter() - t0, "objective": obj,
                     "feasible": bool(problem.overflow(fixed).size == 0),
                     "gap_pct": _gap(ex.objective, obj) if ex.optimal else None})
    return {"seed": seed, "gpu_allocated_before": alloc, "variables": problem.num_variables,
            "exact_optimal": ex.optimal, "exact_objective": ex.objective,
            "exact_bound": ex.bound, "exact_seconds": ex.seconds,
            "start_objective": problem.objective(start),
            "start_gap_pct": _gap(ex.objective, problem.objective(start)) if ex.optimal
            else None, "anneal": rows}


def _gap(opt: float, obj: float) -> float:
    return 100.0 * (opt - obj) / abs(opt) if opt else 0.0


def run_gap(seeds: Sequence[int], nodes: int = 100, pods: int = 200,
            sweeps: Sequence[int] = SWEEPS, limit_s: float = 60.0,
            options: dict[str, Any] | None = None, workers: int | None = None,
            echo: Callable[[str], Any] = print, plot: str | None = None) -> dict[str, Any]:
    """The exact comparison over ``seeds``; a markdown table (and the plot)."""
    from smartsched.optimize.placer import AnnealOptions
    from smartsched.pool import map_jobs

    opts = {"k": 8, "d": 2, "value": "share", "homes": "shapes", "replicas": 8,
            "method": "sa", "polish": 2000, "lns": AnnealOptions.lns, **(options or {})}
    jobs = [(s, nodes, pods, tuple(sweeps), limit_s, opts) for s in seeds]
    per = map_jobs(_gap_one, jobs, workers)
    if not any(p["exact_optimal"] or np.isfinite(p["exact_objective"]) for p in per):
        # Nothing to compare the annealer with: an empty table (exit 0) said nothing.
        raise ValidationError("limit_s", f"the exact solver found no answer on any of the "
                              f"{len(per)} instances within {limit_s:g} s: nothing to "
                              "compare with (raise --limit-s)")
    table, curve = gap_table(per, sweeps, f"{nodes} nodes x {pods} pods", limit_s)
    echo(table)
    if plot and curve:
        proven = sum(p["exact_optimal"] for p in per)
        plot_curves([(f"{nodes} nodes x {pods} pods ({proven} proven)", curve)], plot)
    return {"nodes": nodes, "pods": pods, "options": opts, "instances": per, "table": table,
            "curve": curve}


def gap_table(per: Sequence[dict[str, Any]], sweeps: Sequence[int], size: str,
              limit_s: float) -> tuple[str, list[tuple[int, float, float, float]]]:
    """Markdown tables from ``_gap_one`` results: the gap to the proven optimum (where
    HiGHS proved one) per sweep budget, then, for every instance, the gap to HiGHS's
    best answer at its time limit (negative: the annealer found more); and the curve."""
    proven = [p for p in per if p["exact_optimal"]]
    lines = [f"exact: {len(proven)} of {len(per)} instances proven optimal "
             f"({size}; HiGHS, {limit_s:.0f} s), "
             f"median {statistics.median(p['exact_seconds'] for p in per):.2f} s",
             "| sweeps | median s | median gap % | max gap % | within 2 % | feasible |",
             "|---:|---:|---:|---:|---:|---:|"]
    if proven:
        g0 = [p["start_gap_pct"] for p in proven]
        lines.append(f"| start | 0 | {statistics.median(g0):.3f} | {max(g0):.3f} | "
                     f"{sum(g <= 2.0 for g in g0)}/{len(g0)} | - |")
    curve = []
    for j, sw in enumerate(sweeps):
        secs = [p["anneal"][j]["seconds"] for p in per]
        gaps = [p["anneal"][j]["gap_pct"] for p in proven]
        feas = sum(p["anneal"][j]["feasible"] for p in per)
        if gaps:
            curve.append((sw, statistics.median(secs), statistics.median(gaps), max(gaps)))
            lines.append(f"| {sw} | {statistics.median(secs):.3f} | "
                         f"{statistics.median(gaps):.3f} | {max(gaps):.3f} | "
                         f"{sum(g <= 2.0 for g in gaps)}/{len(gaps)} | {feas}/{len(per)} |")
    with_answer = [p for p in per if np.isfinite(p["exact_objective"])]
    if with_answer:
        lines += ["", f"against HiGHS's answer at {limit_s:.0f} s, all {len(with_answer)} "
                  "instances (gap % to its answer; to its bound in brackets)",
                  "| sweeps | median gap % | max gap % | min gap % |", "|---:|---:|---:|---:|"]
        for j, sw in enumerate(sweeps):
            inc = [_gap(p["exact_objective"], p["anneal"][j]["objective"])
                   for p in with_answer]
            bnd = [_gap(p["exact_bound"], p["anneal"][j]["objective"]) for p in with_answer]
            lines.append(f"| {sw} | {statistics.median(inc):.3f} "
                         f"({statistics.median(bnd):.3f}) | {max(inc):.3f} ({max(bnd):.3f}) | "
                         f"{min(inc):.3f} |")
    return "\n".join(lines), curve


def plot_curves(curves: Sequence[tuple[str, list[tuple[int, float, float, float]]]],
                path: str) -> None:
    """Sweeps against the gap to the proven optimum (median solid, worst dashed), one
    colour per instance size, each point labelled with its median milliseconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for n, (label, curve) in enumerate(curves):
        sw = [c[0] for c in curve]
        colour = f"C{n}"
        ax.plot(sw, [c[2] for c in curve], "o-", color=colour, label=f"{label}: median")
        ax.plot(sw, [c[3] for c in curve], "s--", color=colour, alpha=0.6,
                label=f"{label}: worst")
        for c in curve:
            ax.annotate(f"{c[1] * 1e3:.0f} ms", (c[0], c[2]), textcoords="offset points",
                        xytext=(0, 6), fontsize=6, ha="center", color=colour)
    ax.axhline(2.0, color="grey", lw=0.8, ls=":", label="2 % target")
    ax.set_xscale("log")
    ax.set_xlabel("sweeps (each: about one move per pod and replica)")
    ax.set_ylabel("gap to the proven optimum, %")
    ax.set_title("Annealer time-quality (anneal + repair + polish + ruin-and-recreate, 8 replicas)",
                 fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_speed(window: int = 1000, levels: Sequence[int] = (0, 3000, 7000),
              options: Sequence[dict[str, Any]] | None = None, seed: int = 0,
              echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """``place_window`` on the whole openb cluster at fill levels (pods fgd placed first)."""
    from smartsched.optimize.placer import AnnealOptions, place_window
    from smartsched.scheduling.run import build_run

    variants = list(options or [{"homes": "shapes"}, {"homes": "profile"}])
    run = build_run("openb-gpu", "openb:default", "fgd", mode="fill", seed=seed)
    eng, sched = run.engine, run.scheduler
    st = eng.state
    rows = []
    done = 0
    lines = ["| pods placed first | GPU allocated | homes | total s | first call s | "
             "candidates s | anneal s | repair+polish+lns s | twin check s | by model | "
             "by profile | unplaced |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for level in levels:
        while done < level:
            req = run.next_decision()
            if req is None:
                break
            run.decide(req)
            done += 1
        req = run.next_decision()
        if req is None:
            break
        win = eng.fill_window(window)
        alloc = float(st.allocated[:, 2].sum() / st.capacity[:, 2].sum())
        for v in variants:
            opts = AnnealOptions(window=window, **v)
            # Twice: the first call also pays what the profile caches per state (FGD's
            # per-node fragmentation); the table shows the second, the JSON both.
            cold = 0.0
            for rep in range(2):
                t0 = time.perf_counter()
                res = place_window(sched, st, win, opts, seed=seed)
                total = time.perf_counter() - t0
                cold = total if rep == 0 else cold
            s = res.stats
            rows.append({"level": level, "gpu_allocated": alloc, "options": v, "seconds": total,
                         "cold_seconds": cold,
                         **{k: s.get(k) for k in ("build_s", "anneal_s", "repair_s",
                                                  "verify_s", "placed_by_model",
                                                  "placed_by_profile", "unplaced")}})
            lines.append(f"| {level} | {100 * alloc:.1f} % | {opts.homes} | {total:.3f} | "
                         f"{cold:.3f} | "
                         f"{s['build_s']:.3f} | {s['anneal_s']:.3f} | {s['repair_s']:.3f} | "
                         f"{s['verify_s']:.3f} | {s['placed_by_model']} | "
                         f"{s['placed_by_profile']} | {s['unplaced']} |")
        run.decide(req)  # the pod offered goes on as fgd decides it
        done += 1
    table = "\n".join(lines)
    echo(table)
    return {"window": window, "rows": rows, "table": table}


def _fill_one(args: tuple[str, str, int]) -> tuple[str, str, int, float, float]:
    variant, scheduler, seed = args
    from smartsched.scheduling.run import build_run

    t0 = time.perf_counter()
    run = build_run("openb-gpu", f"openb:{variant}", scheduler, mode="fill", seed=seed)
    run.drive()
    return (variant, scheduler, seed, float(run.report()["gpu_allocation_rate"]),
            time.perf_counter() - t0)


def run_fill(variants: Sequence[str], seeds: Sequence[int], schedulers: Sequence[str],
             workers: int | None = None, echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """GPU allocation at 130 % arrived, per variant, scheduler and seed."""
    from smartsched.pool import map_jobs

    jobs = [(v, s, seed) for v in variants for s in schedulers for seed in seeds]
    out = map_jobs(_fill_one, jobs, workers)
    runs: dict[str, dict[str, dict[int, float]]] = {}
    secs: dict[str, dict[str, list[float]]] = {}
    for v, s, seed, rate, sec in out:
        runs.setdefault(v, {}).setdefault(s, {})[seed] = rate
        secs.setdefault(v, {}).setdefault(s, []).append(sec)
    base = schedulers[0]
    lines = [f"| variant | scheduler | median GPU allocation % ({len(seeds)} seeds) | "
             f"min diff vs {base} | wins/ties/losses | median run s |",
             "|---|---|---:|---:|---:|---:|"]
    for v, by in runs.items():
        for s, r in by.items():
            d = [r[k] - by[base][k] for k in seeds]
            lines.append(f"| {v} | {s} | {statistics.median(r.values()):.3f} | "
                         f"{min(d):+.3f} | {sum(x > 1e-9 for x in d)}/"
                         f"{sum(abs(x) <= 1e-9 for x in d)}/{sum(x < -1e-9 for x in d)} | "
                         f"{statistics.median(secs[v][s]):.1f} |")
    table = "\n".join(lines)
    echo(table)
    return {"runs": runs, "seconds": secs, "table": table}


def gang_window(seed: int, nodes: int, pods: int, share: float
                ) -> tuple[Any, Any, list[Any], float, int]:
    """``gap_instance``'s window with some GPU pods turned into gangs (synthetic: the
    openb trace has none). GPU pods of one shape, in window order, are cut into runs of
    2-4 (a data-parallel job's workers are alike); each run becomes a gang with
    probability ``share``. Returns (profile, state, window, GPU allocated before, gangs)."""
    from smartsched.optimize.candidates import shape_key

    sched, state, window, alloc = gap_instance(seed, nodes, pods)
    rng = np.random.default_rng([seed, 21])
    by_shape: dict[tuple, list[int]] = {}
    for i, r in enumerate(window):
        if r.num_gpu > 0:
            by_shape.setdefault(shape_key(r.pod), []).append(i)
    out = list(window)
    gangs = 0
    for idx in by_shape.values():
        at = 0
        while len(idx) - at >= 2:
            size = int(min(rng.integers(2, 5), len(idx) - at))
            run, at = idx[at:at + size], at + size
            if rng.random() >= share:
                continue
            gid = f"gang-{seed}-{gangs}"
            gangs += 1
            for i in run:
                out[i] = state.compile(dataclasses.replace(window[i].pod, gang_id=gid,
                                                           gang_size=size))
    return sched, state, out, alloc, gangs


def _placed_figures(window: Sequence[Any], decisions: Sequence[Any]) -> dict[str, Any]:
    """GPUs placed, pods placed and gangs placed whole, from the final decisions; for the
    gangs placed whole, how many nodes each spans and the share of member pairs that
    share a node (co-location)."""
    gpus = sum(r.num_gpu * r.gpu_milli / 1000 for r, d in zip(window, decisions, strict=True)
               if d.node is not None)
    members: dict[str, list[int | None]] = {}
    for r, d in zip(window, decisions, strict=True):
        if r.pod.gang_id is not None:
            members.setdefault(r.pod.gang_id, []).append(d.node)
    whole = [v for v in members.values() if all(n is not None for n in v)]
    partial = sum(any(n is not None for n in v) and any(n is None for n in v)
                  for v in members.values())
    pairs = sum(len(v) * (len(v) - 1) // 2 for v in whole)
    together = sum(c * (c - 1) // 2 for v in whole for c in Counter(v).values())
    return {"gpus": gpus, "pods": sum(d.node is not None for d in decisions),
            "gangs_whole": len(whole), "gangs_partial": partial,
            "gang_nodes": sum(len(set(v)) for v in whole) / len(whole) if whole else None,
            "pairs_together_pct": 100.0 * together / pairs if pairs else None}


def _sequential(sched: Any, state: Any, window: Sequence[Any]) -> list[Any]:
    """The profile alone, in window order, each gang all or nothing (no preemption)."""
    from smartsched.model.errors import InfeasibleDecisionError
    from smartsched.twin.decision import Decision

    fork = state.fork(share_bound=True)
    out: list[Any] = [None] * len(window)
    units: dict[str, list[int]] = {}
    for i, r in enumerate(window):
        units.setdefault(r.pod.gang_id or f"\0{i}", []).append(i)
    for idx in units.values():
        got: list[tuple[int, Any, tuple[int, ...]]] = []
        for i in idx:
            d = sched.decide(fork, window[i])
            if d.node is None or d.victims or d.defer:
                break
            dv = tuple(d.devices) if d.devices is not None else \
                fork.pick_devices(d.node, window[i])
            try:
                fork.allocate(d.node, window[i], dv)
            except InfeasibleDecisionError:
                break
            got.append((i, d.node, dv))
        if len(got) < len(idx):
            for i, node, dv in got:
                fork.release(node, window[i], dv)
            got = []
        for i, node, dv in got:
            out[i] = Decision(node, dv)
        for i in idx:
            out[i] = out[i] or Decision.reject("not placed")
    return out


def _gangs_one(args: tuple[int, int, int, float, int, float, float]) -> dict[str, Any]:
    seed, nodes, pods, share, sweeps, limit, colocate = args
    from smartsched.optimize.exact import solve_exact
    from smartsched.optimize.placer import AnnealOptions, place_window

    sched, state, window, alloc, gangs = gang_window(seed, nodes, pods, share)
    row: dict[str, Any] = {"seed": seed, "gpu_allocated_before": alloc, "gangs": gangs,
                           "gang_pods": sum(r.pod.gang_id is not None for r in window)}
    t0 = time.perf_counter()
    row["sequential"] = {**_placed_figures(window, _sequential(sched, state, window)),
                         "seconds": time.perf_counter() - t0}
    variants = [("after", "after", 0.0), ("model", "model", 0.0)]
    if colocate > 0:
        variants.append(("colocated", "model", colocate))
    for key, how, co in variants:
        opts = AnnealOptions(window=len(window), sweeps=sweeps, value="gpu", homes="profile",
                             gangs=how, colocate=co)
        t0 = time.perf_counter()
        res = place_window(sched, state, window, opts, seed=seed)
        row[key] = {**_placed_figures(window, res.decisions),
                    "seconds": time.perf_counter() - t0}
        if how == "model" and res.problem is not None:  # the gang model's exact optimum
            ex = solve_exact(res.problem, time_limit_s=limit)
            obj = res.stats["model_objective"]
            row["exact" if key == "model" else f"exact_{key}"] = {
                "optimal": ex.optimal, "objective": ex.objective, "model_objective": obj,
                "gap_pct": _gap(ex.objective, obj) if ex.optimal else None}
    return row


def run_gangs(seeds: Sequence[int], nodes: int = 100, pods: int = 200, share: float = 0.5,
              sweeps: int = 20, limit_s: float = 60.0, workers: int | None = None,
              echo: Callable[[str], Any] = print, colocate: float = 0.0) -> dict[str, Any]:
    """Windows with gangs: the profile alone, gangs left to the profile after the window
    (``gangs=after``), and gangs in the model (``gangs=model``), with the exact optimum
    of the gang model where HiGHS proves one; with ``colocate`` > 0 also the gang model
    with co-location. Value: GPUs (the fill experiment's)."""
    from smartsched.pool import map_jobs

    per = map_jobs(_gangs_one, [(s, nodes, pods, share, sweeps, limit_s, colocate)
                                for s in seeds], workers)
    lines = [f"{nodes} nodes x {pods} pods, GPU pods of a shape cut into gangs of 2-4 with "
             f"probability {share:g} (gangs per window: median "
             f"{statistics.median(p['gangs'] for p in per):g}), {sweeps} sweeps",
             "| variant | median GPUs placed | median gangs whole | gangs in part | "
             "wins/ties/losses vs sequential (GPUs) | nodes per whole gang | member pairs "
             "on one node | median s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    rows = [("sequential", "profile alone, window order"),
            ("after", "window, gangs after it (gangs=after)"),
            ("model", "window, gangs in the model (gangs=model)")]
    if colocate > 0:
        rows.append(("colocated", f"window, gangs in the model, colocate={colocate:g}"))
    for how, label in rows:
        d = [p[how]["gpus"] - p["sequential"]["gpus"] for p in per]
        spans = [p[how]["gang_nodes"] for p in per if p[how]["gang_nodes"] is not None]
        tog = [p[how]["pairs_together_pct"] for p in per
               if p[how]["pairs_together_pct"] is not None]
        lines.append(
            f"| {label} | {statistics.median(p[how]['gpus'] for p in per):.2f} | "
            f"{statistics.median(p[how]['gangs_whole'] for p in per):g} | "
            f"{sum(p[how]['gangs_partial'] for p in per)} | "
            f"{sum(x > 1e-9 for x in d)}/{sum(abs(x) <= 1e-9 for x in d)}/"
            f"{sum(x < -1e-9 for x in d)} | "
            f"{statistics.mean(spans) if spans else float('nan'):.2f} | "
            f"{statistics.mean(tog) if tog else float('nan'):.1f} % | "
            f"{statistics.median(p[how]['seconds'] for p in per):.3f} |")
    d = [p["model"]["gpus"] - p["after"]["gpus"] for p in per]
    g = [p["model"]["gangs_whole"] - p["after"]["gangs_whole"] for p in per]
    lines.append(f"\nGangs in the model against gangs after the window, per window: GPUs "
                 f"placed more / equal / fewer {sum(x > 1e-9 for x in d)}/"
                 f"{sum(abs(x) <= 1e-9 for x in d)}/{sum(x < -1e-9 for x in d)} (median "
                 f"{statistics.median(d):+.2f}, worst {min(d):+.2f}); gangs whole more / "
                 f"equal / fewer {sum(x > 0 for x in g)}/{sum(x == 0 for x in g)}/"
                 f"{sum(x < 0 for x in g)}.")
    for key, what in (("exact", "The gang model"),
                      ("exact_colocated", "With co-location, the gang model")):
        proven = [p[key] for p in per if p.get(key) and p[key]["optimal"]]
        gaps = [e["gap_pct"] for e in proven]
        if gaps:
            lines.append(f"{what} against its exact optimum (HiGHS, {limit_s:g} s): "
                         f"{len(proven)} of {len(per)} proven; gap median "
                         f"{statistics.median(gaps):.3f} %, max {max(gaps):.3f} %, within 2 % "
                         f"on {sum(g <= 2.0 for g in gaps)}.")
    table = "\n".join(lines)
    echo(table)
    return {"nodes": nodes, "pods": pods, "share": share, "sweeps": sweeps, "instances": per,
            "table": table}
