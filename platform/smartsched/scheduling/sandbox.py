"""Sandbox validation: a risky decision is rolled forward on forks of the twin before it counts.

Owns the design's "a digital-twin environment validates decisions in a sandbox
to keep scheduling safe" (issue 18). A ``Proposal`` -- pods on nodes, and the
bound pods it evicts first (preemption victims, a migration's source) -- is
checked in two steps on forks of the live ``ClusterState`` (the real state is
never touched):

1. Hard constraints, on a fork with the evictions and placements applied in
   order: every placement passes the hard filters of a filter profile
   (resources, selectors, taints, regions, cordons, GPU models: ``k8s-default``
   unless configured) and the state accepts it (no over-commit); every victim
   is a bound pod; evicting online or edge pods of an app stays within its
   disruption budget (as ``plugins.preemption`` counts it); a proposal that
   says it holds whole gangs holds every member. One broken constraint refuses
   the proposal, with no rollout.
2. SLO figures over the next ``horizon_s``: the same arrivals -- drawn with
   replacement from the pods seen recently, at their recent rate, never the
   real future -- are placed by a fast rollout profile on two forks, one
   *with* the proposal and one *without* it, where the proposal's pods are
   left to the rollout profile (what the default would have done) and nobody
   is evicted. Victims of the *with* branch queue again at once. Pending pods
   are retried whenever a pod leaves (bound pods at their expected end, rolled
   pods after their duration). Figures per branch, averaged over ``samples``
   draws (common random numbers: both branches see the same draws):

   * ``online_pending_s``: pod-seconds that online, edge and inference pods wait;
   * ``pending_s``: pod-seconds that all pods wait;
   * ``online_contended``: online pods, at the end, on nodes whose expected use
     (measured use now, plus each newly placed pod's request times its usage
     profile's peak, less what evicted pods used) exceeds capacity -- the
     twin's contention measure, predicted;
   * ``latency_violations``: placed pods further from their origin site than
     their latency SLO;
   * ``gpu_frag_pct``: expected fragmented GPU (FGD's measure against the
     typical recent pods) as % of all GPU at the end;
   * ``lost_work_s``: work the evictions throw away (since the victim's start,
     or its last checkpoint).

   The proposal is refused when a figure is worse *with* it than *without* by
   more than its margin (``Margins``; None never refuses on that figure).

A ``Verdict`` carries every figure of both branches, and for a refusal its
reasons: which constraint, or which figure and by how much. The cost is
bounded by ``max_arrivals`` per draw (the horizon shortens to the last arrival
kept when the recent rate would bring more); ``smartsched bench sandbox``
reports the time per validation.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from smartsched.model.configfile import validate
from smartsched.model.errors import SmartSchedError, ValidationError
from smartsched.model.pod import POD_CLASS_IDS, Pod, PodClass
from smartsched.model.resources import CPU, MEM
from smartsched.scheduling.base import Scheduler, WorkloadAware, make_scheduler
from smartsched.scheduling.framework import ProfileScheduler
from smartsched.scheduling.registry import load_profile
from smartsched.twin.state import ClusterState, InfeasibleDecisionError, PodRequest

FIGURES = ("online_pending_s", "pending_s", "online_contended", "latency_violations",
           "gpu_frag_pct", "lost_work_s")
_CRITICAL = frozenset({PodClass.ONLINE, PodClass.EDGE_RT, PodClass.AI_INFER})
_BUDGETED = frozenset({PodClass.ONLINE, PodClass.EDGE_RT})
_ONLINE_ID = POD_CLASS_IDS[PodClass.ONLINE]
MIN_HISTORY = 8  # pods seen before arrivals are drawn (until then: the proposal's own pods)


class Margins(BaseModel):
    """How much worse each figure may be with the proposal than without (None: any)."""

    model_config = ConfigDict(extra="forbid")
    online_pending_s: float | None = Field(60.0, ge=0, le=1e9)
    pending_s: float | None = Field(3600.0, ge=0, le=1e9)
    online_contended: float | None = Field(0.0, ge=0, le=1e9)
    latency_violations: float | None = Field(0.0, ge=0, le=1e9)
    gpu_frag_pct: float | None = Field(2.0, ge=0, le=100)
    lost_work_s: float | None = Field(None, ge=0, le=1e12)


class SandboxConfig(BaseModel):
    """Settings of sandbox validation (YAML/JSON: ``validate_config`` names bad fields)."""

    model_config = ConfigDict(extra="forbid")
    horizon_s: float = Field(600.0, gt=0, le=7 * 86_400)
    samples: int = Field(2, ge=1, le=64)
    max_arrivals: int = Field(16, ge=0, le=100_000)
    history: int = Field(2000, ge=MIN_HISTORY, le=1_000_000)
    rollout: str = "k8s-default"
    filters: str = "k8s-default"
    max_unavailable_per_app: int = Field(1, ge=0, le=100_000)
    margins: Margins = Field(default_factory=Margins)
    seed: int = Field(0, ge=0, le=2**32 - 1)


def validate_config(doc: Any, prefix: str = "sandbox") -> SandboxConfig:
    """``SandboxConfig`` from a parsed document; errors name ``prefix.field``."""
    if isinstance(doc, SandboxConfig):
        return doc
    return validate(SandboxConfig, doc, prefix=prefix)


@dataclass(frozen=True)
class Placement:
    """One pod on one node (``devices`` None: the state's default pick)."""

    request: PodRequest
    node: int
    devices: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Proposal:
    """A decision to validate: evict ``evictions`` (bound pods), then make ``placements``.

    ``whole_gangs``: the placements claim to hold every member of their gangs (a
    service request does; the twin offers a gang one member at a time)."""

    placements: tuple[Placement, ...]
    evictions: tuple[Pod, ...] = ()
    kind: str = "placement"
    whole_gangs: bool = False


@dataclass(frozen=True)
class Finding:
    """A figure worse with the proposal than without, beyond its margin."""

    figure: str
    with_value: float
    without_value: float
    margin: float

    @property
    def delta(self) -> float:
        return self.with_value - self.without_value

    def __str__(self) -> str:
        return (f"{self.figure} {self.delta:+.1f} (with {self.with_value:.1f}, without "
                f"{self.without_value:.1f}; margin {self.margin:g})")


@dataclass(frozen=True)
class Verdict:
    """The sandbox's answer: accepted or not, why, and every figure of both branches."""

    accepted: bool
    kind: str
    hard: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()
    figures: dict[str, tuple[float, float]] = field(default_factory=dict)  # (with, without)
    horizon_s: float = 0.0
    arrivals: float = 0.0  # mean drawn arrivals per sample
    seconds: float = 0.0

    @property
    def reasons(self) -> tuple[str, ...]:
        return self.hard + tuple(str(f) for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "kind": self.kind, "reasons": list(self.reasons),
                "figures": {k: {"with": w, "without": wo} for k, (w, wo) in self.figures.items()},
                "horizon_s": self.horizon_s, "arrivals": self.arrivals,
                "seconds": self.seconds}


@dataclass
class _Branch:
    """Running totals of one rolled-forward fork."""

    state: ClusterState
    online_pending_s: float = 0.0
    pending_s: float = 0.0
    latency_violations: float = 0.0
    lost_work_s: float = 0.0
    extra_use: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [N, 2] cpu, mem
    touched: set[int] = field(default_factory=set)
    # The fork shares the live state's bound-pod table and never changes it: the rows
    # gone in this branch (evicted, left), and the pods it placed (id -> request, node,
    # devices) are kept here instead.
    gone: set[int] = field(default_factory=set)
    rolled: dict[int, tuple[PodRequest, int, tuple[int, ...]]] = field(default_factory=dict)


class Sandbox:
    """Validates proposals on forks of the twin; remembers recent pods for the arrivals."""

    def __init__(self, config: SandboxConfig | dict[str, Any] | None = None, *,
                 field: str = "sandbox") -> None:
        """``field``: where the settings came from, for errors (``scheduler``,
        ``service.sandbox.settings``)."""
        self.config = validate_config(config or {}, prefix=field)
        cfg = self.config
        try:
            self.rollout: Scheduler = make_scheduler(cfg.rollout, cfg.seed)
        except (SmartSchedError, OSError) as e:
            raise ValidationError(f"{field}.rollout", f"{cfg.rollout!r}: {e}") from None
        try:
            self.filters = ProfileScheduler(load_profile(cfg.filters), cfg.seed)
        except (SmartSchedError, OSError) as e:
            raise ValidationError(f"{field}.filters", f"{cfg.filters!r}: {e}") from None
        self.rng = np.random.default_rng(cfg.seed)
        self._seen: deque[tuple[float, Pod]] = deque(maxlen=cfg.history)
        self._target: Any = None
        self._target_at = -1
        self.validations = 0
        self.refusals = 0
        self.seconds: list[float] = []
        self._placed_now: dict[int, tuple[PodRequest, int, tuple[int, ...]]] = {}

    # ------------------------------------------------------------ history
    def observe(self, pod: Pod, t: float) -> None:
        """A pod offered at ``t`` (seconds): the recent distribution arrivals come from."""
        self._seen.append((float(t), pod))

    def with_rollout(self, rollout: str) -> Sandbox:
        """The same settings and recent pods, compared with (and rolled by) ``rollout``."""
        other = Sandbox(self.config.model_copy(update={"rollout": rollout}))
        other._seen.extend(self._seen)
        return other

    def prepare(self, pods: Sequence[Pod]) -> None:
        """Workload-aware rollout profiles (FGD's typical pods)."""
        if isinstance(self.rollout, WorkloadAware):
            self.rollout.prepare(pods)

    # ------------------------------------------------------------ validation
    def validate(self, state: ClusterState, proposal: Proposal) -> Verdict:
        """Accept or refuse ``proposal`` against ``state`` (untouched)."""
        t0 = time.perf_counter()
        self.validations += 1
        trial = state.fork(share_bound=True)
        hard, victims, lost = self._apply(trial, proposal)
        if hard:
            return self._done(Verdict(False, proposal.kind, hard=tuple(hard)), t0)
        figures, horizon, arrivals = self._roll(state, trial, proposal, victims, lost)
        margins = self.config.margins
        findings = []
        for name in FIGURES:
            margin = getattr(margins, name)
            w, wo = figures[name]
            if margin is not None and w - wo > margin + 1e-9:
                findings.append(Finding(name, w, wo, margin))
        return self._done(Verdict(not findings, proposal.kind, findings=tuple(findings),
                                  figures=figures, horizon_s=horizon, arrivals=arrivals), t0)

    def _done(self, v: Verdict, t0: float) -> Verdict:
        secs = time.perf_counter() - t0
        self.seconds.append(secs)
        if not v.accepted:
            self.refusals += 1
        return Verdict(v.accepted, v.kind, v.hard, v.findings, v.figures, v.horizon_s,
                       v.arrivals, secs)

    def _apply(self, trial: ClusterState, proposal: Proposal
               ) -> tuple[list[str], list[tuple[PodRequest, int, int]], float]:
        """Evict and place on ``trial``; the hard constraints broken, the victims (request,
        node, bound row) and the work they lose."""
        hard: list[str] = []
        bound = trial.bound
        victims: list[tuple[PodRequest, int, int]] = []
        lost = 0.0
        evicted_per_app: dict[str, int] = {}
        seen: set[int] = set()
        for pod in proposal.evictions:
            if id(pod) in seen:
                hard.append(f"victim {pod.id}: evicted twice in one proposal")
                continue
            seen.add(id(pod))
            rows = [r for r in np.flatnonzero(bound.used).tolist() if bound.pods[r] is pod]
            if not rows:
                hard.append(f"victim {pod.id}: not a pod bound in this state")
                continue
            r = rows[0]
            node, req = int(bound.node[r]), bound.requests[r]
            devices = tuple(int(d) for d in np.flatnonzero(bound.devices[r] > 0))
            ran = max(trial.now - float(bound.since[r]), 0.0)
            if pod.checkpoint_interval_s:
                ran = ran % pod.checkpoint_interval_s
            lost += ran
            trial.release(node, req, devices)
            victims.append((req, node, r))
            if pod.app and pod.pod_class in _BUDGETED:
                evicted_per_app[pod.app] = evicted_per_app.get(pod.app, 0) + 1
        budget = self.config.max_unavailable_per_app
        for app, n in sorted(evicted_per_app.items()):
            total = n + int(trial.disrupted.get(app, 0))
            if total > budget:
                hard.append(f"disruption budget of app {app}: {total} pods unavailable, "
                            f"budget {budget}")
        placed: dict[int, tuple[PodRequest, int, tuple[int, ...]]] = {}
        self._placed_now = placed
        for p in proposal.placements:
            req, node = p.request, p.node
            name = trial.names[node] if 0 <= node < trial.num_nodes else str(node)
            if not 0 <= node < trial.num_nodes:
                hard.append(f"pod {req.pod.id}: node index {node} out of range")
                continue
            ok, ctx = self.filters.feasible(trial, req)
            if not ok[node]:
                refused = [f"{s.plugin} ({r})" for s in ctx.statuses
                           for r, _, m in s.checks if not m[node]]
                hard.append(f"pod {req.pod.id} on {name}: refused by "
                            f"{', '.join(refused) or 'the filters'}")
                continue
            try:
                devices = p.devices if p.devices is not None else trial.pick_devices(node, req)
                trial.allocate(node, req, tuple(devices))
                placed[id(req)] = (req, node, tuple(int(d) for d in devices))
            except InfeasibleDecisionError as e:
                hard.append(f"pod {req.pod.id}: {e}")
        if proposal.whole_gangs:
            members: dict[str, tuple[int, int]] = {}
            for p in proposal.placements:
                g = p.request.pod.gang_id
                if g is not None and p.request.pod.gang_size > 1:
                    n, size = members.get(g, (0, p.request.pod.gang_size))
                    members[g] = (n + 1, size)
            for g, (n, size) in sorted(members.items()):
                if n < size:
                    hard.append(f"gang {g}: {n} of {size} members placed (all or nothing)")
        return hard, victims, lost

    # ------------------------------------------------------------ rollout
    def _arrivals(self, now: float) -> tuple[list[list[tuple[float, Pod]]], float]:
        """``samples`` draws of (offset s, pod) over the horizon, and the horizon used."""
        cfg = self.config
        seen = list(self._seen)
        if len(seen) < MIN_HISTORY or cfg.max_arrivals == 0:
            return [[] for _ in range(cfg.samples)], cfg.horizon_s
        times = np.array([t for t, _ in seen])
        span = float(times.max() - times.min())
        if span <= 0:
            return [[] for _ in range(cfg.samples)], cfg.horizon_s
        rate = (len(seen) - 1) / span
        draws, horizon = [], cfg.horizon_s
        for _ in range(cfg.samples):
            gaps = self.rng.exponential(1.0 / rate, size=cfg.max_arrivals)
            at = np.cumsum(gaps)
            idx = self.rng.integers(len(seen), size=cfg.max_arrivals)
            keep = at <= cfg.horizon_s
            if keep.all() and cfg.max_arrivals:  # capped: the horizon ends at the last one
                horizon = min(horizon, float(at[-1]))
            draws.append([(float(a), seen[i][1]) for a, i in zip(at[keep], idx[keep],
                                                                  strict=True)])
        draws = [[(a, p) for a, p in d if a <= horizon] for d in draws]
        return draws, horizon

    def _roll(self, state: ClusterState, trial: ClusterState, proposal: Proposal,
              victims: list[tuple[PodRequest, int, int]], lost: float
              ) -> tuple[dict[str, tuple[float, float]], float, float]:
        draws, horizon = self._arrivals(state.now)
        # A migration evicts a pod and places it again: placed in "with", still bound in
        # "without" -- queued in neither.
        moved = ({p.request.pod.id for p in proposal.placements}
                 & {v.id for v in proposal.evictions})
        self._retarget()
        frag_base = self._frag(state, None)
        sums = {name: np.zeros(2) for name in FIGURES}
        for k, draw in enumerate(draws):
            for b, with_it in enumerate((True, False)):
                last = with_it and k == len(draws) - 1  # the trial itself: one fork less
                branch = self._branch(state, trial, proposal, victims, lost, with_it, last)
                self._run(branch, draw, horizon, queued_first=(
                    [v for v, _, _ in victims if v.pod.id not in moved] if with_it
                    else [p.request for p in proposal.placements
                          if p.request.pod.id not in moved]))
                figs = self._figures(state, branch, frag_base)
                for name in FIGURES:
                    sums[name][b] += figs[name]
        n = max(len(draws), 1)
        figures = {name: (float(sums[name][0] / n), float(sums[name][1] / n))
                   for name in FIGURES}
        return figures, horizon, float(np.mean([len(d) for d in draws])) if draws else 0.0

    def _branch(self, state: ClusterState, trial: ClusterState, proposal: Proposal,
                victims: list[tuple[PodRequest, int, int]], lost: float, with_it: bool,
                consume: bool = False) -> _Branch:
        fork = trial if consume else (trial if with_it else state).fork(share_bound=True)
        br = _Branch(fork, extra_use=np.zeros((state.num_nodes, 2)))
        if with_it:
            br.lost_work_s = lost
            for req, node, devices in self._placed_now.values():
                self._placed(br, req, node, 0.0)
                br.rolled[id(req)] = (req, node, devices)
            for req, node, row in victims:
                br.extra_use[node] -= _peak_use(req)
                br.touched.add(node)
                br.gone.add(row)
        return br

    def _placed(self, br: _Branch, req: PodRequest, node: int, t: float) -> None:
        """Book-keeping of a pod placed on the branch at offset ``t``."""
        pod = req.pod
        br.extra_use[node] += _peak_use(req)
        br.touched.add(node)
        st = br.state
        if pod.latency_slo_ms is not None and pod.origin_site in st.site_ids:
            lat = st.site_latency_ms[st.site_ids[pod.origin_site], st.site_id[node]]
            if lat > pod.latency_slo_ms:
                br.latency_violations += 1

    def _run(self, br: _Branch, draw: list[tuple[float, Pod]], horizon: float,
             queued_first: list[PodRequest]) -> None:
        """Arrivals, departures and retries of the pending pods, up to ``horizon``."""
        st = br.state
        order = itertools.count()  # ties in time keep the order events were made
        events: list[tuple[float, int, int, Any]] = []  # (t, order, kind, payload)
        bound = st.bound  # the live state's: read only (see ``_Branch``)
        live = np.flatnonzero(bound.used & (bound.until <= st.now + horizon))
        for r in live.tolist():  # bound pods expected to leave within the horizon
            if r not in br.gone:
                events.append((max(float(bound.until[r]) - st.now, 0.0), next(order), 2, r))
        for t, pod in draw:
            events.append((t, next(order), 1, pod))
        heapq.heapify(events)
        pending = self._retry(br, [(0.0, r) for r in queued_first], 0.0, events, order)
        while events:
            t, _, kind, payload = heapq.heappop(events)
            if t > horizon:
                break
            if kind == 1:  # arrival
                pending.extend(self._retry(br, [(t, st.compile(payload))], t, events, order))
                continue
            if kind == 2:  # a pod bound before the rollout leaves
                req, node = bound.requests[payload], int(bound.node[payload])
                devices = tuple(int(d) for d in np.flatnonzero(bound.devices[payload] > 0))
                br.gone.add(payload)
            else:  # a pod the rollout placed leaves
                got = br.rolled.pop(id(payload), None)
                if got is None:
                    continue
                req, node, devices = got
            st.release(node, req, devices)
            br.extra_use[node] -= _peak_use(req)
            br.touched.add(node)
            if pending:
                pending = self._retry(br, pending, t, events, order)
        for since, req in pending:  # still waiting at the horizon
            self._wait(br, req, horizon - since)

    def _retry(self, br: _Branch, pending: list[tuple[float, PodRequest]], t: float,
               events: list[tuple[float, int, int, Any]], order: Any
               ) -> list[tuple[float, PodRequest]]:
        """Offer the pending pods (highest priority first) to the rollout profile; the ones
        left waiting."""
        st = br.state
        left = []
        for since, req in sorted(pending, key=lambda x: (-x[1].pod.priority, x[0])):
            d = self.rollout.decide(st, req)
            if d.node is None or d.victims or d.defer:
                left.append((since, req))
                continue
            try:
                devices = d.devices if d.devices is not None else st.pick_devices(d.node, req)
                st.allocate(d.node, req, tuple(devices))
            except InfeasibleDecisionError:
                left.append((since, req))
                continue
            br.rolled[id(req)] = (req, d.node, tuple(int(x) for x in devices))
            self._wait(br, req, t - since)
            self._placed(br, req, d.node, t)
            if req.pod.duration is not None:
                heapq.heappush(events, (t + float(req.pod.duration), next(order), 0, req))
        return left

    @staticmethod
    def _wait(br: _Branch, req: PodRequest, seconds: float) -> None:
        if seconds <= 0:
            return
        br.pending_s += seconds
        if req.pod.pod_class in _CRITICAL:
            br.online_pending_s += seconds

    def _figures(self, state: ClusterState, br: _Branch, frag_base: float
                 ) -> dict[str, float]:
        st = br.state
        cap = state.capacity[:, [CPU, MEM]].astype(np.float64)
        use = state.usage[:, :2] + br.extra_use
        over = (use > cap).any(axis=1)
        b = st.bound  # before the rollout; less what left, plus what the branch placed
        online = b.used & (b.cls == _ONLINE_ID)
        if br.gone:
            online[list(br.gone)] = False
        contended = float(over[b.node[online]].sum())
        contended += sum(1.0 for req, node, _ in br.rolled.values()
                         if req.pod.pod_class == PodClass.ONLINE and over[node])
        return {"online_pending_s": br.online_pending_s, "pending_s": br.pending_s,
                "online_contended": contended, "latency_violations": br.latency_violations,
                "gpu_frag_pct": self._frag_pct(state, br, frag_base),
                "lost_work_s": br.lost_work_s}

    # ------------------------------------------------------------ fragmentation
    def _retarget(self) -> None:
        """FGD's typical pods of the recent ones, refit every ``history`` validations."""
        if len(self._seen) < MIN_HISTORY:
            self._target = None
            return
        if self._target is None or self.validations - self._target_at >= 500:
            from smartsched.twin.fragmentation import typical_pods

            self._target = typical_pods([p for _, p in self._seen], include_cpu_pods=True)
            self._target_at = self.validations

    def _frag(self, st: ClusterState, nodes: np.ndarray | None) -> float:
        """Expected fragmented GPU milli over ``nodes`` (None: all) of ``st``."""
        if self._target is None or not st.gpu_exists.any():
            return 0.0
        from smartsched.twin.fragmentation import node_fragmentation

        sel = slice(None) if nodes is None else nodes
        free = st.gpu_free[sel]
        return float(node_fragmentation(free, st.free_res[sel, CPU], st.gpu_model[sel],
                                        np.ones(free.shape[0], bool), self._target).sum())

    def _frag_pct(self, state: ClusterState, br: _Branch, frag_base: float) -> float:
        """Fragmented % of all GPU on the branch: the base state's, plus what the branch
        changed on the nodes it touched."""
        total = float(state.gpu_exists.sum()) * 1000.0
        if total == 0 or self._target is None:
            return 0.0
        idx = np.fromiter(br.touched, dtype=np.int64)
        delta = self._frag(br.state, idx) - self._frag(state, idx) if idx.size else 0.0
        return 100.0 * (frag_base + delta) / total


def _peak_use(req: PodRequest) -> np.ndarray:
    """A pod's expected peak [cpu, mem] use: its request times its usage profile's peak."""
    u = req.pod.usage
    burst = u.burst_factor if u.burst_probability > 0 else 1.0
    return float(u.mean * (1.0 + u.amplitude) * max(burst, 1.0)) * req.vector[[CPU, MEM]]

