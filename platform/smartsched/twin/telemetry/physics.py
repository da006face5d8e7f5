"""Pure formulas of the node telemetry model, vectorized over nodes.

Owns the small, monotone curves the synthesizer composes: queueing delay,
saturation loss, cache hit ratios under memory pressure, IPC, run-queue
length, memory heaviness of a pod, and the first-order thermal lag. Every
function maps numpy arrays to numpy arrays with no state; the constants they
use are module-level so the documentation and the tests can name them.
"""

from __future__ import annotations

from typing import Final

import numpy as np

# Utilization is capped here before it enters a queueing curve, so delays stay finite
# (1 + u/(1-u) <= 50 times the unloaded value).
U_CAP: Final = 0.98

# A pod's memory heaviness goes from 0 at LIGHT to 1 at HEAVY GiB requested per core
# (online services ask ~2 GiB/core, a 64-core / 256 GiB node offers 4).
HEAVY_LIGHT_GIB_PER_CORE: Final = 2.0
HEAVY_HEAVY_GIB_PER_CORE: Final = 6.0

# Cache hit ratio of each level with no memory pressure, and what full pressure takes off.
CACHE_HIT_BASE: Final = np.array([0.96, 0.85, 0.75])  # L1, L2, L3
CACHE_HIT_DROP: Final = np.array([0.05, 0.25, 0.45])
# Pressure = HEAVY_WEIGHT * heavy share + (1 - HEAVY_WEIGHT) * memory-bandwidth utilization.
HEAVY_WEIGHT: Final = 0.6

# IPC of a busy core: IPC_FLOOR at an L3 hit ratio of 0, + IPC_PER_L3_HIT per unit of hit
# ratio, less up to IPC_SMT_LOSS when every hardware thread of the socket is busy.
IPC_FLOOR: Final = 0.5
IPC_PER_L3_HIT: Final = 1.8
IPC_SMT_LOSS: Final = 0.2

# Run queue: busy cores plus a queue that grows as u/(1-u) (sharply above ~90 %).
RUNQ_QUEUE_SCALE: Final = 2.0


def queueing_factor(u: np.ndarray, cap: float = U_CAP) -> np.ndarray:
    """Sojourn over service time of an M/M/1 queue: ``1 + u/(1-u)``, u capped at ``cap``."""
    uc = np.clip(u, 0.0, cap)
    return 1.0 + uc / (1.0 - uc)


def saturation_loss(u: np.ndarray, onset: float = 0.85) -> np.ndarray:
    """0 below ``onset``, rising quadratically to 1 at full utilization (and beyond)."""
    return np.clip((u - onset) / (1.0 - onset), 0.0, 1.0) ** 2


def memory_heaviness(memory_mib: np.ndarray, cpu_milli: np.ndarray) -> np.ndarray:
    """0..1: how memory-heavy a pod is from its memory-to-CPU request ratio (GiB per core)."""
    gib_per_core = (memory_mib / 1024.0) / np.maximum(cpu_milli / 1000.0, 0.1)
    span = HEAVY_HEAVY_GIB_PER_CORE - HEAVY_LIGHT_GIB_PER_CORE
    return np.clip((gib_per_core - HEAVY_LIGHT_GIB_PER_CORE) / span, 0.0, 1.0)


def cache_hit_ratios(heavy_share: np.ndarray, bandwidth_util: np.ndarray) -> np.ndarray:
    """[N, 3] hit ratios of L1, L2, L3.

    pressure = 0.6 * heavy_share + 0.4 * bandwidth_util (both 0..1)
    hit[level] = base[level] - drop[level] * pressure

    so L1 > L2 > L3 always (0.91 > 0.60 > 0.30 at full pressure), and every level
    falls as memory-heavy pods crowd the node or its memory bandwidth fills up.
    """
    p = np.clip(HEAVY_WEIGHT * heavy_share + (1 - HEAVY_WEIGHT) * bandwidth_util, 0.0, 1.0)
    return CACHE_HIT_BASE[None, :] - CACHE_HIT_DROP[None, :] * p[:, None]


def instructions_per_cycle(l3_hit: np.ndarray, util: np.ndarray) -> np.ndarray:
    """IPC = (0.5 + 1.8 * L3 hit) * (1 - 0.2 * util): falls as the L3 hit ratio falls."""
    return (IPC_FLOOR + IPC_PER_L3_HIT * l3_hit) * (1.0 - IPC_SMT_LOSS * np.clip(util, 0, 1))


def run_queue_length(cores: np.ndarray, demand: np.ndarray) -> np.ndarray:
    """Runnable tasks: ``cores * min(d, 1) + 2 * q(d) + cores * max(d - 1, 0)``.

    ``demand`` d is CPU demand over capacity (above 1 when pods burst past it);
    q(d) = u/(1-u) with u = min(d, 0.98) is the queue a nearly full machine builds.
    """
    d = np.maximum(demand, 0.0)
    return (cores * np.minimum(d, 1.0) + RUNQ_QUEUE_SCALE * (queueing_factor(d) - 1.0)
            + cores * np.maximum(d - 1.0, 0.0))


def spill_to_free_sockets(raw: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Per-socket utilization from per-socket demand ``raw`` [N, S] (1.0 = socket full).

    Demand above a socket's capacity moves to the node's other sockets in
    proportion to their free room (the kernel's load balancing), so the mean
    over present sockets equals min(node demand, 1).
    """
    raw = np.where(present, raw, 0.0)
    held = np.minimum(raw, 1.0)
    excess = (raw - held).sum(axis=1, keepdims=True)
    room = np.where(present, 1.0 - held, 0.0)
    total_room = room.sum(axis=1, keepdims=True)
    share = np.divide(room, total_room, out=np.zeros_like(room), where=total_room > 0)
    return np.minimum(held + np.minimum(excess, total_room) * share, 1.0)


def first_order_lag(prev: np.ndarray, target: np.ndarray, elapsed_s: float,
                    tau_s: float) -> np.ndarray:
    """``prev`` moved towards ``target`` by ``1 - exp(-elapsed/tau)``."""
    a = 1.0 - np.exp(-max(elapsed_s, 0.0) / tau_s)
    return prev + (target - prev) * a
