"""Place a window of pods jointly: prune, anneal, repair, and check every answer on the twin.

Owns ``place_window`` (what the fill mode's windows and the benches call) and the
``anneal:<profile>`` scheduler that uses it: in fill mode, and as a service
site's profile (``region_profile: anneal:fgd``), where a batch's single pods are
placed as one window (``serving.site.SitePlacer``).

A window is solved in four steps: ``candidates.build_problem`` (the profile's
filters and scores, pruned to ``k`` nodes x ``d`` device choices a pod),
``annealer.anneal`` (replicas of simulated annealing or parallel tempering),
``repair.repair`` (feasible in the model, leftover room refilled) and
``repair.polish`` (ejection chains: a pod left out takes a slot by taking out
pods in its way, which try their other slots; at most ``polish`` attempts) and
``lns.ruin_recreate`` (at most ``lns`` rounds: the window's pods taken off a few
related nodes and put back in a random order; kept when the objective rises), then
the twin: on a fork of the state each placement is checked by the profile's
filters and allocated (the twin refuses any over-allocation), in window order.
A pod whose model answer fails there -- or that the model left out, or could
not hold (best-effort pods, a gang not whole in the window) -- is decided by
the profile itself on the fork, after the window's placements; a gang is kept
only whole (the model places its members all or none, and a member the twin
refuses sends the whole gang to the profile). So
every answer is feasible on the real state, and no pod the profile alone would
place given the window's choices is left out.

Spec: ``anneal:<profile>?window=1000&k=8&d=2&sweeps=5&replicas=8&method=sa
&value=share&score_weight=0.5&batch=64&homes=shapes&polish=2000&lns=300&gangs=model
&colocate=0`` (``gangs=after``: gangs are left to the profile after the window, as
before they were modelled; ``colocate``: each pair of a gang's members on one node
adds that fraction of the members' mean value, see ``candidates.build_problem``). As a
scheduler it decides pods the driver announced in a window (``plan_window``;
fill mode does); any other pod the profile decides alone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from smartsched.model.errors import InfeasibleDecisionError, ValidationError
from smartsched.model.pod import Pod
from smartsched.optimize.annealer import METHODS, AnnealResult, anneal
from smartsched.optimize.candidates import HOMES, VALUES, Pruning, build_problem, profile_for
from smartsched.optimize.lns import ruin_recreate
from smartsched.optimize.problem import WindowProblem
from smartsched.optimize.repair import polish, repair
from smartsched.scheduling.base import (
    Scheduler,
    SplitScheduler,
    TwinNeeds,
    make_scheduler,
    refuse_repeated_options,
)
from smartsched.scheduling.framework import ProfileScheduler
from smartsched.twin.decision import Decision
from smartsched.twin.state import ClusterState, PodRequest

GANGS = ("model", "after")  # whole gangs in the window's model, or left to the profile


# Upper bounds of the integer options: the annealer holds replicas x window x k x d
# arrays, so replicas=100000 or window=1e11 was accepted and then exhausted memory (or
# ran for ever) instead of being named. Each bound is far above any setting measured in
# docs/benchmarks.md (window 1,000, k 8, d 2, replicas 8, sweeps up to 80, lns 3,000).
OPTION_MAX = {"window": 100_000, "k": 256, "d": 64, "sweeps": 100_000, "replicas": 1_024,
              "batch": 100_000, "polish": 10_000_000, "lns": 1_000_000}


@dataclass(frozen=True)
class AnnealOptions:
    """How a window is solved (see the module docstring for the spec keys)."""

    window: int = 1000
    k: int = 8
    d: int = 2
    sweeps: int = 5
    replicas: int = 8
    method: str = "sa"
    value: str = "share"
    score_weight: float = 0.5
    batch: int = 64
    homes: str = "shapes"
    polish: int = 2000
    lns: int = 300
    gangs: str = "model"
    colocate: float = 0.0
    # Wall seconds one window's search may take (annealing, polish, ruin and recreate;
    # the repair that makes the answer feasible always runs); 0: no limit, and the search
    # is deterministic. A service site answers nobody while it searches.
    time_limit_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("window", "k", "d", "sweeps", "replicas", "batch", "polish", "lns"):
            v = getattr(self, name)
            low = 0 if name in ("polish", "lns") else 1
            high = OPTION_MAX[name]
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise ValidationError(name, f"must be an integer in [{low}, {high:,}], "
                                      f"got {v!r}")
        if self.method not in METHODS:
            raise ValidationError("method", f"must be one of {', '.join(METHODS)}")
        if self.value not in VALUES:
            raise ValidationError("value", f"must be one of {', '.join(VALUES)}")
        if not 0.0 <= self.score_weight < 1.0:
            raise ValidationError("score_weight", "must be in [0, 1)")
        if self.homes not in HOMES:
            raise ValidationError("homes", f"must be one of {', '.join(HOMES)}")
        if self.gangs not in GANGS:
            raise ValidationError("gangs", f"must be one of {', '.join(GANGS)}")
        if not (isinstance(self.colocate, int | float) and 0.0 <= self.colocate < 1e6):
            raise ValidationError("colocate", "must be a number in [0, 1e6)")
        if not (isinstance(self.time_limit_s, int | float)
                and 0.0 <= self.time_limit_s <= 3600.0):
            raise ValidationError("time_limit_s", "must be a number of seconds in [0, 3600] "
                                  "(0: no limit)")


@dataclass
class WindowResult:
    """One decision per request, in window order, and how they were reached.

    ``stats``: seconds per step, the model's objective before and after repair, pods
    placed by the model / by the profile after it / left unplaced, pruning figures."""

    decisions: list[Decision]
    stats: dict[str, Any] = field(default_factory=dict)
    problem: WindowProblem | None = None
    anneal: AnnealResult | None = None

    @property
    def unplaced(self) -> list[int]:
        """Window positions of the pods left unplaced (each decision says why)."""
        return [i for i, d in enumerate(self.decisions) if d.node is None]


def place_window(
    base: Scheduler,
    state: ClusterState,
    requests: Sequence[PodRequest],
    options: AnnealOptions = AnnealOptions(),
    seed: int = 0,
) -> WindowResult:
    """Decide ``requests`` jointly on ``state`` (which is not changed). ``base``: a
    scheduling profile or a split profile (pods whose route is not a profile, like
    best-effort pods, and gangs not whole in the window, are decided by ``base`` after
    the window)."""
    if not requests:
        raise ValidationError("window", "is empty: no pods to place")
    t0 = time.perf_counter()
    modelled = _modelled(base, requests, options.gangs == "model")
    assign = np.zeros(0, dtype=np.int64)
    problem = result = None
    stats: dict[str, Any] = {"pods": len(requests), "modelled": len(modelled)}
    if modelled:
        problem, _ = build_problem(base, state, [requests[i] for i in modelled],
                                   Pruning(options.k, options.d), value=options.value,
                                   score_weight=options.score_weight, homes=options.homes,
                                   colocate=options.colocate if options.gangs == "model"
                                   else 0.0)
        t1 = time.perf_counter()
        limit = options.time_limit_s or None
        deadline = None if limit is None else t0 + limit
        result = anneal(problem, sweeps=options.sweeps, replicas=options.replicas,
                        method=options.method, seed=seed, batch=options.batch,
                        time_limit_s=None if deadline is None else max(deadline - t1, 0.0))
        t2 = time.perf_counter()
        assign, moved = repair(problem, result.assign)
        if options.polish:
            assign, moved["chains"] = polish(problem, assign, options.polish, deadline)
        if options.lns:
            assign, moved["rounds_kept"] = ruin_recreate(problem, assign, options.lns,
                                                         seed=seed, deadline=deadline)
        t3 = time.perf_counter()
        stats.update(build_s=t1 - t0, anneal_s=t2 - t1, repair_s=t3 - t2,
                     model_objective=problem.objective(assign),
                     anneal_objective=problem.objective(result.assign),
                     repaired=moved, **{f"problem_{k}": v for k, v in problem.info.items()})
    t3 = time.perf_counter()
    decisions: list[Decision | None] = [None] * len(requests)
    fork = state.fork(share_bound=True)  # window pods stay out of the bound-pod table
    by_model = 0
    # The model's placements, checked on the twin in window order; a gang's members
    # together when its first comes, kept only if every one passes.
    gangs: dict[str, list[int]] = {}
    for j, i in enumerate(modelled):
        if requests[i].pod.gang_id is not None:
            gangs.setdefault(requests[i].pod.gang_id, []).append(j)
    for j, i in enumerate(modelled):
        gid = requests[i].pod.gang_id
        if int(assign[j]) == 0 or (gid is not None and gangs[gid][0] != j):
            continue
        unit = gangs[gid] if gid is not None else [j]
        done: list[tuple[int, int, tuple[int, ...]]] = []
        for jj in unit:
            req = requests[modelled[jj]]
            c = int(assign[jj])
            node = int(problem.node[jj, c])
            dv = problem.devices[jj, c]
            devices = tuple(int(x) for x in dv[dv >= 0])
            ok, _ = profile_for(base, req).feasible(fork, req)
            if c == 0 or not ok[node]:
                break
            try:
                fork.allocate(node, req, devices)
            except InfeasibleDecisionError:
                break
            done.append((modelled[jj], node, devices))
        if len(done) < len(unit):  # a member failed on the twin: the gang goes whole
            for ii, node, devices in done:  # to the profile after the window
                fork.release(node, requests[ii], devices)
            continue
        for ii, node, devices in done:
            decisions[ii] = Decision(node, devices)
        by_model += len(done)
    by_profile = 0
    # The rest, in window order, the profile deciding on the fork: single pods, and
    # gangs as units (all members or none, so a failed gang never holds room).
    units: dict[str, list[int]] = {}
    for i, req in enumerate(requests):
        if decisions[i] is None:
            units.setdefault(req.pod.gang_id or f"\0{i}", []).append(i)
    for key, idx in units.items():
        placed: list[int] = []
        why = ""
        for i in idx:
            req = requests[i]
            dec = base.decide(fork, req)
            if dec.node is not None and not dec.victims and not dec.defer:
                try:
                    devices = tuple(dec.devices) if dec.devices is not None else \
                        fork.pick_devices(dec.node, req)
                    fork.allocate(dec.node, req, devices)
                except InfeasibleDecisionError as e:  # a profile bug must not corrupt
                    dec = Decision.reject(f"refused by the state: {e}")
                else:
                    dec = Decision(dec.node, devices)
                    placed.append(i)
            elif dec.node is not None:  # preemption: not part of a window's answer
                dec = Decision.reject("the window placer does not preempt")
            decisions[i] = dec
            if dec.node is None and not key.startswith("\0"):
                said = "; ".join(dec.reasons) or ("deferred" if dec.defer else "no node")
                why = f"gang {key} not placed whole: {req.pod.id}: {said}"
                break
        if not key.startswith("\0") and not why:
            size = requests[idx[0]].pod.gang_size
            if len(idx) < size:
                why = f"gang {key}: {len(idx)} of {size} members in the window"
        if why:
            for i in placed:
                d = decisions[i]
                fork.release(d.node, requests[i], tuple(d.devices or ()))
            for i in idx:
                decisions[i] = Decision.reject(why)
            placed = []
        by_profile += len(placed)
    stats.update(verify_s=time.perf_counter() - t3, seconds=time.perf_counter() - t0,
                 placed_by_model=by_model, placed_by_profile=by_profile,
                 unplaced=len(requests) - by_model - by_profile)
    return WindowResult([d for d in decisions if d is not None], stats, problem, result)


class WindowPlacer:
    """``anneal:<profile>``: a scheduler that places announced windows jointly."""

    def __init__(self, base: Scheduler, options: AnnealOptions, seed: int,
                 name: str) -> None:
        self.base = base
        self.options = options
        self.window = options.window
        self.seed = seed
        self.name = name
        self.queue_sort = base.queue_sort
        self.failure_toleration_s = base.failure_toleration_s
        self._plan: dict[str, tuple[PodRequest, Decision]] = {}
        self._windows = 0
        self.last: WindowResult | None = None

    def prepare(self, pods: Sequence[Pod]) -> None:
        self.base.prepare(pods)

    def twin_needs(self) -> TwinNeeds:
        return self.base.twin_needs()

    def planned(self, request: PodRequest) -> bool:
        """Whether ``request``'s pod (the same object) belongs to a window already solved."""
        hit = self._plan.get(request.pod.id)
        return hit is not None and hit[0].pod is request.pod

    def plan_window(self, state: ClusterState, requests: Sequence[PodRequest]) -> None:
        """Solve the window ``requests`` (the next pods to be offered, in order)."""
        res = place_window(self.base, state, requests, self.options,
                           seed=self.seed + self._windows)
        self._windows += 1
        self.last = res
        self._plan = {r.pod.id: (r, d) for r, d in zip(requests, res.decisions, strict=True)}

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        hit = self._plan.pop(request.pod.id, None)
        if hit is None or hit[0].pod is not request.pod:
            return self.base.decide(state, request)
        dec = hit[1]
        prof = profile_for(self.base, request)
        if dec.node is not None and prof is not None:
            ok, _ = prof.feasible(state, request)
            devices = dec.devices or ()
            if not ok[dec.node] or np.any(state.gpu_free[dec.node, list(devices)]
                                          < request.gpu_milli):
                return self.base.decide(state, request)  # the state moved since the plan
        return dec


def _modelled(base: Scheduler, requests: Sequence[PodRequest], gangs: bool = True
              ) -> list[int]:
    """Window positions the model decides: pods with a scheduling profile's route, not
    best-effort; a gang's members only when ``gangs``, the whole gang is in the window and
    every member is modelled (else the profile decides the gang after the window)."""
    ok = [not r.best_effort and profile_for(base, r) is not None
          and (gangs or r.pod.gang_id is None) for r in requests]
    members: dict[str, list[int]] = {}
    for i, r in enumerate(requests):
        if r.pod.gang_id is not None:
            members.setdefault(r.pod.gang_id, []).append(i)
    whole = {g for g, idx in members.items()
             if len(idx) == requests[idx[0]].pod.gang_size and all(ok[i] for i in idx)}
    return [i for i, r in enumerate(requests)
            if ok[i] and (r.pod.gang_id is None or r.pod.gang_id in whole)]


def parse_spec(spec: str) -> tuple[str, AnnealOptions]:
    """``<profile>?key=value&...`` -> the base profile's name and the options."""
    from urllib.parse import parse_qs

    head, sep, query = spec.partition("?")
    if not head:
        raise ValidationError("scheduler", "anneal: needs a base profile, e.g. anneal:fgd")
    kw: dict[str, Any] = {}
    if sep:
        parsed = parse_qs(query, keep_blank_values=True)
        refuse_repeated_options(parsed)
        fields = AnnealOptions.__dataclass_fields__
        for key, vals in parsed.items():
            if key not in fields:
                raise ValidationError(f"scheduler.{key}", "unknown anneal option; known: "
                                      + ", ".join(fields))
            raw = vals[-1]
            kind = {"int": (int, "an integer"), "float": (float, "a number")}.get(
                fields[key].type)
            if kind is None:
                kw[key] = raw
                continue
            try:
                kw[key] = kind[0](raw)
            except ValueError:
                raise ValidationError(f"scheduler.{key}",
                                      f"must be {kind[1]}, got {raw!r}") from None
    return head, AnnealOptions(**kw)


def make_window_placer(spec: str, seed: int) -> WindowPlacer:
    """Entry point for the ``anneal:`` prefix (see pyproject's smartsched.schedulers)."""
    head, options = parse_spec(spec)
    base = make_scheduler(head, seed)
    if not isinstance(base, ProfileScheduler | SplitScheduler):
        raise ValidationError("scheduler", f"anneal:{head}: the base must be a scheduling "
                              "profile or a split profile (its filters and scores build the "
                              "window's model)")
    return WindowPlacer(base, options, seed, f"anneal:{spec}")


make_window_placer.option_names = tuple(  # type: ignore[attr-defined]
    AnnealOptions.__dataclass_fields__)
