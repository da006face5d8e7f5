"""Drive a scheduler over an engine built elsewhere (kept for callers of ``run``).

New code builds runs with ``scheduling.run.build_run``, which also attaches the
hooks a scheduler asks for; this drives an existing engine through the same
loop (``Run.drive``).
"""

from __future__ import annotations

from typing import Any

from smartsched.scheduling.base import Scheduler, WorkloadAware
from smartsched.scheduling.run import Run
from smartsched.twin.engine import Engine


def run(engine: Engine, scheduler: Scheduler, progress: bool = False) -> dict[str, Any]:
    """Run ``engine`` to the end under ``scheduler``; return the metrics dict."""
    if isinstance(scheduler, WorkloadAware):
        scheduler.prepare(engine.source_pods)
    r = Run(engine.spec, engine, scheduler, {})
    r.drive(progress=progress)
    return r.report()
