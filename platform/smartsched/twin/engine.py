"""The discrete-event engine of the twin, with a step-wise API.

Owns simulated time and the event loop (arrivals, completions, node failure
and recovery, power-down and power-up, metric ticks), binding pods to nodes
and taking them off again (completion, eviction), and gangs' tentative
placement. Drivers call ``next_decision()`` to advance until a pod needs
placing and ``apply(decision)`` to commit it: the run builder's drive loop,
the gym env and sandbox checks all drive this one engine.

The parts live beside it, one job each: ``events`` (the heap), ``queue``
(Kubernetes order, gangs, retries on the events that can help: queueing
hints), ``powerstate`` (idle power-down and boot), ``failures`` (when nodes
fail), ``fill`` (the FGD paper's fill mode), ``sampling`` (the usage sample
at each tick), ``metrics`` (read-only figures).

Gangs are all-or-nothing: members are offered one after another once all have
arrived; their allocations are tentative until the last is placed, and any
rejection rolls every member back.

Modes:
  replay  pods arrive at their times and leave after their durations.
  fill    the FGD paper's method (see ``twin.fill``): pods arrive one by one,
          never leave, and a pod that does not fit fails at once.

Must not import scheduling: the run builder above the twin drives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from smartsched.model.cluster import ClusterSpec
from smartsched.model.errors import InfeasibleDecisionError, ValidationError
from smartsched.model.pod import POD_CLASS_IDS, Pod, PodClass
from smartsched.model.resources import CPU, GPU, MEM
from smartsched.model.topology import fewest_sockets, locality_stretch
from smartsched.twin.config import MODES, EngineConfig
from smartsched.twin.decision import (
    Code,
    Decision,
    DecisionRequest,
    Migration,
    Rejection,
    RetryHint,
    can_defer,
)
from smartsched.twin.events import (
    EV_ARRIVE,
    EV_COMPLETE,
    EV_DUE,
    EV_FAIL,
    EV_NODE_EVICT,
    EV_NOT_READY,
    EV_POWER_DOWN,
    EV_POWER_UP,
    EV_PULLED,
    EV_RECOVER,
    EV_TICK,
    Event,
    EventHeap,
)
from smartsched.twin.failures import FailureModel
from smartsched.twin.fill import FillProgress, tune_pods_to_gpu_target
from smartsched.twin.fragmentation import typical_pods
from smartsched.twin.metrics import MetricsRecorder
from smartsched.twin.podtable import (
    BOUND,
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    PodTable,
    saved_work,
)
from smartsched.twin.powerstate import PowerLifecycle
from smartsched.twin.queue import SchedulingQueue
from smartsched.twin.reservations import Reservation, holder
from smartsched.twin.sampling import RunningUse, sample_usage
from smartsched.twin.state import POWER_ON, ClusterState, PodRequest

__all__ = [
    "MODES",
    "Code",
    "Decision",
    "DecisionRequest",
    "Engine",
    "EngineConfig",
    "Rejection",
    "RetryHint",
    "TelemetryHook",
    "UsagePredictor",
    "can_defer",
]


class UsagePredictor(Protocol):
    """Predicts node usage from the samples so far (forecast.node_predictor)."""

    def update(self, now: float, state: ClusterState) -> np.ndarray | None:
        """[N, 2] predicted cpu / memory use, or None until it has seen enough."""
        ...


class DeschedulerHook(Protocol):
    """A scheduler's periodic descheduling pass (scheduling.base.Deschedules)."""

    @property
    def deschedule_interval_s(self) -> float | None: ...

    def deschedule(self, state: ClusterState,
                   waiting: Sequence[PodRequest]) -> tuple[Migration, ...]: ...


class TelemetryHook(Protocol):
    """Reduces the wide telemetry to node features (twin.telemetry.reduction)."""

    def update(self, engine: Engine) -> np.ndarray:
        """[N, k] features of every node now."""
        ...


class Engine:
    """A deterministic simulation of one cluster under one workload."""

    def __init__(self, spec: ClusterSpec, pods: Sequence[Pod], config: EngineConfig) -> None:
        self.spec = spec
        self.config = config
        self.rng = np.random.default_rng(config.seed)
        # Hooks the run builder attaches when a scheduler asks for them (the twin never
        # imports their packages): called at every metric tick, after the usage sample.
        self.usage_predictor: UsagePredictor | None = None
        self.telemetry_features: TelemetryHook | None = None
        self.descheduler: DeschedulerHook | None = None
        self._last_deschedule = 0.0
        spec.validate_pods(pods)
        self.state = ClusterState(spec)
        self.state.reservations.gang_preempts = True  # a due gang's victims are evicted here
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
            full=config.report_metrics, track_traffic=config.track_traffic,
        )
        self.now = 0.0
        self.events = EventHeap()
        self._requests: list[PodRequest | None] = [None] * len(self.table)
        self.queue = SchedulingQueue(self.table, self.state, self._request)
        self.power = PowerLifecycle(self.state, self.metrics, config.power_management,
                                    config.idle_power_down_s, config.power_up_s,
                                    self.events.push)
        # Failures are drawn only before this time, so a run without a horizon ends.
        end = (config.horizon_s if config.horizon_s is not None
               else float(self.table.arrival.max(initial=0.0)))
        self.failures = FailureModel(self.rng, config.node_mtbf_hours, config.repair_s, end)
        # Failed nodes not repaired yet, and a count per node that voids the NotReady mark
        # and eviction of a failure the node has recovered from.
        self._dead = np.zeros(self.state.num_nodes, dtype=bool)
        self._fail_epoch = np.zeros(self.state.num_nodes, dtype=np.int64)
        # How long pods tolerate a NotReady node before eviction: the cluster's default,
        # unless the scheduler sets its pods' toleration (the run builder applies it).
        self.failure_toleration_s = config.eviction_toleration_s
        self._rebound: dict[int, float] = {}  # pods stopped by a failure: when bound again
        self._current: DecisionRequest | None = None
        self._node_pods: list[set[int]] = [set() for _ in range(self.state.num_nodes)]
        self._finished = False
        self._last_flush = 0.0
        # A gang being placed: members still to offer, and those placed tentatively.
        self._gang_todo: list[int] = []
        self._gang_placed: list[tuple[int, int, tuple[int, ...]]] = []
        self._fill: FillProgress | None = None
        self._fill_arrived = np.zeros(0, dtype=bool)  # fill mode: pods counted as arrived
        self._pod_index: dict[int, int] | None = None  # id(pod) -> index, built on demand
        # Pods evicted by preemption from an app with a disruption budget, not running yet.
        self._disrupted: set[int] = set()
        self._pulling: set[int] = set()  # bound pods waiting for their image
        self._budgeted = (POD_CLASS_IDS[PodClass.ONLINE], POD_CLASS_IDS[PodClass.EDGE_RT])
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
            unit = self.queue.pop(self._gang_busy)
            if isinstance(unit, list):
                self._gang_todo = unit
                self._gang_placed = []
                continue
            if unit is not None:
                self._current = self._offer(unit, 0)
                return self._current
            if not self._step_events():
                self._finish()
                return None

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
            self._check_reserve(holder(cur.pod), decision.reserve)  # before anything changes
            self._current = None
            self.metrics.rejected((Rejection("deferred"),) if decision.defer
                                  else decision.rejections)
            members = [p for p, _, _ in self._gang_placed] + self._gang_todo if in_gang else [i]
            if in_gang:
                self._rollback_gang()
            self._fill_decided(members)
            if self.config.mode == "fill":
                self.table.status[members] = FAILED
                # A pod placed, then preempted, then refused ends failed, not also placed.
                self.table.scheduled_at[members] = np.nan
                self.table.started_at[members] = np.nan
                # ... nor a latency-bound pod served within its SLO (failed counts missed).
                self.table.latency_ms[members] = np.nan
                self.table.room_within_slo[members] = False
                self.metrics.failed(members)
            elif decision.defer:
                self.queue.defer(self.queue.unit_of(i))
            else:
                unit = self.queue.unit_of(i)
                self.queue.park(unit, decision.retry)
                key = holder(cur.pod)
                if unit < 0 or decision.reserve is not None \
                        or key in self.state.reservations.by_gang:
                    self._hold_room(key, decision.reserve, unit)
            return
        node = int(decision.node)
        req = cur.request
        if not 0 <= node < self.state.num_nodes:
            raise InfeasibleDecisionError(f"node index {node} out of range")
        freed: set[int] = set()
        if decision.victims:
            # Checked before the first eviction: a refused decision changes nothing.
            victims = self._checked_victims(decision.victims, i, node, req, decision.devices)
            freed = self._preempt(victims, i)
        devices = (
            tuple(int(d) for d in decision.devices)
            if decision.devices is not None
            else self.state.pick_devices(node, req)
        )
        slo = cur.pod.latency_slo_ms
        if slo is not None and req.origin >= 0:  # before taking the room: was there any?
            st = self.state
            near = st.site_latency_ms[req.origin][st.site_id] <= slo
            self.table.room_within_slo[i] = bool((near & st.resource_fit(req)).any())
        # Raises, unchanged, on over-allocation; ``until`` is when it is expected to leave.
        self.state.allocate(node, req, devices, until=self._expected_end(i, self.now))
        self._current = None
        if in_gang:
            self._gang_todo.pop(0)
            self._gang_placed.append((i, node, devices))
            if self._gang_todo:
                return
            placed, self._gang_placed = self._gang_placed, []
            gang = cur.pod.gang_id
            if gang is not None:
                self.state.reservations.remove(gang)  # started: its promise is kept
            for p, nd, dv in placed:
                self._bind(p, nd, dv)
            self._fill_decided([p for p, _, _ in placed])
        else:
            if self.state.reservations.by_gang:  # a single pod's reservation is kept too
                self.state.reservations.remove(holder(cur.pod))
            self._bind(i, node, devices)
            self._fill_decided([i])
        for n in sorted(freed - {node}):  # gang mates evicted elsewhere left room there
            self.queue.room_freed(n)

    def fill_window(self, size: int) -> list[PodRequest]:
        """Fill mode's arrivals in windows: the pod offered now and the ``size - 1`` after
        it, in the order they will be offered (their window has arrived: a driver that
        places windows jointly may read them; nothing later)."""
        if self._fill is None or self._current is None:
            raise ValidationError("mode", "windows are fill mode's, with a pod offered")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValidationError("window", f"must be an integer >= 1, got {size!r}")
        later = self._fill.order[self._fill.pos:self._fill.pos + size - 1]
        return [self._current.request] + [self._request(i) for i in later]

    @property
    def tentative(self) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
        """Gang members placed tentatively while the rest of their gang is decided:
        (pod index, node, devices). They hold resources in the state while the pod
        table still shows them pending."""
        return tuple(self._gang_placed)

    def inject_failure(self, node: int, at_s: float) -> None:
        """Fail ``node`` at simulated time ``at_s`` (beside any failures the MTBF draws);
        it is repaired ``repair_s`` later and its pods are handled as for any failure."""
        if self._fill is not None:  # its events would never run: say so, not drop it
            raise ValidationError("mode", "fill mode has no time: nodes fail in replay only")
        if isinstance(node, bool) or not isinstance(node, int | np.integer) \
                or not 0 <= node < self.state.num_nodes:
            raise ValidationError("node", f"must be a node index in 0..{self.state.num_nodes - 1}"
                                  f", got {node!r}")
        if isinstance(at_s, bool) or not isinstance(at_s, int | float) \
                or not self.now <= at_s < np.inf:
            raise ValidationError("at_s", f"must be a time >= now ({self.now}), got {at_s!r}")
        self.events.push(float(at_s), EV_FAIL, int(node))

    def sample_usage(self) -> RunningUse:
        """Take a usage sample now (``state.usage``, the best-effort pool); the metric ticks
        do it, and so may a driver that serves the state between ticks."""
        return sample_usage(self.state, self.table, self.now, self.config.seed)

    def record_decision_time(self, seconds: float) -> None:
        """Wall time a driver spent deciding (and applying) one pod."""
        self.metrics.decision_seconds.append(seconds)

    def run_report(self) -> dict[str, Any]:
        """Metrics of the run so far (call after ``next_decision`` returned None)."""
        curve = self._fill.curve if self._fill is not None else [(0.0, 0.0)]
        return self.metrics.report(self.config.mode, curve)

    @property
    def timeseries(self) -> list[dict[str, float]]:
        return self.metrics.rows

    # ----------------------------------------------------------- event loop
    def _request(self, i: int) -> PodRequest:
        req = self._requests[i]
        if req is None:
            req = self._requests[i] = self.state.compile(self.table.pods[i])
        return req

    def _seed_events(self) -> None:
        tb, cfg = self.table, self.config
        order = np.lexsort((np.arange(len(tb)), tb.arrival))
        if cfg.mode == "fill":
            # Offer pods in list order, all at time 0, each only after the previous decision.
            self._fill = FillProgress(order.tolist(), float(self.state.capacity[:, GPU].sum()),
                                      cfg.fill_frag_every_pct)
            self._fill_arrived = np.zeros(len(tb), dtype=bool)
            return
        for i in order:
            self.events.push(float(tb.arrival[i]), EV_ARRIVE, int(i))
        self.events.push(0.0, EV_TICK, None)
        self.power.start()
        for t, n in self.failures.first_failures(self.state.num_nodes):
            self.events.push(t, EV_FAIL, n)

    def _offer(self, i: int, remaining: int) -> DecisionRequest:
        self.state.now = self.now
        self.state.queue_length = self.metrics.pending
        self.state.queue_by_class = self.metrics.pending_cls
        return DecisionRequest(self.table.pods[i], self._request(i), i, self.now, remaining)

    def _step_events(self) -> bool:
        """Process the next batch of simultaneous events; False when the run is over."""
        if self._fill is not None:
            i = self._fill.next_pod()
            if i is None:
                return False
            self._arrive(i)
            return True
        horizon = self.config.horizon_s
        ev = self.events
        # With only ticks left, go on only while a horizon asks for it.
        if not ev or (ev.non_tick == 0 and horizon is None):
            # Nothing else can happen. Retry waiting pods once more if anything was
            # placed since the last such retry (a deferred pod may fit now).
            if self.queue.waiting and self._binds != self._binds_at_final_flush:
                self._binds_at_final_flush = self._binds
                self.queue.flush()
                self.queue.usage_sampled()
                return True
            if horizon is not None and self.now < horizon:
                self._advance(horizon)
            return False
        t = ev.peek().time
        if horizon is not None and t > horizon:
            self._advance(horizon)
            return False
        self._advance(t)
        handled = False
        while ev and ev.peek().time == t:
            if ev.peek().kind == EV_TICK and handled:
                # Sample only after the pods these events released have been placed.
                break
            self._handle(ev.pop())
            handled = True
        return True

    def _advance(self, t: float) -> None:
        self.metrics.advance(self.now, t)
        self.now = t

    def _handle(self, ev: Event) -> None:
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
                self.queue.room_freed(node)
        elif k == EV_TICK:
            self._tick()
        elif k == EV_POWER_DOWN:
            self.power.idle_timeout(*p)
        elif k == EV_POWER_UP:
            if self.power.booted(p):
                for i in sorted(self._node_pods[p]):
                    if self.table.status[i] == BOUND and i not in self._pulling:
                        self._begin(i)
                self.power.maybe_idle(p, self.now)
        elif k == EV_PULLED:
            i, epoch = p
            if self.table.epoch[i] == epoch and self.table.status[i] == BOUND:
                self._pulling.discard(i)
                self._start(i)
        elif k == EV_DUE:
            if self.queue.is_parked(p):  # the gang still waits: its room should be there now
                self.queue.requeue([p])
        elif k == EV_FAIL:
            self._fail(p)
        elif k == EV_NOT_READY:
            if self._fail_epoch[p[0]] == p[1]:
                self._not_ready(p[0])
        elif k == EV_NODE_EVICT:
            if self._fail_epoch[p[0]] == p[1]:
                self._evict_node(p[0])
        elif k == EV_RECOVER:
            self._recover(p)

    def _arrive(self, i: int) -> None:
        self.table.status[i] = PENDING
        self.metrics.arrived(i)
        self.queue.arrived(i)

    def _tick(self) -> None:
        cfg = self.config
        if self.now - self._last_flush >= cfg.flush_s:
            self._last_flush = self.now
            self.queue.flush()
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
        self.queue.usage_sampled()
        if self.descheduler is not None:
            every = self.descheduler.deschedule_interval_s
            if every is not None and self.now - self._last_deschedule >= every:
                self._last_deschedule = self.now
                self._deschedule()
        nxt = self.now + cfg.tick_s
        if self.events.non_tick > 0 or (cfg.horizon_s is not None and nxt <= cfg.horizon_s):
            self.events.push(nxt, EV_TICK, None)

    # ------------------------------------------------------- pods on nodes
    def _bind(self, i: int, node: int, devices: tuple[int, ...]) -> None:
        tb, st = self.table, self.state
        self._binds += 1
        tb.node[i] = node
        tb.devices[i] = devices
        if not np.isfinite(tb.scheduled_at[i]):
            tb.scheduled_at[i] = self.now
        if np.isfinite(tb.failed_at[i]):
            self._rebound[i] = self.now
        pod = tb.pods[i]
        if pod.origin_site is not None:
            origin = self.spec.site(pod.origin_site)
            target = self.spec.sites[int(st.site_id[node])]
            tb.latency_ms[i] = target.latency_ms_from(origin)
        self._node_pods[node].add(i)
        self.metrics.bound(i)
        req = self._requests[i]
        tb.image[i] = req.image if req is not None else -1
        if self.power.bound(node, self.now):
            self._begin(i)
        else:
            tb.status[i] = BOUND

    def _begin(self, i: int) -> None:
        """Pod ``i``'s node is up: pull its image (if it has one), then start it."""
        tb = self.table
        if self._dead[tb.node[i]]:  # bound to a failed node not yet marked NotReady
            tb.status[i] = BOUND
            return
        img = int(tb.image[i])
        if img < 0:
            self._start(i)
            return
        node = int(tb.node[i])
        done, mib, pinned = self.state.images.pull(node, img, self.now)
        at = done + self.config.container_start_s
        if tb.pinned[i]:
            # Restarting in place (its node was repaired): the pull just pinned the layers
            # again, so the first start's pins go, or they would never be released and the
            # layers never evicted.
            self.state.images.release(node, tb.pinned[i])
        tb.pinned[i] = pinned
        tb.pull_s[i] = at - self.now
        tb.pulled_mib[i] += mib
        tb.status[i] = BOUND
        self._pulling.add(i)
        self.events.push(at, EV_PULLED, (i, int(tb.epoch[i])))

    def _start(self, i: int) -> None:
        tb = self.table
        tb.status[i] = RUNNING
        if not np.isfinite(tb.started_at[i]):
            tb.started_at[i] = self.now  # start latency counts the first start
        tb.last_start[i] = self.now
        if np.isfinite(tb.down_from[i]):  # it had run before: it is back up
            self.metrics.down(i, float(tb.down_from[i]), self.now)
            tb.down_from[i] = np.nan
        if np.isfinite(tb.failed_at[i]):  # stopped by a node failure, running again
            self.metrics.replaced(i, float(tb.failed_at[i]), self._rebound.pop(i, None),
                                  self.now)
            tb.failed_at[i] = np.nan
        if i in self._disrupted:  # an evicted pod of a budgeted app runs again
            self._disrupted.discard(i)
            app = tb.pods[i].app
            self.state.disrupted[app] -= 1  # type: ignore[index]
        if tb.num_gpu[i] > 1 and self.config.mode == "replay":
            self._device_locality(i)
        # Started: it ends after its remaining run (gang reservations plan on this).
        self.state.bound.expect_until(self._requests[i], int(tb.node[i]),
                                      self._expected_end(i, self.now))
        if self.config.mode == "replay" and np.isfinite(tb.remaining[i]):
            self.events.push(self.now + float(tb.remaining[i] * tb.stretch[i]), EV_COMPLETE,
                             (i, int(tb.epoch[i])))

    def _expected_end(self, i: int, start: float) -> float:
        """When pod ``i`` is expected to leave if it runs from ``start`` (inf: it does not
        end, as in fill mode, or its length is unknown)."""
        if self.config.mode != "replay":
            return np.inf
        return start + float(self.table.remaining[i] * self.table.stretch[i])

    def _device_locality(self, i: int) -> None:
        """Multi-GPU pod ``i`` starts: how far apart its devices are stretches its run
        (``model.topology.locality_stretch``), and the metrics count it."""
        tb, st = self.table, self.state
        node = int(tb.node[i])
        socket = st.gpu_socket[node]
        used = np.unique(socket[list(tb.devices[i])]).size
        per_socket = np.bincount(socket[socket >= 0])
        fewest = fewest_sockets(per_socket.tolist(), int(tb.num_gpu[i]))
        nvlink = bool(st.gpu_nvlink[node])
        stretch = locality_stretch(used, fewest, nvlink, self.config.gpu_comm_share)
        tb.stretch[i] = stretch
        self.metrics.multi_gpu_started(i, used, fewest, nvlink, stretch)

    def _unbind(self, i: int) -> None:
        tb = self.table
        node = int(tb.node[i])
        if tb.pinned[i]:
            self.state.images.release(node, tb.pinned[i])
            tb.pinned[i] = ()
        self._pulling.discard(i)
        self.state.release(node, self._requests[i], tb.devices[i])  # type: ignore[arg-type]
        self._node_pods[node].discard(i)
        self.metrics.released(i)
        self.power.maybe_idle(node, self.now)

    # ------------------------------------------------------------- failures
    # A node fails at once; the control plane learns it as Kubernetes does: the node
    # monitor marks it NotReady after its grace period (until then schedulers still see it
    # up and may bind pods there, which cannot start), and its pods are evicted once their
    # toleration of NotReady runs out. Between the failure and the eviction they hold their
    # room and make no progress. A node repaired before that restarts its pods in place.
    def _fail(self, node: int) -> None:
        if self._dead[node]:
            return
        self._dead[node] = True
        self.metrics.node_failed(node, self.now)
        for i in sorted(self._node_pods[node]):
            self._stall(i)
        epoch = int(self._fail_epoch[node])
        self.events.push(self.now + self.config.repair_s, EV_RECOVER, node)
        grace = self.config.node_monitor_grace_s
        if grace > 0:
            self.events.push(self.now + grace, EV_NOT_READY, (node, epoch))
        else:
            self._not_ready(node)

    def _stall(self, i: int) -> None:
        """Pod ``i``'s node failed: it stops where it is (what it ran since its last
        checkpoint is lost) but stays bound until evicted."""
        tb = self.table
        tb.failed_at[i] = self.now
        if tb.status[i] == RUNNING:
            self._lose_work(i)
        self._pulling.discard(i)
        tb.epoch[i] += 1  # its completion or image pull will not come
        tb.status[i] = BOUND

    def _not_ready(self, node: int) -> None:
        st = self.state
        st.up[node] = False
        st.reservations.drop_node(node)
        if self.failure_toleration_s > 0:
            self.events.push(self.now + self.failure_toleration_s, EV_NODE_EVICT,
                             (node, int(self._fail_epoch[node])))
        else:
            self._evict_node(node)

    def _evict_node(self, node: int) -> None:
        """The pods' toleration of the NotReady node ran out: back to the queue."""
        evicted = []
        for i in sorted(self._node_pods[node]):
            self._evict(i)
            evicted.append(self.queue.unit_of(i))
        self.queue.park_evicted(evicted)
        self._evict_partial_gangs()
        self.queue.retry_all()

    def _recover(self, node: int) -> None:
        """The node is repaired: pods still bound to it start again there."""
        self._dead[node] = False
        self._fail_epoch[node] += 1  # a NotReady mark or eviction still to come is void
        self.state.up[node] = True
        if self.state.power[node] == POWER_ON:
            for i in sorted(self._node_pods[node]):
                if self.table.status[i] == BOUND and i not in self._pulling:
                    self._begin(i)
        self.queue.retry_all()
        nxt = self.failures.next_failure(self.now)
        if nxt is not None:
            self.events.push(nxt, EV_FAIL, node)

    def _evict_partial_gangs(self) -> None:
        """A gang with an evicted member restarts as a whole (all-or-nothing)."""
        tb = self.table
        for g, members in enumerate(self.queue.gang_members):
            st = tb.status[members]
            if (st == PENDING).any() and ((st == RUNNING) | (st == BOUND)).any():
                for m in members:
                    if tb.status[m] in (RUNNING, BOUND):
                        self._evict(m)
                self.queue.park_evicted([-(g + 1)])

    def _checked_victims(self, victims: tuple[Pod, ...], by: int, node: int, req: PodRequest,
                         devices: Sequence[int] | None) -> list[int]:
        """The pod indices of ``victims``, once each is a bound pod of lower priority than
        pod ``by`` and ``by`` fits ``node`` after they (and their gang mates there) leave;
        InfeasibleDecisionError otherwise, before anything is evicted."""
        tb, st = self.table, self.state
        if self._pod_index is None:
            self._pod_index = {id(p): k for k, p in enumerate(tb.pods)}
        ks: list[int] = []
        for pod in victims:
            k = self._pod_index.get(id(pod))
            if k is None or tb.status[k] not in (RUNNING, BOUND):
                raise InfeasibleDecisionError(f"victim {pod.id} is not a bound pod of this twin")
            if tb.priority[k] >= tb.priority[by]:
                raise InfeasibleDecisionError(
                    f"{tb.pods[by].id} (priority {tb.priority[by]}) cannot preempt {pod.id} "
                    f"(priority {tb.priority[k]})")
            if k not in ks:  # named twice, evicted once
                ks.append(k)
        # Room on ``node`` once they go: a victim's gang mates bound there go too.
        leaving = set(ks)
        for g in {int(self.queue.gang_of[k]) for k in ks} - {-1}:
            leaving.update(self.queue.gang_members[g])
        b = st.bound  # their rows on ``node``
        rows = np.array([r for k in sorted(leaving) if tb.node[k] == node
                         and tb.status[k] in (RUNNING, BOUND)
                         for r in b.row_of.get(id(self._request(k)), ()) if b.node[r] == node],
                        dtype=np.int64)
        fits = st.fits_without(req, node, rows)
        if fits and devices is not None:
            dev = b.room_on(rows)[2][0]
            d = np.asarray(devices, dtype=np.int64)
            fits = (d.size == req.num_gpu and np.unique(d).size == d.size
                    and bool(((d >= 0) & (d < st.gpu_count[node])).all())
                    and bool((st.gpu_free[node, d] + dev[d] >= req.gpu_milli).all()))
        if not fits:
            raise InfeasibleDecisionError(
                f"{tb.pods[by].id} does not fit node {st.names[node]} after evicting "
                f"{[p.id for p in victims]}")
        return ks

    def _preempt(self, victims: list[int], by: int) -> set[int]:
        """Evict ``victims`` (pod indices checked by ``_checked_victims``) and requeue them;
        a victim's gang goes whole. Returns the nodes that got room back."""
        tb = self.table
        freed: set[int] = set()
        units: list[int] = []
        for k in victims:
            pod = tb.pods[k]
            freed.add(int(tb.node[k]))
            self._evict(k)
            self.metrics.preempted(k)
            app = pod.app
            # A budget counts pods evicted and not running again: one evicted again before
            # it ran (bound, pulling or booting) is already counted, and ``_start`` gives
            # back one count per pod.
            if app and tb.cls[k] in self._budgeted and k not in self._disrupted:
                self.state.disrupted[app] = self.state.disrupted.get(app, 0) + 1
                self._disrupted.add(k)
            unit = self.queue.unit_of(k)
            if unit not in units:
                units.append(unit)
        self._evict_partial_gangs()  # a victim's gang mates left behind go too
        self.queue.requeue(units)
        return freed

    def _check_reserve(self, gang: str | None, reserve: Reservation | None) -> None:
        """A reservation must be for the rejected gang (or single pod: ``holder``), on
        nodes of this cluster."""
        if reserve is None:
            return
        n = self.state.num_nodes
        if gang is None or reserve.gang != gang or not all(0 <= x < n for x in reserve.nodes):
            raise InfeasibleDecisionError(
                f"a reservation must be for the rejected gang {gang!r} on nodes 0..{n - 1}")

    def _hold_room(self, gang: str | None, reserve: Reservation | None, unit: int) -> None:
        """After a gang's rejection: hold the room its scheduler reserved (until due), or
        drop the reservation it no longer renews once due (nodes are not held for a gang
        that cannot use them)."""
        self.state.reservations.settle(gang or "", reserve, self.now)
        if reserve is not None and reserve.due > self.now:  # due now: room freed wakes it
            self.events.push(reserve.due, EV_DUE, unit)

    def _deschedule(self) -> None:
        """Offer the descheduler the waiting pods in queue order; carry out its moves."""
        tb = self.table
        pending = np.flatnonzero(tb.status == PENDING)
        if pending.size == 0:
            return
        self.state.now = self.now  # filters read the time (reservations' due)
        order = pending[np.lexsort((pending, tb.arrival[pending], -tb.priority[pending]))]
        moves = self.descheduler.deschedule(  # type: ignore[union-attr]
            self.state, [self._request(int(i)) for i in order])
        if moves:
            self.migrate(moves)

    def migrate(self, moves: Sequence[Migration]) -> None:
        """Move bound pods (a descheduling pass): each is evicted (what it loses counts as
        for any eviction) and bound to its new node at once, where it pulls its image and
        starts again. A move whose node has no room by now leaves the pod in the queue.
        Gang members are not moved (a gang moves whole or not at all)."""
        tb = self.table
        if self._pod_index is None:
            self._pod_index = {id(p): k for k, p in enumerate(tb.pods)}
        # Every move is checked before the first is carried out: a bad one part-way left
        # the pass half-applied.
        checked: list[tuple[int, int]] = []
        for mv in moves:
            k = self._pod_index.get(id(mv.pod))
            if k is None or tb.status[k] not in (RUNNING, BOUND):
                raise InfeasibleDecisionError(f"{mv.pod.id} is not a bound pod of this twin")
            if self.queue.unit_of(k) < 0:
                raise InfeasibleDecisionError(f"{mv.pod.id} is a gang member: gangs move whole")
            node = int(mv.node)
            if not 0 <= node < self.state.num_nodes:
                raise InfeasibleDecisionError(f"node index {node} out of range")
            if any(k == j for j, _ in checked):
                raise InfeasibleDecisionError(f"{mv.pod.id} is moved twice in one pass")
            checked.append((k, node))
        for k, node in checked:
            src = int(tb.node[k])
            if node == src:
                continue
            req = self._request(k)
            self._evict(k)
            self.metrics.migrated(k)
            if self.state.resource_fit(req)[node]:
                devices = self.state.pick_devices(node, req)
                self.state.allocate(node, req, devices, until=self._expected_end(k, self.now))
                self._bind(k, node, devices)
            else:
                self.queue.requeue([self.queue.unit_of(k)])
            self.queue.room_freed(src)

    def _evict(self, i: int) -> None:
        """Take pod ``i`` off its node and back to the queue; its pending completion is void.
        What it ran since its last start counts as lost, except what it keeps
        (``PodTable.resume_every``: services carry on, training keeps its checkpoints)."""
        tb = self.table
        if tb.status[i] == RUNNING:
            self._lose_work(i)
        self._unbind(i)
        tb.epoch[i] += 1
        tb.status[i] = PENDING
        tb.node[i] = -1
        self.metrics.evicted(i)

    def _lose_work(self, i: int) -> None:
        """Running pod ``i`` stops: count what it loses, and its downtime starts."""
        tb = self.table
        elapsed = self.now - float(tb.last_start[i])
        stretch = float(tb.stretch[i])  # wall seconds per second of work in this run
        keep = float(saved_work(elapsed / stretch, tb.resume_every[i]))
        tb.remaining[i] = max(float(tb.remaining[i]) - keep, 0.0)
        self.metrics.lost_work(i, elapsed - keep * stretch)
        tb.down_from[i] = self.now

    # ---------------------------------------------------------------- gangs
    def _gang_busy(self, g: int) -> bool:
        """Whether a member of gang g is still bound or running (then it must not restart)."""
        st = self.table.status[self.queue.gang_members[g]]
        return bool(((st == RUNNING) | (st == BOUND)).any())

    def _rollback_gang(self) -> None:
        for p, node, devices in self._gang_placed:
            self.state.release(node, self._requests[p], devices)  # type: ignore[arg-type]
        self._gang_placed = []
        self._gang_todo = []

    # ------------------------------------------------------------ fill mode
    def _fill_decided(self, pods: list[int]) -> None:
        """Fill mode: count the decided pods' GPU and sample the allocation curve."""
        if self._fill is None:
            return
        # A pod arrives once: one re-offered after a preemption is decided again, and its
        # GPU must not count as arrived twice on the curve.
        idx = np.asarray(pods, dtype=np.int64)
        fresh = idx[~self._fill_arrived[idx]]
        self._fill_arrived[fresh] = True
        due = self._fill.decided(float(self.table.requests[fresh, GPU].sum()),
                                 float(self.metrics.alloc_total[GPU]))
        if due:
            self.metrics.tick(self.now, 1.0, 0, self.sample_usage(),
                              {"arrived_gpu_pct": self._fill.arrived_pct})

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self._fill is not None:
            self.metrics.tick(self.now, 1.0, 0, self.sample_usage(),
                              {"arrived_gpu_pct": self._fill.arrived_pct})
