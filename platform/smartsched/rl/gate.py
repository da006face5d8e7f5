"""The promotion gate: a candidate policy replaces the incumbent only when it is surely better.

Owns the decision of issue 18's continuous learning: candidate and incumbent
(any scheduler names: ``rl:PATH`` policies, profiles) are run on the same
held-out twin episodes (paired seeds: the same cluster, the same arrivals), each
episode gives both a score, and the candidate is promoted only when

* it broke no hard constraint: every node it chose passed the filter profile's
  filters for the pod at that moment (a choice that did not is counted, and the
  filter profile decides instead so the episode can go on);
* the paired-bootstrap lower bound (one-sided, ``confidence``) of the mean
  per-episode gain ``score(candidate) - score(incumbent)`` is above zero.

The score weighs the twin's figures (``GateConfig.weights``, per unit):
utilization % (CPU and GPU use over powered-on capacity, mean) counts for,
online contention %, latency-SLO violations and waiting pod-hours against. A
candidate that decides exactly as the incumbent has gains of exactly zero and
is never promoted.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from smartsched.model.configfile import validate
from smartsched.pool import map_jobs
from smartsched.scheduling.base import Scheduler, make_scheduler
from smartsched.scheduling.framework import ProfileScheduler
from smartsched.scheduling.registry import load_profile
from smartsched.twin.decision import Decision
from smartsched.twin.state import ClusterState, PodRequest

# figure name -> path into the report's metrics (averaged when several)
SCORE_FIGURES: dict[str, tuple[tuple[str, ...], ...]] = {
    "utilization_pct": (("usage_on_pct", "cpu"), ("usage_on_pct", "gpu")),
    "online_contended_pct": (("slo", "online_contended_time_pct"),),
    "latency_violations": (("slo", "latency_violations"),),
    "waiting_pod_hours": (("pods", "waiting_pod_hours"),),
}


class ScoreWeights(BaseModel):
    """Per unit of each figure: utilization counts for the score, the others against."""

    model_config = ConfigDict(extra="forbid")
    utilization_pct: float = Field(1.0, ge=0, le=1e6)
    online_contended_pct: float = Field(1.0, ge=0, le=1e6)
    latency_violations: float = Field(0.1, ge=0, le=1e6)
    waiting_pod_hours: float = Field(0.01, ge=0, le=1e6)


class GateConfig(BaseModel):
    """Where and how candidate and incumbent are compared (errors name ``gate.<field>``)."""

    model_config = ConfigDict(extra="forbid")
    cluster: str = "medium"
    workload: str = "mixed"
    seeds: int = Field(8, ge=2, le=10_000)
    first_seed: int = Field(40_000, ge=0)
    hours: float = Field(2.0, gt=0, le=24 * 14)
    warmup_hours: float = Field(1.0, ge=0, le=24 * 14)
    filters: str = "k8s-default"
    weights: ScoreWeights = Field(default_factory=ScoreWeights)
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    resamples: int = Field(2000, ge=100, le=1_000_000)
    workers: int | None = Field(None, ge=1, le=256)


def parse_gate_config(doc: Any) -> GateConfig:
    if isinstance(doc, GateConfig):
        return doc
    return validate(GateConfig, doc, prefix="gate")


class HardChecked:
    """A scheduler whose every chosen node is checked against the filter profile's filters;
    a choice that fails them is counted and replaced by the filter profile's decision."""

    def __init__(self, inner: Scheduler, filters: str, seed: int = 0) -> None:
        self.inner = inner
        self.filters = ProfileScheduler(load_profile(filters), seed)
        self.name = getattr(inner, "name", "candidate")
        self.violations = 0
        self.first: list[str] = []

    def __getattr__(self, name: str) -> Any:  # prepare, twin_needs, deschedule, ...
        return getattr(self.inner, name)

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        d = self.inner.decide(state, request)
        if d.node is None:
            return d
        ok, ctx = self.filters.feasible(state, request)
        if 0 <= d.node < state.num_nodes and ok[d.node]:
            return d
        self.violations += 1
        if len(self.first) < 5:
            where = state.names[d.node] if 0 <= d.node < state.num_nodes else str(d.node)
            refused = sorted({s.plugin for s in ctx.statuses
                              if 0 <= d.node < state.num_nodes and not s.passing[d.node]})
            self.first.append(f"pod {request.pod.id} on {where}: "
                              f"{', '.join(refused) or 'no such node'}")
        return self.filters.decide(state, request)


def score_of(metrics: dict[str, Any], weights: dict[str, float]) -> tuple[float, dict[str, float]]:
    """The weighted score of one run, and the figures it was made of."""
    figs = {}
    for name, paths in SCORE_FIGURES.items():
        vals = []
        for path in paths:
            v: Any = metrics
            for key in path:
                v = v.get(key) if isinstance(v, dict) else None
            vals.append(float(v) if isinstance(v, int | float) else 0.0)
        figs[name] = float(np.mean(vals))
    score = sum((1.0 if name == "utilization_pct" else -1.0) * weights.get(name, 0.0) * v
                for name, v in figs.items())
    return score, figs


def _episode(job: tuple[str, str, str, str, int, float, float, dict[str, float]]
             ) -> dict[str, Any]:
    from smartsched.scheduling.run import build_run

    scheduler, filters, cluster, workload, seed, hours, warmup, weights = job
    sched = HardChecked(make_scheduler(scheduler, seed), filters, seed)
    run = build_run(cluster, workload, sched, seed=seed, hours=hours, warmup_hours=warmup)
    run.drive()
    score, figs = score_of(run.report(), weights)
    return {"score": score, "figures": figs, "violations": sched.violations,
            "first_violations": sched.first}


@dataclass
class GateResult:
    """The gate's answer, with every figure it decided on."""

    promoted: bool
    reasons: list[str]
    gain_mean: float
    gain_lower: float
    gains: list[float]
    violations: int
    seconds: float
    candidate: list[dict[str, Any]] = field(default_factory=list)
    incumbent: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"promoted": self.promoted, "reasons": self.reasons,
                "gain_mean": self.gain_mean, "gain_lower": self.gain_lower,
                "gains": self.gains, "violations": self.violations,
                "seconds": self.seconds}


def paired_lower_bound(gains: Sequence[float], confidence: float, resamples: int,
                       seed: int = 0) -> float:
    """One-sided percentile-bootstrap lower bound of the mean of ``gains``."""
    g = np.asarray(gains, dtype=np.float64)
    if g.size == 0:
        return -math.inf
    if np.all(g == g[0]):
        return float(g[0])
    rng = np.random.default_rng(seed)
    means = g[rng.integers(g.size, size=(resamples, g.size))].mean(axis=1)
    return float(np.quantile(means, 1.0 - confidence))


def run_gate(candidate: str, incumbent: str, config: GateConfig | dict[str, Any] | None = None
             ) -> GateResult:
    """Compare ``candidate`` with ``incumbent`` on paired twin episodes; promote or not."""

    cfg = parse_gate_config(config or {})
    t0 = time.perf_counter()
    seeds = list(range(cfg.first_seed, cfg.first_seed + cfg.seeds))
    jobs = [(s, cfg.filters, cfg.cluster, cfg.workload, seed, cfg.hours, cfg.warmup_hours,
             cfg.weights.model_dump()) for s in (candidate, incumbent) for seed in seeds]
    runs = map_jobs(_episode, jobs, cfg.workers)
    cand, inc = runs[: len(seeds)], runs[len(seeds):]
    gains = [c["score"] - i["score"] for c, i in zip(cand, inc, strict=True)]
    lower = paired_lower_bound(gains, cfg.confidence, cfg.resamples)
    violations = sum(c["violations"] for c in cand)
    reasons = []
    if violations:
        first = next(c["first_violations"][0] for c in cand if c["first_violations"])
        reasons.append(f"broke a hard constraint {violations} time(s), first: {first}")
    if not lower > 0:
        reasons.append(f"gain not shown: mean {np.mean(gains):+.3f}, "
                       f"{100 * cfg.confidence:.0f} % lower bound {lower:+.3f} (must be > 0)")
    return GateResult(not reasons, reasons, float(np.mean(gains)), lower, gains, violations,
                      time.perf_counter() - t0, cand, inc)
