"""Make any assignment feasible in the model, then fill what room is left.

Owns the guarantee that the annealer's answer is 100 % feasible whatever state
the search ended in: pods are taken off overfilled bins (the least valuable
first) until none is overfilled, gangs placed in part are taken off whole, then
the pods left out try their slots again, most valuable first (a gang as one
unit: every member or none), best slot first. The result never has less
objective than the feasible part of its input.
"""

from __future__ import annotations

import time

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
    part = pr.partial_groups(a)
    if part.size:  # a gang left in part holds room for nothing: off whole
        out = np.flatnonzero(np.isin(pr.group, part) & (a > 0))
        for i in out:
            np.subtract.at(load, pr.bins[i, a[i]], pr.amount[i, a[i]])
        a[out] = 0
        removed += out.size
    added = fill(pr, a, load)
    return a, {"removed": removed, "added": added}


def units(problem: WindowProblem, pods: np.ndarray) -> list[np.ndarray]:
    """``pods`` as placement units -- a pod of its own, or all of a gang's members among
    them -- most valuable first (a gang's value is its members' sum)."""
    pr = problem
    if pr.group is None:
        return [np.array([i]) for i in pods[np.argsort(-pr.value[pods], kind="stable")]]
    out: dict[int, list[int]] = {}
    for i in pods:
        g = int(pr.group[i])
        out.setdefault(g if g >= 0 else -1 - int(i), []).append(int(i))
    us = [np.array(m) for m in out.values()]
    worth = np.array([pr.value[u].sum() for u in us])
    return [us[j] for j in np.argsort(-worth, kind="stable")]


def fit_unit(problem: WindowProblem, unit: np.ndarray, a: np.ndarray, load: np.ndarray
             ) -> bool:
    """Place every pod of ``unit`` by ``first_fit`` into ``a``/``load``, or none of them
    (both unchanged) when one does not fit."""
    if len(unit) == 1:  # a pod of its own: no copy of the loads needed
        a[unit[0]] = first_fit(problem, int(unit[0]), load)
        return bool(a[unit[0]])
    trial = load.copy()
    got = [first_fit(problem, int(i), trial) for i in unit]
    if not all(got):
        return False
    a[unit] = got
    load[:] = trial
    return True


def fill(problem: WindowProblem, a: np.ndarray, load: np.ndarray) -> int:
    """Let the pods left out (whole gangs only: a gang placed in part must be off first)
    try their slots, most valuable unit first; returns the pods placed."""
    pr = problem
    left = np.flatnonzero((a == 0) & (pr.nslots > 1))
    if pr.group is not None:  # a gang is one unit only when no member is placed
        busy = np.unique(pr.group[(a > 0) & (pr.group >= 0)])
        left = left[~np.isin(pr.group[left], busy) | (pr.group[left] < 0)]
    added = 0
    for u in units(pr, left):
        g = -1 if pr.group is None else int(pr.group[u[0]])
        if g >= 0 and u.size < pr.group_size[g]:
            continue  # a member has no candidate slot: the gang is never whole
        if fit_unit(pr, u, a, load):
            added += u.size
    return added


def polish(problem: WindowProblem, assign: np.ndarray, max_tries: int = 4000,
           deadline: float | None = None) -> tuple[np.ndarray, int]:
    """Ejection chains on a feasible assignment: a pod left out takes one of its slots by
    taking out the least valuable pods in its way, which then try their other slots; the
    chain is kept when the objective rises. Pods left out go most valuable first, each
    slot best first, for at most ``max_tries`` (pod, slot) attempts over at most three
    passes, and no attempt after ``deadline`` (``time.perf_counter()``); returns the
    assignment and the chains kept. Deterministic without a deadline."""
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
    # A gang member never starts a chain (its gang would be placed in part); one in a
    # chain's way is moved to another of its slots, first, or the chain is dropped.
    alone = np.ones(pr.num_pods, dtype=bool) if pr.group is None else pr.group < 0
    for _ in range(3):
        improved = False
        left = np.flatnonzero((a == 0) & (pr.nslots > 1) & alone)
        for u in left[np.argsort(-pr.value[left], kind="stable")]:
            if a[u] != 0:
                continue
            for c in range(1, int(pr.nslots[u])):
                if tries >= max_tries or (deadline is not None and tries % 64 == 0
                                          and time.perf_counter() > deadline):
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
                out = out[np.lexsort((-pr.value[out], alone[out]))]  # members first
                for i in out:
                    trial[i] = first_fit(pr, int(i), tl)
                    if trial[i] == 0 and not alone[i]:
                        break  # its gang would be left in part
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
