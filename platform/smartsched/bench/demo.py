"""The end-to-end demo behind ``smartsched demo``: schedulers side by side on the mixed workload.

Owns which schedulers the demo runs by default (k8s-default, fgd, and the
shipped policy when its folder exists), running each through the same
``bench.simulate.simulate`` on one cluster, seed and horizon -- a report
folder per scheduler under ``out`` -- and writing the comparison as
``comparison.txt`` (the table) and ``comparison.json`` (the reports).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smartsched.model.errors import ValidationError
from smartsched.outputs import json_text

SHIPPED_POLICY = "models/ppo_mixed_small"  # relative to the working directory
DEMO_WORKLOAD = "mixed"


@dataclass(frozen=True)
class DemoResult:
    reports: list[dict[str, Any]]  # one simulate report per scheduler, in order
    table: str  # comparison_table(reports), as written to comparison.txt


def default_schedulers(shipped_policy: str | Path = SHIPPED_POLICY) -> list[str]:
    """k8s-default and fgd, plus ``rl:<shipped_policy>`` when that folder exists."""
    names = ["k8s-default", "fgd"]
    if Path(shipped_policy).is_dir():
        names.append(f"rl:{shipped_policy}")
    return names


def report_folder_name(spec: str) -> str:
    """The folder, directly inside the demo's ``--out``, of one scheduler's report: its
    spec as one path component (``rl:models/p`` -> ``rl:models_p``). The spec itself was
    the path: ``../../prof/mine.yaml`` wrote outside ``--out``, an absolute profile path
    over the profile file."""
    import re

    name = re.sub(r"[^\w.:+=,-]", "_", spec.replace("/", "_"))[:200]
    return name if name and not name.startswith(".") else f"_{name}"


def run_demo(out: str | Path, *, cluster: str = "small", hours: float = 24.0, seed: int = 0,
             warmup_hours: float = 6.0, schedulers: Sequence[str] | None = None,
             progress: bool = False, echo: Callable[[str], Any] = print) -> DemoResult:
    """Simulate each scheduler (default: ``default_schedulers()``) on ``cluster`` for
    ``hours`` of the mixed workload; write the reports and the comparison under ``out``."""
    from smartsched.bench.compare import comparison_table
    from smartsched.bench.simulate import simulate

    out = Path(out)
    names = default_schedulers() if schedulers is None else list(schedulers)
    folders = [report_folder_name(n) for n in names]
    for i, f in enumerate(folders):  # rl:a/b and rl:a_b: the second replaced the first
        if f in folders[:i]:
            raise ValidationError("schedulers", f"{names[folders.index(f)][:64]!r} and "
                                  f"{names[i][:64]!r} would share one report folder ({f!r})")
    reports = []
    for name, folder in zip(names, folders, strict=True):
        echo(f"simulating {name} on {cluster} for {hours:g} h of the mixed workload ...")
        reports.append(simulate(
            cluster, DEMO_WORKLOAD, name, seed=seed, hours=hours, warmup_hours=warmup_hours,
            out=out / folder, progress=progress,
        ))
    table = comparison_table(reports)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.txt").write_text(table + "\n")
    (out / "comparison.json").write_text(json_text(reports))  # strict JSON: NaN is null
    return DemoResult(reports, table)
