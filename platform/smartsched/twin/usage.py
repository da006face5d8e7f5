"""Actual resource use of running pods over time, vectorized over pods.

Owns the evaluation of usage profiles (constant, diurnal, bursty) at a
simulation time. Bursts are drawn from a counter-based hash of (pod, window,
seed) so usage is deterministic for a seed and identical whatever scheduler
placed the pods.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from smartsched.model.pod import USAGE_KINDS, UsageKind

BURST_WINDOW_S: Final = 600.0
KIND_IDS: Final = {k: i for i, k in enumerate(USAGE_KINDS)}
_DIURNAL: Final = KIND_IDS[UsageKind.DIURNAL]
_BURSTY: Final = KIND_IDS[UsageKind.BURSTY]


def _hash01(a: np.ndarray, b: np.ndarray, seed: int) -> np.ndarray:
    """Uniform [0,1) values from integer keys (splitmix64-style mixing)."""
    x = (a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ (
        b.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
    )
    x ^= np.uint64(((seed & 0xFFFFFFFF) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0xD6E8FEB86659FD93)
    x ^= x >> np.uint64(32)
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def usage_factor(
    t: float,
    pod_ids: np.ndarray,
    kind: np.ndarray,
    mean: np.ndarray,
    amplitude: np.ndarray,
    peak_hour: np.ndarray,
    burst_factor: np.ndarray,
    burst_probability: np.ndarray,
    seed: int,
) -> np.ndarray:
    """Fraction of its request each pod uses at time ``t`` (may exceed 1 for bursts).

    diurnal: mean + amplitude * cos(2*pi*(hour - peak_hour) / 24)
    bursty:  mean * burst_factor in a window with probability burst_probability, else mean
    """
    hour = (t / 3600.0) % 24.0
    f = mean.copy()
    d = kind == _DIURNAL
    if d.any():
        f[d] += amplitude[d] * np.cos(2 * np.pi * (hour - peak_hour[d]) / 24.0)
    b = kind == _BURSTY
    if b.any():
        window = np.full(int(b.sum()), int(t // BURST_WINDOW_S), dtype=np.int64)
        hit = _hash01(pod_ids[b], window, seed) < burst_probability[b]
        f[b] = np.where(hit, f[b] * burst_factor[b], f[b])
    return np.clip(f, 0.0, None)
