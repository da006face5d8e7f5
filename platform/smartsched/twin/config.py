"""Settings of one simulation run, validated: every field a bad value names.

Owns ``EngineConfig`` (mode, seed, horizon and warm-up, tick and flush periods,
power management, failures, fill-mode inflation, fragmentation target,
best-effort threshold). Frozen, so a run's settings never change under it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from smartsched.model.errors import ValidationError

MODES: Final = ("replay", "fill")


# A run walks through every metric tick and queue flush up to its horizon or its last
# event: a horizon of 1e308 s, or a tick of a microsecond over a day's trace, was
# accepted and never finished. (build_run caps a run at a year; these bound the engine
# for callers that drive it directly.)
MAX_HORIZON_S = 10 * 366 * 86_400.0
MIN_STEP_S = 1.0


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Settings of one simulation run.

    Attributes:
        mode: "replay" or "fill".
        seed: seeds every random choice (fill sampling, failures, bursts).
        horizon_s: stop at this simulated time (None: when nothing more can happen).
        warmup_s: metrics cover [warmup_s, end); the cluster fills up before.
        tick_s: metric sampling period in replay mode.
        flush_s: unschedulable pods are retried at least this often.
        power_management: power idle nodes down (replay only).
        idle_power_down_s: a node with no pods for this long powers down.
        power_up_s: boot time of a powered-down node; its pods start after it.
        node_mtbf_hours: mean time between failures per node (None: no failures).
        repair_s: time a failed node stays down.
        node_monitor_grace_s: a failed node is marked NotReady this long after it fails
            (kube-controller-manager's node-monitor-grace-period, 40 s); until then
            schedulers still see it up and its pods are stalled, not evicted.
        eviction_toleration_s: pods stay bound to a NotReady node this long before they
            are evicted and re-queued (the 300 s that Kubernetes' DefaultTolerationSeconds
            gives every pod); a scheduler may shorten it for its pods
            (``Scheduler.failure_toleration_s``). Both 0: the node's pods go back to the
            queue the moment it fails.
        inflate: fill mode target, as a multiple of cluster GPU capacity.
        fill_frag_every_pct: fill mode samples fragmentation every this many % of arrived GPU.
        frag_coverage: share of pods the "typical pods" must cover (FGD: 0.95).
        frag_include_cpu_pods: count CPU-only pods in the fragmentation target workload.
        best_effort_threshold: best-effort pods may request up to this share of a node's
            cpu/memory minus what the other pods use (sampled at ticks).
        container_start_s: a container's start after its image is on the node (pods
            with an image only).
        gpu_comm_share: the share of a multi-GPU pod's best-placed run spent moving data
            between its GPUs (replay only). A pod whose devices span NUMA sockets when its
            node could have kept them on one runs longer (``model.topology.
            locality_stretch``). 0, the default, leaves run times as the workload gives
            them (every figure measured before this setting existed assumes 0); data-
            parallel training over PCIe spends roughly 0.2-0.4 of a step on all-reduce.
        report_metrics: keep everything the run report needs (the default). False keeps
            only what the RL step reward reads (``MetricsRecorder.snapshot``): no per-tick
            time series, GPU fragmentation, cross-zone traffic, per-pod carbon or set of
            contended pods, and ``run_report`` refuses. Training env runners use it: no
            reward reads those figures, and they took several percent of each decision.
        track_traffic: with ``report_metrics`` false, still measure cross-zone traffic at
            each tick (the ``traffic`` reward component reads its share); the training env
            sets it when its weights can weigh traffic.
    """

    mode: str = "replay"
    seed: int = 0
    horizon_s: float | None = None
    warmup_s: float = 0.0
    tick_s: float = 300.0
    flush_s: float = 300.0
    power_management: bool = True
    idle_power_down_s: float = 900.0
    power_up_s: float = 180.0
    node_mtbf_hours: float | None = None
    repair_s: float = 3600.0
    node_monitor_grace_s: float = 40.0
    eviction_toleration_s: float = 300.0
    inflate: float = 1.3
    fill_frag_every_pct: float = 2.0
    frag_coverage: float = 0.95
    frag_include_cpu_pods: bool = False
    best_effort_threshold: float = 0.9
    container_start_s: float = 2.0
    gpu_comm_share: float = 0.0
    report_metrics: bool = True
    track_traffic: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValidationError("seed", f"must be an integer >= 0, got {self.seed!r}")
        for name in ("horizon_s", "warmup_s", "tick_s", "flush_s", "idle_power_down_s",
                     "power_up_s", "node_mtbf_hours", "repair_s", "inflate",
                     "fill_frag_every_pct", "frag_coverage", "best_effort_threshold",
                     "container_start_s", "node_monitor_grace_s", "eviction_toleration_s",
                     "gpu_comm_share"):
            v = getattr(self, name)
            if v is None and name in ("horizon_s", "node_mtbf_hours"):
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValidationError(name, f"must be a finite number, got {v!r}")
        # Strictly booleans: a string from a config ("false") would read as true.
        for name in ("power_management", "frag_include_cpu_pods", "report_metrics",
                     "track_traffic"):
            if not isinstance(getattr(self, name), bool):
                raise ValidationError(name,
                                      f"must be true or false, got {getattr(self, name)!r}")
        if self.mode not in MODES:
            raise ValidationError("mode", f"{self.mode!r} is not one of {MODES}")
        for name in ("tick_s", "flush_s", "idle_power_down_s", "repair_s", "fill_frag_every_pct"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValidationError(name, f"must be a positive number, got {v!r}")
        for name in ("node_monitor_grace_s", "eviction_toleration_s"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValidationError(name, "must be >= 0")
        if not 0 <= self.container_start_s < math.inf:
            raise ValidationError("container_start_s", "must be >= 0")
        if not (isinstance(self.power_up_s, int | float) and 0 <= self.power_up_s < math.inf):
            raise ValidationError("power_up_s", f"must be >= 0, got {self.power_up_s!r}")
        if self.horizon_s is not None and not (0 < self.horizon_s <= MAX_HORIZON_S):
            raise ValidationError("horizon_s", f"must be a positive number of seconds up to "
                                  f"{MAX_HORIZON_S:g} (ten years), got {self.horizon_s}")
        for name in ("tick_s", "flush_s"):  # a run steps through every tick and flush
            if getattr(self, name) < MIN_STEP_S:
                raise ValidationError(name, f"must be at least {MIN_STEP_S:g} s, got "
                                      f"{getattr(self, name)}")
        if not (0 <= self.warmup_s < (self.horizon_s or math.inf)):
            raise ValidationError("warmup_s", "must be >= 0 and before the horizon")
        if not (0 < self.inflate <= 100):
            raise ValidationError("inflate", f"must be within (0, 100], got {self.inflate}")
        if self.node_mtbf_hours is not None and not self.node_mtbf_hours > 0:
            raise ValidationError("node_mtbf_hours", "must be positive")
        if not 0 <= self.best_effort_threshold <= 1:
            raise ValidationError("best_effort_threshold", "must be within [0, 1]")
        if not 0 <= self.gpu_comm_share <= 1:
            raise ValidationError("gpu_comm_share", "must be within [0, 1]")
        if not 0 < self.frag_coverage <= 1:
            raise ValidationError("frag_coverage", "must be within (0, 1]")
