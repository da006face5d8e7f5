"""The exact reference: the window's model as a mixed-integer program, solved by HiGHS.

Owns proving how good the annealer is. The same ``WindowProblem`` becomes a
0/1 program: one variable per candidate slot, at most one slot per pod, every
bin within its capacity, a gang's members all placed or none, maximize value
placed plus score bonus, plus gang co-location where the problem has it (one
more binary per pair of a gang's members and node both could take: the
annealer's objective). HiGHS (through
``scipy.optimize.milp``, already a dependency of the stack) proves optimality
on instances up to a few thousand variables within seconds; past its time limit
it returns its best answer and bound, and the result says the optimum is *not*
proven.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from smartsched.model.errors import ValidationError
from smartsched.optimize.problem import WindowProblem


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """HiGHS prints some progress lines from C straight to the process's stdout, whatever
    ``disp`` says: send file descriptor 1 to /dev/null while it runs."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no real stdout (an embedded interpreter): leave it
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


@dataclass(frozen=True)
class ExactResult:
    """``assign`` is the solver's best feasible assignment (None if it found none);
    ``optimal`` whether HiGHS proved it; ``bound`` the best upper bound on the objective."""

    assign: np.ndarray | None
    objective: float
    bound: float
    optimal: bool
    seconds: float
    status: str


def _widen(a: Any, extra: int) -> Any:
    """Sparse ``a`` with ``extra`` zero columns on the right."""
    from scipy.sparse import csr_matrix, hstack

    return hstack([a, csr_matrix((a.shape[0], extra))]).tocsr()


def solve_exact(problem: WindowProblem, time_limit_s: float = 60.0) -> ExactResult:
    """Maximize ``problem.objective`` exactly (or as far as ``time_limit_s`` allows)."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix, hstack, vstack

    if not time_limit_s > 0:
        raise ValidationError("time_limit_s", f"must be > 0, got {time_limit_s!r}")
    problem.validate()
    pr = problem
    t0 = time.perf_counter()
    pods, slots = np.nonzero(np.arange(pr.cost.shape[1])[None, :] < pr.nslots[:, None])
    real = slots > 0
    pods, slots = pods[real], slots[real]
    nvar = pods.size
    if nvar == 0:
        assign = np.zeros(pr.num_pods, dtype=np.int64)
        return ExactResult(assign, pr.objective(assign), pr.objective(assign), True,
                           time.perf_counter() - t0, "no candidates")
    # Placing pod i in slot c changes the energy by cost[i, c] - value_i (< 0): minimize it.
    c = pr.cost[pods, slots] - pr.value[pods]
    one = coo_matrix((np.ones(nvar), (pods, np.arange(nvar))), shape=(pr.num_pods, nvar))
    b = pr.bins[pods, slots]  # [nvar, E]
    w = pr.amount[pods, slots]
    keep = (b < pr.num_bins) & (w > 0)
    var = np.broadcast_to(np.arange(nvar)[:, None], b.shape)[keep]
    rows, inv = np.unique(b[keep], return_inverse=True)
    capm = coo_matrix((w[keep], (inv, var)), shape=(rows.size, nvar))
    a = vstack([one, capm]).tocsr()
    ub = np.concatenate([np.ones(pr.num_pods), pr.cap[rows]])
    constraints = [LinearConstraint(a, -np.inf, ub)]
    if pr.num_groups:
        # A gang all or nothing: each member placed exactly when the gang's first is.
        head = np.full(pr.num_groups, -1)
        members = np.flatnonzero(pr.group >= 0)
        for i in members[::-1]:
            head[pr.group[i]] = i
        tail = members[head[pr.group[members]] != members]
        if tail.size:
            sel = coo_matrix((np.ones(tail.size), (np.arange(tail.size), tail)),
                             shape=(tail.size, pr.num_pods)).tocsr()
            lead = coo_matrix((np.ones(tail.size), (np.arange(tail.size),
                                                    head[pr.group[tail]])),
                              shape=(tail.size, pr.num_pods)).tocsr()
            eq = ((sel - lead) @ one).tocsr()  # placed(member) - placed(head) == 0
            constraints.append(LinearConstraint(eq, 0.0, 0.0))
    ntot = nvar
    if pr.colocate and pr.num_groups:
        # A pair (i, j) of one gang on node n: y <= on(i, n), y <= on(j, n), where on(i, n)
        # sums i's slots on n; maximizing colocate * y makes y the product.
        node_of = pr.node[pods, slots]
        pairs = []
        for g in range(pr.num_groups):
            mem = np.flatnonzero(pr.group == g)
            for x, i in enumerate(mem):
                for j in mem[x + 1:]:
                    common = np.intersect1d(node_of[pods == i], node_of[pods == j])
                    pairs.extend((int(i), int(j), int(n)) for n in common)
        if pairs:
            npair = len(pairs)
            r_, c_ = [], []
            for q, (i, j, n) in enumerate(pairs):
                for who, row in ((i, 2 * q), (j, 2 * q + 1)):
                    vs = np.flatnonzero((pods == who) & (node_of == n))
                    r_.extend([row] * vs.size)
                    c_.extend(vs.tolist())
            on = coo_matrix((np.ones(len(r_)), (r_, c_)), shape=(2 * npair, nvar))
            ys = coo_matrix((np.full(2 * npair, -1.0), (np.arange(2 * npair),
                                                        np.repeat(np.arange(npair), 2))),
                            shape=(2 * npair, npair))
            # Every earlier row gets zero columns for the pair variables.
            constraints = [LinearConstraint(_widen(k.A, npair), k.lb, k.ub)
                           for k in constraints]
            constraints.append(LinearConstraint(hstack([on, ys]).tocsr(), 0.0, np.inf))
            c = np.concatenate([c, np.full(npair, -pr.colocate)])
            ntot = nvar + npair
    with _quiet():
        res = milp(c, constraints=constraints, integrality=np.ones(ntot),
                   bounds=Bounds(0, 1), options={"time_limit": float(time_limit_s),
                                                 "mip_rel_gap": 0.0})
    seconds = time.perf_counter() - t0
    if res.x is None:
        return ExactResult(None, float("-inf"), float("inf"), False, seconds, res.message)
    x = res.x[:nvar] > 0.5
    assign = np.zeros(pr.num_pods, dtype=np.int64)
    assign[pods[x]] = slots[x]
    bound = getattr(res, "mip_dual_bound", None)
    # objective = -(the program's minimum): its dual bound bounds the objective from above.
    bound_obj = -float(bound) if bound is not None and np.isfinite(bound) \
        else pr.objective(assign)
    return ExactResult(assign, pr.objective(assign), bound_obj, res.status == 0, seconds,
                       res.message)
