"""Render one Grafana panel's data to a PNG, straight from Prometheus.

Owns ``smartsched telemetry panel``: it reads a panel's PromQL targets from a
dashboard JSON (the same file an operator imports into Grafana), runs them as
range queries against a Prometheus server, and draws what the panel shows --
a heatmap for status-history panels (one row per series), lines otherwise. It
is how the docs show the dashboard without a Grafana server, and a quick look
for anyone with only Prometheus at hand.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from smartsched.model.errors import ValidationError
from smartsched.paths import read_regular_file
from smartsched.prometheus.source import PrometheusSource

MAX_DASHBOARD_BYTES = 64 << 20  # a Grafana dashboard's JSON: a few hundred KiB
# The dashboard ``telemetry panel`` draws from when none is named: the one the project
# ships under ``infra/grafana`` (found beside this checkout, so the command works from
# any directory; a wheel without the checkout must be given ``--dashboard``).
DEFAULT_DASHBOARD = "infra/grafana/smartsched-cluster.json"


def default_dashboard() -> Path:
    """The shipped cluster dashboard: in the source checkout this package was installed
    from (``pip install -e``), else relative to the working directory (which the error
    then names)."""
    beside = Path(__file__).resolve().parents[3] / DEFAULT_DASHBOARD
    return beside if beside.is_file() else Path(DEFAULT_DASHBOARD)


def find_panel(dashboard: str | Path, title: str) -> dict[str, Any]:
    """The panel titled ``title`` in the Grafana dashboard JSON at ``dashboard``. A FIFO is
    refused rather than waited on; a binary file, or JSON that is no dashboard, is named
    rather than a UnicodeDecodeError or AttributeError traceback."""
    try:
        dash = json.loads(read_regular_file(dashboard, MAX_DASHBOARD_BYTES).decode("utf-8"))
    except OSError as e:
        raise ValidationError("dashboard", f"cannot read {dashboard}: {e.strerror or e}"
                              ) from None
    except ValueError as e:  # not UTF-8 text, or not JSON
        raise ValidationError("dashboard", f"cannot read {dashboard}: {e}") from None
    panels = dash.get("panels", []) if isinstance(dash, dict) else None
    if not isinstance(panels, list):
        raise ValidationError("dashboard", f"{dashboard} is not a Grafana dashboard (a JSON "
                              "object with a list of panels)")
    panels = [p for p in panels if isinstance(p, dict)]
    for p in panels:
        if p.get("title") == title:
            return p
    raise ValidationError("title", f"no panel {title!r}; panels: "
                          f"{[p.get('title') for p in panels]}")


def _legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or str(labels)


# The most series one panel draws (a status-history panel gives each a row).
MAX_PANEL_ROWS = 400


def render_panel(url: str, dashboard: str | Path, title: str, out: str | Path, *,
                 minutes: float = 10.0, step_s: float = 5.0) -> dict[str, Any]:
    """Query the panel's targets over the last ``minutes`` and save a PNG; returns a summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not (minutes > 0 and step_s > 0):
        raise ValidationError("minutes", "minutes and step must be > 0")
    with PrometheusSource(url, [], timeout_s=10.0) as src:  # the URL is checked first
        panel = find_panel(dashboard, title)
        targets = panel.get("targets", [])
        for i, t in enumerate(targets):
            if not isinstance(t, dict) or not isinstance(t.get("expr"), str):
                raise ValidationError(f"panels[{title!r}].targets[{i}].expr", "missing")
        end = time.time()
        start = end - minutes * 60.0
        rows: list[tuple[str, np.ndarray, np.ndarray]] = []
        for t in targets:
            for labels, ts, vals in src.range(t["expr"], start, end, step_s):
                rows.append((_legend(t.get("legendFormat", ""), labels), ts, vals))
        sim = src.range("smartsched_twin_simulated_seconds", start, end, step_s)
    if not rows:
        raise ValidationError("prometheus", f"no data for panel {title!r} in the last "
                              f"{minutes:g} minutes")
    if len(rows) > MAX_PANEL_ROWS:  # a row each: 20,000 made a 9,000-inch figure
        raise ValidationError("prometheus", f"panel {title!r}: {len(rows):,} series; at most "
                              f"{MAX_PANEL_ROWS} can be drawn (narrow the query)")
    # Simulated time on the x axis when the twin's clock is in the same Prometheus and ran
    # forward over the whole window (a restarted twin resets it: then wall minutes).
    grid = np.arange(start, end + step_s / 2, step_s)
    if len(sim) == 1 and len(sim[0][2]) > 1 and (np.diff(sim[0][2]) >= 0).all():
        x = np.interp(grid, sim[0][1], sim[0][2]) / 3600.0
        xlabel = "simulated hours"
    else:
        x = (grid - grid[0]) / 60.0
        xlabel = "minutes"
    rows.sort(key=lambda r: r[0])
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.6
                                    if panel.get("type") == "status-history" else 4.2))
    if panel.get("type") == "status-history":
        M = np.full((len(rows), len(grid)), np.nan)
        for i, (_, ts, vals) in enumerate(rows):
            idx = np.clip(np.rint((ts - start) / step_s).astype(int), 0, len(grid) - 1)
            M[i, idx] = vals
        scale = 100.0 if unit == "percentunit" else 1.0
        # Cell edges on the x axis: simulated time is not linear in wall time (a paused or
        # restarted twin), so columns get their real width.
        mid = (x[1:] + x[:-1]) / 2
        edges = np.concatenate([[x[0]], mid, [x[-1]]])
        with np.errstate(over="ignore"):  # a 1e308 sample is drawn as the scale's end
            cells = M * scale
        im = ax.pcolormesh(edges, np.arange(len(rows) + 1) - 0.5, cells, cmap="RdYlGn_r",
                           vmin=0, vmax=100 if unit == "percentunit" else None)
        ax.invert_yaxis()
        ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
        fig.colorbar(im, ax=ax, label="%" if unit == "percentunit" else unit, pad=0.01)
    else:
        for name, ts, vals in rows:
            ax.plot(np.interp(ts, grid, x), vals, lw=1, label=name)
        ax.legend(fontsize=7, loc="upper left", ncol=2)
        ax.set_ylabel(unit)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return {"panel": title, "series": len(rows), "points": int(sum(len(r[1]) for r in rows)),
            "x": xlabel, "out": str(out)}
