"""Observation features for the policy, vectorized over nodes.

Owns the per-node and per-pod feature vectors the RL policy sees (and their
fixed order, so a checkpoint knows what each column means). Everything is
read from the twin's ``ClusterState`` and the scheduling framework's plugins;
nothing here mutates state. Features are scaled to roughly [-1, 1] and
clipped to [-10, 10].
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
from smartsched.twin.state import ClusterState, PodRequest

CPU_SCALE: Final = 128_000.0
MEM_SCALE: Final = 1_048_576.0
DEVICE_SLOTS: Final = 8
ZONE_SLOTS: Final = 8
ZONE_COL: Final = 37  # zone one-hot: ZONE_COL .. ZONE_COL + ZONE_SLOTS
SOCKETS_COL: Final = ZONE_COL + ZONE_SLOTS  # static hardware layout for the topology encoder
NVLINK_COL: Final = SOCKETS_COL + 1
RACK_COL: Final = SOCKETS_COL + 2  # rack identity (rack index / 100), for rack edges
NODE_FEATURES: Final = RACK_COL + 1
# Columns that never change for a node: the topology encoder's input and cache key.
STATIC_COLS: Final = (0, 1, 2, *range(ZONE_COL, NODE_FEATURES))
POD_FEATURES: Final = 19
# Node columns a heuristic-residual policy mixes (module.heuristic_prior): app
# co-location on the node, app peers in its zone, LeastAllocated, BestFit, FGD.
HEURISTIC_COLS: Final = (31, 32, 33, 34, 35)
# Optional columns after the fixed ones (``FeatureBuilder(forecast=True)``): the
# forecaster's predicted CPU and memory use over the next horizon, as fractions of
# capacity (current usage until the forecaster has seen a full lookback).
FORECAST_COLS: Final = 2
# Then, with ``telemetry_k > 0``, the node's reduced telemetry (twin.telemetry.reduction:
# the first k principal components of its wide metric vector; zeros before the first tick).
CLIP: Final = 10.0


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
        self.static = np.zeros((state.num_nodes, NODE_FEATURES - ZONE_COL), dtype=np.float32)
        zone = state.zone_id % ZONE_SLOTS
        self.static[np.arange(state.num_nodes), zone] = 1.0
        self.static[:, SOCKETS_COL - ZONE_COL] = [x.sockets / 4 for x in spec.nodes]
        self.static[:, NVLINK_COL - ZONE_COL] = [
            1.0 if x.num_gpu > 1 and DEVICE_MODELS[x.gpu_model].nvlink else 0.0
            for x in spec.nodes
        ]
        self.static[:, RACK_COL - ZONE_COL] = (state.rack_id % 1000) / 100.0
        self.prev_usage = state.usage.copy()
        self.trend = np.zeros_like(state.usage, dtype=np.float32)
        self.prev_usage_time = -1.0

    def nodes(self, ctx: CycleContext, feasible: np.ndarray, now: float) -> np.ndarray:
        """[N, self.width] float32."""
        st, req = self.state, ctx.request
        n = st.num_nodes
        cap = st.capacity.astype(np.float32)
        gpu_cap = np.maximum(cap[:, GPU], 1.0)
        f = np.zeros((n, self.width), dtype=np.float32)
        f[:, 0] = cap[:, CPU] / CPU_SCALE
        f[:, 1] = cap[:, MEM] / MEM_SCALE
        f[:, 2] = st.gpu_count / DEVICE_SLOTS
        f[:, 3] = st.free_res[:, CPU] / cap[:, CPU]
        f[:, 4] = st.free_res[:, MEM] / cap[:, MEM]
        f[:, 5] = np.where(st.gpu_count > 0, st.gpu_free.sum(axis=1) / gpu_cap, 0.0)
        f[:, 6] = st.gpu_max_free / MILLI_PER_DEVICE
        f[:, 7] = st.gpu_full / DEVICE_SLOTS
        dev = -np.sort(-st.gpu_free, axis=1)[:, :DEVICE_SLOTS] / MILLI_PER_DEVICE
        f[:, 8 : 8 + dev.shape[1]] = dev
        usage_frac = st.usage / np.stack([cap[:, CPU], cap[:, MEM], gpu_cap], axis=1)
        f[:, 16:19] = usage_frac
        if now != self.prev_usage_time and not np.array_equal(st.usage, self.prev_usage):
            self.trend = (st.usage - self.prev_usage) / np.stack(
                [cap[:, CPU], cap[:, MEM], gpu_cap], axis=1)
            self.prev_usage = st.usage.copy()
            self.prev_usage_time = now
        f[:, 19:22] = self.trend
        f[:, 22] = st.power == 2
        f[:, 23] = st.power == 1
        f[:, 24] = (st.be_allocatable[:, 0] - st.be_allocated[:, 0]) / cap[:, CPU]
        f[:, 25] = self.site_edge[st.site_id]
        pod = req.pod
        if pod.origin_site is not None and pod.origin_site in self._site_index:
            lat = self.latency[self._site_index[pod.origin_site]][st.site_id]
            f[:, 26] = lat / 20.0
            if pod.latency_slo_ms is not None:
                f[:, 27] = lat > pod.latency_slo_ms
        ci = np.array([s.carbon.at(now) for s in self.sites], dtype=np.float32)
        f[:, 28] = ci[st.site_id] / 500.0
        f[:, 29] = self.site_pue[st.site_id] - 1.0
        f[:, 30] = self.site_price[st.site_id] * 10.0
        if pod.app and pod.app in st.app_pods:
            on_node = st.app_pods[pod.app]
            total = max(int(on_node.sum()), 1)
            f[:, 31] = on_node / 10.0
            zone = np.bincount(st.zone_id, weights=on_node, minlength=len(st.zone_names))
            f[:, 32] = zone[st.zone_id] / total
        if feasible.any():
            f[:, 33] = _as_array(self.least.score(ctx, feasible), n) / 100.0
            f[:, 34] = _as_array(self.bestfit.score(ctx, feasible), n) / 100.0
            if self.fgd is not None and self.fgd.target is not None:
                f[:, 35] = _as_array(self.fgd.score(ctx, feasible), n) / 100.0
        f[:, 36] = 1.0 if req.models_ok is None else req.models_ok[st.gpu_model]
        f[:, ZONE_COL:NODE_FEATURES] = self.static
        if self.forecast:
            pred = st.predicted_usage
            base = st.usage[:, :2] if pred is None else pred[:, :2]
            f[:, NODE_FEATURES:NODE_FEATURES + FORECAST_COLS] = base / cap[:, [CPU, MEM]]
        if self.telemetry_k and st.telemetry_features is not None:
            f[:, self.width - self.telemetry_k:] = st.telemetry_features
        np.clip(f, -CLIP, CLIP, out=f)
        return f

    @staticmethod
    def pod(req: PodRequest, now: float, queue_length: int, feasible_share: float) -> np.ndarray:
        """[POD_FEATURES] float32."""
        p = req.pod
        f = np.zeros(POD_FEATURES, dtype=np.float32)
        f[0] = p.cpu_milli / CPU_SCALE * 4
        f[1] = p.memory_mib / MEM_SCALE * 4
        f[2] = p.num_gpu / DEVICE_SLOTS
        f[3] = p.gpu_milli / MILLI_PER_DEVICE
        f[4 + POD_CLASSES.index(p.pod_class)] = 1.0
        f[9] = p.gang_size / 64.0
        f[10] = 1.0 if p.gpu_models else 0.0
        f[11] = 0.0 if p.deadline is None else min((p.deadline - now) / 86400.0, 2.0)
        f[12] = 0.0 if p.latency_slo_ms is None else p.latency_slo_ms / 100.0
        f[13] = p.priority / 1000.0
        f[14] = 1.0 if p.best_effort else 0.0
        f[15] = math.log1p(queue_length) / 5.0
        hour = (now / 3600.0) % 24.0
        f[16] = math.sin(2 * math.pi * hour / 24)
        f[17] = math.cos(2 * math.pi * hour / 24)
        f[18] = feasible_share
        np.clip(f, -CLIP, CLIP, out=f)
        return f


def _as_array(x: np.ndarray | float, n: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(x, dtype=np.float32), (n,))
