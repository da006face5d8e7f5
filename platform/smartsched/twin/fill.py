"""The FGD paper's "fill" workload: inflate a trace to a target share of cluster GPU.

Method (Weng et al., USENIX ATC '23; hkust-adsl/kubernetes-scheduler-simulator):
compare the pods' total GPU request (sum of num_gpu * gpu_milli) with
``inflate`` x the cluster's GPU milli. Below it, append copies of pods drawn
uniformly with replacement until the next copy would pass the target; above
it, drop pods drawn uniformly until at or below. Then shuffle the whole list.
All randomness comes from one seeded generator. Pods keep no times: they
arrive in list order and never leave; gangs are dissolved (the paper's
trace has none, and copies of single members would make partial gangs).
``FillProgress`` is the mode's clock: list order, and the allocation curve.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from smartsched.model.pod import Pod


def tune_pods_to_gpu_target(
    pods: Sequence[Pod], cluster_gpu_milli: int, inflate: float, rng: np.random.Generator
) -> list[Pod]:
    """Return the inflated (or deflated) and shuffled pod list; arrivals and durations cleared."""
    if not pods:
        return []
    gpu = np.array([p.gpu_total_milli for p in pods], dtype=np.int64)
    target = inflate * cluster_gpu_milli
    total = int(gpu.sum())
    chosen: list[int] = list(range(len(pods)))
    copies = 0
    if total < target and gpu.any():
        # Draw in batches: the stopping rule is sequential but the draws are i.i.d.
        while True:
            draws = rng.integers(0, len(pods), size=4096)
            cum = total + np.cumsum(gpu[draws])
            stop = np.flatnonzero(cum > target)
            take = draws[: stop[0]] if stop.size else draws
            chosen.extend(take.tolist())
            copies += take.size
            total = int(cum[take.size - 1]) if take.size else total
            if stop.size:
                break
    elif total > target:
        keep = np.ones(len(pods), dtype=bool)
        while total > target:
            i = int(rng.integers(0, len(pods)))
            if keep[i]:
                keep[i] = False
                total -= int(gpu[i])
        chosen = np.flatnonzero(keep).tolist()
    order = rng.permutation(len(chosen))
    seen: dict[int, int] = {}
    out: list[Pod] = []
    for j in order:
        i = chosen[j]
        n = seen.get(i, 0)
        seen[i] = n + 1
        pid = pods[i].id if n == 0 else f"{pods[i].id}-tuned-{n}"
        out.append(
            dataclasses.replace(
                pods[i], id=pid, arrival=0.0, duration=None, deadline=None, gang_id=None,
                gang_size=1,
            )
        )
    return out


class FillProgress:
    """Fill mode's clock: pods offered one by one in list order, and the curve of GPU
    allocated against GPU arrived (a point per arrived percent; a fragmentation sample
    every ``frag_every_pct``)."""

    def __init__(self, order: list[int], cluster_gpu_milli: float, frag_every_pct: float) -> None:
        self.order = order
        self.pos = 0
        self.cap_gpu = float(cluster_gpu_milli)
        self.frag_every_pct = frag_every_pct
        self.arrived_gpu = 0.0
        self.curve: list[tuple[float, float]] = [(0.0, 0.0)]
        self._next_curve_pct = 1
        self._next_frag_pct = 0.0

    def next_pod(self) -> int | None:
        """The next pod to arrive, or None when every pod has."""
        if self.pos >= len(self.order):
            return None
        i = self.order[self.pos]
        self.pos += 1
        return i

    @property
    def arrived_pct(self) -> float:
        return 100.0 * self.arrived_gpu / max(self.cap_gpu, 1.0)

    def decided(self, gpu_milli: float, allocated_gpu_milli: float) -> bool:
        """Pods asking ``gpu_milli`` in all were decided; returns whether a fragmentation
        sample is due."""
        if self.cap_gpu == 0:
            return False
        self.arrived_gpu += gpu_milli
        arrived_pct = 100.0 * self.arrived_gpu / self.cap_gpu
        alloc_pct = 100.0 * allocated_gpu_milli / self.cap_gpu
        if arrived_pct >= self._next_curve_pct:
            self.curve.append((round(arrived_pct, 3), round(float(alloc_pct), 3)))
            self._next_curve_pct = math.floor(arrived_pct) + 1
        if arrived_pct >= self._next_frag_pct:
            step = self.frag_every_pct
            self._next_frag_pct = (math.floor(arrived_pct / step) + 1) * step
            return True
        return False
