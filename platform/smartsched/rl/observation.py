"""The policy's observation: named columns, built one way for training and for inference.

Owns what the RL policy sees and the meaning of every column: per-node
features (``NODE_COLUMNS``, then optionally the forecaster's two columns and
k reduced-telemetry columns), per-pod features (``POD_COLUMNS``), the action
mask (the scheduling framework's filters; last entry = defer) and the reward
weights. ``Observer`` assembles the whole observation; the gym env (training)
and the ``rl:`` scheduler (inference) both call it, so a checkpoint sees the
same thing wherever it runs. Code that needs a column asks for it by name
(``NODE_COL["score_fgd"]``), never by number.

Everything is read from the twin's ``ClusterState`` and the scheduling
framework's plugins; nothing here mutates state. Features are scaled to
roughly [-1, 1] and clipped to [-10, 10]. The column order is part of every
exported policy (``smartsched_policy.json`` records it): appending is safe for
new policies, reordering is not.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np

from smartsched.model.cluster import ClusterSpec
from smartsched.model.pod import POD_CLASSES
from smartsched.model.resources import CPU, DEVICE_MODELS, GPU, MEM, MILLI_PER_DEVICE
from smartsched.scheduling.framework import CycleContext
from smartsched.scheduling.plugins.gpu import FGD, BestFit
from smartsched.scheduling.plugins.k8s import NodeResourcesFit
from smartsched.twin.state import POWER_BOOTING, POWER_ON, ClusterState, PodRequest

CPU_SCALE: Final = 128_000.0
MEM_SCALE: Final = 1_048_576.0
DEVICE_SLOTS: Final = 8
ZONE_SLOTS: Final = 8
CLIP: Final = 10.0

NODE_COLUMNS: Final[tuple[str, ...]] = (
    "cap_cpu", "cap_mem", "gpu_count",  # capacity (static)
    "free_cpu", "free_mem", "free_gpu", "gpu_max_free", "gpu_full_devices",
    *(f"device_free_{d}" for d in range(DEVICE_SLOTS)),  # per device, most free first
    "use_cpu", "use_mem", "use_gpu", "trend_cpu", "trend_mem", "trend_gpu",
    "powered_on", "booting", "best_effort_slack_cpu",
    "edge_site", "client_latency", "over_latency_slo",  # from the pod's origin site
    "carbon", "pue", "price",
    "app_on_node", "app_in_zone",  # the pod's app: co-location on the node and in its zone
    "score_least_allocated", "score_bestfit", "score_fgd", "gpu_model_ok",
    *(f"zone_{z}" for z in range(ZONE_SLOTS)),  # static layout, for the topology encoder
    "sockets", "nvlink", "rack",
)
NODE_COL: Final[dict[str, int]] = {name: i for i, name in enumerate(NODE_COLUMNS)}
NODE_FEATURES: Final = len(NODE_COLUMNS)
# Optional columns after the fixed ones (``forecast=True``): the forecaster's predicted CPU
# and memory use over the next horizon, as fractions of capacity (current usage until the
# forecaster has seen a full lookback); then, with ``telemetry_k > 0``, the node's reduced
# telemetry (twin.telemetry.reduction: the first k principal components of its wide metric
# vector; zeros before the first tick).
FORECAST_COLUMNS: Final = ("forecast_cpu", "forecast_mem")
FORECAST_COLS: Final = len(FORECAST_COLUMNS)

ZONE_COL: Final = NODE_COL["zone_0"]  # zone one-hot: ZONE_COL .. ZONE_COL + ZONE_SLOTS
SOCKETS_COL: Final = NODE_COL["sockets"]
NVLINK_COL: Final = NODE_COL["nvlink"]
RACK_COL: Final = NODE_COL["rack"]  # rack identity (rack index / 100), for rack edges
# Columns that never change for a node: the topology encoder's input and cache key.
STATIC_COLS: Final = (NODE_COL["cap_cpu"], NODE_COL["cap_mem"], NODE_COL["gpu_count"],
                      *range(ZONE_COL, NODE_FEATURES))
# Node columns a heuristic-residual policy mixes (module.heuristic_prior), by name.
HEURISTIC_NAMES: Final = ("app_on_node", "app_in_zone", "score_least_allocated",
                          "score_bestfit", "score_fgd")
HEURISTIC_COLS: Final = tuple(NODE_COL[n] for n in HEURISTIC_NAMES)
# Columns that change only when a node's allocation does (capacity, free resources and
# devices): ``ClusterState`` stamps every allocate and release with a new version, so
# ``FeatureBuilder`` keeps these per node and recomputes only the nodes stamped since.
ALLOC_COLS: Final = slice(NODE_COL["cap_cpu"], NODE_COL["device_free_0"] + DEVICE_SLOTS)

# The columns ``FeatureBuilder.nodes`` writes at each call (a few static ones between them).
_DYNAMIC_COLS: Final = slice(NODE_COL["use_cpu"], NODE_COL["gpu_model_ok"] + 1)
assert ALLOC_COLS.stop <= _DYNAMIC_COLS.start and _DYNAMIC_COLS.stop <= ZONE_COL
# ``_allocation_rows`` writes the capacity columns as one block and free cpu, memory as one.
assert ALLOC_COLS.start == 0 and NODE_COL["free_cpu"] == 3 == NODE_COL["free_mem"] - 1
assert MEM == CPU + 1

POD_COLUMNS: Final[tuple[str, ...]] = (
    "cpu", "mem", "num_gpu", "gpu_milli",
    *(f"class_{c.value}" for c in POD_CLASSES),
    "gang_size", "gpu_model_constrained", "deadline_days", "latency_slo", "priority",
    "best_effort", "queue", "hour_sin", "hour_cos", "feasible_share",
)
POD_COL: Final[dict[str, int]] = {name: i for i, name in enumerate(POD_COLUMNS)}
POD_FEATURES: Final = len(POD_COLUMNS)


def node_columns(forecast: bool, telemetry_k: int) -> tuple[str, ...]:
    """The names of every node column for these options, in order."""
    return (NODE_COLUMNS + (FORECAST_COLUMNS if forecast else ())
            + tuple(f"telemetry_{j}" for j in range(telemetry_k)))


class FeatureBuilder:
    """Builds node and pod features for one cluster; keeps the previous usage for trends."""

    def __init__(self, spec: ClusterSpec, state: ClusterState, fgd: FGD | None,
                 forecast: bool = False, telemetry_k: int = 0) -> None:
        self.state = state
        self.forecast = forecast
        self.telemetry_k = telemetry_k
        self.width = NODE_FEATURES + (FORECAST_COLS if forecast else 0) + telemetry_k
        self.fgd = fgd
        self.least = NodeResourcesFit()
        self.bestfit = BestFit()
        sites = spec.sites
        self.site_edge = np.array([s.kind == "edge" for s in sites], dtype=np.float32)
        self.site_pue = np.array([s.pue for s in sites], dtype=np.float32)
        self.site_price = np.array([s.price_core_hour for s in sites], dtype=np.float32)
        self.sites = sites
        self._site_index = {s.name: i for i, s in enumerate(sites)}
        # Latency from every site (as a pod's origin) to every site.
        self.latency = np.array(
            [[t.latency_ms_from(o) for t in sites] for o in sites], dtype=np.float32
        )
        n = state.num_nodes
        self.static = np.zeros((n, NODE_FEATURES - ZONE_COL), dtype=np.float32)
        self.static[np.arange(n), state.zone_id % ZONE_SLOTS] = 1.0
        self.static[:, SOCKETS_COL - ZONE_COL] = [x.sockets / 4 for x in spec.nodes]
        self.static[:, NVLINK_COL - ZONE_COL] = [
            1.0 if x.num_gpu > 1 and DEVICE_MODELS[x.gpu_model].nvlink else 0.0
            for x in spec.nodes
        ]
        self.static[:, RACK_COL - ZONE_COL] = (state.rack_id % 1000) / 100.0
        cap = state.capacity.astype(np.float32)
        self.cap_cpu = cap[:, CPU]
        # Divisors of the usage columns (the GPU's at least 1: nodes without GPUs read 0).
        self.scale = np.stack([cap[:, CPU], cap[:, MEM], np.maximum(cap[:, GPU], 1.0)], axis=1)
        n_alloc = ALLOC_COLS.stop - ALLOC_COLS.start
        self._cap32 = cap
        # The allocation block's capacity columns (cap_cpu, cap_mem, gpu_count), clipped.
        static = np.stack([cap[:, CPU] / CPU_SCALE, cap[:, MEM] / MEM_SCALE,
                           state.gpu_count / DEVICE_SLOTS], axis=1).astype(np.float32)
        self._alloc_static = np.clip(static, -CLIP, CLIP)
        self._alloc = np.zeros((n, n_alloc), dtype=np.float32)
        # Stamps of the state's nodes when their rows were computed; none matches yet.
        self._alloc_version = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        self.prev_usage = state.usage.copy()
        self.trend = np.zeros_like(state.usage, dtype=np.float32)
        self.prev_usage_time = -1.0
        # Every column that never changes for a node (the static block, and what a node's
        # site gives it), filled once; each call starts from a copy of it. Column-major, so
        # each later column write is one contiguous write.
        c = NODE_COL
        base = np.zeros((self.width, n), dtype=np.float32).T
        base[:, c["edge_site"]] = self.site_edge[state.site_id]
        base[:, c["pue"]] = self.site_pue[state.site_id] - 1.0
        base[:, c["price"]] = self.site_price[state.site_id] * 10.0
        base[:, ZONE_COL:NODE_FEATURES] = self.static
        np.clip(base, -CLIP, CLIP, out=base)
        self._base = base
        self._carbon_at: tuple[float, float, np.ndarray] | None = None  # (from, until, column)

    def nodes(self, ctx: CycleContext, feasible: np.ndarray, now: float) -> np.ndarray:
        """[N, self.width] float32."""
        st, req = self.state, ctx.request
        c = NODE_COL
        n = st.num_nodes
        # Filled column by column over a copy of the static columns: a column-major buffer
        # makes each column one contiguous write (row-major, every column write touched
        # every row's cache line).
        f = self._base.copy(order="F")
        f[:, ALLOC_COLS] = self._allocation()
        scale = self.scale
        f[:, c["use_cpu"] : c["use_gpu"] + 1] = st.usage / scale
        if now != self.prev_usage_time and not np.array_equal(st.usage, self.prev_usage):
            self.trend = (st.usage - self.prev_usage) / scale
            self.prev_usage = st.usage.copy()
            self.prev_usage_time = now
        f[:, c["trend_cpu"] : c["trend_gpu"] + 1] = self.trend
        f[:, c["powered_on"]] = st.power == POWER_ON
        f[:, c["booting"]] = st.power == POWER_BOOTING
        f[:, c["best_effort_slack_cpu"]] = (
            (st.be_allocatable[:, 0] - st.be_allocated[:, 0]) / self.cap_cpu)
        pod = req.pod
        if pod.origin_site is not None and pod.origin_site in self._site_index:
            lat = self.latency[self._site_index[pod.origin_site]][st.site_id]
            f[:, c["client_latency"]] = lat / 20.0
            if pod.latency_slo_ms is not None:
                f[:, c["over_latency_slo"]] = lat > pod.latency_slo_ms
        f[:, c["carbon"]] = self._carbon(now)
        if pod.app and pod.app in st.app_pods:
            on_node = st.app_pods[pod.app]
            total = max(int(on_node.sum()), 1)
            f[:, c["app_on_node"]] = on_node / 10.0
            zone = np.bincount(st.zone_id, weights=on_node, minlength=len(st.zone_names))
            f[:, c["app_in_zone"]] = zone[st.zone_id] / total
        if feasible.any():
            f[:, c["score_least_allocated"]] = _as_array(self.least.score(ctx, feasible),
                                                         n) / 100.0
            f[:, c["score_bestfit"]] = _as_array(self.bestfit.score(ctx, feasible), n) / 100.0
            if self.fgd is not None and self.fgd.target is not None:
                f[:, c["score_fgd"]] = _as_array(self.fgd.score(ctx, feasible), n) / 100.0
        f[:, c["gpu_model_ok"]] = 1.0 if req.models_ok is None else req.models_ok[st.gpu_model]
        if self.forecast:
            pred = st.predicted_usage
            base = st.usage[:, :2] if pred is None else pred[:, :2]
            f[:, NODE_FEATURES:NODE_FEATURES + FORECAST_COLS] = base / scale[:, :2]
        if self.telemetry_k and st.telemetry_features is not None:
            f[:, self.width - self.telemetry_k:] = st.telemetry_features
        # Clip what was written here: the static and allocation columns are clipped already.
        np.clip(f[:, _DYNAMIC_COLS], -CLIP, CLIP, out=f[:, _DYNAMIC_COLS])
        if self.width > NODE_FEATURES:
            np.clip(f[:, NODE_FEATURES:], -CLIP, CLIP, out=f[:, NODE_FEATURES:])
        return f

    def _carbon(self, now: float) -> np.ndarray:
        """The carbon column at ``now`` (each node's site's grid intensity / 500), kept
        while every site's series holds the value read."""
        if self._carbon_at is None or not self._carbon_at[0] <= now < self._carbon_at[1]:
            ci = np.array([s.carbon.at(now) for s in self.sites], dtype=np.float32)
            until = min(s.carbon.held_until(now) for s in self.sites)
            self._carbon_at = (now, until, ci[self.state.site_id] / 500.0)
        return self._carbon_at[2]

    def _allocation(self) -> np.ndarray:
        """[N, ALLOC_COLS] clipped: the rows of nodes stamped since the last call
        recomputed, the others as they were (the same arithmetic row by row, so the
        result equals a full recomputation bit for bit)."""
        st = self.state
        stale = np.flatnonzero(self._alloc_version != st.version)
        if stale.size:
            rows: np.ndarray | slice = slice(None) if stale.size == st.num_nodes else stale
            self._alloc[rows] = self._allocation_rows(rows)
            self._alloc_version[stale] = st.version[stale]
        return self._alloc

    def _allocation_rows(self, rows: np.ndarray | slice) -> np.ndarray:
        st = self.state
        c = NODE_COL
        cap = self._cap32[rows]
        gpu_count = st.gpu_count[rows]
        gpu_free = st.gpu_free[rows]
        free = st.free_res[rows]
        out = np.empty((cap.shape[0], ALLOC_COLS.stop - ALLOC_COLS.start), dtype=np.float32)
        out[:, : c["free_cpu"]] = self._alloc_static[rows]  # capacity: never changes
        out[:, c["free_cpu"]:c["free_mem"] + 1] = free[:, CPU:MEM + 1] / cap[:, CPU:MEM + 1]
        # The state keeps its GPU column equal to the devices' sum (as the GPU plugins read it).
        out[:, c["free_gpu"]] = np.where(gpu_count > 0, free[:, GPU]
                                         / np.maximum(cap[:, GPU], 1.0), 0.0)
        out[:, c["gpu_max_free"]] = st.gpu_max_free[rows] / MILLI_PER_DEVICE
        out[:, c["gpu_full_devices"]] = st.gpu_full[rows] / DEVICE_SLOTS
        # Devices most free first; nodes without GPUs have none (all zero).
        slots = min(DEVICE_SLOTS, gpu_free.shape[1])
        d0 = c["device_free_0"]
        out[:, d0 + slots:] = 0.0
        out[:, d0 : d0 + slots] = -np.sort(-gpu_free, axis=1)[:, :slots] / MILLI_PER_DEVICE
        np.clip(out[:, c["free_cpu"]:], -CLIP, CLIP, out=out[:, c["free_cpu"]:])
        return out

    @staticmethod
    def pod(req: PodRequest, now: float, queue_length: int, feasible_share: float) -> np.ndarray:
        """[POD_FEATURES] float32 (filled as Python floats, then one array: per-element
        writes into a numpy array cost more than the whole rest)."""
        p = req.pod
        c = POD_COL
        f = [0.0] * POD_FEATURES
        f[c["cpu"]] = p.cpu_milli / CPU_SCALE * 4
        f[c["mem"]] = p.memory_mib / MEM_SCALE * 4
        f[c["num_gpu"]] = p.num_gpu / DEVICE_SLOTS
        f[c["gpu_milli"]] = p.gpu_milli / MILLI_PER_DEVICE
        f[c[f"class_{p.pod_class.value}"]] = 1.0
        f[c["gang_size"]] = p.gang_size / 64.0
        f[c["gpu_model_constrained"]] = 1.0 if p.gpu_models else 0.0
        f[c["deadline_days"]] = 0.0 if p.deadline is None else min(
            (p.deadline - now) / 86400.0, 2.0)
        f[c["latency_slo"]] = 0.0 if p.latency_slo_ms is None else p.latency_slo_ms / 100.0
        f[c["priority"]] = p.priority / 1000.0
        f[c["best_effort"]] = 1.0 if p.best_effort else 0.0
        f[c["queue"]] = math.log1p(queue_length) / 5.0
        hour = (now / 3600.0) % 24.0
        f[c["hour_sin"]] = math.sin(2 * math.pi * hour / 24)
        f[c["hour_cos"]] = math.cos(2 * math.pi * hour / 24)
        f[c["feasible_share"]] = feasible_share
        out = np.array(f, dtype=np.float32)
        np.clip(out, -CLIP, CLIP, out=out)
        return out


class Observer:
    """The whole observation of one pod decision: padded node features, pod features, the
    action mask (feasible nodes, then defer) and the reward weights."""

    def __init__(self, spec: ClusterSpec, state: ClusterState, fgd: FGD | None, *,
                 forecast: bool = False, telemetry_k: int = 0,
                 max_nodes: int | None = None) -> None:
        self.features = FeatureBuilder(spec, state, fgd, forecast, telemetry_k)
        self.state = state
        self.max_nodes = max_nodes or state.num_nodes
        if self.max_nodes < state.num_nodes:
            raise ValueError(f"max_nodes {self.max_nodes} < cluster nodes {state.num_nodes}")

    @property
    def width(self) -> int:
        return self.features.width

    def observe(self, ctx: CycleContext, feasible: np.ndarray, deferrable: bool,
                now: float, queue_length: int, weights: np.ndarray) -> dict[str, np.ndarray]:
        n = self.state.num_nodes
        nodes = np.zeros((self.max_nodes, self.width), dtype=np.float32)
        nodes[:n] = self.features.nodes(ctx, feasible, now)
        mask = np.zeros(self.max_nodes + 1, dtype=np.float32)
        mask[:n] = feasible
        mask[-1] = 1.0 if deferrable else 0.0
        pod = FeatureBuilder.pod(ctx.request, now, queue_length, float(feasible.mean()))
        return {"nodes": nodes, "pod": pod, "action_mask": mask, "weights": weights}

    def terminal(self, weights: np.ndarray) -> dict[str, np.ndarray]:
        """The observation after the last decision (nothing to choose; defer kept open so
        the mask is never empty for samplers)."""
        mask = np.zeros(self.max_nodes + 1, dtype=np.float32)
        mask[-1] = 1.0
        return {
            "nodes": np.zeros((self.max_nodes, self.width), dtype=np.float32),
            "pod": np.zeros(POD_FEATURES, dtype=np.float32),
            "action_mask": mask,
            "weights": weights,
        }


def _as_array(x: np.ndarray | float, n: int) -> np.ndarray:
    """A score (per node, or one for all) as float32, for a column of ``n`` rows (a column
    assignment broadcasts a single value itself)."""
    a = np.asarray(x, dtype=np.float32)
    if a.ndim and a.shape != (n,):
        raise ValueError(f"a score has {a.shape[0]} values for {n} nodes")
    return a
