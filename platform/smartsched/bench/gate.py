"""``smartsched bench gate``: how often the promotion gate promotes which kind of candidate.

Issue 18's gate figures, measured over ``trials`` independent gates (each on its
own block of held-out seeds) for each kind of candidate against one incumbent:

* broken -- ``random`` (a random policy), ``gate-probe:worst:<incumbent>``
  (the incumbent's own ranking reversed: what a flipped reward sign learns),
  ``gate-probe:nofilter:<incumbent>`` (the incumbent, but one decision in five
  on any node, filters ignored): must be refused every time;
* identical -- the incumbent itself: promoted in at most 5 % of trials;
* better -- the incumbent against a degraded copy of itself
  (``gate-probe:mix:<q>:<incumbent>:k8s-default``: with probability ``q`` a
  decision is k8s-default's instead), its measured utilization gain reported:
  promoted in at least 80 %.

The probes are benchmark schedulers registered here (``gate-probe:`` prefix);
they never ship as profiles.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from smartsched.scheduling.base import Scheduler, make_scheduler, register_prefix
from smartsched.twin.decision import Decision
from smartsched.twin.state import ClusterState, PodRequest


class _Worst:
    """The base's ranking reversed: its worst feasible node."""

    def __init__(self, base: Scheduler) -> None:
        self.base, self.name = base, f"worst:{base.name}"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        ranked = self.base.ranked(state, request, state.num_nodes)  # type: ignore[attr-defined]
        if not ranked:
            return self.base.decide(state, request)
        node, devices = ranked[-1]
        return Decision(node, devices)


class _NoFilter:
    """The base, but one decision in five on a node drawn from all of them."""

    def __init__(self, base: Scheduler, seed: int) -> None:
        self.base, self.name = base, f"nofilter:{base.name}"
        self.rng = np.random.default_rng(seed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        if self.rng.random() < 0.2:
            return Decision(int(self.rng.integers(state.num_nodes)))
        return self.base.decide(state, request)


class _Mix:
    """``a``'s decisions, each replaced by ``b``'s with probability ``q``."""

    def __init__(self, q: float, a: Scheduler, b: Scheduler, seed: int) -> None:
        self.q, self.a, self.b = q, a, b
        self.name = f"mix:{q}:{a.name}:{b.name}"
        self.rng = np.random.default_rng(seed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.a, name)

    def prepare(self, pods: Any) -> None:
        for s in (self.a, self.b):
            if hasattr(s, "prepare"):
                s.prepare(pods)

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        return (self.b if self.rng.random() < self.q else self.a).decide(state, request)


def _probe(spec: str, seed: int) -> Scheduler:
    kind, _, rest = spec.partition(":")
    if kind == "worst":
        return _Worst(make_scheduler(rest, seed))
    if kind == "nofilter":
        return _NoFilter(make_scheduler(rest, seed), seed)
    if kind == "mix":
        q, _, pair = rest.partition(":")
        a, _, b = pair.rpartition(":")
        return _Mix(float(q), make_scheduler(a, seed), make_scheduler(b, seed), seed)
    raise ValueError(f"unknown gate probe {spec!r}")


register_prefix("gate-probe", _probe)


# The score's figures other than utilization (rl.gate.SCORE_FIGURES): online contention,
# latency-SLO violations, waiting pod-hours.
QOS_FIGURES = ("online_contended_pct", "latency_violations", "waiting_pod_hours")


def run_gate_bench(incumbent: str, *, trials: int = 40, seeds: int = 8, cluster: str = "medium",
                   hours: float = 2.0, warmup_hours: float = 1.0, degrade: float = 0.5,
                   workers: int | None = None, kinds: tuple[str, ...] = (
                       "random", "worst", "nofilter", "identical", "better"),
                   echo: Callable[[str], Any] = print) -> dict[str, Any]:
    from smartsched.rl.gate import GateConfig, run_gate

    worse = f"gate-probe:mix:{degrade}:{incumbent}:k8s-default"
    pairs = {"random": ("random", incumbent),
             "worst": (f"gate-probe:worst:{incumbent}", incumbent),
             "nofilter": (f"gate-probe:nofilter:{incumbent}", incumbent),
             "identical": (incumbent, incumbent),
             "better": (incumbent, worse)}
    res: dict[str, Any] = {"incumbent": incumbent, "trials": trials, "seeds": seeds,
                           "kinds": {}}
    for kind in kinds:
        cand, inc = pairs[kind]
        promoted, secs, gains, util = 0, [], [], []
        qos: dict[str, list[float]] = {f: [] for f in QOS_FIGURES}
        for t in range(trials):
            cfg = GateConfig(cluster=cluster, seeds=seeds, first_seed=50_000 + 1000 * t,
                             hours=hours, warmup_hours=warmup_hours, workers=workers)
            t0 = time.perf_counter()
            g = run_gate(cand, inc, cfg)
            secs.append(time.perf_counter() - t0)
            promoted += g.promoted
            gains.append(g.gain_mean)
            util.append(float(np.mean([c["figures"]["utilization_pct"] - i["figures"][
                "utilization_pct"] for c, i in zip(g.candidate, g.incumbent, strict=True)])))
            for f in QOS_FIGURES:  # the QoS side: is a gain in utilization bought with it?
                qos[f].append(float(np.mean([c["figures"][f] - i["figures"][f] for c, i in
                                             zip(g.candidate, g.incumbent, strict=True)])))
        row = {"candidate": cand, "incumbent": inc, "promoted": promoted,
               "promoted_pct": 100.0 * promoted / trials, "gate_s_p50": float(np.median(secs)),
               "gate_s_max": float(np.max(secs)), "gain_mean": float(np.mean(gains)),
               "utilization_gain_points": float(np.mean(util)),
               # candidate - incumbent per trial (mean over its episodes): mean, and the
               # share of trials where the candidate was worse
               "qos_diff": {f: {"mean": float(np.mean(v)),
                                "worse_pct": 100.0 * float(np.mean(np.array(v) > 1e-9))}
                            for f, v in qos.items()}}
        res["kinds"][kind] = row
        echo(f"{kind:10s} promoted {promoted}/{trials} ({row['promoted_pct']:.0f} %), "
             f"utilization {row['utilization_gain_points']:+.2f} points, gate "
             f"{row['gate_s_p50']:.1f} s (max {row['gate_s_max']:.1f})  [{cand} vs {inc}]")
        echo("           QoS vs incumbent: " + ", ".join(
            f"{f} {d['mean']:+.3f} (worse in {d['worse_pct']:.0f} % of trials)"
            for f, d in row["qos_diff"].items()))
    return res
