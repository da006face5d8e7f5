"""Dynamic reward weights: switch or blend scenario profiles from the cluster's condition.

Owns the rule set that picks the weight vector the policy is asked to
optimize right now, and the log of when and why it moved. Rules are checked
in order; the first that holds names the target profile, otherwise the base
profile applies:

  surge    online arrivals in the last ``surge_window_s`` >= ``surge_ratio`` x
           their average rate over the last ``baseline_s`` -> ``online-peak``
  backlog  AI-training pods waiting >= max(``backlog_min``, ``backlog_per_node`` x nodes)
           -> ``ai-training``
  night    hour of day in [``night_start``, ``night_end``) -> ``green``

With ``blend`` < 1 the weights move that fraction of the way to the target at
each evaluation (exponential smoothing) instead of switching at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from smartsched.objectives.reward import COMPONENTS, RewardWeights


@dataclass(frozen=True)
class ClusterCondition:
    """What the rules look at, measured from the twin."""

    time_s: float
    online_recent_rate: float  # online arrivals per second over the surge window
    online_baseline_rate: float  # ... over the baseline window
    ai_backlog: int  # AI-training pods waiting
    nodes: int

    @property
    def hour(self) -> float:
        return (self.time_s / 3600.0) % 24.0

    @staticmethod
    def from_arrivals(now: float, online_arrivals: Sequence[float] | np.ndarray,
                      ai_backlog: int, nodes: int, rules: DynamicRules) -> ClusterCondition:
        """The condition at ``now`` from the sorted arrival times of online pods: the rate over
        the surge window and over the baseline (at most the time elapsed)."""
        arr = np.asarray(online_arrivals, dtype=np.float64)
        end = np.searchsorted(arr, now, "right")
        recent = end - np.searchsorted(arr, now - rules.surge_window_s, "right")
        span = min(rules.baseline_s, max(now, 1.0))
        base = end - np.searchsorted(arr, now - span, "right")
        return ClusterCondition(now, float(recent) / rules.surge_window_s, float(base) / span,
                                ai_backlog, nodes)


@dataclass
class DynamicRules:
    """Thresholds and targets of the rules (see module docstring)."""

    base: str = "balanced"
    surge_profile: str = "online-peak"
    backlog_profile: str = "ai-training"
    night_profile: str = "green"
    surge_ratio: float = 3.0
    surge_window_s: float = 900.0
    baseline_s: float = 6 * 3600.0
    backlog_min: int = 4
    backlog_per_node: float = 0.05
    night_start: float = 0.0
    night_end: float = 6.0
    blend: float = 1.0

    def choose(self, c: ClusterCondition) -> tuple[str, str]:
        """(profile name, reason) for condition ``c``."""
        if c.online_baseline_rate > 0 and c.online_recent_rate >= (
            self.surge_ratio * c.online_baseline_rate
        ):
            ratio = c.online_recent_rate / c.online_baseline_rate
            return self.surge_profile, f"online arrivals at {ratio:.1f}x their 6 h average"
        need = max(self.backlog_min, int(np.ceil(self.backlog_per_node * c.nodes)))
        if c.ai_backlog >= need:
            return self.backlog_profile, f"{c.ai_backlog} AI-training pods waiting (>= {need})"
        if self.night_start <= c.hour < self.night_end:
            return self.night_profile, f"night hours ({c.hour:.1f} h)"
        return self.base, "no rule fired"


@dataclass
class DynamicWeights:
    """Current weights under ``rules``, with a log of every change."""

    rules: DynamicRules
    profiles: dict[str, RewardWeights]
    current: np.ndarray = field(init=False)
    active: str = field(init=False)
    log: list[dict[str, object]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in (self.rules.base, self.rules.surge_profile, self.rules.backlog_profile,
                     self.rules.night_profile):
            if name not in self.profiles:
                from smartsched.model.errors import UnknownReferenceError

                raise UnknownReferenceError("dynamic_weights", f"unknown scenario {name!r}")
        self.active = self.rules.base
        self.current = self.profiles[self.active].vector()

    def update(self, c: ClusterCondition) -> np.ndarray:
        """Evaluate the rules at ``c``; return the (possibly moved) weight vector."""
        name, reason = self.rules.choose(c)
        target = self.profiles[name].vector()
        before = self.current.copy()
        a = self.rules.blend
        self.current = ((1 - a) * self.current + a * target).astype(np.float32)
        if name != self.active or not np.allclose(before, self.current):
            if name != self.active:
                self.log.append({
                    "time_s": c.time_s, "profile": name, "reason": reason,
                    "weights": dict(zip(COMPONENTS, map(float, self.current), strict=True)),
                })
            self.active = name
        return self.current

    def weights(self) -> RewardWeights:
        return RewardWeights(**dict(zip(COMPONENTS, map(float, self.current), strict=True)))
