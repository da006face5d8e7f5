"""The step-wise reward: a weighted sum of normalized components from the twin's metrics.

Owns the reward the RL policy optimizes. It never measures anything itself:
every component is a difference of ``MetricsRecorder.snapshot()`` totals
between two decisions, normalized so each is of order one per simulated hour
of a whole cluster:

  utilization  (d alloc_cpu_frac_s + d alloc_gpu_frac_s) / 2 / 3600
               (fill mode, where no time passes: d gpu_alloc_frac, the
               paper's objective)
  qos          -((sum_c q_c * d pending_s.c + d contended_s) / nodes
                 + d pending_gpu_frac_s) / 3600
               (waiting pods per node weighted by class -- q_c in QOS_CLASS_WEIGHTS:
               user-facing online, inference and edge pods count 2, training 1,
               deadline batch 0.5 -- plus online pods in contention (their SLO),
               plus the share of cluster GPU that waiting pods ask for: an 8-GPU
               gang member waiting an hour weighs what its GPUs are worth, which is
               what AI start latency costs)
  cost         -d cost_usd / (cluster cost per hour, all nodes on)
  energy       -d energy_j / (3600 * cluster idle watts)
  fairness     -(1 - Jain's index) * d time_s / 3600
  carbon       -d carbon_g / (cluster idle kWh per hour * REFERENCE_CARBON_G_PER_KWH)
               (the same energy priced at each site's grid intensity at the time:
               a kWh on a 100 g/kWh grid costs a quarter of one at 400)
  contention   -d contended_share_s / 3600
               (the share of running online pods on over-used nodes, per hour: the
               report's "online contended %" as a rate. qos counts the same pods per
               node, which on a cluster of hundreds of nodes makes them nearly invisible
               next to utilization; this one is of order one when every online pod
               contends)
  traffic      -d cross_zone_share_s / 3600
               (the share of app traffic between pods in different zones, per hour: the
               report's cross-zone GB/h over the apps' own traffic. Only measured when
               weighed: the env asks the twin for it when the weights can be non-zero)

Summed over an episode, utilization is the time-average allocated share
(in hours), qos the average waiting or contended pods per node, and so on.
The last two components came later: policies exported before them observe the
first six weights (``COMPONENTS[:6]``), and both weigh 0 unless a profile sets them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np

from smartsched.model.errors import ValidationError

COMPONENTS: Final = ("utilization", "qos", "cost", "energy", "fairness", "carbon",
                      "contention", "traffic")
DEFAULT_WEIGHTS: Final = {"utilization": 1.0, "qos": 0.5, "cost": 0.2, "energy": 0.1,
                          "fairness": 0.1, "carbon": 0.0, "contention": 0.0,
                          "traffic": 0.0}
QOS_CLASS_WEIGHTS: Final = {"online": 2.0, "ai-infer": 2.0, "edge-rt": 2.0,
                            "ai-train": 1.0, "batch": 0.5}
REFERENCE_CARBON_G_PER_KWH: Final = 400.0  # roughly the world grid average
_QOS_KEYS: Final = tuple((f"pending_s.{c}", q) for c, q in QOS_CLASS_WEIGHTS.items())


@dataclass(frozen=True)
class RewardWeights:
    """Weights per component (non-negative; the vector the policy also observes)."""

    utilization: float = 1.0
    qos: float = 0.5
    cost: float = 0.2
    energy: float = 0.1
    fairness: float = 0.1
    carbon: float = 0.0
    contention: float = 0.0
    traffic: float = 0.0

    def __post_init__(self) -> None:
        for name in COMPONENTS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 100:
                raise ValidationError(f"reward_weights.{name}",
                                      f"must be within [0, 100], got {v!r}")

    @staticmethod
    def from_mapping(m: Mapping[str, float] | None) -> RewardWeights:
        if m is None:
            return RewardWeights()
        unknown = set(m) - set(COMPONENTS)
        if unknown:
            raise ValidationError(f"reward_weights.{sorted(unknown)[0]}",
                                  f"unknown component (known: {', '.join(COMPONENTS)})")
        if not isinstance(m, Mapping):
            raise ValidationError("reward_weights", f"must map components to weights, got "
                                  f"{m!r}")
        # Numbers as given (ints become floats); anything else goes to the range check as it
        # is, so the error names the component instead of float() raising.
        return RewardWeights(**{k: float(v) if isinstance(v, int | float)
                                and not isinstance(v, bool) else v for k, v in m.items()})

    def vector(self) -> np.ndarray:
        return np.array([getattr(self, c) for c in COMPONENTS], dtype=np.float32)


class StepReward:
    """Turns successive metric snapshots into per-decision rewards."""

    def __init__(self, weights: RewardWeights, nodes: int, cost_per_hour: float,
                 idle_watts: float, fill_mode: bool) -> None:
        self.w = weights
        self.nodes = max(nodes, 1)
        self.cost_per_hour = max(cost_per_hour, 1e-9)
        self.idle_watts = max(idle_watts, 1e-9)
        self.fill = fill_mode
        self.last: dict[str, float] | None = None

    def components(self, snap: Mapping[str, float]) -> dict[str, float]:
        """Normalized component values since the previous snapshot (0 for the first)."""
        prev = self.last or snap
        d = {k: snap[k] - prev[k] for k in snap}
        self.last = dict(snap)
        if self.fill:
            util = d["gpu_alloc_frac"]
        else:
            util = (d["alloc_cpu_frac_s"] + d["alloc_gpu_frac_s"]) / 2 / 3600
        waiting = sum(q * d[k] for k, q in _QOS_KEYS)
        idle_kwh_per_h = self.idle_watts / 1000.0
        return {
            "utilization": util,
            "qos": -((waiting + d["contended_s"]) / self.nodes
                     + d["pending_gpu_frac_s"]) / 3600,
            "cost": -d["cost_usd"] / self.cost_per_hour,
            "energy": -d["energy_j"] / (3600 * self.idle_watts),
            "fairness": -(1.0 - snap["jain"]) * d["time_s"] / 3600,
            "carbon": -d["carbon_g"] / (idle_kwh_per_h * REFERENCE_CARBON_G_PER_KWH),
            "contention": -d["contended_share_s"] / 3600,
            "traffic": -d["cross_zone_share_s"] / 3600,
        }

    def __call__(self, snap: Mapping[str, float]) -> tuple[float, dict[str, float]]:
        comp = self.components(snap)
        return sum(getattr(self.w, k) * v for k, v in comp.items()), comp
