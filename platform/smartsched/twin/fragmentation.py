"""GPU fragmentation as defined by the FGD paper (Weng et al., USENIX ATC '23).

Owns the "typical pods" target workload and the per-node fragmentation
measure. For a task m asking ``k`` GPUs of ``g`` milli (and ``c`` CPU), node
n with per-device free milli ``left_i`` and ``L = sum_i left_i``:

    frag_n(m) = sum_{i: left_i < g} left_i   if the node can host m
                                              (>= k devices with left_i >= g,
                                               CPU fits, model allowed)
              = L                             otherwise (incl. CPU-only tasks)

    F_n = sum_m p_m * frag_n(m),   cluster fragmentation = sum_n F_n

reported as a percentage of total GPU milli (the paper's figures) and of idle
GPU milli. ``p_m`` is the popularity of task type m in the workload: pods
grouped by (cpu, gpu_milli, num_gpu, gpu models), most popular first, kept
until they cover ``coverage`` of pods, renormalized. By default only GPU pods
form the target workload (see ``typical_pods``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from smartsched.model.pod import Pod
from smartsched.model.resources import CPU, GPU_MODEL_IDS


@dataclass(frozen=True, slots=True)
class TargetWorkload:
    """Typical task types as arrays: K types."""

    cpu: np.ndarray  # [K] millicores
    gpu_milli: np.ndarray  # [K] per-device milli (0: CPU-only)
    num_gpu: np.ndarray  # [K]
    models_ok: np.ndarray  # [K, M+1] bool over GPU model ids
    weight: np.ndarray  # [K] popularity, sums to 1
    g_values: np.ndarray  # [G] distinct nonzero gpu_milli among the types
    g_index: np.ndarray  # [K] index into g_values, -1 for CPU-only types


def typical_pods(
    pods: Sequence[Pod], coverage: float = 0.95, include_cpu_pods: bool = False
) -> TargetWorkload:
    """Group pods into task types and keep the most popular ones covering ``coverage``.

    CPU-only pods are left out by default: no placement can let them use a
    GPU, so counting all idle GPU as their fragment would measure the workload
    mix rather than the placement (the FGD simulator's ``isInvolvedCpuPods``
    switch; turn it on to match that setting).
    """
    counts = Counter(
        (p.cpu_milli, p.gpu_milli, p.num_gpu, p.gpu_models)
        for p in pods
        if include_cpu_pods or p.num_gpu > 0
    )
    ranked = counts.most_common()
    total = sum(c for _, c in ranked) or 1
    kept, acc = [], 0
    for key, c in ranked:
        kept.append((key, c))
        acc += c
        if acc / total >= coverage:
            break
    k = len(kept)
    models_ok = np.ones((k, len(GPU_MODEL_IDS) + 1), dtype=bool)
    for i, ((_, _, _, models), _) in enumerate(kept):
        if models:
            models_ok[i] = False
            models_ok[i, [GPU_MODEL_IDS[m] for m in models]] = True
    w = np.array([c for _, c in kept], dtype=np.float64)
    gpu_milli = np.array([key[1] for key, _ in kept], dtype=np.int64)
    g_values = np.unique(gpu_milli[gpu_milli > 0])
    g_index = np.where(gpu_milli > 0, np.searchsorted(g_values, gpu_milli), -1)
    return TargetWorkload(
        cpu=np.array([key[0] for key, _ in kept], dtype=np.int64),
        gpu_milli=gpu_milli,
        num_gpu=np.array([key[2] for key, _ in kept], dtype=np.int64),
        models_ok=models_ok,
        weight=w / w.sum() if k else w,
        g_values=g_values,
        g_index=g_index.astype(np.int64),
    )


def node_fragmentation(
    gpu_free: np.ndarray,
    free_cpu: np.ndarray,
    gpu_model: np.ndarray,
    up: np.ndarray,
    target: TargetWorkload,
) -> np.ndarray:
    """Expected fragmented GPU milli per node, ``F_n`` above, as float [N].

    Vectorized over nodes and task types at once: per distinct per-device
    demand g, the count of devices with >= g free and the milli stranded on
    devices with < g free; then one [N, K] selection and a weighted sum.
    """
    left = gpu_free.astype(np.int64)
    idle = left.sum(axis=1).astype(np.float64)
    if target.weight.size == 0:
        return np.where(up, 0.0, idle)
    g_vals = target.g_values  # [G] distinct nonzero per-device demands
    if g_vals.size == 0:  # only CPU-only task types: all idle GPU is stranded for them
        return idle
    usable = left[:, :, None] >= g_vals[None, None, :]  # [N, D, G]
    n_usable = usable.sum(axis=1)  # [N, G]
    small = np.where(usable, 0, left[:, :, None]).sum(axis=1).astype(np.float64)  # [N, G]
    gi = target.g_index  # [K], -1 for CPU-only types
    gpu_task = gi >= 0
    gic = np.where(gpu_task, gi, 0)
    hosts = (
        (n_usable[:, gic] >= target.num_gpu[None, :])
        & (free_cpu[:, None] >= target.cpu[None, :])
        & target.models_ok[:, gpu_model].T
        & gpu_task[None, :]
    )  # [N, K]
    frag = np.where(hosts, small[:, gic], idle[:, None])
    return np.where(up, frag @ target.weight, idle)


def cluster_fragmentation(state: object, target: TargetWorkload) -> tuple[float, float]:
    """(fragmented % of total GPU milli, fragmented % of idle GPU milli) for a ClusterState."""
    from smartsched.twin.state import ClusterState

    assert isinstance(state, ClusterState)
    total = float(state.gpu_exists.sum()) * 1000.0
    if total == 0 or target.weight.size == 0:
        return 0.0, 0.0
    free_cpu = state.capacity[:, CPU] - state.allocated[:, CPU]
    f = node_fragmentation(state.gpu_free, free_cpu, state.gpu_model, state.up, target).sum()
    idle = float(state.gpu_free.sum())
    return 100.0 * f / total, (100.0 * f / idle if idle > 0 else 0.0)
