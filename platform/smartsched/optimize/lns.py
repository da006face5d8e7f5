"""Ruin and recreate: a large-neighbourhood search after repair and polish.

Owns the rearrangements an ejection chain of depth one cannot reach. On tight
windows the optimum often leaves out a few large pods and places many small
ones around them, or moves several pods at once to make room; the annealer's
single-pod moves and polish's chains find some of these, not all. Each round
here takes every window pod off a few related nodes (grown from a node the pods
left out could use, or with gang co-location a gang member could use), then
puts those pods and the pods left out back in a randomized order (most
valuable first, perturbed; or most valuable per unit of room), each by its
best-scored slot that fits or by the slot that leaves its bins fullest; with
co-location a gang goes back on one node when one has room for all. A round is
kept when the objective rises. Gangs go off and back whole. Seeded: the same
seed gives the same answer. The answer is never worse than the input.
"""

from __future__ import annotations

import time

import numpy as np

from smartsched.model.errors import ValidationError
from smartsched.optimize.problem import EPS, WindowProblem
from smartsched.optimize.repair import first_fit


def _tightest_fit(problem: WindowProblem, i: int, load: np.ndarray) -> int:
    """Pod ``i``'s slot that fits and leaves its fullest bin with the least room,
    taken into ``load``; 0 when none fits."""
    n = int(problem.nslots[i])
    if n <= 1:
        return 0
    b = problem.bins[i, 1:n]
    after = load[b] + problem.amount[i, 1:n]
    ok = np.all(after <= problem.cap[b] + EPS, axis=1)
    if not ok.any():
        return 0
    real = b < problem.num_bins
    room = np.where(real, problem.cap[b] - after, np.inf).min(axis=1)
    room[~ok] = np.inf
    c = int(np.argmin(room)) + 1
    np.add.at(load, problem.bins[i, c], problem.amount[i, c])
    return c


def _together(problem: WindowProblem, unit: np.ndarray, a: np.ndarray,
              load: np.ndarray) -> bool:
    """A gang's members all on one node (co-location), on the node where their slots
    cost least together among those with room for all; False (nothing changed) if none."""
    pr = problem
    slots = [np.arange(1, int(pr.nslots[i])) for i in unit]
    common = set(pr.node[unit[0], slots[0]].tolist())
    for i, s in zip(unit[1:], slots[1:], strict=True):
        common &= set(pr.node[i, s].tolist())
    best: tuple[float, list[int]] | None = None
    for n in sorted(common):  # ties go to the lowest node, whatever the set's order
        trial = load.copy()
        got, cost = [], 0.0
        for i, s in zip(unit, slots, strict=True):
            here = s[pr.node[i, s] == n]
            b, w = pr.bins[i, here], pr.amount[i, here]
            ok = np.flatnonzero(np.all(trial[b] + w <= pr.cap[b] + EPS, axis=1))
            if not ok.size:
                break
            c = int(here[ok[0]])
            np.add.at(trial, pr.bins[i, c], pr.amount[i, c])
            got.append(c)
            cost += float(pr.cost[i, c])
        if len(got) == len(unit) and (best is None or cost < best[0]):
            best = (cost, got)
    if best is None:
        return False
    a[unit] = best[1]
    for i, c in zip(unit, best[1], strict=True):
        np.add.at(load, pr.bins[i, c], pr.amount[i, c])
    return True


def _place(problem: WindowProblem, unit: np.ndarray, a: np.ndarray, load: np.ndarray,
           tight: bool) -> None:
    fit = _tightest_fit if tight else first_fit
    if len(unit) == 1:
        a[unit[0]] = fit(problem, int(unit[0]), load)
        return
    if problem.colocate and _together(problem, unit, a, load):
        return
    trial = load.copy()
    got = [fit(problem, int(i), trial) for i in unit]
    if all(got):
        a[unit] = got
        load[:] = trial


def ruin_recreate(problem: WindowProblem, assign: np.ndarray, rounds: int = 300,
                  seed: int = 0, ruin: int = 3, deadline: float | None = None
                  ) -> tuple[np.ndarray, int]:
    """At most ``rounds`` ruin-and-recreate rounds on a feasible ``assign``, each taking
    the window's pods off 1..``ruin`` related nodes; returns the assignment and the
    rounds kept. Stops early when no pod is left out (nothing left to gain in value),
    unless gangs are co-located (moving a placed gang onto one node may pay), and after
    ``deadline`` (``time.perf_counter()``) when one is given."""
    pr = problem
    pr.check_assignment(assign)
    a = assign.copy()
    if pr.overflow(a).size or pr.partial_groups(a).size:
        raise ValidationError("assign", "must be feasible (repair it first): a bin is "
                              "overfilled or a gang placed in part")
    rng = np.random.default_rng(seed)
    rows = np.arange(pr.num_pods)
    load = pr.loads(a)
    obj = pr.objective(a)
    # The room a pod takes, for the "value per room" order (its first slot's amounts).
    size = np.maximum(pr.amount[:, 1, :].sum(axis=1) if pr.amount.shape[1] > 1
                      else np.ones(pr.num_pods), 1e-9)
    grouped = pr.group is not None
    pairs = pr.colocated_pairs(a) if pr.colocate else 0
    kept = 0
    # With co-location, moving placed gangs can pay even when no pod is left out.
    members = np.flatnonzero(pr.group >= 0) if pr.colocate else np.zeros(0, np.int64)
    for _ in range(rounds):
        if deadline is not None and time.perf_counter() > deadline:
            break
        left = np.flatnonzero((a == 0) & (pr.nslots > 1))
        if left.size == 0 and members.size == 0:
            break  # nothing left out: no value to gain
        cand = pr.node[np.concatenate([left, members]), 1:]
        cand = np.unique(cand[cand >= 0])
        if cand.size == 0:
            break
        where = pr.node[rows, a]
        picks = _related(pr, a, where, int(rng.choice(cand)), int(rng.integers(1, ruin + 1)),
                         rng)
        off = (a > 0) & np.isin(where, picks)
        if grouped:
            off |= (a > 0) & np.isin(pr.group, np.unique(pr.group[off & (pr.group >= 0)]))
        trial = a.copy()
        tl = load.copy()
        for i in np.flatnonzero(off):
            np.subtract.at(tl, pr.bins[i, trial[i]], pr.amount[i, trial[i]])
        trial[off] = 0
        # Only the picked nodes gained room: a pod left out before (none of its slots fit)
        # can fit now only through them.
        pool = np.flatnonzero(off | ((a == 0) & np.isin(pr.node, picks).any(axis=1)))
        worth = pr.value[pool] * (1.0 if rng.random() < 0.5 else 1.0 / size[pool])
        worth = worth * rng.lognormal(0.0, 0.25, pool.size)
        tight = bool(rng.random() < 0.5)
        for unit in _units(pr, pool, worth):
            if grouped and pr.group[unit[0]] >= 0 and \
                    unit.size < pr.group_size[pr.group[unit[0]]]:
                continue  # a member has no slot: the gang is never whole
            _place(pr, unit, trial, tl, tight)
        moved = np.flatnonzero(trial != a)  # feasible by construction: only the sum moves
        new = obj + float(pr.cost[moved, a[moved]].sum() - pr.cost[moved, trial[moved]].sum())
        if pr.colocate:
            pt = pr.colocated_pairs(trial)
            new += pr.colocate * (pt - pairs)
        if new > obj + 1e-12:
            a, load, obj = trial, tl, new
            pairs = pt if pr.colocate else 0
            kept += 1
    return a, kept


def _units(pr: WindowProblem, pods: np.ndarray, worth: np.ndarray) -> list[np.ndarray]:
    """``pods`` as units (a pod, or a gang's members among them), highest worth first."""
    if pr.group is None:
        return [np.array([i]) for i in pods[np.argsort(-worth, kind="stable")]]
    keys = np.where(pr.group[pods] >= 0, pr.group[pods], -1 - pods)
    uniq, inv = np.unique(keys, return_inverse=True)
    total = np.bincount(inv, weights=worth, minlength=uniq.size)
    return [pods[inv == j] for j in np.argsort(-total, kind="stable")]


def _related(pr: WindowProblem, a: np.ndarray, where: np.ndarray, first: int, size: int,
             rng: np.random.Generator) -> np.ndarray:
    """Up to ``size`` nodes grown from ``first`` through the pods that could move between
    them: each step adds a random node among the slots of the pods placed on the nodes
    so far or left out with a slot there (a chain of moves stays inside the set)."""
    picked = [first]
    for _ in range(size - 1):
        on = np.isin(where, picked) | ((a == 0) & np.isin(pr.node, picked).any(axis=1))
        near = np.unique(pr.node[on, 1:])
        near = near[(near >= 0) & ~np.isin(near, picked)]
        if near.size == 0:
            break
        picked.append(int(rng.choice(near)))
    return np.array(picked)
