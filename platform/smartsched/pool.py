"""Run independent jobs (benchmarks, distillation, the promotion gate) in parallel processes.

Owns the one rule every bench uses: a pool sized to the machine's cores (or
``workers``), and no pool at all for a single worker, so a run in one process can
be profiled and debugged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

J = TypeVar("J")
R = TypeVar("R")


def map_jobs(fn: Callable[[J], R], jobs: Sequence[J], workers: int | None = None) -> list[R]:
    """``[fn(j) for j in jobs]``, in order, across up to ``workers`` processes (default:
    the cores), never more than one per job: the pool starts every worker it is sized
    for, so ``--workers 100000`` forked processes by the thousand for a handful of runs
    (and left them behind when stopped). ``fn`` must be a module-level function."""
    n = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if n == 1:
        return [fn(j) for j in jobs]
    with ProcessPoolExecutor(n) as pool:
        return list(pool.map(fn, jobs))
