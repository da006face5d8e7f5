"""One way to build a simulation run and one loop to drive it.

Owns turning (cluster, workload, scheduler, engine settings) into a twin
ready to run -- the workload loaded over the right span, the engine
configured, the scheduler prepared, and every hook the scheduler asks for
attached (a load forecaster, reduced telemetry) -- and the drive loop
``next_decision -> scheduler.decide -> apply`` with per-decision timing.
Every command (simulate, demo, benches, tuning, the telemetry exporter, the
reduction study) and the RL env build their runs here, so a scheduler gets
the same twin whoever runs it.

Lives just above the twin: the twin never imports scheduling.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from smartsched.model.cluster import ClusterSpec
from smartsched.model.pod import Pod
from smartsched.scheduling.base import (
    Deschedules,
    NeedsTwin,
    Scheduler,
    TwinNeeds,
    WindowPlanner,
    WorkloadAware,
    make_scheduler,
)
from smartsched.twin.decision import DecisionRequest
from smartsched.twin.engine import Engine, EngineConfig

DEFAULT_GENERATOR_HOURS = 24.0
# The longest span one run simulates (a leap year); the twin ticks every few minutes
# through it, so a trace stretching to year 9999 would never finish.
MAX_RUN_HOURS = 24 * 366
# Workload names that generate pods for the run's span (``hours``) rather than read a trace.
GENERATORS = frozenset({"mixed", "finance"})
# EngineConfig fields build_run derives from its own arguments.
_RUN_OWNED = frozenset({"mode", "seed", "inflate", "horizon_s", "warmup_s"})


@dataclass
class Run:
    """A twin and the scheduler that places its pods (see ``build_run``)."""

    cluster: ClusterSpec
    engine: Engine
    scheduler: Scheduler
    # What the run was asked for (scheduler name, mode, seed, cluster, workload, hours...),
    # as reports show it.
    settings: dict[str, Any]

    def next_decision(self) -> DecisionRequest | None:
        """Advance the twin to the next pod that needs placing (None: the run is over)."""
        return self.engine.next_decision()

    @functools.cached_property
    def _windows(self) -> WindowPlanner | None:
        """The scheduler, when it places fill mode's arrivals in windows."""
        s = self.scheduler
        return s if isinstance(s, WindowPlanner) and self.engine.config.mode == "fill" else None

    def decide(self, req: DecisionRequest) -> None:
        """Let the scheduler decide ``req`` and commit it; the wall time counts as the
        decision's latency (a window's solve counts to its first pod)."""
        t0 = time.perf_counter()
        win = self._windows
        if win is not None and not win.planned(req.request):
            win.plan_window(self.engine.state, self.engine.fill_window(win.window))
        self.engine.apply(self.scheduler.decide(self.engine.state, req.request))
        self.engine.record_decision_time(time.perf_counter() - t0)

    def drive(self, *, until_s: float | None = None, max_decisions: int | None = None,
              progress: bool = False) -> int:
        """Decide pods until the run ends, simulated time reaches ``until_s``, or
        ``max_decisions`` were made; returns the number of decisions."""
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(self.engine.table), unit="pod", desc=self.scheduler.name,
                       mininterval=0.5, leave=False)
        done = 0
        try:
            while max_decisions is None or done < max_decisions:
                req = self.engine.next_decision()
                if req is None or (until_s is not None and req.time >= until_s):
                    break
                self.decide(req)
                done += 1
                if bar is not None and done % 256 == 0:
                    bar.n = int((self.engine.table.status != 0).sum())
                    bar.refresh()
        finally:
            if bar is not None:
                bar.close()
        return done

    def report(self) -> dict[str, Any]:
        """The twin's metrics so far (after ``drive`` ran to the end: the run's)."""
        return self.engine.run_report()


def build_run(
    cluster: str | ClusterSpec,
    workload: str | Sequence[Pod],
    scheduler: str | Scheduler,
    *,
    mode: str = "replay",
    seed: int = 0,
    hours: float | None = None,
    warmup_hours: float = 0.0,
    start_hours: float | None = None,
    inflate: float = 1.3,
    engine_overrides: Mapping[str, Any] | None = None,
    needs: TwinNeeds | None = None,
    compliance: Any = None,
) -> Run:
    """A run ready to drive.

    ``workload``: a workload name (``mixed``, ``openb:<variant>``, a pod file) or the pods.
    ``hours``: span of generated workloads and the replay horizon (None: 24 h for
    generators, the whole trace for files). ``warmup_hours``: simulated first and not
    measured (the cluster is not empty when measuring starts). ``start_hours``: replay a
    trace from that moment. ``needs``: hooks to attach beyond what the scheduler asks for
    (the RL env's observation features). ``compliance``: a compliance policy (file, mapping
    or ``Compliance``) every decision of the run is bound by.
    """
    from smartsched.model.presets import load_cluster

    _check_run_numbers(seed, hours, warmup_hours, start_hours)

    spec = load_cluster(cluster) if isinstance(cluster, str) else cluster
    is_generator = isinstance(workload, str) and workload.split(":", 1)[0] in GENERATORS
    gen_hours = hours if hours is not None else DEFAULT_GENERATOR_HOURS
    warm = warmup_hours if mode == "replay" else 0.0
    if isinstance(workload, str):
        from smartsched.workloads.resolve import load_workload

        pods = load_workload(workload, spec, gen_hours + (warm if is_generator else 0.0), seed)
    else:
        pods = list(workload)
    if start_hours:
        from smartsched.workloads.window import window_pods

        pods = window_pods(pods, start_hours * 3600.0)
    if mode == "replay" and not is_generator and warm > 0 and pods:
        last = max(p.arrival for p in pods)
        if warm * 3600.0 > last:  # nothing would arrive in the measured window
            from smartsched.model.errors import ValidationError

            raise ValidationError("warmup_hours", f"{warm:g} h is past the trace's last "
                                  f"arrival (hour {last / 3600:,.1f}): nothing would be "
                                  "measured")
    horizon = None
    if mode == "replay" and (hours is not None or is_generator):
        horizon = (warm + gen_hours) * 3600.0
    elif mode == "replay":
        _check_trace_span(pods)
    overrides = dict(engine_overrides or {})
    for key in overrides:
        if key not in EngineConfig.__dataclass_fields__ or key in _RUN_OWNED:
            from smartsched.model.errors import ValidationError

            why = ("set by the run (mode, seed, hours, warm-up, inflate)" if key in _RUN_OWNED
                   else "unknown engine setting")
            raise ValidationError(f"engine.{key}", why)
    config = EngineConfig(mode=mode, seed=seed, inflate=inflate, horizon_s=horizon,
                          warmup_s=warm * 3600.0, **overrides)
    engine = Engine(spec, pods, config)
    unbound: list[str] = []
    if compliance is not None:
        from smartsched.scheduling.compliance import Compliance, attach, load_policy, unmatched

        policy = compliance if isinstance(compliance, Compliance) else load_policy(compliance)
        unbound = [str(e) for e in unmatched(policy.policy, pods)]  # near misses raise
        attach(engine.state, policy)
    sched = make_scheduler(scheduler, seed) if isinstance(scheduler, str) else scheduler
    wanted = sched.twin_needs() if isinstance(sched, NeedsTwin) else TwinNeeds()
    attach_hooks(engine, wanted.merge(needs or TwinNeeds(), "needs"))
    if isinstance(sched, WorkloadAware):
        sched.prepare(engine.source_pods)
    if isinstance(sched, Deschedules) and sched.deschedule_interval_s is not None:
        engine.descheduler = sched  # its periodic pass runs at the twin's ticks
    # A profile's run settings (profile_doc.RunSettings); other schedulers keep the twin's.
    queue_sort = getattr(sched, "queue_sort", "priority")
    engine.queue.set_order(queue_sort)
    toleration = getattr(sched, "failure_toleration_s", None)
    if toleration is not None:
        engine.failure_toleration_s = float(toleration)
    settings = {
        "scheduler": scheduler if isinstance(scheduler, str) else sched.name,
        "mode": mode,
        "seed": seed,
        "cluster": cluster if isinstance(cluster, str) else spec.name,
        "nodes": len(spec.nodes),
        "workload": workload if isinstance(workload, str) else f"{len(pods)} pods",
        "inflate": inflate if mode == "fill" else None,
        "hours": gen_hours if horizon is not None else None,
        "warmup_hours": warm,
        "queue_sort": queue_sort,
        "failure_toleration_s": engine.failure_toleration_s,
        "start_hours": start_hours,
    }
    if compliance is not None:  # the report says which rules bound the run
        settings["compliance"] = str(compliance) if isinstance(compliance, str | Path) \
            else "given"
        settings["compliance_unbound"] = unbound  # rules naming no pod of the workload
    return Run(spec, engine, sched, settings)


def _check_run_numbers(seed: Any, hours: Any, warmup_hours: Any, start_hours: Any) -> None:
    """Each of the run's numbers in range, or a ValidationError naming it (a negative seed
    reached numpy as a traceback; a negative warm-up was blamed on ``hours``)."""
    import math
    import numbers

    from smartsched.model.errors import ValidationError

    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**32:
        raise ValidationError("seed", f"must be an integer in [0, 2^32), got {seed!r}")
    for name, value, required in (("hours", hours, False), ("warmup_hours", warmup_hours, True),
                                  ("start_hours", start_hours, False)):
        if value is None and not required:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
                math.isfinite(value) and 0 <= value <= MAX_RUN_HOURS):
            raise ValidationError(name, f"must be within [0, {MAX_RUN_HOURS}] hours, "
                                  f"got {value!r}")
    if hours is not None and hours <= 0:
        raise ValidationError("hours", f"must be positive, got {hours!r}")


def _check_trace_span(pods: Sequence[Pod]) -> None:
    """A replay without ``hours`` runs to the trace's last arrival or departure: refuse one
    past MAX_RUN_HOURS, naming the pod (a time in ms where s were meant, or year 9999)."""
    from smartsched.model.errors import ValidationError

    limit = MAX_RUN_HOURS * 3600.0
    for row, p in enumerate(pods):
        end = p.arrival + (p.duration or 0.0)
        if end > limit:
            h = end / 3600
            shown = f"{h:,.0f}" if h < 1e9 else f"{h:.3g}"
            raise ValidationError(
                "hours", f"the workload runs until hour {shown} (pod {p.id!r}, row {row}), "
                f"past the longest run ({MAX_RUN_HOURS} h): pass --hours")


def attach_hooks(engine: Engine, needs: TwinNeeds) -> None:
    """Attach what ``needs`` asks for to ``engine``: a load forecaster (replay mode only:
    fill mode has no time to forecast over) and reduced telemetry."""
    if needs.forecaster is not None and engine.config.mode == "replay":
        from smartsched.forecast.node_predictor import NodeUsagePredictor

        fc, plan = cached_forecaster(needs.forecaster)
        engine.usage_predictor = NodeUsagePredictor(fc, engine.config.tick_s, plan)
    if needs.telemetry is not None:
        from smartsched.twin.telemetry.reduction import TelemetryFeatures

        proj = cached_projection(needs.telemetry)
        engine.telemetry_features = TelemetryFeatures(proj, engine.spec, engine.config.seed)
        # Until the first tick samples it, every node reads as average (zeros), as a
        # policy trained with it saw at the start of each episode.
        engine.state.telemetry_features = np.zeros((engine.state.num_nodes, proj.k),
                                                   dtype=np.float32)


@functools.lru_cache(maxsize=8)
def cached_forecaster(spec: str) -> Any:
    """A loaded forecaster and its plan (read-only at inference, so runs may share it)."""
    from smartsched.forecast.node_predictor import load_forecaster

    return load_forecaster(spec)


@functools.lru_cache(maxsize=8)
def cached_projection(path: str) -> Any:
    """A loaded telemetry projection (read-only, shared like the forecaster)."""
    from smartsched.twin.telemetry.reduction import TelemetryProjection

    return TelemetryProjection.load(path)

