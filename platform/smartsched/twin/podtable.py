"""Pods as structure-of-arrays, with their lifecycle status.

Owns the per-pod numpy arrays the engine and the metrics read (requests,
times, class, tenant, app, usage profile parameters, status, placement) so
per-tick work is vectorized over pods instead of looping over objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from smartsched.model.pod import POD_CLASS_IDS, Pod, PodClass
from smartsched.model.resources import NUM_RESOURCES
from smartsched.twin.usage import KIND_IDS

# Lifecycle.
NOT_ARRIVED: Final = 0
PENDING: Final = 1
BOUND: Final = 2  # placed on a node that is still booting
RUNNING: Final = 3
DONE: Final = 4
FAILED: Final = 5


_STATELESS: Final = (PodClass.ONLINE, PodClass.AI_INFER, PodClass.EDGE_RT)


def _resume_every(pod: Pod) -> float:
    if pod.checkpoint_interval_s is not None:
        return float(pod.checkpoint_interval_s)
    return 0.0 if pod.pod_class in _STATELESS else float("inf")


def saved_work(elapsed: np.ndarray | float, resume_every: np.ndarray | float) -> np.ndarray:
    """Seconds of ``elapsed`` running an evicted pod keeps: all (0: stateless), the last
    whole checkpoint interval, or nothing (inf)."""
    elapsed = np.asarray(elapsed, dtype=np.float64)
    every = np.asarray(resume_every, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        ckpt = np.floor(elapsed / np.where(np.isfinite(every) & (every > 0), every, 1.0)) * every
    return np.where(every == 0, elapsed, np.where(np.isinf(every), 0.0, ckpt))


class PodTable:
    """Arrays over P pods, in the order given (index = pod index)."""

    def __init__(self, pods: Sequence[Pod]) -> None:
        p = len(pods)
        self.pods = list(pods)
        self.requests = np.zeros((p, NUM_RESOURCES), dtype=np.int64)
        for i, pod in enumerate(pods):
            self.requests[i] = (pod.cpu_milli, pod.memory_mib, pod.gpu_total_milli, pod.num_fpga)
        self.best_effort = np.array([x.best_effort for x in pods], dtype=bool)
        # What each pod takes from node allocation: best-effort cpu/memory come from slack.
        self.charged = self.requests.copy()
        self.charged[self.best_effort, :2] = 0
        self.num_gpu = np.array([x.num_gpu for x in pods], dtype=np.int64)
        self.gpu_milli = np.array([x.gpu_milli for x in pods], dtype=np.int64)
        self.arrival = np.array([x.arrival for x in pods], dtype=np.float64)
        self.duration = np.array(
            [np.inf if x.duration is None else x.duration for x in pods], dtype=np.float64
        )
        self.deadline = np.array(
            [np.inf if x.deadline is None else x.deadline for x in pods], dtype=np.float64
        )
        self.priority = np.array([x.priority for x in pods], dtype=np.int64)
        self.cls = np.array([POD_CLASS_IDS[x.pod_class] for x in pods], dtype=np.int8)
        self.tenants: list[str] = sorted({x.tenant for x in pods})
        t_idx = {t: i for i, t in enumerate(self.tenants)}
        self.tenant = np.array([t_idx[x.tenant] for x in pods], dtype=np.int32)
        self.apps: list[str] = sorted({x.app for x in pods if x.app})
        a_idx = {a: i for i, a in enumerate(self.apps)}
        self.app = np.array([a_idx[x.app] if x.app else -1 for x in pods], dtype=np.int32)
        self.traffic_mbps = np.array([x.traffic_mbps for x in pods], dtype=np.float64)
        self.usage_kind = np.array([KIND_IDS[x.usage.kind] for x in pods], dtype=np.int8)
        self.usage_mean = np.array([x.usage.mean for x in pods], dtype=np.float64)
        self.usage_amplitude = np.array([x.usage.amplitude for x in pods], dtype=np.float64)
        self.usage_peak = np.array([x.usage.peak_hour for x in pods], dtype=np.float64)
        self.usage_burst = np.array([x.usage.burst_factor for x in pods], dtype=np.float64)
        self.usage_burst_p = np.array([x.usage.burst_probability for x in pods], np.float64)

        self.status = np.full(p, NOT_ARRIVED, dtype=np.int8)
        self.node = np.full(p, -1, dtype=np.int32)
        self.devices: list[tuple[int, ...]] = [()] * p
        self.scheduled_at = np.full(p, np.nan)
        self.started_at = np.full(p, np.nan)
        self.finished_at = np.full(p, np.nan)
        self.latency_ms = np.full(p, np.nan)
        # For latency-bound pods: whether some node within the SLO had room when it was placed
        # (a violation then is a placement choice, not a lack of capacity).
        self.room_within_slo = np.zeros(p, dtype=bool)
        self.epoch = np.zeros(p, dtype=np.int32)  # bumped on eviction: stale completions ignored
        # Work left (seconds of running), and how an evicted pod keeps what it did: services
        # (online, inference, edge) carry on where they were (0: nothing to redo), training
        # resumes from its last checkpoint (the interval), batch starts again (inf).
        self.remaining = self.duration.copy()
        self.resume_every = np.array([_resume_every(x) for x in pods], dtype=np.float64)
        self.last_start = np.full(p, np.nan)  # when the current run began (first: started_at)
        # Wall seconds per second of work in the current run (> 1: a multi-GPU pod whose
        # devices span NUMA sockets it did not need to, EngineConfig.gpu_comm_share).
        self.stretch = np.ones(p)
        # Image pulls: the image's id in ClusterState.images (-1: none), the layers a pull
        # pinned on the pod's node, and seconds from binding to the container's start.
        self.image = np.full(p, -1, dtype=np.int64)
        self.pinned: list[tuple[int, ...]] = [()] * p
        self.pull_s = np.full(p, np.nan)
        self.pulled_mib = np.zeros(p, dtype=np.int64)
        # Availability: since when a pod that had started is not running (nan: running, or
        # never started), and the seconds it was down after the warm-up.
        self.down_from = np.full(p, np.nan)
        self.downtime_s = np.zeros(p)
        # When the node it was on failed (nan: not stopped by a failure); cleared once it
        # runs again, for the re-placement figures.
        self.failed_at = np.full(p, np.nan)
        # Grams of CO2 of each pod's own work after the warm-up (metrics.tick: its share of
        # its node's dynamic watts, at the node's PUE and grid intensity).
        self.carbon_g = np.zeros(p)

    def __len__(self) -> int:
        return len(self.pods)
