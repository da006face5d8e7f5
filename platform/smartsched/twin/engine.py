"""The discrete-event engine of the twin, with a step-wise API.

Owns simulated time, the event heap (arrivals, completions, node failure and
recovery, power-down and power-up, metric ticks), the pending queue, gangs
and power state. Drivers call ``next_decision()`` to advance until a pod needs
placing and ``apply(decision)`` to commit it: a heuristic runner, the gym env
and sandbox checks all drive this one engine.

Queue: pending pods are offered in Kubernetes order (priority desc, then
arrival, then submission order). A rejected pod moves to an "unschedulable"
set and returns to the active queue on a cluster event that frees or adds
capacity (completion, eviction, node recovery) or at the periodic flush
(every ``flush_s``, as kube-scheduler's podMaxInUnschedulablePodsDuration).
Gangs are all-or-nothing: members are offered one after another once all have
arrived; their allocations are tentative until the last is placed, and any
rejection rolls every member back.

Modes:
  replay  pods arrive at their times and leave after their durations.
  fill    the FGD paper's method (see ``twin.fill``): pods arrive one by one,
          never leave, and a pod that does not fit fails at once.

Must not import scheduling: a runner outside the twin drives it.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from smartsched.model.cluster import ClusterSpec
from smartsched.model.errors import InfeasibleDecisionError, ValidationError
from smartsched.model.pod import Pod
from smartsched.model.resources import CPU, GPU, MEM
from smartsched.twin.fill import tune_pods_to_gpu_target
from smartsched.twin.fragmentation import typical_pods
from smartsched.twin.metrics import MetricsRecorder
from smartsched.twin.podtable import (
    BOUND,
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    PodTable,
)
from smartsched.twin.sampling import RunningUse, sample_usage
from smartsched.twin.state import (
    POWER_BOOTING,
    POWER_OFF,
    POWER_ON,
    ClusterState,
    PodRequest,
)

MODES: Final = ("replay", "fill")

# Event kinds; the integer also orders simultaneous events (completions free
# capacity before arrivals ask for it; ticks see the settled state).
EV_RECOVER: Final = 0
EV_COMPLETE: Final = 1
EV_POWER_UP: Final = 2
EV_FAIL: Final = 3
EV_POWER_DOWN: Final = 4
EV_ARRIVE: Final = 5
EV_TICK: Final = 6


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
        inflate: fill mode target, as a multiple of cluster GPU capacity.
        fill_frag_every_pct: fill mode samples fragmentation every this many % of arrived GPU.
        frag_coverage: share of pods the "typical pods" must cover (FGD: 0.95).
        frag_include_cpu_pods: count CPU-only pods in the fragmentation target workload.
        best_effort_threshold: best-effort pods may request up to this share of a node's
            cpu/memory minus what the other pods use (sampled at ticks).
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
    inflate: float = 1.3
    fill_frag_every_pct: float = 2.0
    frag_coverage: float = 0.95
    frag_include_cpu_pods: bool = False
    best_effort_threshold: float = 0.9

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValidationError("seed", f"must be an integer >= 0, got {self.seed!r}")
        for name in ("horizon_s", "warmup_s", "tick_s", "flush_s", "idle_power_down_s",
                     "power_up_s", "node_mtbf_hours", "repair_s", "inflate",
                     "fill_frag_every_pct", "frag_coverage", "best_effort_threshold"):
            v = getattr(self, name)
            if v is None and name in ("horizon_s", "node_mtbf_hours"):
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValidationError(name, f"must be a finite number, got {v!r}")
        if self.mode not in MODES:
            raise ValidationError("mode", f"{self.mode!r} is not one of {MODES}")
        for name in ("tick_s", "flush_s", "idle_power_down_s", "repair_s", "fill_frag_every_pct"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValidationError(name, f"must be a positive number, got {v!r}")
        if not (isinstance(self.power_up_s, int | float) and 0 <= self.power_up_s < math.inf):
            raise ValidationError("power_up_s", f"must be >= 0, got {self.power_up_s!r}")
        if self.horizon_s is not None and not (0 < self.horizon_s < math.inf):
            raise ValidationError("horizon_s", f"must be a positive number, got {self.horizon_s}")
        if not (0 <= self.warmup_s < (self.horizon_s or math.inf)):
            raise ValidationError("warmup_s", "must be >= 0 and before the horizon")
        if not (0 < self.inflate <= 100):
            raise ValidationError("inflate", f"must be within (0, 100], got {self.inflate}")
        if self.node_mtbf_hours is not None and not self.node_mtbf_hours > 0:
            raise ValidationError("node_mtbf_hours", "must be positive")
        if not 0 <= self.best_effort_threshold <= 1:
            raise ValidationError("best_effort_threshold", "must be within [0, 1]")
        if not 0 < self.frag_coverage <= 1:
            raise ValidationError("frag_coverage", "must be within (0, 1]")


@dataclass(frozen=True, slots=True)
class Decision:
    """A scheduler's answer for the offered pod.

    ``node`` None rejects the pod (``reasons`` say why, per filter);
    ``devices`` None lets the twin's default binder pick devices; ``defer``
    keeps a deferrable pod waiting although it might fit.
    """

    node: int | None
    devices: tuple[int, ...] | None = None
    defer: bool = False
    reasons: tuple[str, ...] = ()

    @staticmethod
    def reject(*reasons: str) -> Decision:
        return Decision(None, reasons=tuple(reasons))


def can_defer(pod: Pod, now: float) -> bool:
    """Whether ``pod`` may still be deferred at ``now``: it has a deadline and, if it
    started now, would finish before it. Shared by the RL env and the rl: scheduler."""
    if pod.deadline is None:
        return False
    return now + (pod.duration or 0.0) < pod.deadline


@dataclass(frozen=True, slots=True)
class DecisionRequest:
    """A pod that needs placing now."""

    pod: Pod
    request: PodRequest
    pod_index: int
    time: float
    gang_remaining: int = 0  # members still to place after this one


@dataclass(order=True)
class _Event:
    time: float
    kind: int
    seq: int
    payload: Any = field(compare=False)


class Engine:
    """A deterministic simulation of one cluster under one workload."""

    def __init__(self, spec: ClusterSpec, pods: Sequence[Pod], config: EngineConfig) -> None:
        self.spec = spec
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        # Optional: ``update(now, state) -> [N, 2] predicted cpu/mem use or None``, called
        # at every metric tick (see forecast.node_predictor); the twin never imports it.
        self.usage_predictor: Any = None
        # Optional: ``update(engine) -> [N, k]`` reduced telemetry, called at every metric
        # tick (see twin.telemetry.reduction); stored in ``state.telemetry_features``.
        self.telemetry_features: Any = None
        spec.validate_pods(pods)
        self.state = ClusterState(spec)
        self.state.best_effort_threshold = config.best_effort_threshold
        self.state.be_allocatable = (
            self.state.capacity[:, :2] * config.best_effort_threshold
        )
        self.source_pods: list[Pod] = list(pods)  # before fill-mode tuning: the workload's shape
        target = typical_pods(pods, config.frag_coverage, config.frag_include_cpu_pods)
        if config.mode == "fill":
            gpu_milli = int(self.state.capacity[:, GPU].sum())
            pods = tune_pods_to_gpu_target(pods, gpu_milli, config.inflate, self.rng)
        self.table = PodTable(pods)
        self.metrics = MetricsRecorder(
            spec, self.state, self.table, target, config.seed,
            measure_from=config.warmup_s if config.mode == "replay" else 0.0,
        )
        self.now = 0.0
        self._seq = itertools.count()
        self._events: list[_Event] = []
        self._active: list[tuple[int, float, int, int]] = []  # (-prio, arrival, seq, unit)
        self._unschedulable: set[int] = set()
        self._deferred: set[int] = set()
        self._current: DecisionRequest | None = None
        self._node_pods: list[set[int]] = [set() for _ in range(self.state.num_nodes)]
        self._node_ready_at = np.zeros(self.state.num_nodes)
        self._idle_epoch = np.zeros(self.state.num_nodes, dtype=np.int64)
        self._requests: list[PodRequest | None] = [None] * len(self.table)
        self._finished = False
        self._last_flush = 0.0
        self._non_tick_events = 0

        # Gangs: unit id for a gang is -(g + 1); members and arrival counts.
        self._gang_members: list[list[int]] = []
        self._gang_of = np.full(len(self.table), -1, dtype=np.int64)
        gang_ids: dict[str, int] = {}
        for i, p in enumerate(self.table.pods):
            if p.gang_id is not None and p.gang_size > 1:
                g = gang_ids.setdefault(p.gang_id, len(gang_ids))
                if g == len(self._gang_members):
                    self._gang_members.append([])
                self._gang_members[g].append(i)
                self._gang_of[i] = g
        self._gang_arrived = np.zeros(len(self._gang_members), dtype=np.int64)
        self._gang_size = np.array(
            [self.table.pods[m[0]].gang_size for m in self._gang_members], dtype=np.int64
        )
        self._gang_todo: list[int] = []
        self._gang_placed: list[tuple[int, int, tuple[int, ...]]] = []

        # Fill mode bookkeeping: arrived GPU demand and the allocation curve.
        self._cap_gpu = float(self.state.capacity[:, GPU].sum())
        self._arrived_gpu = 0.0
        self._fill_curve: list[tuple[float, float]] = [(0.0, 0.0)]
        self._next_curve_pct = 1
        self._next_frag_pct = 0.0

        # Failures are drawn only before this time, so a run without a horizon ends.
        self._failure_end = (
            config.horizon_s if config.horizon_s is not None
            else float(self.table.arrival.max(initial=0.0))
        )
        self._binds = 0
        self._binds_at_final_flush = -1
        self._seed_events()

    # ------------------------------------------------------------ public API
    @property
    def queue_length(self) -> int:
        return int((self.table.status == PENDING).sum())

    def next_decision(self) -> DecisionRequest | None:
        """Advance simulated time until a pod needs placing; None when the run is over."""
        if self._current is not None:
            return self._current
        while True:
            if self._gang_todo:
                self._current = self._offer(self._gang_todo[0], len(self._gang_todo) - 1)
                return self._current
            while self._active:
                _, _, _, unit = heapq.heappop(self._active)
                if unit < 0:
                    g = -unit - 1
                    st = self.table.status[self._gang_members[g]]
                    members = [m for m, s in zip(self._gang_members[g], st, strict=True)
                               if s == PENDING]
                    # Members that already finished are not re-run after an eviction.
                    needed = int(((st != DONE) & (st != FAILED)).sum())
                    if members and len(members) == needed and not self._gang_active(g):
                        self._gang_todo = members
                        self._gang_placed = []
                        break
                elif self.table.status[unit] == PENDING and unit not in self._unschedulable:
                    self._current = self._offer(unit, 0)
                    return self._current
            if self._gang_todo:
                continue
            if not self._step_events():
                self._finish()
                return None

    def _gang_active(self, g: int) -> bool:
        """Whether a member of gang g is still bound or running (then it must not restart)."""
        st = self.table.status[self._gang_members[g]]
        return bool(((st == RUNNING) | (st == BOUND)).any())

    def apply(self, decision: Decision) -> None:
        """Commit the scheduler's decision for the pod last offered by ``next_decision``.

        A decision that would over-allocate raises InfeasibleDecisionError and
        changes nothing.
        """
        cur = self._current
        if cur is None:
            raise InfeasibleDecisionError("apply() called with no pending decision")
        i = cur.pod_index
        in_gang = bool(self._gang_todo)
        if decision.node is None or decision.defer:
            self._current = None
            self.metrics.rejected(("deferred",) if decision.defer else decision.reasons)
            members = [p for p, _, _ in self._gang_placed] + self._gang_todo if in_gang else [i]
            if in_gang:
                self._rollback_gang()
            self._arrive_gpu(members)
            if self.config.mode == "fill":
                self.table.status[members] = FAILED
                self.metrics.failed(members)
            else:
                unit = -(int(self._gang_of[i]) + 1) if in_gang else i
                # A deferred pod waits for the next periodic retry, not for the next
                # completion: deferring is a choice about time, not about room.
                (self._deferred if decision.defer else self._unschedulable).add(unit)
            return
        node = int(decision.node)
        req = cur.request
        if not 0 <= node < self.state.num_nodes:
            raise InfeasibleDecisionError(f"node index {node} out of range")
        devices = (
            tuple(int(d) for d in decision.devices)
            if decision.devices is not None
            else self.state.pick_devices(node, req)
        )
        self.state.allocate(node, req, devices)  # raises, unchanged, on over-allocation
        self._current = None
        if in_gang:
            self._gang_todo.pop(0)
            self._gang_placed.append((i, node, devices))
            if self._gang_todo:
                return
            placed, self._gang_placed = self._gang_placed, []
            for p, nd, dv in placed:
                self._bind(p, nd, dv)
            self._arrive_gpu([p for p, _, _ in placed])
        else:
            self._bind(i, node, devices)
            self._arrive_gpu([i])

    def sample_usage(self) -> RunningUse:
        """Take a usage sample now (``state.usage``, the best-effort pool); the metric ticks
        do it, and so may a driver that serves the state between ticks."""
        return sample_usage(self.state, self.table, self.now, self.config.seed)

    def record_decision_time(self, seconds: float) -> None:
        """Wall time a driver spent deciding (and applying) one pod."""
        self.metrics.decision_seconds.append(seconds)

    def run_report(self) -> dict[str, Any]:
        """Metrics of the run so far (call after ``next_decision`` returned None)."""
        return self.metrics.report(self.config.mode, self._fill_curve)

    @property
    def timeseries(self) -> list[dict[str, float]]:
        return self.metrics.rows

    # ------------------------------------------------------------- internals
    def _push(self, time: float, kind: int, payload: Any) -> None:
        if kind != EV_TICK:
            self._non_tick_events += 1
        heapq.heappush(self._events, _Event(time, kind, next(self._seq), payload))

    def _seed_events(self) -> None:
        tb, cfg = self.table, self.config
        order = np.lexsort((np.arange(len(tb)), tb.arrival))
        if cfg.mode == "fill":
            # Offer pods in list order, all at time 0, each only after the previous decision.
            self._fill_order = order.tolist()
            self._fill_pos = 0
            return
        for i in order:
            self._push(float(tb.arrival[i]), EV_ARRIVE, int(i))
        self._push(0.0, EV_TICK, None)
        if cfg.power_management:
            for n in range(self.state.num_nodes):
                self._push(cfg.idle_power_down_s, EV_POWER_DOWN, (n, 0))
        if cfg.node_mtbf_hours is not None:
            ttf = self.rng.exponential(cfg.node_mtbf_hours * 3600.0, self.state.num_nodes)
            for n in np.flatnonzero(ttf < self._failure_end):
                self._push(float(ttf[n]), EV_FAIL, int(n))

    def _offer(self, i: int, remaining: int) -> DecisionRequest:
        self.state.now = self.now
        self.state.queue_length = self.metrics.pending
        self.state.queue_by_class = self.metrics.pending_cls
        req = self._requests[i]
        if req is None:
            req = self._requests[i] = self.state.compile(self.table.pods[i])
        return DecisionRequest(self.table.pods[i], req, i, self.now, remaining)

    def _step_events(self) -> bool:
        """Process the next batch of simultaneous events; False when the run is over."""
        if self.config.mode == "fill":
            return self._fill_next()
        horizon = self.config.horizon_s
        # With only ticks left, go on only while a horizon asks for it.
        if not self._events or (self._non_tick_events == 0 and horizon is None):
            # Nothing else can happen. Retry waiting pods once more if anything was
            # placed since the last such retry (a deferred pod may fit now).
            if (self._unschedulable or self._deferred) and (
                self._binds != self._binds_at_final_flush
            ):
                self._binds_at_final_flush = self._binds
                self._release_deferred()
                self._cluster_event()
                return True
            if horizon is not None and self.now < horizon:
                self._advance(horizon)
            return False
        t = self._events[0].time
        if horizon is not None and t > horizon:
            self._advance(horizon)
            return False
        self._advance(t)
        handled = False
        while self._events and self._events[0].time == t:
            if self._events[0].kind == EV_TICK and handled:
                # Sample only after the pods these events released have been placed.
                break
            ev = heapq.heappop(self._events)
            if ev.kind != EV_TICK:
                self._non_tick_events -= 1
            self._handle(ev)
            handled = True
        return True

    def _advance(self, t: float) -> None:
        self.metrics.advance(self.now, t)
        self.now = t

    def _handle(self, ev: _Event) -> None:
        k, p = ev.kind, ev.payload
        if k == EV_ARRIVE:
            self._arrive(p)
        elif k == EV_COMPLETE:
            i, epoch = p
            if self.table.epoch[i] == epoch and self.table.status[i] == RUNNING:
                self.table.status[i] = DONE
                self.table.finished_at[i] = self.now
                node = int(self.table.node[i])
                self._unbind(i)
                self._cluster_event(node)
        elif k == EV_TICK:
            self._tick()
        elif k == EV_POWER_DOWN:
            n, epoch = p
            st = self.state
            if st.pod_count[n] == 0 and self._idle_epoch[n] == epoch and st.power[n] == POWER_ON:
                self._set_power(n, POWER_OFF)
        elif k == EV_POWER_UP:
            self._power_up_done(p)
        elif k == EV_FAIL:
            self._fail(p)
        elif k == EV_RECOVER:
            self.state.up[p] = True
            self._cluster_event()
            mtbf = self.config.node_mtbf_hours
            if mtbf is not None:
                nxt = self.now + float(self.rng.exponential(mtbf * 3600.0))
                if nxt < self._failure_end:
                    self._push(nxt, EV_FAIL, p)

    def _arrive(self, i: int) -> None:
        tb = self.table
        tb.status[i] = PENDING
        self.metrics.arrived(i)
        g = int(self._gang_of[i])
        if g >= 0:
            self._gang_arrived[g] += 1
            if self._gang_arrived[g] == self._gang_size[g]:
                first = min(self._gang_members[g], key=lambda m: (tb.arrival[m], m))
                self._enqueue(-(g + 1), first)
            return
        self._enqueue(i, i)

    def _enqueue(self, unit: int, rep: int) -> None:
        tb = self.table
        heapq.heappush(
            self._active, (-int(tb.priority[rep]), float(tb.arrival[rep]), rep, unit)
        )

    def _release_deferred(self) -> None:
        """Deferred pods become ordinary waiting pods again (at the periodic retry)."""
        self._unschedulable |= self._deferred
        self._deferred = set()

    def _cluster_event(self, node: int | None = None) -> None:
        """Capacity changed: move unschedulable pods back to the active queue.

        With ``node`` (capacity freed on that node only), move just the pods
        whose request now fits that node's free resources, as kube-scheduler's
        queueing hints do; gangs are judged by their first member. Without it,
        move all.
        """
        if not self._unschedulable:
            return
        units = sorted(self._unschedulable)
        if node is not None:
            units = [u for u, ok in zip(units, self._fits_node(units, node), strict=True) if ok]
        for u in units:
            self._unschedulable.discard(u)
            rep = self._gang_members[-u - 1][0] if u < 0 else u
            self._enqueue(u, rep)

    def _fits_node(self, units: list[int], node: int) -> np.ndarray:
        """Vectorized: does each unit's (first member's) request fit ``node`` now?"""
        reps = np.array([self._gang_members[-u - 1][0] if u < 0 else u for u in units])
        tb, st = self.table, self.state
        ok = (st.free_res[node] >= tb.charged[reps]).all(axis=1)
        be = tb.best_effort[reps]
        if be.any():
            slack = st.be_allocatable[node] - st.be_allocated[node]
            ok &= ~be | (slack >= tb.requests[reps, :2]).all(axis=1)
        ngpu = tb.num_gpu[reps]
        if ngpu.any():
            free_dev = st.gpu_free[node]
            usable = (free_dev[None, :] >= tb.gpu_milli[reps][:, None]).sum(axis=1)
            ok &= usable >= ngpu
        return ok

    def _tick(self) -> None:
        cfg = self.config
        if self.now - self._last_flush >= cfg.flush_s:
            self._last_flush = self.now
            self._release_deferred()
            self._cluster_event()
        span = cfg.tick_s if cfg.horizon_s is None else min(cfg.tick_s, cfg.horizon_s - self.now)
        self.metrics.tick(self.now, span, self.queue_length, self.sample_usage(), {})
        if self.usage_predictor is not None:  # usage was just sampled: predict from it
            st = self.state
            pred = self.usage_predictor.update(self.now, st)
            st.predicted_usage = pred
            if pred is not None:  # best-effort slack backs off before a predicted surge
                cap = st.capacity[:, [CPU, MEM]] * st.best_effort_threshold
                st.be_allocatable = np.minimum(st.be_allocatable, np.maximum(cap - pred, 0.0))
        if self.telemetry_features is not None:
            self.state.telemetry_features = self.telemetry_features.update(self)
        nxt = self.now + cfg.tick_s
        if self._non_tick_events > 0 or (cfg.horizon_s is not None and nxt <= cfg.horizon_s):
            self._push(nxt, EV_TICK, None)

    def _bind(self, i: int, node: int, devices: tuple[int, ...]) -> None:
        tb, st = self.table, self.state
        self._binds += 1
        tb.node[i] = node
        tb.devices[i] = devices
        if not np.isfinite(tb.scheduled_at[i]):
            tb.scheduled_at[i] = self.now
        pod = tb.pods[i]
        if pod.origin_site is not None:
            origin = self.spec.site(pod.origin_site)
            target = self.spec.sites[int(st.site_id[node])]
            tb.latency_ms[i] = target.latency_ms_from(origin)
        self._node_pods[node].add(i)
        self.metrics.bound(i)
        self._idle_epoch[node] += 1
        if st.power[node] == POWER_OFF:
            self._set_power(node, POWER_BOOTING)
            self._node_ready_at[node] = self.now + self.config.power_up_s
            self._push(self._node_ready_at[node], EV_POWER_UP, node)
        if st.power[node] == POWER_BOOTING:
            tb.status[i] = BOUND
        else:
            self._start(i)

    def _start(self, i: int) -> None:
        tb = self.table
        tb.status[i] = RUNNING
        tb.started_at[i] = self.now
        if self.config.mode == "replay" and np.isfinite(tb.duration[i]):
            self._push(self.now + float(tb.duration[i]), EV_COMPLETE, (i, int(tb.epoch[i])))

    def _power_up_done(self, node: int) -> None:
        if self.state.power[node] != POWER_BOOTING:
            return
        self._set_power(node, POWER_ON)
        for i in sorted(self._node_pods[node]):
            if self.table.status[i] == BOUND:
                self._start(i)
        self._schedule_power_down(node)

    def _unbind(self, i: int) -> None:
        tb = self.table
        node = int(tb.node[i])
        self.state.release(node, self._requests[i], tb.devices[i])  # type: ignore[arg-type]
        self._node_pods[node].discard(i)
        self.metrics.released(i)
        self._schedule_power_down(node)

    def _schedule_power_down(self, node: int) -> None:
        if self.config.power_management and self.state.pod_count[node] == 0:
            self._idle_epoch[node] += 1
            self._push(
                self.now + self.config.idle_power_down_s,
                EV_POWER_DOWN,
                (node, int(self._idle_epoch[node])),
            )

    def _set_power(self, node: int, new: int) -> None:
        old = int(self.state.power[node])
        self.state.power[node] = new
        self.metrics.power_changed(node, old, new)

    def _fail(self, node: int) -> None:
        st = self.state
        if not st.up[node]:
            return
        st.up[node] = False
        for i in sorted(self._node_pods[node]):
            self._evict(i)
            g = int(self._gang_of[i])
            self._unschedulable.add(-(g + 1) if g >= 0 else i)
        self._evict_partial_gangs()
        self._push(self.now + self.config.repair_s, EV_RECOVER, node)
        self._cluster_event()

    def _evict_partial_gangs(self) -> None:
        """A gang with an evicted member restarts as a whole (all-or-nothing)."""
        tb = self.table
        for g, members in enumerate(self._gang_members):
            st = tb.status[members]
            if (st == PENDING).any() and ((st == RUNNING) | (st == BOUND)).any():
                for m in members:
                    if tb.status[m] in (RUNNING, BOUND):
                        self._evict(m)
                self._unschedulable.add(-(g + 1))

    def _evict(self, i: int) -> None:
        """Take pod ``i`` off its node and back to the queue; its pending completion is void."""
        tb = self.table
        self._unbind(i)
        tb.epoch[i] += 1
        tb.status[i] = PENDING
        tb.node[i] = -1
        self.metrics.evictions += 1
        self.metrics.requeued(i)

    def _rollback_gang(self) -> None:
        for p, node, devices in self._gang_placed:
            self.state.release(node, self._requests[p], devices)  # type: ignore[arg-type]
        self._gang_placed = []
        self._gang_todo = []

    # ------------------------------------------------------------ fill mode
    def _fill_next(self) -> bool:
        if self._fill_pos >= len(self._fill_order):
            return False
        i = self._fill_order[self._fill_pos]
        self._fill_pos += 1
        self._arrive(i)
        return True

    def _arrive_gpu(self, pods: list[int]) -> None:
        """Fill mode: count arrived GPU demand and sample the allocation curve."""
        if self.config.mode != "fill" or self._cap_gpu == 0:
            return
        self._arrived_gpu += float(self.table.requests[pods, GPU].sum())
        arrived_pct = 100.0 * self._arrived_gpu / self._cap_gpu
        alloc_pct = 100.0 * self.metrics.alloc_total[GPU] / self._cap_gpu
        if arrived_pct >= self._next_curve_pct:
            self._fill_curve.append((round(arrived_pct, 3), round(float(alloc_pct), 3)))
            self._next_curve_pct = math.floor(arrived_pct) + 1
        if arrived_pct >= self._next_frag_pct:
            step = self.config.fill_frag_every_pct
            self._next_frag_pct = (math.floor(arrived_pct / step) + 1) * step
            self.metrics.tick(self.now, 1.0, 0, self.sample_usage(),
                              {"arrived_gpu_pct": arrived_pct})

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self.config.mode == "fill":
            self.metrics.tick(self.now, 1.0, 0, self.sample_usage(),
                              {"arrived_gpu_pct": 100.0 * self._arrived_gpu
                               / max(self._cap_gpu, 1.0)})
            return
