"""Run a bench's independent jobs in parallel processes.

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
    the cores, at most one per job); ``fn`` must be a module-level function."""
    n = workers or max(1, min(os.cpu_count() or 1, len(jobs)))
    if n == 1:
        return [fn(j) for j in jobs]
    with ProcessPoolExecutor(n) as pool:
        return list(pool.map(fn, jobs))
