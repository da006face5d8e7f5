"""``smartsched bench heldout``: the decision engine's verdict table on held-out seeds.

Owns the evaluation issue 17 asks for: every scheduler (the heuristics, the
composite, the learned policy) through the same twin on the same held-out seeds,
one table of medians with bootstrap 95 % intervals, then each scheduler's change
against the baseline (k8s-default) and against the composite heuristic, *paired
by seed* (both ran the same arrivals), with the targets checked.

Why paired and bootstrapped: the training seed and the workload seed move these
figures by several times their differences (docs/benchmarks.md); a median over a
handful of seeds with an interval says how much of a gap is the scheduler. The
interval is the percentile bootstrap of the median over seeds (resampling
seeds, ``scipy.stats.bootstrap``); with 5 seeds it is coarse, and it says so by
being wide. Metrics come from the twin's reports unchanged, the same for every
scheduler.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from smartsched.bench.quality import Job, _g, run_jobs
from smartsched.model.errors import ValidationError

# The largest judged figure a merged run may report (seconds, counts, GB: none comes near).
MAX_FIGURE = 1e12


@dataclass(frozen=True)
class Figure:
    """One column: where it is in the report and which way is better."""

    name: str
    paths: tuple[tuple[str, ...], ...]  # averaged when several
    better: str  # "higher" or "lower"
    fmt: str = "{:.1f}"

    def value(self, metrics: dict[str, Any]) -> float:
        vals = [_g(metrics, *p) for p in self.paths]
        if any(v is None for v in vals):
            return math.nan
        return float(np.mean([v for v in vals if v is not None]))


FIGURES: tuple[Figure, ...] = (
    Figure("utilization %", (("usage_on_pct", "cpu"), ("usage_on_pct", "gpu")), "higher"),
    # Pods never started count with their wait so far (a lower bound): a scheduler that
    # never starts a gang must not look faster than one that starts it late.
    Figure("AI start p95 s", (("classes", "ai-train", "start_latency_all_s", "p95"),),
           "lower", "{:.0f}"),
    Figure("cross-zone GB/h", (("cross_zone_gb_per_h",),), "lower", "{:.0f}"),
    Figure("online contended %", (("slo", "online_contended_time_pct"),), "lower", "{:.2f}"),
    Figure("online queue p95 s", (("classes", "online", "queueing_delay_s", "p95"),),
           "lower", "{:.0f}"),
    Figure("edge SLO violations", (("slo", "latency_violations"),), "lower", "{:.0f}"),
)
FIG = {f.name: f for f in FIGURES}


@dataclass(frozen=True)
class Target:
    """A target against the baseline, on the median of the per-seed paired figure."""

    figure: str
    # "rel_at_least" / "rel_at_most": relative change >= / <= x; "abs_at_most": difference
    # <= x (in the figure's unit); "ratio_at_most": value / baseline's <= x.
    kind: str
    x: float
    text: str


# Issue 17's targets vs k8s-default (mixed on medium).
TARGETS: tuple[Target, ...] = (
    Target("utilization %", "rel_at_least", 0.30, "+30 % or more"),
    Target("AI start p95 s", "rel_at_most", -0.676, "-67.6 % or more"),
    Target("cross-zone GB/h", "rel_at_most", -0.417, "-41.7 % or more"),
    Target("online contended %", "abs_at_most", 0.0, "no higher"),
    Target("online queue p95 s", "abs_at_most", 60.0, "within 60 s"),
    Target("edge SLO violations", "ratio_at_most", 0.10, "at most 10 % of it"),
)


def median_ci(values: Sequence[float], seed: int = 0) -> tuple[float, float, float]:
    """Median of ``values`` and the percentile-bootstrap 95 % interval of the median."""
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    if v.size == 0:
        return math.nan, math.nan, math.nan
    med = float(np.median(v))
    if v.size < 2 or np.all(v == v[0]):
        return med, med, med
    from scipy.stats import bootstrap

    res = bootstrap((v,), np.median, confidence_level=0.95, n_resamples=2000,
                    method="percentile", random_state=np.random.default_rng(seed))
    return med, float(res.confidence_interval.low), float(res.confidence_interval.high)


def paired(fig: Figure, mine: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]],
           how: str) -> tuple[float, float, float]:
    """Per seed, ``mine`` against ``base`` on the same arrivals -- relative change
    (``rel``), symmetric relative change (``srel``: ``(a - b) / ((|a| + |b|) / 2)``, in
    [-2, 2] and defined when one side is 0), difference (``abs``) or ratio -- then the
    median over seeds with its interval. A relative change or ratio against a zero
    baseline is left out."""
    out = []
    for seed in sorted(set(mine) & set(base)):
        a, b = fig.value(mine[seed]), fig.value(base[seed])
        if not (math.isfinite(a) and math.isfinite(b)):
            continue
        if how == "abs":
            out.append(a - b)
        elif how == "srel":
            out.append(0.0 if a == b else (a - b) / ((abs(a) + abs(b)) / 2))
        elif b != 0:
            out.append((a - b) / abs(b) if how == "rel" else a / b)
    return median_ci(out)


def target_met(t: Target, mine: dict[int, dict[str, Any]],
               base: dict[int, dict[str, Any]]) -> tuple[bool, tuple[float, float, float]]:
    fig = FIG[t.figure]
    how = {"rel_at_least": "rel", "rel_at_most": "rel", "abs_at_most": "abs",
           "ratio_at_most": "ratio"}[t.kind]
    m = paired(fig, mine, base, how)
    if not math.isfinite(m[0]):
        # ratio against a baseline with none at all: met only when there are none here too
        if how == "ratio":
            vals = [fig.value(x) for x in mine.values()]
            return bool(vals) and all(v == 0 for v in vals), m
        return False, m
    ok = m[0] >= t.x if t.kind == "rel_at_least" else m[0] <= t.x
    return ok, m


def verdict_vs_composite(mine: dict[int, dict[str, Any]],
                         comp: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Issue 17: against the composite, no figure worse by more than 5 % (relative, in
    its better direction) and at least two better by 10 % or more. Symmetric relative
    changes, so that a figure the composite has at 0 (no edge SLO violations) still
    counts: 830 against 0 is +200 %, the most a change can be."""
    rows = {}
    worse, better = [], []
    for fig in FIGURES:
        med, lo, hi = paired(fig, mine, comp, "srel")
        gain = med if fig.better == "higher" else -med  # > 0: better than the composite
        rows[fig.name] = {"rel_median": med, "ci": [lo, hi], "gain": gain}
        if math.isfinite(gain):
            if gain < -0.05:
                worse.append(fig.name)
            if gain >= 0.10:
                better.append(fig.name)
    return {"figures": rows, "worse_by_over_5pct": worse, "better_by_10pct": better,
            "met": not worse and len(better) >= 2}


def run_heldout(schedulers: Sequence[str], seeds: Sequence[int], *, cluster: str = "medium",
                workload: str = "mixed", hours: float = 24.0, warmup_hours: float = 6.0,
                baseline: str = "k8s-default", composite: str = "composite",
                workers: int | None = None,
                echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """Run every scheduler on every seed; return the runs, the table and the verdicts."""
    if len(seeds) < 2:
        raise ValidationError("seeds", "need at least 2 held-out seeds (5 or more to judge)")
    scheds = list(dict.fromkeys([baseline, *schedulers]))
    jobs: list[Job] = [(workload, cluster, s, seed, hours, warmup_hours, {})
                       for s in scheds for seed in seeds]
    runs = run_jobs(jobs, workers)
    by: dict[str, dict[int, dict[str, Any]]] = {s: {} for s in scheds}
    for r in runs:
        by[r["scheduler"]][r["seed"]] = r["metrics"]
    res = summarize(by, baseline, composite)
    res.update({"cluster": cluster, "workload": workload, "hours": hours,
                "warmup_hours": warmup_hours, "seeds": list(seeds),
                "wall_seconds": {s: float(np.median([r["wall_seconds"] for r in runs
                                                     if r["scheduler"] == s])) for s in scheds}})
    res["table"] = format_heldout(res)
    echo(res["table"])
    res["runs"] = runs
    return res


def summarize(by: dict[str, dict[int, dict[str, Any]]], baseline: str,
              composite: str) -> dict[str, Any]:
    """Medians with intervals, paired changes and verdicts from per-seed metrics."""
    absolute = {s: {f.name: median_ci([f.value(m) for m in per.values()]) for f in FIGURES}
                for s, per in by.items()}
    vs_base: dict[str, Any] = {}
    vs_comp: dict[str, Any] = {}
    for s, per in by.items():
        if s == baseline:
            continue
        checks = {}
        for t in TARGETS:
            ok, m = target_met(t, per, by[baseline])
            checks[t.figure] = {"target": t.text, "met": ok, "median": m[0], "ci": [m[1], m[2]],
                                "how": t.kind}
        vs_base[s] = {"targets": checks, "all_met": all(c["met"] for c in checks.values())}
        if composite in by and s != composite:
            vs_comp[s] = verdict_vs_composite(per, by[composite])
    return {"baseline": baseline, "composite": composite, "absolute": absolute,
            "vs_baseline": vs_base, "vs_composite": vs_comp}


def _cell(fmt: str, m: Sequence[float]) -> str:
    if not math.isfinite(m[0]):
        return "-"
    if m[1] == m[2]:
        return fmt.format(m[0])
    return f"{fmt.format(m[0])} [{fmt.format(m[1])}, {fmt.format(m[2])}]"


def _change(how: str, m: Sequence[float]) -> str:
    if not math.isfinite(m[0]):
        return "-"
    if how.startswith("rel"):
        return f"{100 * m[0]:+.0f} % [{100 * m[1]:+.0f}, {100 * m[2]:+.0f}]"
    if how.startswith("ratio"):
        return f"x{m[0]:.2f} [{m[1]:.2f}, {m[2]:.2f}]"
    return f"{m[0]:+.2f} [{m[1]:+.2f}, {m[2]:+.2f}]"


def format_heldout(res: dict[str, Any]) -> str:
    names = [f.name for f in FIGURES]
    n = len(res["seeds"])
    out = [f"**{res['workload']} on {res['cluster']}**, {res['hours']:g} h after "
           f"{res['warmup_hours']:g} h warm-up, held-out seeds {res['seeds'][0]}.."
           f"{res['seeds'][-1]} ({n}): median [bootstrap 95 % interval]", "",
           "| scheduler | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for s, row in res["absolute"].items():
        out.append(f"| {s} | " + " | ".join(_cell(FIG[k].fmt, row[k]) for k in names) + " |")
    out += ["", f"Against {res['baseline']}, paired by seed (median of per-seed changes "
            "[interval]; target in brackets, met or not):", "",
            "| scheduler | " + " | ".join(f"{t.figure} ({t.text})" for t in TARGETS)
            + " | all |", "|---|" + "---:|" * (len(TARGETS) + 1)]
    for s, v in res["vs_baseline"].items():
        cells = [f"{_change(c['how'], [c['median'], *c['ci']])} "
                 f"{'met' if c['met'] else 'not met'}" for c in v["targets"].values()]
        out.append(f"| {s} | " + " | ".join(cells) + f" | {'yes' if v['all_met'] else 'no'} |")
    if res["vs_composite"]:
        out += ["", f"Against {res['composite']}, paired by seed (symmetric relative change, "
                "+-200 % at most; target: none worse by over 5 %, two or more better by "
                "10 %):", "",
                "| scheduler | " + " | ".join(names) + " | met |",
                "|---|" + "---:|" * (len(names) + 1)]
        for s, v in res["vs_composite"].items():
            cells = [_change("rel", [f["rel_median"], *f["ci"]]) for f in v["figures"].values()]
            out.append(f"| {s} | " + " | ".join(cells) + f" | {'yes' if v['met'] else 'no'} |")
    return "\n".join(out)


# A bench heldout --json file of many seeds is a few MiB; anything far larger is not one.
MAX_MERGE_BYTES = 256 << 20


def _check_figures(metrics: dict[str, Any], where: str) -> None:
    """A merged run's judged figures: each present one a number, and at least one present
    (``"metrics": {}`` was judged as a run with every figure missing, and a string or a
    list reached the medians as a traceback)."""
    present = 0
    for fig in FIGURES:
        for path in fig.paths:
            cur: Any = metrics
            for k in path:
                cur = cur.get(k) if isinstance(cur, dict) else None
            if cur is None:
                continue
            if isinstance(cur, bool) or not isinstance(cur, int | float):
                raise ValidationError(f"{where}.metrics.{'.'.join(path)}", "not a number")
            # every judged figure is a share, a count, seconds or GB: NaN, infinity, a
            # negative or 1e308 was judged (a "met" from +inf) with numpy's overflow warning
            if not (math.isfinite(cur) and 0 <= cur <= MAX_FIGURE):
                raise ValidationError(f"{where}.metrics.{'.'.join(path)}", "must be a finite "
                                      f"number within 0..{MAX_FIGURE:.0e}")
            present += 1
    if not present:
        raise ValidationError(f"{where}.metrics", "holds none of the judged figures")


def merge_heldout(paths: Sequence[str], *, baseline: str = "k8s-default",
                  composite: str = "composite",
                  echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """The verdict over the seeds of several earlier runs (their ``--json`` files), without
    running anything: seeds measured apart (another day, another machine) judged as one
    set. The runs must agree on cluster, workload, hours and warm-up; a scheduler and seed
    in two files must have the same report (else they were not the same run); only
    schedulers measured on every seed of the baseline are judged (the others are named)."""
    import json

    by: dict[str, dict[int, dict[str, Any]]] = {}
    setting: dict[str, Any] | None = None
    keys = ("cluster", "workload", "hours", "warmup_hours")
    for i, path in enumerate(paths):
        field = f"merge[{i}]"
        try:
            st = os.stat(path)
        except OSError as e:
            raise ValidationError(field, f"cannot read {str(path)[:200]!r} "
                                  f"({e.strerror or type(e).__name__})") from None
        if not stat.S_ISREG(st.st_mode):  # a FIFO waited forever, /dev/zero filled memory
            raise ValidationError(field, f"{str(path)[:200]!r} is not a regular file")
        if st.st_size > MAX_MERGE_BYTES:
            raise ValidationError(field, f"{str(path)[:200]!r} is over "
                                  f"{MAX_MERGE_BYTES >> 20} MiB: not a bench heldout file")
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, UnicodeDecodeError, ValueError, RecursionError, MemoryError) as e:
            raise ValidationError(field, f"cannot read {str(path)[:200]!r} as JSON "
                                  f"({type(e).__name__})") from None
        runs = doc.get("runs") if isinstance(doc, dict) else None
        if not isinstance(runs, list) or not runs:
            raise ValidationError(field, "has no runs (write it with bench heldout --json)")
        mine = {k: doc.get(k) for k in keys}
        if setting is None:
            setting = mine
        elif mine != setting:
            diff = [k for k in keys if mine[k] != setting[k]]
            raise ValidationError(field, f"was run with other {', '.join(diff)} than "
                                  "merge[0]")
        for j, r in enumerate(runs):
            where = f"{field}.runs[{j}]"
            if not (isinstance(r, dict) and isinstance(r.get("scheduler"), str)
                    and type(r.get("seed")) is int and isinstance(r.get("metrics"), dict)):
                raise ValidationError(where, "needs scheduler, seed (an integer), metrics")
            if not 0 <= r["seed"] < 2**32:
                raise ValidationError(f"{where}.seed", "must be within 0..2**32-1")
            _check_figures(r["metrics"], where)
            s, seed = r["scheduler"], r["seed"]
            seen = by.setdefault(s, {}).get(seed)
            if seen is not None and _judged(seen) != _judged(r["metrics"]):
                raise ValidationError(f"{field}.runs[{j}]", f"{s[:200]!r} on seed {seed} "
                                      "differs from an earlier file's run of it")
            by[s][seed] = r["metrics"]
    assert setting is not None
    if baseline not in by:
        raise ValidationError("baseline", f"{baseline[:200]!r} is in none of the files")
    seeds = sorted(by[baseline])
    if len(seeds) < 2:
        raise ValidationError("merge", "the baseline has fewer than 2 seeds")
    whole = {s: per for s, per in by.items() if set(per) >= set(seeds)}
    for s in by:
        if s not in whole:
            echo(f"left out (not on every seed of {baseline}): {s}")
    res = summarize({s: {k: per[k] for k in seeds} for s, per in whole.items()},
                    baseline, composite)
    res.update({**setting, "seeds": seeds, "merged_from": [str(p) for p in paths]})
    res["table"] = format_heldout(res)
    echo(res["table"])
    return res


def _judged(metrics: dict[str, Any]) -> list[float]:
    """The figures a verdict reads from one report (timings are not among them)."""
    return [f.value(metrics) for f in FIGURES]
