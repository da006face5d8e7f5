"""Simulated annealing and parallel tempering over a ``WindowProblem``, in numpy.

Owns the quantum-inspired solver: many replicas of the assignment evolve at
once, each a Markov chain over the one-hot variables (a move re-assigns one
pod to another of its slots: the one-hot constraint is kept by the move rather
than by a penalty, as annealers with "constraint-preserving" moves do). A
``heat-bath`` move weighs the pod's current slot, "unplaced" and ``TRIES``
random slots by exp(-dE / T) and draws one; a ``metropolis`` move tests one.

Vectorized in two directions: across replicas, and within a replica a batch
of pods proposes moves at once. Moves of one batch are evaluated against the
same loads, so two moves touching the same node could each look good and
together overfill it: of the moves that want to go, a batch keeps those whose
nodes (old and new) and pod no earlier one shares, which makes their energy
changes exact and independent. A *sweep* offers every pod about one move per
replica. Gang members move one at a time (a batch keeps at most one move per
gang), and a gang placed in part pays ``lam_g`` in full throughout: a placed
gang's members move between their slots, and whole gangs come and go through
the start states and repair. The overflow
penalty starts soft and hardens (``_penalty_schedule``): the chain may pass
through overfilled bins to rearrangements a hard wall would block; states are
judged by the full penalty.

``sa``: every replica follows one geometric schedule from ``t_start`` down to
``t_end``. ``pt`` (parallel tempering / replica exchange): the replicas hold
rungs of a fixed ladder, cold and strict to hot and soft, and neighbours swap
rungs after every sweep by the Metropolis rule, so good states cool while hot
replicas keep exploring. Replica 0 starts from the problem's start (the pods'
homes), the others from greedy packings of the pods in random orders. Both
return the lowest-energy state any replica visited at a sweep's end, or any
replica's last state once repaired (``optimize.repair``), whichever is lower.
Deterministic for a seed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from smartsched.model.errors import ValidationError
from smartsched.optimize.problem import EPS, WindowProblem
from smartsched.optimize.repair import first_fit, fit_unit, repair

METHODS = ("sa", "pt")
MOVES = ("heat-bath", "metropolis")
TRIES = 4  # random slots a heat-bath move weighs beside staying and leaving
# Bin entries of a slot: the node's own first (cpu, memory, FPGA, in that order), then
# its devices (``candidates._bins`` lays them out so).
NODE_ENTRIES = 3


@dataclass(frozen=True)
class AnnealResult:
    """The best assignment found and how the search went.

    ``trace``: (sweep, seconds, best energy so far) after each sweep: the time-quality
    curve. ``accepted``: share of proposed moves accepted over the run.
    """

    assign: np.ndarray
    energy: float
    sweeps: int
    seconds: float
    trace: tuple[tuple[int, float, float], ...]
    accepted: float


def greedy_assignment(problem: WindowProblem, order: np.ndarray | None = None) -> np.ndarray:
    """Each pod in ``order`` (default: window order) takes its first slot (slots are
    best-scored first) that overfills no bin given the pods before it; slot 0 if none."""
    load = np.zeros(problem.num_bins + 1)
    assign = np.zeros(problem.num_pods, dtype=np.int64)
    group = problem.group
    done: set[int] = set()
    for i in (range(problem.num_pods) if order is None else order):
        g = -1 if group is None else int(group[i])
        if g < 0:
            assign[i] = first_fit(problem, int(i), load)
        elif g not in done:  # a gang, when its first member comes: all members or none
            done.add(g)
            fit_unit(problem, np.flatnonzero(group == g), assign, load)
    return assign


def anneal(
    problem: WindowProblem,
    *,
    sweeps: int = 60,
    replicas: int = 16,
    method: str = "sa",
    seed: int = 0,
    batch: int = 64,
    t_start: float | None = None,
    t_end: float | None = None,
    init: np.ndarray | None = None,
    time_limit_s: float | None = None,
    soft: bool = True,
    move: str = "heat-bath",
) -> AnnealResult:
    """Search low-energy assignments of ``problem``.

    ``t_start`` / ``t_end`` default to twice and a thousandth of the median pod value,
    so the schedule fits any units of value. ``init``: the starting assignment of every
    replica (default: the problem's ``start``, else ``greedy_assignment``).
    ``time_limit_s`` stops early after a sweep. ``soft``: the overflow penalty starts
    soft and hardens (``_penalty_schedule``; with ``pt``, the ladder's hot rungs are the
    soft ones). ``move``: a heat-bath draw among a few slots (default) or a Metropolis
    test of one.
    """
    if method not in METHODS:
        raise ValidationError("method", f"must be one of {', '.join(METHODS)}, got {method!r}")
    if move not in MOVES:
        raise ValidationError("move", f"must be one of {', '.join(MOVES)}, got {move!r}")
    heat_bath = move == "heat-bath"
    for name, v, lo in (("sweeps", sweeps, 1), ("replicas", replicas, 1), ("batch", batch, 1)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
            raise ValidationError(name, f"must be an integer >= {lo}, got {v!r}")
    problem.validate()
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    pr = problem
    p, r, nb = pr.num_pods, int(replicas), pr.num_bins + 1
    bsz = int(min(batch, p))
    med = float(np.median(pr.value))
    hi = float(t_start) if t_start is not None else 2.0 * med
    lo = float(t_end) if t_end is not None else 1e-3 * med
    if not 0 < lo <= hi:
        raise ValidationError("t_end", f"must satisfy 0 < t_end <= t_start, got {lo}, {hi}")

    if init is not None:
        start = np.asarray(init, dtype=np.int64)
    elif pr.start is not None:
        start = pr.start
    else:
        start = greedy_assignment(pr)
    pr.check_assignment(start)
    a = np.tile(start, (r, 1))
    if init is None:
        # Diverse starts: replica 0 from the start, the others greedy over pods in a
        # random order each (a different packing to anneal from).
        for q in range(1, r):
            a[q] = greedy_assignment(pr, rng.permutation(p))
    load = np.stack([pr.loads(x) for x in a])
    flat_load = load.reshape(-1)
    energy = np.array([pr.energy(x) for x in a])
    cost_part = pr.cost[np.arange(p)[None, :], a].sum(axis=1)
    cap_r = np.tile(pr.cap, r)
    best_e = energy.copy()
    best_a = a.copy()
    soft_l1 = _soft_slope(pr) if soft else pr.lam1
    if method == "pt":
        # A ladder of rungs from cold and strict (the full penalty) to hot and soft;
        # replica j holds rung ``rung[j]`` and neighbours swap rungs.
        f = np.linspace(0.0, 1.0, r) if r > 1 else np.zeros(1)
        ladder_t = lo * (hi / lo) ** f
        ladder_l0 = pr.lam0 * (1.0 - f) ** 2 if soft else np.full(r, pr.lam0)
        ladder_l1 = pr.lam1 * (soft_l1 / pr.lam1) ** f
        rung = np.arange(r)
    else:
        temp = np.full(r, hi)
    cooling = (lo / hi) ** (1.0 / max(sweeps - 1, 1))

    cap, nslots = pr.cap, pr.nslots
    kw = pr.cost.shape[1]
    ent = pr.bins.shape[2]
    # Slot rows, flat (slot id = pod * K + slot): one gather a move instead of two.
    cost_f = pr.cost.reshape(-1)
    bins_f = pr.bins.reshape(-1, ent)
    amt_f = pr.amount.reshape(-1, ent)
    node_f = pr.node.reshape(-1)
    rows = np.arange(r)[:, None]
    steps = max(1, -(-p // bsz))
    movable_pods = np.flatnonzero(nslots > 1)
    trace: list[tuple[int, float, float]] = []
    proposed = accepted = 0
    done = 0
    nn1 = pr.num_nodes + 1
    lam_sched = _penalty_schedule(pr, sweeps, soft_l1)
    # Gangs: members placed per gang and replica; a gang placed in part pays lam_g, in
    # full from the start (a soft gang penalty was tried: early sweeps then break gangs up
    # and their room goes to single pods, so fewer gangs end whole). A placed gang's
    # members move between their slots freely; a gang starts or stops whole through
    # repair's fill and the start states.
    ng = pr.num_groups
    grp = pr.group if ng else np.full(p, -1, dtype=np.int64)
    gsize = pr.group_size if ng else np.ones(1, dtype=np.int64)
    gcnt = np.stack([pr.group_placed(x) for x in a]) if ng else np.zeros((r, 1), np.int64)
    flat_g = gcnt.reshape(-1)
    ngk = max(ng, 1)
    # Co-location: members of each gang per node and replica ([R, G, N] flat), and each
    # replica's pairs of members sharing a node (the term is -colocate x pairs).
    colo = pr.colocate if ng else 0.0
    nnod = pr.num_nodes
    pair_r = np.array([pr.colocated_pairs(x) for x in a], dtype=float) if colo else \
        np.zeros(r)
    if colo:
        on = np.zeros(r * ngk * nnod, dtype=np.int64)
        for q in range(r):
            m = np.flatnonzero((grp >= 0) & (a[q] > 0))
            np.add.at(on, q * ngk * nnod + grp[m] * nnod + pr.node[m, a[q, m]], 1)
    if movable_pods.size:
        for sweep in range(sweeps):
            if method == "pt":
                temp = ladder_t[rung]
                l0r, l1r = ladder_l0[rung], ladder_l1[rung]
            else:
                l0r, l1r = np.full(r, lam_sched[sweep][0]), np.full(r, lam_sched[sweep][1])
            l0, l1 = l0r[:, None, None], l1r[:, None, None]

            def pen(x: np.ndarray, c: np.ndarray, l0: np.ndarray = l0,
                    l1: np.ndarray = l1) -> np.ndarray:
                o = x - c
                return np.where(o > EPS, l0 + l1 * o, 0.0)

            for _ in range(steps):
                pi = movable_pods[rng.integers(0, movable_pods.size, size=(r, bsz))]
                ns = nslots[pi]
                cur = a[rows, pi]
                so = pi * kw + cur
                bo, ao = np.take(bins_f, so, axis=0), np.take(amt_f, so, axis=0)
                fo = bo + (rows * nb)[..., None]
                lo_ = np.take(flat_load, fo)
                co = np.take(cap, bo)
                drem = (pen(lo_ - ao, co) - pen(lo_, co)).sum(axis=2)
                no = np.take(node_f, so)
                gi = np.take(grp, pi)
                ing = gi >= 0
                if ng:
                    gs = np.maximum(gi, 0)
                    gc = np.take(flat_g, rows * ngk + gs)
                    gz = np.take(gsize, gs)
                    was = (cur > 0).astype(np.int64)
                    part0 = (gc > 0) & (gc < gz)
                if colo:  # pairs the member leaves behind on its node
                    cb = rows * (ngk * nnod) + gs * nnod
                    lost = np.where(ing & (cur > 0), np.take(on, cb + np.maximum(no, 0)) - 1, 0)
                if heat_bath:
                    # A few slots of the pod -- its current one, "unplaced", and TRIES at
                    # random -- weighed by exp(-dE / T): a Gibbs update over them.
                    choice = np.concatenate(
                        [cur[..., None], np.zeros((r, bsz, 1), dtype=np.int64),
                         rng.integers(0, 1 << 30, size=(r, bsz, TRIES)) % ns[..., None]],
                        axis=2)  # [R, B, M]
                    sk = pi[..., None] * kw + choice
                    bk = np.take(bins_f, sk, axis=0)  # [R, B, M, E]
                    ak = np.take(amt_f, sk, axis=0)
                    nk = np.take(node_f, sk)
                    lk = np.take(flat_load, bk + (rows * nb)[..., None, None])
                    _gone(lk, (nk == no[..., None]) & (no[..., None] >= 0), ao, bo, bk)
                    over = lk - np.take(cap, bk)
                    added = over + ak
                    dk = (np.take(cost_f, sk) - np.take(cost_f, so)[..., None] + drem[..., None]
                          + (np.where(added > EPS, l0[..., None] + l1[..., None] * added, 0.0)
                             - np.where(over > EPS, l0[..., None] + l1[..., None] * over,
                                        0.0)).sum(axis=3))
                    if ng:  # a member placed or taken out moves its gang's count
                        c1 = gc[..., None] + (choice > 0) - was[..., None]
                        part1 = (c1 > 0) & (c1 < gz[..., None])
                        dk += np.where(ing[..., None],
                                       pr.lam_g * (part1.astype(float) - part0[..., None]),
                                       0.0)
                    if colo:  # pairs it joins on the candidate node
                        join = np.take(on, cb[..., None] + np.maximum(nk, 0)) - (
                            (nk == no[..., None]) & (cur[..., None] > 0))
                        dk -= colo * np.where(ing[..., None] & (choice > 0),
                                              join - lost[..., None], 0)
                    dk[..., 0] = 0.0  # staying put
                    with np.errstate(over="ignore", invalid="ignore"):
                        w = np.exp(-(dk - dk.min(axis=2, keepdims=True)) / temp[:, None, None])
                    cw = np.cumsum(w, axis=2)
                    pick = np.argmax(cw > rng.random((r, bsz, 1)) * cw[..., -1:], axis=2)
                    new = np.take_along_axis(choice, pick[..., None], axis=2)[..., 0]
                    dE = np.take_along_axis(dk, pick[..., None], axis=2)[..., 0]
                    sn = pi * kw + new
                    bn = np.take_along_axis(bk, pick[..., None, None], axis=2)[:, :, 0]
                    an = np.take_along_axis(ak, pick[..., None, None], axis=2)[:, :, 0]
                    nn = np.take(node_f, sn)
                    same = (no == nn) & (no >= 0)
                else:
                    new = (cur + rng.integers(1, ns)) % ns
                    sn = pi * kw + new
                    bn, an = np.take(bins_f, sn, axis=0), np.take(amt_f, sn, axis=0)
                    nn = np.take(node_f, sn)
                    same = (no == nn) & (no >= 0)
                    ln = np.take(flat_load, bn + (rows * nb)[..., None])
                    _gone(ln, same, ao, bo, bn)
                    cn = np.take(cap, bn)
                    dE = (np.take(cost_f, sn) - np.take(cost_f, so) + drem
                          + (pen(ln + an, cn) - pen(ln, cn)).sum(axis=2))
                    if ng:
                        c1 = gc + (new > 0) - was
                        dE = dE + np.where(ing, pr.lam_g * (((c1 > 0) & (c1 < gz))
                                                            .astype(float) - part0), 0.0)
                if colo:  # the pairs the move makes, net (a heat-bath draw already counted)
                    joined = np.take(on, cb + np.maximum(nn, 0)) - (same & (cur > 0))
                    dpair = np.where(ing & (new > 0), joined, 0) - lost
                    if not heat_bath:
                        dE = dE - colo * dpair
                dc = np.take(cost_f, sn) - np.take(cost_f, so)
                fn = bn + (rows * nb)[..., None]
                if heat_bath:  # a Gibbs draw is its own acceptance
                    want = new != cur
                else:
                    with np.errstate(over="ignore"):
                        metro = rng.random((r, bsz)) < np.exp(-np.maximum(dE, 0)
                                                              / temp[:, None])
                    want = (dE <= 0) | metro
                # Of the moves that want to go, keep those no earlier one in the batch shares
                # a node (old or new) or the pod with: their energy changes stay exact.
                base = rows * nn1
                ko = np.where(no >= 0, base + no, -1)
                kn = np.where((nn >= 0) & ~same, base + nn, -1)
                kp = r * nn1 + rows * p + pi
                # A gang's members move one at a time per batch (its count stays exact).
                kg = np.where(ing, r * nn1 + r * p + rows * ngk + np.maximum(gi, 0), -1)
                acc = want & ~_blocked(want, (ko, kn, kp, kg))
                proposed += r * bsz
                if not acc.any():
                    continue
                accepted += int(acc.sum())
                ri, ci = np.nonzero(acc)
                a[ri, pi[ri, ci]] = new[ri, ci]
                flat_load[fo[ri, ci]] -= ao[ri, ci]
                flat_load[fn[ri, ci]] += an[ri, ci]
                cost_part += np.bincount(ri, weights=dc[ri, ci], minlength=r)
                if ng:
                    gm = ing[ri, ci]
                    if gm.any():
                        rg, cg = ri[gm], ci[gm]
                        np.add.at(flat_g, rg * ngk + gi[rg, cg],
                                  (new[rg, cg] > 0).astype(np.int64) - (cur[rg, cg] > 0))
                        if colo:
                            pair_r += np.bincount(rg, weights=dpair[rg, cg], minlength=r)
                            left_ = cur[rg, cg] > 0
                            np.add.at(on, cb[rg, cg][left_] + no[rg, cg][left_], -1)
                            came = new[rg, cg] > 0
                            np.add.at(on, cb[rg, cg][came] + nn[rg, cg][came], 1)
            # Judge states by the full penalty, whatever this sweep's was.
            o = (flat_load - cap_r).reshape(r, nb)
            n_over = (o > EPS).sum(axis=1)
            s_over = np.where(o > EPS, o, 0.0).sum(axis=1)
            n_part = ((gcnt > 0) & (gcnt < gsize)).sum(axis=1) if ng else np.zeros(r)
            energy = (cost_part + pr.lam0 * n_over + pr.lam1 * s_over + pr.lam_g * n_part
                      - colo * pair_r)
            better = energy < best_e - 1e-12
            if better.any():
                best_e[better] = energy[better]
                best_a[better] = a[better]
            done = sweep + 1
            trace.append((done, time.perf_counter() - t0, float(best_e.min())))
            if method == "sa":
                temp *= cooling
            elif r > 1:
                # A gang in part costs lam_g on every rung: part of each state's cost.
                _swap(rung, cost_part + pr.lam_g * n_part - colo * pair_r, n_over, s_over,
                      ladder_t, ladder_l0, ladder_l1, rng, sweep % 2)
            if time_limit_s is not None and time.perf_counter() - t0 >= time_limit_s:
                break
    # The replicas' last states, repaired, compete with the best seen at a sweep's end
    # (a state still paying for overfilled bins may be one repair away from the best).
    for q in range(r if done else 0):
        fixed, _ = repair(pr, a[q])
        e = pr.energy(fixed)
        if e < best_e[q] - 1e-12:
            best_e[q], best_a[q] = e, fixed
    j = int(np.argmin(best_e))
    best = best_a[j].copy()
    return AnnealResult(best, pr.energy(best), done, time.perf_counter() - t0, tuple(trace),
                        accepted / max(proposed, 1))


def _blocked(want: np.ndarray, keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """[R, B] moves (of those in ``want``) that share a key -- a node or a pod, each
    ``keys`` array giving one per move, -1 for none -- with an earlier wanting move."""
    ids = np.flatnonzero(want.ravel())
    out = np.zeros(want.size, dtype=bool)
    if ids.size < 2:
        return out.reshape(want.shape)
    kk = np.concatenate([k.ravel()[ids] for k in keys])
    who = np.tile(ids, len(keys))
    has = kk >= 0
    kk, who = kk[has], who[has]
    order = np.lexsort((who, kk))
    ks = kk[order]
    later = np.zeros(ks.size, dtype=bool)
    later[1:] = ks[1:] == ks[:-1]
    out[who[order][later]] = True
    return out.reshape(want.shape)


def _gone(load: np.ndarray, same: np.ndarray, ao: np.ndarray, bo: np.ndarray,
          bn: np.ndarray) -> None:
    """Take the pod's current slot out of ``load`` (the loads its new slots see) where a
    new slot is on the same node as the current one (``same``): the node's own bins at
    the same entries, devices wherever the two slots share one. ``load``/``bn``/``same``
    may carry an extra slot axis after the batch axes of ``ao``/``bo``."""
    if not same.any():
        return
    idx = np.nonzero(same)
    head = idx[:2]  # replica, batch position
    gone = np.zeros((idx[0].size, load.shape[-1]))
    gone[:, :NODE_ENTRIES] = ao[head][:, :NODE_ENTRIES]
    dvo, dvn = bo[head][:, NODE_ENTRIES:], bn[idx][:, NODE_ENTRIES:]
    gone[:, NODE_ENTRIES:] = ((dvo[:, :, None] == dvn[:, None, :])
                              * ao[head][:, NODE_ENTRIES:, None]).sum(axis=1)
    load[idx] -= gone


def _soft_slope(pr: WindowProblem) -> float:
    """The window's median value density: a pod's value per unit of its largest demand
    (overfilling a bin to place a pod then costs about what the pod is worth)."""
    top = np.where(np.isfinite(pr.cost), pr.amount.max(axis=2), 0.0)[:, 1:]
    top = top.max(axis=1, initial=0.0)  # (0 when no pod has a candidate: a full cluster)
    dens = pr.value[top > 0] / top[top > 0]
    return min(float(np.median(dens)) if dens.size else pr.lam1, pr.lam1)


def _penalty_schedule(pr: WindowProblem, sweeps: int,
                      s1: float) -> list[tuple[float, float]]:
    """(step, slope) of the overflow penalty at each sweep of ``sa``: from no step and
    slope ``s1`` up to the problem's own, geometrically, reached by the last fifth of
    the sweeps (``s1 = lam1``: the full penalty throughout); the state goes through
    overfilled bins on its way to rearrangements a hard wall would block."""
    if s1 >= pr.lam1 or sweeps < 2:
        return [(pr.lam0, pr.lam1)] * sweeps
    ramp = max(1, int(0.8 * sweeps) - 1)
    out = []
    for i in range(sweeps):
        f = min(i / ramp, 1.0)
        out.append((pr.lam0 * f ** 2 if f < 1.0 else pr.lam0,
                    s1 * (pr.lam1 / s1) ** f))
    return out


def _swap(rung: np.ndarray, cost: np.ndarray, n_over: np.ndarray, s_over: np.ndarray,
          temp: np.ndarray, l0: np.ndarray, l1: np.ndarray, rng: np.random.Generator,
          parity: int) -> None:
    """Replica exchange on the ladder: replicas on neighbouring rungs (pairs starting at
    ``parity``) swap rungs with the Metropolis rule for two temperatures *and* two
    penalties: min(1, exp(sum of H_k(x)/T_k before - after))."""
    who = np.argsort(rung)  # who[q]: the replica on rung q
    a, b = who[parity:-1:2], who[parity + 1::2]
    m = min(a.size, b.size)
    a, b = a[:m], b[:m]
    if m == 0:
        return
    qa, qb = rung[a], rung[b]

    def h(x: np.ndarray, q: np.ndarray) -> np.ndarray:
        return (cost[x] + l0[q] * n_over[x] + l1[q] * s_over[x]) / temp[q]

    arg = h(a, qa) + h(b, qb) - h(a, qb) - h(b, qa)
    with np.errstate(over="ignore"):
        swap = rng.random(m) < np.exp(np.minimum(arg, 0.0))
    rung[a[swap]], rung[b[swap]] = qb[swap], qa[swap]
