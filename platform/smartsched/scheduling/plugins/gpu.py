"""GPU-sharing heuristics from the FGD paper's simulator, and FGD itself.

Owns DotProd, GpuClustering, GpuPacking, BestFit, RandomScore and FGD
(Fragmentation Gradient Descent, Weng et al., USENIX ATC '23), written from
the paper and the public simulator's definitions (hkust-adsl/
kubernetes-scheduler-simulator, pkg/simulator/plugin). Shared terms:
cpu_left = allocatable - requested (actual requests); the pod's cpu uses
kube's non-zero default (100m); gpu_left = sum of a node's per-device free
milli; constants MAX_CPU = 128000 and MAX_GPU = 8000 scale the "max" norm.
Memory is in no score (only in the fit filter), as in the simulator.

  DotProd       0 if cpu_left < cpu, else
                int(100 * (1 - (cpu_left*cpu/MAX_CPU^2 + gpu_left*gpu/MAX_GPU^2) / 2))
  GpuClustering base = 25 * (8000 - gpu_left) // 8000, plus 75 if the node holds only
                GPU pods of this pod's shape tag, 50 if this tag and others, 25 if no GPU
                pods, 0 if only other tags; CPU-only pods 0
  GpuPacking    node all free (F devices): max(33 - F, F); else take the pod's devices
                tightest-first; if k > 0 of them are fully free: max(50 - k, 33); else
                max(100 - sum(floor(left_i * 100 / 1000)) // 10, 50); CPU-only pods 0
  BestFit       int(100 * (1 - ((cpu_left - cpu)/MAX_CPU + (gpu_left - gpu)/MAX_GPU) / 2)),
                then integer min-max normalization over feasible nodes (all 0 if equal)
  FGD           int(100 * sigmoid((F_before - F_after) / 1000)), F the node's expected
                fragmentation for the workload's typical pods (twin.fragmentation, CPU
                pods included as in the paper's runs); a GPU-share pod tries every device
                and the binder uses the best one
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from smartsched.model.pod import Pod
from smartsched.model.resources import CPU, GPU, MILLI_PER_DEVICE
from smartsched.scheduling.framework import MAX_NODE_SCORE, CycleContext
from smartsched.scheduling.plugins.k8s import NoArgs
from smartsched.twin.fragmentation import TargetWorkload, node_fragmentation, typical_pods
from smartsched.twin.state import ClusterState, PodRequest, gpu_tag

MAX_CPU = 128_000.0
MAX_GPU = 8_000.0


def _pod_cpu(req: PodRequest) -> int:
    return int(req.nonzero[0])


def _cpu_left(st: ClusterState) -> np.ndarray:
    return st.free_res[:, CPU]


def _gpu_left(st: ClusterState) -> np.ndarray:
    """Each node's free GPU milli over its devices: the state keeps its GPU column equal to
    the devices' sum (tests/twin/test_invariants.py), a column read instead of a sum over
    [N, D] at every decision."""
    return st.free_res[:, GPU]


class DotProd:
    """Tetris-style alignment of the pod's request with the node's free vector (merge, max)."""

    name = "DotProd"
    Args = NoArgs

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray:
        st, req = ctx.state, ctx.request
        cpu = _pod_cpu(req)
        cpu_left = _cpu_left(st)
        gpu_left = _gpu_left(st)
        s = 0.5 * (cpu_left / MAX_CPU * (cpu / MAX_CPU)
                   + gpu_left / MAX_GPU * (req.vector[2] / MAX_GPU))
        return np.where(cpu_left < cpu, 0.0, np.trunc(MAX_NODE_SCORE * (1 - s)))


class GpuClustering:
    """Keep GPU pods of one shape together; CPU-only pods get 0."""

    name = "GpuClustering"
    Args = NoArgs

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray:
        st, req = ctx.state, ctx.request
        if not req.num_gpu:
            return np.zeros(st.num_nodes)
        gpu_left = _gpu_left(st)
        base = 25 * (int(MAX_GPU) - gpu_left) // int(MAX_GPU)
        tags = st.gpu_pod_tags
        same = tags[:, gpu_tag(req)] > 0
        other = (tags.sum(axis=1) - tags[:, gpu_tag(req)]) > 0
        offset = np.select([same & ~other, same & other, ~same & ~other], [75, 50, 25], 0)
        return (base + offset).astype(np.float64)


class GpuPacking:
    """Prefer partly used GPUs, then partly used nodes, then idle nodes with few GPUs."""

    name = "GpuPacking"
    Args = NoArgs

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray:
        st, req = ctx.state, ctx.request
        n = st.num_nodes
        if not req.num_gpu:
            return np.zeros(n)
        free = st.gpu_free.astype(np.int64)
        exists = st.gpu_exists
        fully = (free == MILLI_PER_DEVICE) & exists
        n_free = fully.sum(axis=1)
        all_free = n_free == st.gpu_count
        # The pod's devices: the first num_gpu fitting devices in ascending free order.
        key = np.where(exists & (free >= req.gpu_milli), free, MILLI_PER_DEVICE * 10)
        order = np.argsort(key, axis=1, kind="stable")[:, : req.num_gpu]
        chosen = np.take_along_axis(free, order, axis=1)
        k = (chosen == MILLI_PER_DEVICE).sum(axis=1)
        used_pct = (chosen * 100 // MILLI_PER_DEVICE).sum(axis=1)
        partly = np.where(k > 0, np.maximum(50 - k, 33), np.maximum(100 - used_pct // 10, 50))
        return np.where(all_free, np.maximum(33 - n_free, n_free), partly).astype(np.float64)


class BestFit:
    """Least leftover cpu and GPU after placing, min-max normalized (integer)."""

    name = "BestFit"
    Args = NoArgs

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray:
        st, req = ctx.state, ctx.request
        raw = 0.5 * (_cpu_left(st) - _pod_cpu(req)) / MAX_CPU + 0.5 * (
            _gpu_left(st) - req.vector[2]
        ) / MAX_GPU
        s = np.trunc(MAX_NODE_SCORE * (1 - raw)).astype(np.int64)
        vals = s[feasible]
        lo, hi = int(vals.min()), int(vals.max())
        if hi == lo:
            return np.zeros(st.num_nodes)
        return ((s - lo) * MAX_NODE_SCORE // (hi - lo)).astype(np.float64)


class RandomGpu:
    """Binder: a random fitting device for a GPU share; the lowest free ones for whole GPUs."""

    name = "RandomGpu"
    Args = NoArgs

    def __init__(self, args: NoArgs | None = None) -> None:
        self.rng = np.random.default_rng(0)  # ProfileScheduler reseeds with the run's seed

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def devices(self, ctx: CycleContext, node: int) -> tuple[int, ...] | None:
        req = ctx.request
        if not req.num_gpu:
            return ()
        free = ctx.state.gpu_free[node]
        cand = np.flatnonzero(free >= req.gpu_milli)
        if req.gpu_milli < MILLI_PER_DEVICE:
            return (int(cand[self.rng.integers(cand.size)]),)
        return tuple(int(d) for d in cand[: req.num_gpu])


class FgdArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    coverage: float = Field(0.95, gt=0, le=1)
    include_cpu_pods: bool = True
    cache_shapes: int = Field(1024, ge=0, le=100_000)
    # Score every pod shape of the workload on the first call, so no later decision
    # pays for a shape's first full pass over the cluster (an online service's
    # start-up cost instead of a latency tail).
    warm: bool = False


class FGD:
    """Fragmentation Gradient Descent: place where expected GPU fragmentation grows least.

    Needs the workload's typical pods: ``prepare(pods)`` computes them (the
    runner calls it with the workload before the run). Scores are cached per
    (pod shape, node version), so each decision recomputes only nodes that
    changed since the same shape was last scored.
    """

    name = "FGD"
    Args = FgdArgs

    def __init__(self, args: FgdArgs | None = None) -> None:
        self.args = args or FgdArgs()
        self.target: TargetWorkload | None = None
        self._to_warm: list[Pod] = []
        self._cache: OrderedDict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()
        # Each node's expected fragmentation as it is (``before`` of every pod shape), by
        # node version: [N] versions, [N] values.
        self._before: tuple[np.ndarray, np.ndarray] | None = None

    def prepare(self, pods: Sequence[Pod]) -> None:
        self.target = typical_pods(pods, self.args.coverage, self.args.include_cpu_pods)
        self._cache.clear()
        self._before = None
        shapes: dict[tuple, Pod] = {}
        for p in pods:
            shapes.setdefault((p.cpu_milli, p.gpu_milli, p.num_gpu, p.gpu_models), p)
        self._to_warm = list(shapes.values())[: self.args.cache_shapes] if self.args.warm else []

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray:
        scores, devices = self._scores(ctx)
        ctx.cache["fgd_devices"] = devices
        return scores

    def devices(self, ctx: CycleContext, node: int) -> tuple[int, ...] | None:
        """The device FGD scored for a GPU-share pod; lowest fitting devices otherwise."""
        req = ctx.request
        if not req.num_gpu:
            return ()
        if "fgd_devices" not in ctx.cache:
            self._scores(ctx)
        if req.gpu_milli < MILLI_PER_DEVICE:
            return (int(ctx.cache["fgd_devices"][node]),)
        return ctx.state.pick_devices(node, req)

    def _scores(self, ctx: CycleContext) -> tuple[np.ndarray, np.ndarray]:
        if self.target is None:
            raise RuntimeError("FGD needs the workload: call prepare(pods) before scheduling")
        st, req = ctx.state, ctx.request
        if self._to_warm:
            pods, self._to_warm = self._to_warm, []
            for p in pods:
                self._scores(CycleContext(st, st.compile(p)))
        shape = (_pod_cpu(req), req.gpu_milli, req.num_gpu,
                 None if req.models_ok is None else req.models_ok.tobytes())
        entry = self._cache.get(shape)
        if entry is None or entry[0].size != st.num_nodes:
            entry = (np.full(st.num_nodes, -1, dtype=np.int64), np.zeros(st.num_nodes),
                     np.zeros(st.num_nodes, dtype=np.int64))
            self._cache[shape] = entry
            if len(self._cache) > self.args.cache_shapes:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(shape)
        versions, scores, devices = entry
        stale = np.flatnonzero(versions != st.version)
        if stale.size:
            s, d = self._compute(st, req, stale)
            scores[stale] = s
            devices[stale] = d
            versions[stale] = st.version[stale]
        ctx.cache["fgd_devices"] = devices
        return scores, devices

    def _compute(
        self, st: ClusterState, req: PodRequest, nodes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        target = self.target
        assert target is not None
        free = st.gpu_free[nodes].astype(np.int64)
        cpu_left = _cpu_left(st)[nodes]
        model = st.gpu_model[nodes]
        up = np.ones(nodes.size, dtype=bool)
        before = self._fragmentation_now(st, nodes, free, cpu_left, model, up)
        cpu_after = cpu_left - _pod_cpu(req)
        n_dev = free.shape[1]
        if req.num_gpu == 0:
            after = node_fragmentation(free, cpu_after, model, up, target)
            return _sigmoid_score(before - after), np.zeros(nodes.size, dtype=np.int64)
        if req.gpu_milli < MILLI_PER_DEVICE:
            # Every (node, device) trial at once: D stacked copies of the nodes.
            m = nodes.size
            fits = free >= req.gpu_milli  # [m, D]
            trial = np.repeat(free[None, :, :], n_dev, axis=0)  # [D, m, D]
            idx = np.arange(n_dev)
            trial[idx, :, idx] -= np.where(fits.T, req.gpu_milli, 0)
            after = node_fragmentation(
                trial.reshape(n_dev * m, n_dev), np.tile(cpu_after, n_dev),
                np.tile(model, n_dev), np.ones(n_dev * m, dtype=bool), target,
            ).reshape(n_dev, m)
            s = np.where(fits.T, _sigmoid_score(before[None, :] - after), -1.0)  # [D, m]
            best_dev = s.argmax(axis=0)  # first (lowest) device among equal best scores
            return np.maximum(s.max(axis=0), 0.0), best_dev.astype(np.int64)
        # Whole GPUs: take the lowest-index fully free devices.
        usable = free >= req.gpu_milli
        take = usable & (np.cumsum(usable, axis=1) <= req.num_gpu)
        trial = free - np.where(take, req.gpu_milli, 0)
        after = node_fragmentation(trial, cpu_after, model, up, target)
        return _sigmoid_score(before - after), np.zeros(nodes.size, dtype=np.int64)

    def _fragmentation_now(self, st: ClusterState, nodes: np.ndarray, free: np.ndarray,
                           cpu_left: np.ndarray, model: np.ndarray, up: np.ndarray
                           ) -> np.ndarray:
        """``node_fragmentation`` of ``nodes`` as they are: it does not depend on the pod,
        so it is computed once per node version for every shape."""
        assert self.target is not None
        if self._before is None or self._before[0].size != st.num_nodes:
            self._before = (np.zeros(st.num_nodes, dtype=np.int64), np.zeros(st.num_nodes))
        versions, values = self._before
        stale = versions[nodes] != st.version[nodes]
        if stale.any():
            idx = np.flatnonzero(stale)
            rows = nodes[idx]
            values[rows] = node_fragmentation(free[idx], cpu_left[idx], model[idx], up[idx],
                                              self.target)
            versions[rows] = st.version[rows]
        return values[nodes]


def _sigmoid_score(delta: np.ndarray) -> np.ndarray:
    return np.trunc(MAX_NODE_SCORE / (1.0 + np.exp(-delta / 1000.0)))
