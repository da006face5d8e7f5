"""A heuristic's shortlist for the policy to choose within (issue 17's "policy over a
heuristic's top-k").

Owns the base profile a policy steers and what "its shortlist" means: the base (a
profile, or a split of profiles such as ``composite``) runs the twin as it would alone
-- its routes, filters, post-filters (preemption, gang reservations), deferrers,
descheduling pass, queue order -- and wherever it places a pod on a node that has
rivals, the shortlist is its route's ``k`` best-scored feasible nodes, the base's own
choice always among them (ties at the k-th score broken by node index). The training
env (``rl.env``, ``base:``) and the ``rl:`` scheduler (``?base=&k=&classes=``) both ask
this class, so a policy is trained and deployed on the same shortlists.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from smartsched.model.errors import ValidationError
from smartsched.model.pod import POD_CLASSES
from smartsched.scheduling.base import SplitScheduler, make_scheduler
from smartsched.scheduling.framework import ProfileScheduler
from smartsched.twin.decision import Decision
from smartsched.twin.state import PodRequest


class Shortlist:
    """The base profile a policy chooses within, its routes, and how many of its best
    nodes the policy may pick from. ``base`` (a profile or a split) also carries the
    run's hooks -- queue order, failure toleration, descheduling, twin needs -- which
    whoever runs the twin reads from it directly."""

    def __init__(self, base: ProfileScheduler | SplitScheduler, k: int,
                 classes: frozenset[str] | None) -> None:
        self.base = base
        self.k = k
        self.classes = classes
        self.decisions = 0  # placements the policy chose within a shortlist
        self.changed = 0  # ... where it picked another node than the base's own choice

    @staticmethod
    def build(name: str, k: int, classes: Sequence[str] | None, seed: int,
              with_filters: bool, fields: tuple[str, str, str] = ("scheduler.base",
                                                                 "scheduler.k",
                                                                 "scheduler.classes"),
              ) -> Shortlist:
        """The base ``name`` built with ``seed``; errors name ``fields`` (base, k, classes:
        the ``rl:`` options by default, the env's keys in training)."""
        f_base, f_k, f_classes = fields
        if with_filters:
            raise ValidationError("scheduler.filters", "cannot be combined with base=: the "
                                  "base profile's filters mask the policy's choices")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValidationError(f_k, f"must be an integer >= 1, got {k!r}")
        known = [c.value for c in POD_CLASSES]
        if classes is not None and (not isinstance(classes, list | tuple | frozenset) or not all(
                isinstance(c, str) for c in classes)):  # (a number was not iterable)
            raise ValidationError(f_classes, "must be a list of pod classes")
        for c in classes or ():
            if c not in known:
                raise ValidationError(f_classes, f"unknown pod class {c!r} (known: "
                                      f"{', '.join(known)})")
        base = make_scheduler(name, seed)
        routes = list(base.routes.values()) if isinstance(base, SplitScheduler) else [base]
        if not all(isinstance(r, ProfileScheduler) for r in routes):
            raise ValidationError(f_base, f"{name!r} must be a profile or a split "
                                  "of profiles (not a policy, lookahead or window placer)")
        return Shortlist(base, k, frozenset(classes) if classes else None)  # type: ignore[arg-type]

    def route(self, request: PodRequest) -> ProfileScheduler:
        b = self.base
        return b.route(request) if isinstance(b, SplitScheduler) else b  # type: ignore[return-value]

    def steers(self, request: PodRequest) -> bool:
        return self.k > 1 and (self.classes is None
                               or request.pod.pod_class.value in self.classes)

    def choices(self, route: ProfileScheduler, ok: np.ndarray, base: Decision
                ) -> np.ndarray | None:
        """[N] bool: the shortlist for the decision ``base`` that ``route`` just took over
        the feasible mask ``ok`` (its scores in ``route.last_scores``); None when there is
        nothing to choose: the base rejects, defers or preempts, or no other node passes."""
        if base.node is None or base.victims or self.k < 2:
            return None
        idx = np.flatnonzero(ok)
        scores = route.last_scores
        if idx.size <= 1 or scores is None:
            return None
        order = idx[np.argsort(-scores[idx], kind="stable")]
        out = np.zeros(ok.size, dtype=bool)
        out[order[order != base.node][: self.k - 1]] = True
        out[base.node] = True
        return out

    @staticmethod
    def action_mask(choices: np.ndarray, like: np.ndarray) -> np.ndarray:
        """The observation's action mask (shaped ``like``: padded nodes, then defer) that
        offers exactly ``choices``: what a policy trained within a shortlist sees, in
        training and at inference alike."""
        mask = np.zeros_like(like)
        mask[: choices.size] = choices
        return mask
