"""Block-bootstrap resampling of a recorded workload: many plausible episodes from one.

Why: the promotion gate (``rl.gate``) compares candidate and incumbent on paired
episodes and promotes only when a bootstrap lower bound of the gain is above zero.
On a recorded trace (the service's recent experience) every seed replays the same
pods, so every episode gives the same gain, its spread is zero and the "lower
bound" is just the one replay's gain: a candidate a hair better on that one replay
would pass. A seed here draws another episode from the same recent distribution
instead -- never the future -- so the paired gains vary as the traffic could.

The method is a block bootstrap over time (Kunsch 1989; Politis and Romano's
stationary bootstrap is the same idea with random block lengths): the trace's span
is cut into blocks (eight by default, or of ``block_s`` seconds), as many blocks as it
spans are drawn
with replacement, and laid end to end, so bursts and the mix within a block (an
online surge, a gang with its neighbours) stay together while their order and
counts vary. A gang goes with the block of its first member's arrival. Pod and
gang names get the slot's number (``name~3``), so a block drawn twice is two sets
of pods.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod

DEFAULT_BLOCKS = 8
MAX_BLOCKS = 100_000  # a block length that cuts the span finer is refused (memory)


def resample_blocks(pods: Sequence[Pod], seed: int, block_s: float | None = None
                    ) -> list[Pod]:
    """One block-bootstrap episode of ``pods`` (arrivals from 0), the same for a seed.
    ``block_s`` None: the span cut into ``DEFAULT_BLOCKS`` blocks (a recorded window of
    a few minutes and a day's trace both give several blocks to draw from)."""
    if not pods:
        raise ValidationError("workload", "nothing to resample: the workload holds no pods")
    t0 = min(p.arrival for p in pods)
    if block_s is None:
        span = max(p.arrival for p in pods) - t0
        block_s = span / DEFAULT_BLOCKS * (1 + 1e-9) if span > 0 else 1.0
    if not math.isfinite(block_s) or block_s <= 0:
        raise ValidationError("workload.block_s", f"must be a number > 0, got {block_s!r}")
    # A gang's members go with the block of its first arrival.
    gang_start: dict[str, float] = {}
    for p in pods:
        if p.gang_id is not None:
            gang_start[p.gang_id] = min(gang_start.get(p.gang_id, p.arrival), p.arrival)
    start = np.array([gang_start[p.gang_id] if p.gang_id is not None else p.arrival
                      for p in pods]) - t0
    if float(start.max()) / block_s >= MAX_BLOCKS:
        raise ValidationError("workload.block_s", f"{block_s:g} s cuts the span of "
                              f"{float(start.max()):g} s into more than {MAX_BLOCKS:,} blocks")
    block = (start // block_s).astype(np.int64)
    n_blocks = int(block.max()) + 1
    members: list[list[int]] = [[] for _ in range(n_blocks)]
    for i, b in enumerate(block.tolist()):
        members[b].append(i)
    drawn = np.random.default_rng(seed).integers(0, n_blocks, size=n_blocks)
    out: list[Pod] = []
    for slot, b in enumerate(drawn.tolist()):
        shift = (slot - b) * block_s
        for i in members[b]:
            p = pods[i]
            out.append(replace(
                p, id=f"{p.id}~{slot}", arrival=p.arrival - t0 + shift,
                # A deadline is absolute: it moves with its pod, the slack stays.
                deadline=None if p.deadline is None else p.deadline - t0 + shift,
                gang_id=None if p.gang_id is None else f"{p.gang_id}~{slot}"))
    if not out:  # every draw fell on empty blocks: keep the episode non-empty
        return resample_blocks(pods, seed + 1_000_003, block_s)
    out.sort(key=lambda p: p.arrival)
    return out


def parse_resample_spec(rest: str) -> tuple[str, float | None]:
    """``<workload>[?block_s=S]`` -> (the inner workload, the block length or None)."""
    inner, sep, query = rest.rpartition("?")
    block_s: float | None = None
    if sep and query.startswith("block_s="):
        raw = query.split("=", 1)[1]
        try:
            block_s = float(raw)
        except ValueError:
            raise ValidationError("workload.block_s", f"must be a number, got {raw!r}") \
                from None
    else:
        inner = rest
    if not inner:
        raise ValidationError("workload", "resample: needs a workload, e.g. "
                              "resample:recent.parquet")
    return inner, block_s
