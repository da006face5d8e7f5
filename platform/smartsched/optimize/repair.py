"""Make any assignment feasible in the model, then fill what room is left.

Owns the guarantee that the annealer's answer is 100 % feasible whatever state
the search ended in: pods are taken off overfilled bins (the least valuable
first) until none is overfilled, then the pods left out try their slots again,
most valuable first, best slot first. The result never has less objective
than the feasible part of its input.
"""

from __future__ import annotations

import numpy as np

from smartsched.optimize.problem import EPS, WindowProblem


def first_fit(problem: WindowProblem, i: int, load: np.ndarray) -> int:
    """Pod ``i``'s first slot (slots are best-scored first) that overfills no bin under
    ``load``, taken into ``load``; 0 (and ``load`` unchanged) when none fits."""
    n = int(problem.nslots[i])
    if n <= 1:
        return 0
    b = problem.bins[i, 1:n]
    hit = np.flatnonzero(np.all(load[b] + problem.amount[i, 1:n] <= problem.cap[b] + EPS,
                                axis=1))
    if not hit.size:
        return 0
    c = int(hit[0]) + 1
    np.add.at(load, problem.bins[i, c], problem.amount[i, c])
    return c


def repair(problem: WindowProblem, assign: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    """A feasible assignment from ``assign``, and how many pods each step moved."""
    pr = problem
    pr.check_assignment(assign)
    a = assign.copy()
    load = pr.loads(a)
    removed = 0
    over = np.flatnonzero(load[:-1] > pr.cap[:-1] + EPS)
    while over.size:
        b = int(over[0])
        rows = np.arange(pr.num_pods)
        touching = np.flatnonzero(np.any(pr.bins[rows, a] == b, axis=1) & (a > 0))
        i = int(touching[np.argmin(pr.value[touching])])
        np.subtract.at(load, pr.bins[i, a[i]], pr.amount[i, a[i]])
        a[i] = 0
        removed += 1
        over = np.flatnonzero(load[:-1] > pr.cap[:-1] + EPS)
    added = 0
    left = np.flatnonzero((a == 0) & (pr.nslots > 1))
    for i in left[np.argsort(-pr.value[left], kind="stable")]:
        a[i] = first_fit(pr, int(i), load)
        added += int(a[i] > 0)
    return a, {"removed": removed, "added": added}


def polish(problem: WindowProblem, assign: np.ndarray, max_tries: int = 4000
           ) -> tuple[np.ndarray, int]:
    """Ejection chains on a feasible assignment: a pod left out takes one of its slots by
    taking out the least valuable pods in its way, which then try their other slots; the
    chain is kept when the objective rises. Pods left out go most valuable first, each
    slot best first, for at most ``max_tries`` (pod, slot) attempts over at most three
    passes; returns the assignment and the chains kept. Deterministic."""
    pr = problem
    pr.check_assignment(assign)
    a = assign.copy()
    if pr.overflow(a).size:
        a, _ = repair(pr, a)
    rows = np.arange(pr.num_pods)
    load = pr.loads(a)
    cur_bins = pr.bins[rows, a]
    obj = pr.objective(a)
    tries = kept = 0
    for _ in range(3):
        improved = False
        left = np.flatnonzero((a == 0) & (pr.nslots > 1))
        for u in left[np.argsort(-pr.value[left], kind="stable")]:
            if a[u] != 0:
                continue
            for c in range(1, int(pr.nslots[u])):
                if tries >= max_tries:
                    return a, kept
                tries += 1
                b, w = pr.bins[u, c], pr.amount[u, c]
                need = load[b] + w - pr.cap[b]
                short = b[(need > EPS) & (b < pr.num_bins)]
                if short.size == 0:
                    continue  # it fits as it is: repair's fill would have placed it
                hit = np.flatnonzero(np.isin(cur_bins, short).any(axis=1) & (a > 0))
                if hit.size == 0 or pr.value[hit].min() >= pr.value[u]:
                    continue
                trial = a.copy()
                tl = load.copy()
                for i in hit[np.argsort(pr.value[hit], kind="stable")]:
                    if np.all(tl[b] + w <= pr.cap[b] + EPS):
                        break
                    np.subtract.at(tl, pr.bins[i, trial[i]], pr.amount[i, trial[i]])
                    trial[i] = 0
                if not np.all(tl[b] + w <= pr.cap[b] + EPS):
                    continue
                trial[u] = c
                np.add.at(tl, b, w)
                out = np.flatnonzero((trial == 0) & (a > 0))
                for i in out[np.argsort(-pr.value[out], kind="stable")]:
                    trial[i] = first_fit(pr, int(i), tl)
                new = pr.objective(trial)
                if new > obj + 1e-12:
                    a, load, obj = trial, tl, new
                    cur_bins = pr.bins[rows, a]
                    kept += 1
                    improved = True
                    break
        if not improved:
            break
    return a, kept
