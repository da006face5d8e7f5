"""The report folder of one simulation run: JSON, time series and plots.

Owns the files ``smartsched simulate`` writes: ``report.json`` (settings and
every metric), ``timeseries.parquet`` (one row per metric tick), and PNG
plots a person would rather look at than read (utilization over time, queue
length, start-latency CDF per class, and in fill mode the GPU allocation
curve). Reads the engine; computes no metric itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from smartsched.model.errors import ValidationError
from smartsched.model.pod import POD_CLASSES
from smartsched.twin.engine import Engine

log = logging.getLogger(__name__)


# Every file a run's report folder may hold: an earlier report's are removed before a new
# one is written, so the folder never mixes two runs (a run without plots kept the last
# run's plots beside its own figures).
PLOT_FILES = ("gpu_allocation_curve.png", "utilization.png", "queue.png",
              "start_latency_cdf.png")
REPORT_FILES = ("report.json", "timeseries.parquet", *PLOT_FILES)


def report_folder_problem(out: Path) -> str | None:
    """Why a run's report cannot go into ``out``, or None: one of its file names there is
    something other than a file (a folder named ``queue.png`` failed the run at its end)."""
    for name in REPORT_FILES:
        p = out / name
        if p.is_symlink() or (p.exists() and not p.is_file()):
            return f"{str(p)[:200]!r} is not a regular file: remove it or give another folder"
    return None


@contextlib.contextmanager
def staged_report(out: Path) -> Iterator[Path]:
    """A fresh folder inside ``out`` to write a run's report into; when the block ends
    without an error its files replace an earlier report's in ``out`` (each by a rename;
    the earlier report's files the new one lacks are removed), and on an error it is
    removed and ``out`` is as it was. (The earlier report was deleted first, so a run that
    failed while writing -- a plot, a full disk, Ctrl-C -- left neither report.)"""
    if (why := report_folder_problem(out)) is not None:
        raise ValidationError("out", why)
    out.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".report-", dir=out))
    try:
        yield stage
        for name in REPORT_FILES:
            if (stage / name).exists():
                os.replace(stage / name, out / name)
            else:
                (out / name).unlink(missing_ok=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def write_report(out: Path, engine: Engine, report: dict[str, Any], plots: bool = True) -> None:
    """Write the run's files into ``out`` (a ``staged_report`` folder): timeseries.parquet
    and the plots; report.json comes after (``write_report_json``), so the caller's
    report may carry the wall time of everything before it."""
    rows = engine.timeseries
    if rows:
        keys = sorted({k for r in rows for k in r})
        table = pa.table({k: [float(r.get(k, np.nan)) for r in rows] for k in keys})
    else:
        table = pa.table({"time_s": pa.array([], pa.float64())})
    pq.write_table(table, out / "timeseries.parquet")
    if plots:
        write_plots(out, engine, report["metrics"])


def write_report_json(out: Path, report: dict[str, Any]) -> None:
    from smartsched.outputs import json_text  # strict JSON: NaN is null

    (out / "report.json").write_text(json_text(report))


def write_plots(out: Path, engine: Engine, metrics: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = engine.timeseries
    mode = engine.config.mode
    if mode == "fill":
        curve = metrics.get("gpu_allocation_curve", [])
        fig, ax = plt.subplots(figsize=(6, 4))
        x = [p["arrived_gpu_pct"] for p in curve]
        ax.plot(x, [p["gpu_allocation_pct"] for p in curve], label="GPU allocated")
        ax.plot(x, np.minimum(x, 100), "k:", lw=0.8, label="ideal")
        if rows:
            ax.plot([r.get("arrived_gpu_pct", 0) for r in rows],
                    [r["gpu_frag_pct"] for r in rows], label="GPU fragmented (% of total)")
        ax.set_xlabel("arrived GPU demand (% of cluster GPU)")
        ax.set_ylabel("% of cluster GPU")
        ax.set_title("GPU allocation vs arrived demand (fill)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "gpu_allocation_curve.png", dpi=110)
        plt.close(fig)
        return

    if rows:
        hours = np.array([r["time_s"] for r in rows]) / 3600
        fig, ax = plt.subplots(figsize=(8, 4))
        for key, label in (
            ("alloc_cpu_pct", "CPU allocated"), ("usage_cpu_pct", "CPU used"),
            ("alloc_gpu_pct", "GPU allocated"), ("usage_gpu_pct", "GPU used"),
            ("usage_cpu_on_pct", "CPU used (powered-on)"),
        ):
            ax.plot(hours, [r[key] for r in rows], label=label)
        ax.set_xlabel("simulated hours")
        ax.set_ylabel("% of capacity")
        ax.set_title("Utilization over time")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "utilization.png", dpi=110)
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(8, 3))
        ax.plot(hours, [r["queue_length"] for r in rows], label="pending pods")
        ax2 = ax.twinx()
        ax2.plot(hours, [r["powered_on_nodes"] for r in rows], "g--", label="powered-on nodes")
        ax.set_xlabel("simulated hours")
        ax.set_ylabel("pending pods")
        ax2.set_ylabel("powered-on nodes")
        ax.set_title("Queue length and powered-on nodes")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "queue.png", dpi=110)
        plt.close(fig)

    tb = engine.table
    fig, ax = plt.subplots(figsize=(6, 4))
    for ci, cls in enumerate(POD_CLASSES):
        sel = (tb.cls == ci) & np.isfinite(tb.started_at)
        if not sel.any():
            continue
        lat = np.sort(tb.started_at[sel] - tb.arrival[sel])
        ax.step(np.maximum(lat, 1e-1), np.arange(1, lat.size + 1) / lat.size, where="post",
                label=cls.value)
    ax.set_xscale("log")
    ax.set_xlabel("start latency (s, log; 0 shown at 0.1)")
    ax.set_ylabel("CDF")
    ax.set_title("Start latency by class")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "start_latency_cdf.png", dpi=110)
    plt.close(fig)
