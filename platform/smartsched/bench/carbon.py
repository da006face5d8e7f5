"""``smartsched bench carbon``: temporal shifting against its perfect-knowledge bound.

Owns issue 20's figures for temporal shifting, per grid series and deadline slack:
the same random deferrable jobs run carbon-agnostic (from arrival), by the
forecast-driven policy and by the perfect-knowledge bound (``carbon.shifting``), and
the share of the bound's saving the policy captures; deadline misses (there must be
none); the cost in waiting (hours between arrival and finish beyond the work); and
the forecaster's error against two baselines on the same origins. Location-based
accounting: each hour's energy times the grid's average intensity in that hour.

Jobs: arrival hours uniform over the series after a warm-up (five weeks of past for
the forecaster) and before its end, work 1-8 h, deadline = arrival + slack, 1 kW
(figures scale with power). The policies never see the jobs' future beyond their
own forecast; nothing here is fitted to one series.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from smartsched.carbon.forecast import (
    DAY,
    WEEK,
    ForecastTable,
    errors,
    hourly,
    lag_regression,
    last_value,
    seasonal_naive,
)
from smartsched.carbon.shifting import Job, agnostic, emitted_kg, forecast, oracle
from smartsched.model.errors import ValidationError

SERIES = ("ger-2020", "gb-2020", "ca-2022")
WARMUP_H = WEEK + 28 * DAY


def random_jobs(n_hours: int, count: int, slack_h: int, seed: int,
                interruptible: bool = True, max_work: int = 8) -> list[Job]:
    rng = np.random.default_rng(seed)
    last = n_hours - slack_h - 1
    if last <= WARMUP_H:
        raise ValueError(f"series too short: {n_hours} h (needs > {WARMUP_H + slack_h} h)")
    arrivals = rng.integers(WARMUP_H, last, count)
    work = rng.integers(1, min(max_work, slack_h) + 1, count)
    return [Job(int(a), int(w), int(a) + slack_h, 1.0, interruptible)
            for a, w in zip(arrivals, work, strict=True)]


def evaluate(y: np.ndarray, table: ForecastTable, jobs: Sequence[Job]) -> dict[str, Any]:
    """Carbon of each way of running ``jobs`` on ``y``, misses and waiting."""
    kg = {"agnostic": 0.0, "forecast": 0.0, "oracle": 0.0}
    wait = {"forecast": 0.0, "oracle": 0.0}
    misses = 0
    for j in jobs:
        plans = {"agnostic": agnostic(j), "forecast": forecast(j, table),
                 "oracle": oracle(j, y)}
        for k, hours in plans.items():
            kg[k] += emitted_kg(j, hours, y)
        ran = plans["forecast"]
        misses += ran.size != j.work or ran.max() >= j.deadline or ran.min() < j.arrival
        for k in wait:
            wait[k] += float(plans[k].max() + 1 - j.arrival - j.work)
    saved_bound = kg["agnostic"] - kg["oracle"]
    saved = kg["agnostic"] - kg["forecast"]
    return {
        "jobs": len(jobs),
        "agnostic_kg": kg["agnostic"],
        "forecast_kg": kg["forecast"],
        "oracle_kg": kg["oracle"],
        # A series of zeros emits nothing to save: the shares are undefined (None).
        "forecast_saving_pct": 100 * saved / kg["agnostic"] if kg["agnostic"] > 0 else None,
        "oracle_saving_pct": (100 * saved_bound / kg["agnostic"] if kg["agnostic"] > 0
                              else None),
        "captured_pct": 100 * saved / saved_bound if saved_bound > 0 else None,
        "deadline_misses": misses,
        "forecast_wait_h": wait["forecast"] / len(jobs),
        "oracle_wait_h": wait["oracle"] / len(jobs),
    }


def exact_ahead(y: np.ndarray, table: ForecastTable, hours: int) -> ForecastTable:
    """``table`` with its first ``hours`` horizons replaced by the true values: a what-if
    (how much a forecast exact that far ahead would capture), never a policy -- it reads
    the future."""
    rows = table.rows.copy()
    n = y.size
    for h in range(1, min(hours, table.horizon) + 1):
        rows[: n - h, h - 1] = y[h:]
        rows[n - h:, h - 1] = np.nan
    return ForecastTable(rows, f"exact for {hours} h")


def run_carbon(series: Sequence[str] = SERIES, slacks: Sequence[int] = (24, 48),
               jobs: int = 2000, seed: int = 0, plot: str | Path | None = None,
               data_dir: Path | None = None, echo: Callable[[str], Any] = print,
               exact_hours: Sequence[int] = ()) -> dict[str, Any]:
    """The forecast-driven policy against the bound for each series, deadline and
    pausability. ``exact_hours``: also what the same rule captures when the forecast is
    exact for the first k hours ahead (the forecaster's after), for each k -- how much a
    better forecast could buy, which no forecaster from the series' past reaches."""
    from smartsched.model.carbon import load_series
    from smartsched.paths import data_dir as default_data_dir

    root = data_dir or default_data_dir()
    horizon = max(slacks)
    rows: list[dict[str, Any]] = []
    forecast_errors: dict[str, Any] = {}
    given: dict[str, str] = {}
    for spec in series:
        loaded = load_series(spec, root)
        name = loaded.name
        if name in given:  # rows and errors are keyed by it: the first's errors were lost
            raise ValidationError("series", f"two series named {name!r} ({given[name]}, "
                                  f"{spec}): give files of different names")
        given[name] = spec
        y = hourly(loaded)
        if y.size <= WARMUP_H + horizon + 1:  # (a file of one's own may be short)
            raise ValidationError("series", f"{name} holds {y.size} h; the benchmark needs "
                                  f"more than {WARMUP_H + horizon + 1} h (five weeks of past "
                                  "for the forecaster, then the longest slack)")
        table = lag_regression(y, horizon)
        origins = np.arange(WARMUP_H, y.size)
        forecast_errors[name] = errors(
            y, [table, seasonal_naive(y, horizon), last_value(y, horizon)], origins)
        for slack in slacks:
            for pausable in (True, False):
                js = random_jobs(y.size, jobs, slack, seed, pausable)
                row = {"series": name, "slack_h": slack, "interruptible": pausable,
                       **evaluate(y, table, js)}
                if exact_hours:
                    row["captured_if_exact_pct"] = {
                        k: evaluate(y, exact_ahead(y, table, k), js)["captured_pct"]
                        for k in exact_hours}
                rows.append(row)
        if plot is not None and spec == series[0]:
            plot_week(y, table, Path(plot), name, max(slacks), seed)
    echo(format_tables(rows, forecast_errors))
    return {"rows": rows, "forecast_errors": forecast_errors, "jobs": jobs, "seed": seed}


def format_tables(rows: list[dict[str, Any]], errs: dict[str, Any]) -> str:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else fmt.format(v)

    lines = ["series | slack h | pause | agnostic kg | forecast -% | bound -% | captured % | "
             "misses | wait h (forecast / bound)"]
    for r in rows:
        lines.append(" | ".join([
            r["series"], str(r["slack_h"]), "yes" if r["interruptible"] else "no",
            f(r["agnostic_kg"], "{:.0f}"), f(r["forecast_saving_pct"], "{:.1f}"),
            f(r["oracle_saving_pct"], "{:.1f}"), f(r["captured_pct"], "{:.1f}"),
            str(r["deadline_misses"]),
            f"{r['forecast_wait_h']:.1f} / {r['oracle_wait_h']:.1f}",
        ]))
    if any("captured_if_exact_pct" in r for r in rows):
        ks = list(rows[0]["captured_if_exact_pct"])
        lines.append("")
        lines.append("captured % if the forecast were exact for the first k hours ahead "
                     "(a what-if that reads the future)")
        lines.append("series | slack h | pause | forecaster | " + " | ".join(
            f"exact {k} h" for k in ks))
        for r in rows:
            lines.append(" | ".join([
                r["series"], str(r["slack_h"]), "yes" if r["interruptible"] else "no",
                f(r["captured_pct"], "{:.1f}"),
                *(f(r["captured_if_exact_pct"][k], "{:.1f}") for k in ks)]))
    lines.append("")
    lines.append("forecast error, MAPE % (MAE g/kWh) by horizon hours")
    for name, res in errs.items():
        for method, bands in res.items():
            cells = [f"{b}: {v['mape_pct']:.1f} ({v['mae']:.0f})" for b, v in bands.items()]
            lines.append(f"{name} | {method} | " + " | ".join(cells))
    return "\n".join(lines)


def plot_week(y: np.ndarray, table: ForecastTable, out: Path, name: str, slack_h: int,
              seed: int, count: int = 80) -> None:
    """Intensity over one week with ``count`` jobs' power on top, carbon-agnostic and
    shifted by the forecast policy (jobs arriving in the week's first days, due within
    it; drawn for the plot, like the bench's, from ``seed``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = WARMUP_H + 2 * WEEK
    end = start + WEEK
    rng = np.random.default_rng(seed)
    arrivals = rng.integers(start, end - slack_h, count)
    works = rng.integers(1, 9, count)
    jobs = [Job(int(a), int(w), int(a) + slack_h) for a, w in zip(arrivals, works, strict=True)]
    agn = np.zeros(y.size)
    shf = np.zeros(y.size)
    for j in jobs:
        np.add.at(agn, agnostic(j), j.power_kw)
        np.add.at(shf, forecast(j, table), j.power_kw)
    saved = 100 * (1 - (shf * y).sum() / (agn * y).sum())
    hours = np.arange(start, end)
    days = (hours - start) / 24.0
    fig, ax = plt.subplots(figsize=(11, 4.2))
    ax.fill_between(days, 0, y[hours], color="#d9d9d9", step="post", label="grid intensity")
    ax.set_ylabel("gCO2/kWh")
    ax.set_xlabel("day of the week shown")
    ax2 = ax.twinx()
    ax2.fill_between(days, 0, shf[hours], step="post", color="#2ca02c", alpha=0.45,
                     label="deferrable work, shifted by forecast")
    ax2.step(days, agn[hours], where="post", color="#d62728", lw=1.3,
             label="deferrable work, carbon-agnostic")
    ax2.set_ylabel("kW of deferrable work")
    ax2.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="upper center",
              bbox_to_anchor=(0.5, -0.13), ncol=3, fontsize=8, frameon=False)
    ax.set_title(f"{name}: one week, {count} jobs of 1-8 h due {slack_h} h after arrival; "
                 f"shifting by forecast emits {saved:.0f} % less")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- the twin
THREE_GRIDS = {
    "name": "three-grids",
    "sites": [{"name": "de", "pue": 1.3, "carbon": "ger-2020", "coords_km": [0, 0]},
              {"name": "gb", "pue": 1.3, "carbon": "gb-2020", "coords_km": [900, 300]},
              {"name": "ca", "pue": 1.3, "carbon": "ca-2022", "coords_km": [8800, 0]}],
    "zones": [{"name": f"{s}-1", "site": s} for s in ("de", "gb", "ca")],
    "nodes": [{"name": f"{s}-n", "zone": f"{s}-1", "cpu_milli": 64000, "memory_mib": 262144,
               "count": 12} for s in ("de", "gb", "ca")],
}
PUBLIC_GRIDS = tuple(s["carbon"] for s in THREE_GRIDS["sites"])


def grids_doc(series: Sequence[str] | None = None) -> dict[str, Any]:
    """The twin's cluster for the carbon runs: THREE_GRIDS, or as many regions of 12
    nodes as ``series`` names (public names or CSV files of one's own, read as
    ``model.carbon.load_series`` reads them), 1,000 km apart."""
    if series is None or tuple(series) == PUBLIC_GRIDS:
        return THREE_GRIDS
    sites = [{"name": f"grid{i}", "pue": 1.3, "carbon": _absolute_series(spec),
              "coords_km": [1000 * i, 0]} for i, spec in enumerate(series)]
    return {"name": "grids", "sites": sites,
            "zones": [{"name": f"grid{i}-1", "site": f"grid{i}"} for i in range(len(sites))],
            "nodes": [{"name": f"grid{i}-n", "zone": f"grid{i}-1", "cpu_milli": 64000,
                       "memory_mib": 262144, "count": 12} for i in range(len(sites))]}


def _absolute_series(spec: str) -> str:
    """A series file by its absolute path (the runs may read it in other worker
    processes); a public name, or what is neither (refused when loaded), as it is."""
    from smartsched.model.carbon import PUBLIC_SERIES, series_file

    if spec in PUBLIC_SERIES:
        return spec
    try:
        path, tcol, vcol = series_file(spec)
    except ValidationError:
        return spec
    return str(path.resolve()) + (f":{tcol}:{vcol}" if tcol is not None else "")


TWIN_VARIANTS = ("agnostic", "time", "space", "time+space")
# Also known: "green" and "time+green" (GreenScore picks the node instead of GridCarbon),
# and "green-run", "time+green-run" (GreenScore with the renewable share expected over the
# pod's run instead of the grid's now).
ALL_TWIN_VARIANTS = (*TWIN_VARIANTS, "green", "time+green", "green-run", "time+green-run")


def _batch_profile(name: str, defer: bool, grid: bool, green: bool | str = False) -> Any:
    from smartsched.scheduling.registry import read_profile_doc

    doc, _ = read_profile_doc("green-batch")
    doc = dict(doc, name=name)
    if not defer:
        doc["defer"] = []
    if not grid:
        doc["score"] = [s for s in doc["score"] if s["name"] != "GridCarbon"]
    if green:  # GreenScore where GridCarbon was, at its weight
        entry: dict[str, Any] = {"name": "GreenScore", "weight": 10}
        if green == "run":
            entry["args"] = {"over": "run"}
        doc["score"] = [*doc["score"], entry]
    return doc


def twin_scheduler(variant: str, seed: int) -> Any:
    """The composite with batch placed carbon-agnostic, or with CarbonShift (time),
    GridCarbon (space), GreenScore (green) or time with either."""
    from smartsched.scheduling.base import SplitScheduler, make_scheduler
    from smartsched.scheduling.framework import ProfileScheduler
    from smartsched.scheduling.registry import profile_from_dict

    if variant == "agnostic":
        return make_scheduler("composite", seed)
    if variant not in ALL_TWIN_VARIANTS:
        raise ValidationError("variants", f"unknown variant {variant!r} (known: "
                              f"{', '.join(ALL_TWIN_VARIANTS)})")
    batch = ProfileScheduler(profile_from_dict(_batch_profile(
        f"batch-{variant}", "time" in variant, "space" in variant,
        ("run" if variant.endswith("-run") else "green" in variant))), seed)
    online = make_scheduler("composite-online", seed)
    accel = make_scheduler("composite-accelerators", seed)
    return SplitScheduler(f"green-{variant}", {
        "online": online, "edge-rt": online, "ai-infer": accel, "ai-train": accel,
        "batch": batch})


TWIN_WARMUP_H = 6.0  # simulated before each twin run is measured


def _check_days_fit(days: Sequence[int], span_h: float,
                    doc: dict[str, Any] | None = None) -> None:
    """Every run from its start day must end within the shortest grid series: a series
    repeats after its end, so a later start would read the year's first days as if
    they came next (and the 365- and 366-day series would wrap at different days)."""
    from smartsched.model.presets import cluster_from_dict

    spec = cluster_from_dict(doc or THREE_GRIDS)
    shortest = min(len(s.carbon.values) * s.carbon.step_s for s in spec.sites) / 3600.0
    if span_h > shortest:  # (the message below said "the last start day is -1")
        raise ValidationError("days", f"no run fits: one run ({span_h:g} h with its warm-up)"
                              f" is longer than the shortest grid series ({shortest:g} h)")
    for d in days:
        if d * 24.0 + span_h > shortest:
            raise ValidationError("days", f"a run from day {d} ({span_h:g} h with its "
                                  f"warm-up) ends past the shortest grid series "
                                  f"({shortest / 24:g} days): the last start day is "
                                  f"{int((shortest - span_h) // 24)}")


def _twin_job(job: tuple[str, int, int, int, float, dict[str, Any]]) -> dict[str, Any]:
    import dataclasses

    from smartsched.model.presets import cluster_from_dict
    from smartsched.scheduling.run import build_run
    from smartsched.workloads.mixed import generate_mixed, load_profile

    variant, day, slack, seed, hours, doc = job
    spec = cluster_from_dict(doc)
    spec = dataclasses.replace(spec, sites=tuple(
        dataclasses.replace(s, carbon=s.carbon.with_offset(day * 86400.0)) for s in spec.sites))
    prof = load_profile()
    prof["batch"] = dict(prof["batch"], deadline_hours=float(slack))
    warm = TWIN_WARMUP_H
    pods = generate_mixed(spec, hours=hours + warm, seed=seed, profile=prof)
    run = build_run(spec, pods, twin_scheduler(variant, seed), seed=seed, hours=hours,
                    warmup_hours=warm)
    run.drive()
    m = run.engine.run_report()
    batch = m["classes"].get("batch", {})
    return {"variant": variant, "day": day, "slack_h": slack, "seed": seed,
            "batch_kg": m["pod_carbon_kg"].get("batch", 0.0), "carbon_kg": m["carbon_kg"],
            "green_score": m["green"]["score"],
            "deadline_missed": m["pods"]["deadline_missed"],
            "batch_wait_pod_h": batch.get("waiting_pod_hours", 0.0),
            "batch_pods": batch.get("arrived", 0)}


def run_twin_carbon(days: Sequence[int] = (45, 135, 225, 315), slacks: Sequence[int] = (24, 48),
                    hours: float = 72.0, variants: Sequence[str] = TWIN_VARIANTS,
                    workers: int | None = None, echo: Callable[[str], Any] = print,
                    series: Sequence[str] | None = None) -> dict[str, Any]:
    """The mixed workload (batch deadline = slack) on three regions with the DE, GB and
    CA grids (or one region per grid of ``series``: ``grids_doc``), from each start day
    of the series; batch pods' own carbon per variant (``agnostic``, the reference,
    always runs)."""
    from smartsched.pool import map_jobs

    unknown = [v for v in variants if v not in ALL_TWIN_VARIANTS]
    if unknown:
        raise ValidationError("variants", f"unknown variant {unknown[0]!r} (known: "
                              f"{', '.join(ALL_TWIN_VARIANTS)})")
    doc = grids_doc(series)
    _check_days_fit(days, hours + TWIN_WARMUP_H, doc)
    variants = ["agnostic", *(v for v in dict.fromkeys(variants) if v != "agnostic")]
    jobs = [(v, d, s, k, hours, doc) for s in slacks for v in variants
            for k, d in enumerate(days)]
    res = map_jobs(_twin_job, jobs, workers)
    rows = []
    for s in slacks:
        base = sum(r["batch_kg"] for r in res if r["slack_h"] == s and r["variant"] == "agnostic")
        for v in variants:
            rs = [r for r in res if r["slack_h"] == s and r["variant"] == v]
            kg = sum(r["batch_kg"] for r in rs)
            rows.append({"slack_h": s, "variant": v, "batch_kg": kg,
                         "vs_agnostic_pct": 100 * (kg - base) / base if base else None,
                         "cluster_kg": sum(r["carbon_kg"] for r in rs),
                         "deadline_missed": sum(r["deadline_missed"] for r in rs),
                         "batch_wait_h_per_pod": sum(r["batch_wait_pod_h"] for r in rs)
                         / max(1, sum(r["batch_pods"] for r in rs)),
                         "green_score": float(np.mean([r["green_score"] for r in rs]))})
    grids = ("three regions (DE 2020, GB 2020, CA 2022 grids)" if doc is THREE_GRIDS else
             f"{len(doc['sites'])} regions (grids: "
             + ", ".join(str(s["carbon"]) for s in doc["sites"]) + ")")
    lines = [f"twin: {grids}, mixed workload, "
             f"{hours:g} h from days {list(days)}; batch pods' own carbon",
             "deadline h | variant | batch kg | vs agnostic | cluster kg | missed | "
             "batch wait h/pod | GreenScore"]
    for r in rows:
        lines.append(f"{r['slack_h']} | {r['variant']} | {r['batch_kg']:.1f} | "
                     f"{r['vs_agnostic_pct']:+.1f} % | {r['cluster_kg']:.0f} | "
                     f"{r['deadline_missed']} | {r['batch_wait_h_per_pod']:.1f} | "
                     f"{r['green_score']:.3f}")
    echo("\n".join(lines))
    return {"rows": rows, "runs": res, "days": list(days), "hours": hours}
