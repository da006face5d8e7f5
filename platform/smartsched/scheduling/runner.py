"""Drive a scheduler over the twin's step-wise API: the scheduling loop.

Owns the loop ``next_decision -> scheduler.decide -> apply`` with per-decision
timing and an optional progress bar. Lives outside the twin so the twin never
imports scheduling.
"""

from __future__ import annotations

import time
from typing import Any

from smartsched.scheduling.base import Scheduler
from smartsched.twin.engine import Engine


def run(engine: Engine, scheduler: Scheduler, progress: bool = False) -> dict[str, Any]:
    """Run ``engine`` to the end under ``scheduler``; return the metrics dict."""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(engine.table), unit="pod", desc=scheduler.name, mininterval=0.5,
                   leave=False)
    if hasattr(scheduler, "prepare"):
        scheduler.prepare(engine.source_pods)
    perf = time.perf_counter
    done = 0
    while (req := engine.next_decision()) is not None:
        t0 = perf()
        engine.apply(scheduler.decide(engine.state, req.request))
        engine.record_decision_time(perf() - t0)
        done += 1
        if bar is not None and done % 256 == 0:
            bar.n = int((engine.table.status != 0).sum())
            bar.refresh()
    if bar is not None:
        bar.close()
    return engine.run_report()
