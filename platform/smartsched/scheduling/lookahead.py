"""``lookahead:<base>``: choose among the base's top-k nodes by rolling the twin forward.

Owns decision-time lookahead on forks of the twin (issue 17). For the pod
offered, the base scheduler (a profile, or the learned policy ``rl:PATH``) ranks
its feasible nodes; for each of its ``k`` best, the state is forked, the pod is
placed there, and ``samples`` sequences of ``horizon`` future pods are placed on
the fork by a fast rollout profile (``fgd`` unless named). The candidate whose
forks fit the most of those pods (in dominant-share units of the cluster's
mean node) wins; ties keep the base's order, so a lookahead that sees no
difference decides as the base does.

The future pods are drawn, with replacement, from the pods this scheduler has
been offered so far (the workload's recent distribution) -- never from the
run's real future -- with the same draws for every candidate (common random
numbers: the comparison is between nodes, not between draws). The real state
is never touched: forks copy the mutable arrays (``ClusterState.fork``).

``objective=frag`` also charges each fork the GPU fragmentation it added (FGD's
expected fragmented GPU, ``twin.fragmentation``, against the typical pods of
the pods offered so far, on the nodes the fork changed), in the same
dominant-share units: the multi-step version of FGD's one-step measure.

Spec: ``lookahead:<base>`` with options in a final ``?k=4&horizon=8&samples=2
&rollout=fgd&history=2000&objective=volume`` (the part after the last ``?`` is the lookahead's
when every key in it is one of those; otherwise it belongs to the base, e.g.
``lookahead:rl:models/p?weights=green``). A lone part with a key the base takes too is
refused as ambiguous (``lookahead:rl:P?k=8``): ``lookahead:rl:P??k=8`` is the lookahead's k,
``lookahead:rl:P?k=8?`` the shortlist's (``base.split_wrapper_spec``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod
from smartsched.model.resources import CPU, GPU, MEM
from smartsched.scheduling.base import (
    Scheduler,
    WorkloadAware,
    make_scheduler,
    split_wrapper_spec,
)
from smartsched.twin.decision import Decision, Migration
from smartsched.twin.state import ClusterState, InfeasibleDecisionError, PodRequest

OPTIONS = {"k": 4, "horizon": 8, "samples": 2, "history": 2000}
OPTION_NAMES = frozenset({*OPTIONS, "rollout", "objective"})
OBJECTIVES = ("volume", "frag")
RETARGET_EVERY = 500  # decisions between refits of the typical pods (objective=frag)
MIN_HISTORY = 8  # pods seen before the lookahead starts (the base decides until then)
# The most each option may ask, and the most pods one candidate's rollouts may place
# (horizon x samples): one decision stays within seconds and a little memory (samples and
# horizon of 10^6 each asked 7 TiB for the draws; 3,000 each ran for hours).
OPTION_MAX = {"k": 64, "horizon": 1_000, "samples": 100, "history": 1_000_000}
MAX_ROLLOUT_PODS = 10_000


@runtime_checkable
class Ranks(Protocol):
    """A scheduler that can list its best feasible nodes (ProfileScheduler, RLScheduler)."""

    def ranked(self, state: ClusterState, request: PodRequest, k: int
               ) -> list[tuple[int, tuple[int, ...] | None]]: ...


class LookaheadScheduler:
    """The base's top-k candidates, judged by rollouts of sampled arrivals on forks."""

    def __init__(self, base: Scheduler, rollout: Scheduler, *, k: int = 4, horizon: int = 8,
                 samples: int = 2, history: int = 2000, seed: int = 0,
                 objective: str = "volume", name: str = "lookahead") -> None:
        if objective not in OBJECTIVES:
            raise ValidationError("scheduler.objective", f"must be one of {OBJECTIVES}")
        self.objective = objective
        self._target: Any = None  # typical pods of the past (objective=frag)
        self._target_at = -1
        if not isinstance(base, Ranks):
            raise ValidationError("scheduler", f"{getattr(base, 'name', base)!r} cannot rank "
                                  "its nodes; lookahead needs a profile or an rl: policy")
        for field, v, lo in (("k", k, 1), ("horizon", horizon, 1), ("samples", samples, 1),
                             ("history", history, MIN_HISTORY)):
            if not isinstance(v, int) or not lo <= v <= OPTION_MAX[field]:
                raise ValidationError(f"scheduler.{field}", f"must be an integer in "
                                      f"[{lo}, {OPTION_MAX[field]:,}]")
        if horizon * samples > MAX_ROLLOUT_PODS:
            raise ValidationError("scheduler.samples", f"horizon x samples is {horizon * samples:,}"
                                  f" pods a candidate; at most {MAX_ROLLOUT_PODS:,}")
        self.base, self.rollout = base, rollout
        self.k, self.horizon, self.samples = k, horizon, samples
        self.rng = np.random.default_rng(seed)
        self.name = name
        self._seen: deque[Pod] = deque(maxlen=history)
        self.lookahead_seconds: list[float] = []  # per decision that rolled out
        self.changed = 0  # decisions where the lookahead overruled the base's first choice

    def prepare(self, pods: Sequence[Pod]) -> None:
        """Workload-aware parts (FGD's typical pods) of the base and of the rollout."""
        for s in (self.base, self.rollout):
            if isinstance(s, WorkloadAware):
                s.prepare(pods)

    def twin_needs(self) -> Any:
        needs = getattr(self.base, "twin_needs", None)
        if needs is None:
            from smartsched.scheduling.base import TwinNeeds

            return TwinNeeds()
        return needs()

    @property
    def deschedule_interval_s(self) -> float | None:
        """The base's descheduling pass runs as it would without the lookahead."""
        return getattr(self.base, "deschedule_interval_s", None)

    def deschedule(self, state: ClusterState,
                   waiting: Sequence[PodRequest]) -> tuple[Migration, ...]:
        plan = getattr(self.base, "deschedule", None)
        return plan(state, waiting) if plan is not None else ()

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        enough = len(self._seen) >= MIN_HISTORY
        cands = self.base.ranked(state, request, self.k)  # type: ignore[attr-defined]
        if len(cands) <= 1 or not enough:
            self._seen.append(request.pod)
            return self.base.decide(state, request)
        history = list(self._seen)  # the past only: this pod joins it after the draws
        self._seen.append(request.pod)
        t0 = time.perf_counter()
        idx = self.rng.integers(len(history), size=(self.samples, self.horizon))
        futures = [[history[i] for i in row] for row in idx]
        unit = np.maximum(state.capacity.mean(axis=0)[[CPU, MEM, GPU]], 1.0)
        frag_now: dict[int, float] = {}
        if self.objective == "frag":
            self._retarget(history)
        best, best_value = cands[0], -np.inf
        for node, devices in cands:
            value = 0.0
            for seq in futures:
                fork = state.fork()
                try:
                    fork.allocate(node, request, tuple(
                        devices if devices is not None else fork.pick_devices(node, request)))
                except InfeasibleDecisionError:
                    value = -np.inf
                    break
                touched = {node}
                value += self._roll(fork, seq, unit, touched)
                if self.objective == "frag":
                    value -= self._frag_added(state, fork, touched, frag_now) / unit[2]
            if value > best_value + 1e-9:  # strictly better: ties keep the base's order
                best, best_value = (node, devices), value
        self.lookahead_seconds.append(time.perf_counter() - t0)
        if best[0] != cands[0][0]:
            self.changed += 1
        return Decision(best[0], best[1])

    def _retarget(self, history: Sequence[Pod]) -> None:
        """The typical pods of the past (FGD's target), refit every RETARGET_EVERY pods."""
        if self._target is None or len(self.lookahead_seconds) - self._target_at >= \
                RETARGET_EVERY:
            from smartsched.twin.fragmentation import typical_pods

            self._target = typical_pods(history, include_cpu_pods=True)
            self._target_at = len(self.lookahead_seconds)

    def _frag_added(self, state: ClusterState, fork: ClusterState, touched: set[int],
                    frag_now: dict[int, float]) -> float:
        """Expected fragmented GPU milli the fork added, over the nodes it changed."""
        from smartsched.twin.fragmentation import node_fragmentation

        idx = np.fromiter(touched, dtype=np.int64)
        todo = [n for n in touched if n not in frag_now]
        if todo:
            t = np.asarray(todo, dtype=np.int64)
            now = node_fragmentation(state.gpu_free[t], state.free_res[t, CPU],
                                     state.gpu_model[t], np.ones(t.size, bool), self._target)
            frag_now.update(zip(todo, now.tolist(), strict=True))
        after = node_fragmentation(fork.gpu_free[idx], fork.free_res[idx, CPU],
                                   fork.gpu_model[idx], np.ones(idx.size, bool), self._target)
        return float(after.sum() - sum(frag_now[int(n)] for n in idx))

    def _roll(self, fork: ClusterState, seq: Sequence[Pod], unit: np.ndarray,
              touched: set[int]) -> float:
        """Dominant-share volume of ``seq`` that the rollout profile fits on ``fork``
        (the nodes it places on are added to ``touched``)."""
        placed = 0.0
        for pod in seq:
            req = fork.compile(pod)
            d = self.rollout.decide(fork, req)
            if d.node is None or d.victims or d.defer:
                continue
            devices = d.devices if d.devices is not None else fork.pick_devices(d.node, req)
            try:
                fork.allocate(d.node, req, tuple(devices))
            except InfeasibleDecisionError:
                continue
            touched.add(d.node)
            v = req.vector
            placed += float(max(v[0] / unit[0], v[1] / unit[1], v[2] / unit[2]))
        return placed


def make_lookahead(spec: str, seed: int) -> LookaheadScheduler:
    """Entry point for the ``lookahead:`` prefix (see the module docstring)."""
    base_spec, parsed = split_wrapper_spec("lookahead", spec, OPTION_NAMES)
    opts = {k: v[-1] for k, v in parsed.items()}
    if not base_spec:
        raise ValidationError("scheduler", "lookahead: needs a base, e.g. lookahead:fgd")
    nums: dict[str, int] = {}
    for key, default in OPTIONS.items():
        raw = opts.get(key, str(default))
        try:
            nums[key] = int(raw)
        except ValueError:
            raise ValidationError(f"scheduler.{key}", f"must be an integer, got {raw!r}") from None
    base = make_scheduler(base_spec, seed)
    # The rollout places horizon x samples pods per candidate: a profile, never a policy
    # (its observer is built per state, and a fork is a new state every time).
    rollout_name = opts.get("rollout") or (base_spec if ":" not in base_spec else "fgd")
    if ":" in rollout_name:
        raise ValidationError("scheduler.rollout", f"{rollout_name!r}: the rollout must be "
                              "a scheduling profile (fast), not a prefixed scheduler")
    rollout = make_scheduler(rollout_name, seed)
    objective = opts.get("objective", "volume")
    q = "&".join(f"{k}={nums[k]}" for k in ("k", "horizon", "samples"))
    return LookaheadScheduler(base, rollout, k=nums["k"], horizon=nums["horizon"],
                              samples=nums["samples"], history=nums["history"], seed=seed,
                              objective=objective,
                              name=f"lookahead:{base_spec}?{q}&rollout={rollout_name}"
                              f"&objective={objective}")


make_lookahead.option_names = OPTION_NAMES  # type: ignore[attr-defined]
