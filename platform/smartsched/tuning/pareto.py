"""Pareto front, per-scenario recommendations, table and plot of a reward-weight sweep.

Owns what a person looks at after ``smartsched tune``: which trials are
non-dominated over the sweep's objectives, which trial each scenario profile
should use, and the same as a Markdown table, CSV and a PNG.

A trial's standing on objective ``o`` is its symmetric relative change against
the baseline scheduler on the same twin seeds, signed so that larger is better:
``rel_o = s_o * (value_o - base_o) / max((|value_o| + |base_o|) / 2, eps)`` with
``s_o = +1`` for ``max`` objectives and ``-1`` for ``min`` (bounded by 2 in size,
and defined when the baseline's figure is 0, e.g. no pod ever waited). A
scenario profile with weights ``w`` picks, among the Pareto trials, the one
with the largest ``sum_o w[component_o] * rel_o`` -- the trade-off that
profile asks for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from smartsched.objectives.reward import COMPONENTS, RewardWeights
from smartsched.tuning.sweep import Objective

EPS = 1e-9


def relative(values: Mapping[str, float], base: Mapping[str, float],
             objectives: Mapping[str, Objective]) -> dict[str, float]:
    """Signed relative change of each objective against the baseline (larger is better)."""
    out = {}
    for name, o in objectives.items():
        s = 1.0 if o.mode == "max" else -1.0
        v, b = values[name], base[name]
        out[name] = s * (v - b) / max((abs(v) + abs(b)) / 2, EPS)
    return out


def pct_change(value: float, base: float) -> str:
    """Plain change against the baseline for people: '+25 %', or 'n/a' when it is 0."""
    return f"{100 * (value - base) / abs(base):+.0f} %" if abs(base) > EPS else "n/a"


def pareto_mask(values: np.ndarray, modes: Sequence[str]) -> np.ndarray:
    """Rows of ``values`` (trials x objectives) that no other row dominates."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return np.zeros(0, dtype=bool)
    sign = np.array([1.0 if m == "max" else -1.0 for m in modes])
    g = v * sign  # larger is better everywhere
    ge = (g[:, None, :] >= g[None, :, :]).all(axis=2)  # ge[j, i]: j at least as good as i
    gt = (g[:, None, :] > g[None, :, :]).any(axis=2)
    dominated = (ge & gt).any(axis=0)
    return ~dominated


def recommend(rows: Sequence[dict[str, Any]], objectives: Mapping[str, Objective],
              scenarios: Mapping[str, RewardWeights]) -> dict[str, dict[str, Any]]:
    """For each scenario, the Pareto row with the best scenario-weighted relative change."""
    front = [r for r in rows if r["pareto"]]
    out: dict[str, dict[str, Any]] = {}
    for name, w in scenarios.items():
        def score(r: dict[str, Any], w: RewardWeights = w) -> float:
            return sum(getattr(w, o.component) * r["relative"][k] for k, o in objectives.items())

        if front:
            best = max(front, key=score)
            out[name] = {"trial": best["trial"], "score": score(best), "row": best}
    return out


def recommendations_yaml(recs: Mapping[str, dict[str, Any]],
                         objectives: Mapping[str, Objective], baseline: str) -> str:
    """The recommended weights in the scenario-profile schema (loadable by load_scenarios)."""
    import yaml

    doc = {}
    for name, rec in recs.items():
        r = rec["row"]
        figures = ", ".join(f"{k} {r['values'][k]:.4g} ({baseline} {r['base'][k]:.4g})"
                            for k in objectives)
        doc[name] = {"description": f"trial {r['trial']} of the sweep: {figures}",
                     "weights": {c: round(float(r["weights"][c]), 4) for c in COMPONENTS}}
    head = ("# Recommended reward weights per scenario profile, written by `smartsched tune`.\n"
            "# Same schema as objectives/profiles/scenarios.yaml.\n")
    return head + yaml.safe_dump(doc, sort_keys=False, width=100)


def markdown_table(rows: Sequence[dict[str, Any]], objectives: Mapping[str, Objective],
                   base: Mapping[str, float], baseline: str) -> str:
    searched = [c for c in COMPONENTS if any(
        r["weights"][c] != rows[0]["weights"][c] for r in rows)] if rows else []
    head = ["trial", "Pareto", "iters", *[f"w.{c}" for c in searched],
            *[f"{k} ({objectives[k].mode})" for k in objectives]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines.append("| " + " | ".join([baseline, "", "", *[""] * len(searched),
                                    *[f"{base[k]:.4g}" for k in objectives]]) + " |")
    order = sorted(rows, key=lambda r: (not r["pareto"], r["trial"]))
    for r in order:
        cells = [r["trial"], "**yes**" if r["pareto"] else "", str(r["iterations"]),
                 *[f"{r['weights'][c]:.3g}" for c in searched],
                 *[f"{r['values'][k]:.4g} ({pct_change(r['values'][k], base[k])})"
                   for k in objectives]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(path: Path, rows: Sequence[dict[str, Any]],
              objectives: Mapping[str, Objective]) -> None:
    import csv

    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trial", "pareto", "iterations", *[f"w.{c}" for c in COMPONENTS],
                    *objectives, *[f"rel.{k}" for k in objectives], "checkpoint"])
        for r in rows:
            w.writerow([r["trial"], int(r["pareto"]), r["iterations"],
                        *[r["weights"][c] for c in COMPONENTS],
                        *[r["values"][k] for k in objectives],
                        *[r["relative"][k] for k in objectives], r.get("checkpoint") or ""])


def plot_front(path: Path, rows: Sequence[dict[str, Any]], objectives: Mapping[str, Objective],
               base: Mapping[str, float], baseline: str) -> None:
    """One panel per pair of objectives: all trials, the Pareto ones marked, the baseline."""
    import itertools

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(objectives)
    pairs = list(itertools.combinations(names, 2))
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.6 * len(pairs), 4.2), squeeze=False)
    for ax, (a, b) in zip(axes[0], pairs, strict=True):
        for front, style in ((False, {"c": "0.6", "s": 22, "label": "trial"}),
                             (True, {"c": "tab:red", "s": 40, "label": "Pareto"})):
            pts = [r for r in rows if r["pareto"] == front]
            ax.scatter([r["values"][a] for r in pts], [r["values"][b] for r in pts], **style)
        ax.scatter([base[a]], [base[b]], marker="*", s=160, c="k", label=baseline)
        ax.set_xlabel(f"{a} ({objectives[a].mode})")
        ax.set_ylabel(f"{b} ({objectives[b].mode})")
        ax.grid(alpha=0.3)
    axes[0][0].legend(loc="best", fontsize=8)
    fig.suptitle("Reward-weight sweep: evaluated objectives per trial")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
