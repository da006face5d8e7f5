"""DefaultPreemption: kube-scheduler's PostFilter, over the twin's arrays.

Owns finding, for a pod no node passes, a node where evicting pods of lower
priority makes room, and the fewest, least important such pods (after
kubernetes/pkg/scheduler/framework/preemption and plugins/defaultpreemption):

1. Nodes that can help: every check other than room passes there (selector,
   taints, region, cordon, GPU model, load), and the pod fits once every pod
   of strictly lower priority on it is gone (``ClusterState.fit_checks`` with
   that room added). A pod whose ``preemption_policy`` is ``Never`` preempts
   nobody; a gang member preempts only on the nodes reserved for its gang,
   once that reservation is due (scheduling.plugins.gangs).
2. Up to ``max(min_candidate_nodes_percentage % of nodes,
   min_candidate_nodes_absolute)`` of them, from a seeded offset as upstream
   does, each get their victims chosen: all lower-priority pods removed, then
   given back one by one, most important first (higher priority, then bound
   earlier) -- pods whose eviction would break a disruption budget before the
   others -- keeping each that still leaves room. A victim in a gang takes its
   whole gang with it (all-or-nothing).
3. The node is chosen by upstream's order: fewest disruption-budget
   violations, lowest highest-victim priority, smallest sum of victim
   priorities, fewest victims, latest bind time of the highest-priority
   victims, then candidate order.

Disruption budget (a PodDisruptionBudget-like limit): pods of an online or
edge app may be evicted while fewer than ``max_unavailable_per_app`` of that
app are evicted and not running again (``ClusterState.disrupted``). ``soft``
(upstream's) ranks violations last; ``strict`` never violates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from smartsched.model.pod import POD_CLASS_IDS, Pod, PodClass
from smartsched.model.priority import NEVER
from smartsched.twin.state import ClusterState, PodRequest

_BUDGETED = np.array([POD_CLASS_IDS[PodClass.ONLINE], POD_CLASS_IDS[PodClass.EDGE_RT]])


class PreemptionArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_candidate_nodes_percentage: int = Field(10, ge=0, le=100)
    min_candidate_nodes_absolute: int = Field(100, ge=1, le=100_000)
    max_unavailable_per_app: int = Field(1, ge=0, le=100_000)
    pdb: Literal["soft", "strict"] = "soft"


@dataclass(frozen=True)
class Nomination:
    """Where the pod goes once ``victims`` are evicted (bound pods, by object)."""

    node: int
    victims: tuple[Pod, ...]


@dataclass(frozen=True)
class _Candidate:
    node: int
    rows: np.ndarray  # victim rows in the bound-pod table (gang mates included)
    violations: int
    order: int

    def key(self, bound: object) -> tuple[float, ...]:
        b = bound
        prio = b.priority[self.rows]  # type: ignore[attr-defined]
        top = int(prio.max())
        # Upstream: the latest start among the highest-priority victims wins; negate so that
        # a smaller key is better throughout.
        latest = float(b.since[self.rows[prio == top]].min())  # type: ignore[attr-defined]
        return (self.violations, top, float(prio.sum()), self.rows.size, -latest, self.order)


class DefaultPreemption:
    """PostFilter: evict the fewest, least important pods to make room."""

    name = "DefaultPreemption"
    Args = PreemptionArgs

    def __init__(self, args: PreemptionArgs | None = None) -> None:
        self.args = args or PreemptionArgs()
        self.rng = np.random.default_rng(0)

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def post_filter(self, state: ClusterState, req: PodRequest,
                    eligible: np.ndarray) -> Nomination | None:
        """A node and its victims for ``req``, or None. ``eligible``: nodes where every
        check other than room passes (the framework computes it from the filters)."""
        pod = req.pod
        if pod.preemption_policy == NEVER:
            return None
        if pod.gang_size > 1:
            # A gang preempts only on the nodes reserved for it, once the reservation is due.
            held = state.reservations.by_gang.get(pod.gang_id or "")
            if held is None or held.due > state.now:
                return None
            mine = np.zeros(state.num_nodes, dtype=bool)
            mine[list(held.nodes)] = True
            eligible = eligible & mine
        bound = state.bound
        lower = bound.below(pod.priority)
        if lower.size == 0 or not eligible.any():
            return None
        room = bound.room(lower)
        ok = eligible.copy()
        for _, mask in state.fit_checks(req, extra=room):
            ok &= mask
        nodes = np.flatnonzero(ok)
        if nodes.size == 0:
            return None
        a = self.args
        want = max(state.num_nodes * a.min_candidate_nodes_percentage // 100,
                   a.min_candidate_nodes_absolute)
        start = int(self.rng.integers(nodes.size))
        nodes = np.roll(nodes, -start)[:want]
        best: _Candidate | None = None
        best_key: tuple[float, ...] | None = None
        for order, n in enumerate(nodes.tolist()):
            cand = self._victims(state, req, int(n), lower, order)
            if cand is None:
                continue
            key = cand.key(bound)
            if best_key is None or key < best_key:
                best, best_key = cand, key
        if best is None:
            return None
        return Nomination(best.node, tuple(bound.pods[r] for r in best.rows.tolist()))

    # ----------------------------------------------------------------- victims
    def _victims(self, state: ClusterState, req: PodRequest, node: int,
                 lower: np.ndarray, order: int) -> _Candidate | None:
        bound = state.bound
        on_node = lower[bound.node[lower] == node]
        # Most important first: higher priority, then bound earlier (upstream's
        # MoreImportantPod); pods whose eviction would break a budget are given back first.
        budget_breaking = self._breaks_budget(state, on_node)
        idx = np.lexsort((bound.since[on_node], -bound.priority[on_node], ~budget_breaking))
        victims = set(on_node.tolist())
        for r in on_node[idx].tolist():
            victims.discard(r)
            if not state.fits_without(req, node, np.fromiter(victims, dtype=np.int64)):
                victims.add(r)  # needed: it stays a victim
        if not victims:
            return None  # cannot happen: the pod did not fit without evicting anyone
        rows = np.fromiter(victims, dtype=np.int64)
        gangs = np.unique(bound.gang[rows])
        gangs = gangs[gangs >= 0]
        if gangs.size:  # a gang is evicted whole: its members elsewhere go too
            mates = np.flatnonzero(bound.used & np.isin(bound.gang, gangs))
            rows = np.union1d(rows, mates)
        violations = int(self._breaks_budget(state, rows).sum())
        if violations and self.args.pdb == "strict":
            return None
        return _Candidate(node, rows, violations, order)

    def _breaks_budget(self, state: ClusterState, rows: np.ndarray) -> np.ndarray:
        """Bool per row: evicting these rows together exceeds its app's budget."""
        bound = state.bound
        out = np.zeros(rows.size, dtype=bool)
        budgeted = np.isin(bound.cls[rows], _BUDGETED) & (bound.app[rows] >= 0)
        if not budgeted.any():
            return out
        limit = self.args.max_unavailable_per_app
        seen: dict[str, int] = {}
        for k in np.flatnonzero(budgeted).tolist():
            app = bound.pods[int(rows[k])].app  # type: ignore[union-attr]
            seen[app] = seen.get(app, 0) + 1
            out[k] = state.disrupted.get(app, 0) + seen[app] > limit
        return out
