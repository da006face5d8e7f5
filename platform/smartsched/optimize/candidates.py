"""Turn a window of pods into a ``WindowProblem``: the profile's filters and scores, pruned.

Owns the pruning that makes joint placement tractable. A dense one-hot over
1,000 pods x 1,213 nodes is ~1.2 million variables; here each pod keeps ``k``
nodes that pass the profile's filters, and on each node up to ``d`` device
choices, so the window has at most ``P * k * d`` variables.

Pods with the same request (everything but the id and arrival) see the same
filters and scores against the window's starting state, so the profile runs
once per *shape*, not per pod. Identical pods must not all keep the same ``k``
nodes (a hundred of them would fight over room for ten): pod ``j`` of a shape
keeps the shape's ``ceil(k/2)`` best nodes, shared, and ``k - ceil(k/2)`` from its
*home* on: the node it would land on if the shape's pods alone filled the
ranked nodes in order, each holding as many as fit. Device choices are
rotated the same way: the tightest-fitting devices (the twin's default
binder) first, then a block starting at the pod's index among those sharing
its home, in the node's fitting devices, tightest first.

A candidate's score is the profile's weighted score over its filters' feasible
nodes, divided by its largest possible value (100 x the weights), so 0..1.
Gang members are pods like any other with a group constraint on top (all of a
gang's members placed or none: ``WindowProblem.group``); a home that places a
gang in part is no home. Best-effort pods (their own memory pool) are not
modelled; the placer decides them with the profile after the window.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod
from smartsched.model.resources import CPU, FPGA, GPU, MEM
from smartsched.optimize.problem import WindowProblem
from smartsched.scheduling.base import Scheduler, SplitScheduler
from smartsched.scheduling.framework import MAX_NODE_SCORE, ProfileScheduler
from smartsched.twin.state import (
    MILLI_PER_DEVICE,
    ClusterState,
    InfeasibleDecisionError,
    PodRequest,
)

VALUES = ("share", "count", "gpu")
HOMES = ("shapes", "profile")


@dataclass(frozen=True)
class Pruning:
    """How many candidates each pod keeps: ``k`` nodes, ``d`` device choices per node."""

    k: int = 8
    d: int = 2

    def __post_init__(self) -> None:
        for name in ("k", "d"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValidationError(name, f"must be an integer >= 1, got {v!r}")


_SHAPE_FIELDS = tuple(f.name for f in dataclasses.fields(Pod) if f.name not in ("id", "arrival"))


def profile_for(sched: Scheduler, request: PodRequest) -> ProfileScheduler | None:
    """The scheduling profile whose filters and scores decide ``request`` under ``sched``:
    itself, or a split profile's route for the pod's class; None when that is not a
    profile (a learned policy has no scores to prune by: the placer leaves such pods to
    it, after the window)."""
    if isinstance(sched, ProfileScheduler):
        return sched
    if isinstance(sched, SplitScheduler):
        return profile_for(sched.route(request), request)
    return None


def shape_key(pod: Pod) -> tuple:
    """What the profile's filters and scores can read of a pod: all of it but its id and
    arrival (two pods with equal keys get equal verdicts on one state)."""
    return tuple(getattr(pod, f) for f in _SHAPE_FIELDS)


def pod_values(state: ClusterState, requests: Sequence[PodRequest], value: str) -> np.ndarray:
    """What placing each pod is worth (``WindowProblem.value``).

    ``count``: 1 a pod (place as many as possible). ``gpu``: GPUs asked (devices, so 0.5
    for half a GPU) plus 0.01, so CPU-only pods still count: the fill experiment's GPU
    allocation. ``share``: the pod's dominant share of the cluster's mean node (cpu,
    memory, GPU devices of nodes that have them), plus 0.01: big pods first, as
    dominant-resource fairness measures size.
    """
    if value not in VALUES:
        raise ValidationError("value", f"must be one of {', '.join(VALUES)}, got {value!r}")
    if value == "count":
        return np.ones(len(requests))
    vec = np.array([r.vector for r in requests], dtype=np.float64).reshape(len(requests), -1)
    gpu = vec[:, GPU] / MILLI_PER_DEVICE
    if value == "gpu":
        return gpu + 0.01
    cap = state.capacity.astype(np.float64)
    mean = np.maximum(cap[:, [CPU, MEM]].mean(axis=0), 1.0)
    has = state.gpu_count > 0
    mean_gpu = float(state.gpu_count[has].mean()) if has.any() else 1.0
    share = np.maximum(np.maximum(vec[:, CPU] / mean[0], vec[:, MEM] / mean[1]), gpu / mean_gpu)
    return share + 0.01


def build_problem(
    sched: Scheduler,
    state: ClusterState,
    requests: Sequence[PodRequest],
    pruning: Pruning = Pruning(),
    *,
    value: str = "share",
    score_weight: float = 0.5,
    homes: str = "shapes",
    fixed: dict[int, tuple[int, tuple[int, ...]]] | None = None,
    colocate: float = 0.0,
) -> tuple[WindowProblem, dict[int, str]]:
    """The window's problem, and for pods no node passes, why (position -> message).

    ``sched``: a scheduling profile, or a split profile whose routes for these pods are
    profiles (each pod is filtered and scored by its own route).

    ``homes``: each pod's home slot, the annealer's start. ``shapes``: shapes take room
    in turn, biggest first, each filling its best-scored nodes (one profile run per
    shape: fast). ``profile``: where the profile alone would put each pod in window
    order (one profile decision per pod: the profile's own answer, which the annealer
    then improves); the home then scores 1, the best there is.

    ``score_weight`` (0 <= w < 1): the profile score's weight against the smallest pod
    value; below 1, placing one more pod always beats a better score for another.

    ``fixed``: window position -> (node, devices) for pods that already have a place (a
    descheduling pass re-plans running pods): that place is their home, scoring 1, and
    taken before any shape's room (``homes="shapes"`` only).

    ``colocate`` (>= 0): gang co-location; each pair of one gang's members on the same
    node adds ``colocate`` x the gang members' mean value to the objective (a whole gang
    of m on one node: m (m - 1) / 2 pairs). 0: no co-location term.
    """
    if not requests:
        raise ValidationError("window", "is empty: no pods to place")
    if not 0.0 <= score_weight < 1.0:
        raise ValidationError("score_weight", f"must be in [0, 1), got {score_weight!r}")
    if homes not in HOMES:
        raise ValidationError("homes", f"must be one of {', '.join(HOMES)}, got {homes!r}")
    if not (np.isfinite(colocate) and colocate >= 0):
        raise ValidationError("colocate", f"must be finite and >= 0, got {colocate!r}")
    n, dmax = state.num_nodes, state.max_devices
    k, d = pruning.k, pruning.d
    p = len(requests)
    kmax = 2 + k * d  # slot 0: unplaced; 1: the pod's home; then k nodes x d choices
    values = pod_values(state, requests, value)
    vmin = float(values.min())
    node = np.full((p, kmax), -1, dtype=np.int64)
    score = np.zeros((p, kmax))
    option = np.zeros((p, kmax), dtype=np.int64)
    devs = np.full((p, kmax, dmax), -1, dtype=np.int64)
    valid = np.zeros((p, kmax), dtype=bool)
    unplaceable: dict[int, str] = {}

    shapes: dict[tuple, list[int]] = {}
    for i, r in enumerate(requests):
        shapes.setdefault(shape_key(r.pod), []).append(i)
    homed = 0
    fixed = fixed or {}
    if fixed and homes != "shapes":
        raise ValidationError("homes", "pods with a place already need homes=shapes")
    if homes == "profile":
        # Each pod's home is where the profile alone puts it, pods in window order, each
        # seeing the ones before it; the candidates come from the window's start.
        homed = _profile_homes(sched, state, requests, node, score, devs, valid)
        work = None
    else:
        # Shapes take room in turn, biggest pods first (first-fit decreasing), on a working
        # copy: each is filtered, scored and homed on what the shapes before it left.
        work = state.fork(share_bound=True)
        for i, (nd, dv) in fixed.items():  # running pods keep their room first
            try:
                work.allocate(nd, requests[i], dv)
            except InfeasibleDecisionError as e:
                raise ValidationError(f"fixed.{i}", f"does not fit where it runs: {e}") \
                    from None
            _set_home(i, nd, dv, 1.0, node, score, devs, valid)
            homed += 1
    for members in sorted(shapes.values(), key=lambda ms: (-values[ms[0]], ms[0])):
        req = requests[members[0]]
        prof = profile_for(sched, req)
        if prof is None:
            raise ValidationError("scheduler", f"{getattr(sched, 'name', sched)!r} has no "
                                  f"scheduling profile for pod {req.pod.id!r} to prune by")
        weight_sum = sum(w for _, w in prof.profile.scorers) or 1.0
        on = work if work is not None else state
        ok, ctx = prof.feasible(on, req)
        if not ok.any() and on is not state:  # no room left after earlier shapes
            on = state
            ok, ctx = prof.feasible(state, req)
        idx = np.flatnonzero(ok)
        if idx.size == 0:
            from smartsched.scheduling.framework import unschedulable_message

            why = unschedulable_message(n, prof.reasons(ctx))
            for i in members:
                unplaceable[i] = why
            continue
        if prof.profile.scorers and idx.size > 1:
            total = prof.weighted_scores(ctx, ok)[idx]
        else:
            total = np.zeros(idx.size)
        order = np.argsort(-total, kind="stable")
        ranked = idx[order]
        s = np.clip(total[order] / (MAX_NODE_SCORE * weight_sum), 0.0, 1.0)
        mem = np.asarray(members)
        pos, within, home = _positions(on, req, ranked, len(members), k)
        _fill_slots(on, req, ranked, s, pos, within, mem, d, node, score, option, devs, valid)
        if work is not None and on is work:
            new = np.array([int(i) not in fixed for i in mem], dtype=bool)
            homed += _take_homes(work, req, ranked, s, home[new], mem[new], node, score,
                                 devs, valid)

    # A choice equal to the home adds nothing.
    same = (node[:, 2:] == node[:, 1:2]) & np.all(devs[:, 2:] == devs[:, 1:2], axis=2)
    valid[:, 2:] &= ~(same & valid[:, 1:2])
    # Compact each pod's valid slots behind slot 0, best first.
    # A rotated device choice costs a hair more than the binder's own on the same node.
    cost_c = -score_weight * vmin * score + 1e-5 * score_weight * vmin * option
    cost_c = np.where(valid, cost_c, np.inf)
    cost_c[:, 0] = -np.inf  # slot 0 (unplaced) sorts first
    order = np.argsort(cost_c, axis=1, kind="stable")
    rows = np.arange(p)[:, None]
    valid = valid[rows, order]
    valid[:, 0] = True
    at_home = np.argmax(order == 1, axis=1)  # where the home slot went
    start = np.where(valid[np.arange(p), at_home], at_home, 0)
    node = node[rows, order]
    devs = devs[rows, order]
    cost = np.where(valid, cost_c[rows, order], np.inf)
    cost[:, 0] = values
    nslots = valid.sum(axis=1).astype(np.int64)
    width = int(nslots.max())
    node, cost, devs = node[:, :width], cost[:, :width], devs[:, :width]
    node[:, 0] = -1

    bins, amount, cap = _bins(state, requests, node, devs)
    group, worth = _groups(requests, values)
    # Any overflow must cost more than dropping what caused it: a pod, or a whole gang.
    lam1 = float(max(values.max(), worth.max(initial=0.0)))
    biggest = int(np.bincount(group[group >= 0]).max()) if group is not None else 0
    mu = colocate * float(values[group >= 0].mean()) if group is not None else 0.0
    # Above a gang's value, scores and co-location.
    lam_g = 1.5 * lam1 + score_weight * vmin * biggest + mu * biggest * (biggest - 1) / 2
    problem = WindowProblem(
        value=values, cost=cost, nslots=nslots, node=node, bins=bins, amount=amount, cap=cap,
        devices=devs, lam0=1.5 * lam1 + score_weight * vmin, lam1=lam1, num_nodes=n,
        start=start, group=group, lam_g=lam_g if group is not None else 0.0, colocate=mu,
        info={"shapes": len(shapes), "pods": p, "k": k, "d": d, "value": value,
              "score_weight": score_weight, "variables": int((nslots - 1).sum()),
              "dense_variables": p * n, "unplaceable": len(unplaceable),
              "homes": homes, "homed": homed, "gangs": int(worth.size)})
    problem.drop_partial(start)  # a gang's home is all its members' or none
    problem.validate()
    return problem, unplaceable


def _groups(requests: Sequence[PodRequest], values: np.ndarray
            ) -> tuple[np.ndarray | None, np.ndarray]:
    """Each pod's gang index (-1: none), or None when the window holds no gang; and each
    gang's value (its members' sum)."""
    index: dict[str, int] = {}
    group = np.array([index.setdefault(r.pod.gang_id, len(index))
                      if r.pod.gang_id is not None else -1 for r in requests], dtype=np.int64)
    if not index:
        return None, np.zeros(0)
    worth = np.bincount(group[group >= 0], weights=values[group >= 0], minlength=len(index))
    return group, worth


def _positions(state: ClusterState, req: PodRequest, ranked: np.ndarray, m: int,
               k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ranks (into ``ranked``) of the nodes each of a shape's ``m`` pods keeps, [m, k'];
    each pod's index among the pods that share its home node, [m]; and its home's rank
    ([m], ``ranked.size`` where the shape runs out of room).

    A pod's *home* is the node it would land on if the shape's pods alone filled the
    ranked nodes in order (each node holding as many as fit); it keeps the shape's
    ``ceil(k/2)`` best nodes and ``k - ceil(k/2)`` from its home on."""
    f = ranked.size
    fit = _fit_counts(state, req, ranked)
    cum = np.cumsum(fit)
    j = np.arange(m)
    home = np.searchsorted(cum, j, side="right")
    within = j - np.where(home > 0, cum[np.maximum(home - 1, 0)], 0)
    if f <= k:
        return np.broadcast_to(np.arange(f), (m, f)), within, home
    h = math.ceil(k / 2)
    extra = k - h
    start = np.clip(home, h, f - extra)
    pos = np.concatenate([np.broadcast_to(np.arange(h), (m, h)),
                          start[:, None] + np.arange(extra)[None, :]], axis=1)
    return pos, within, home


def _fit_counts(state: ClusterState, req: PodRequest, nodes: np.ndarray) -> np.ndarray:
    """How many pods like ``req`` fit on each of ``nodes`` by room and, for GPU pods, by
    devices (0 where the filters let it pass on something else's account)."""
    big = np.iinfo(np.int64).max // 4
    free = state.free_res[nodes]
    fit = np.full(nodes.size, big, dtype=np.int64)
    for res in (CPU, MEM, FPGA):
        need = int(req.vector[res])
        if need > 0:
            fit = np.minimum(fit, free[:, res] // need)
    if req.num_gpu:
        per_dev = np.where(state.gpu_exists[nodes], state.gpu_free[nodes] // max(req.gpu_milli, 1),
                           0).sum(axis=1)
        fit = np.minimum(fit, per_dev // req.num_gpu)
    return fit


def _profile_homes(sched: Scheduler, state: ClusterState,
                   requests: Sequence[PodRequest], node: np.ndarray, score: np.ndarray,
                   devs: np.ndarray, valid: np.ndarray) -> int:
    """Slot 1 of each pod: the profile's own decision on a working copy, in window order
    (no preemption or deferral: those are not a placement)."""
    work = state.fork(share_bound=True)
    got = 0
    for i, req in enumerate(requests):
        dec = sched.decide(work, req)
        if dec.node is None or dec.victims or dec.defer:
            continue
        nd = int(dec.node)
        dv = tuple(dec.devices) if dec.devices is not None else work.pick_devices(nd, req)
        try:
            work.allocate(nd, req, dv)
        except InfeasibleDecisionError:
            continue
        _set_home(i, nd, dv, 1.0, node, score, devs, valid)
        got += 1
    return got


def _take_homes(work: ClusterState, req: PodRequest, ranked: np.ndarray, s: np.ndarray,
                home: np.ndarray, members: np.ndarray, node: np.ndarray, score: np.ndarray,
                devs: np.ndarray, valid: np.ndarray) -> int:
    """Allocate each pod of a shape on its home in ``work`` (the twin's own binder picks
    the devices) and write that as the pod's slot 1; returns how many got one."""
    got = 0
    for j, i in enumerate(members):
        if home[j] >= ranked.size:
            break
        nd = int(ranked[home[j]])
        try:
            dv = work.pick_devices(nd, req)
            work.allocate(nd, req, dv)
        except InfeasibleDecisionError:
            continue
        _set_home(i, nd, dv, float(s[home[j]]), node, score, devs, valid)
        got += 1
    return got


def _set_home(i: int, nd: int, dv: Sequence[int], sc: float, node: np.ndarray,
              score: np.ndarray, devs: np.ndarray, valid: np.ndarray) -> None:
    """Write pod ``i``'s home slot (slot 1 before compaction)."""
    node[i, 1] = nd
    score[i, 1] = sc
    devs[i, 1, :len(dv)] = dv
    valid[i, 1] = True


def _fill_slots(state: ClusterState, req: PodRequest, ranked: np.ndarray, s: np.ndarray,
                pos: np.ndarray, within: np.ndarray, members: np.ndarray, d: int,
                node: np.ndarray,
                score: np.ndarray, option: np.ndarray, devs: np.ndarray,
                valid: np.ndarray) -> None:
    """Write the slots (1..) of a shape's pods: ``pos`` [m, k'] ranks into ``ranked``; each
    node with up to ``d`` device choices, rotated by the pod's index ``within`` its home."""
    m, kk = pos.shape
    nodes = ranked[pos]  # [m, kk]
    sc = s[pos]
    g, milli = req.num_gpu, req.gpu_milli
    if g == 0:
        slot = 2 + np.arange(kk) * d
        node[members[:, None], slot[None, :]] = nodes
        score[members[:, None], slot[None, :]] = sc
        valid[members[:, None], slot[None, :]] = True
        return
    free = state.gpu_free[nodes]  # [m, kk, D]
    dmax = free.shape[-1]
    fit = (free >= milli) & state.gpu_exists[nodes]
    cnt = fit.sum(axis=-1)  # [m, kk]
    # Fitting devices tightest first (ties: lowest index); others after.
    keyv = np.where(fit, free.astype(np.int64), 1 << 20) * dmax + np.arange(dmax)
    srt = np.argsort(keyv, axis=-1)  # [m, kk, D]
    j = within[:, None]
    seen: list[np.ndarray] = []
    for o in range(d):
        start = np.zeros((m, kk), dtype=np.int64) if o == 0 else \
            ((j * (d - 1) + o) * g) % np.maximum(cnt, 1)
        at = (start[..., None] + np.arange(g)) % np.maximum(cnt, 1)[..., None]  # [m, kk, g]
        chosen = np.take_along_axis(srt, at, axis=-1)
        chosen = np.sort(chosen, axis=-1)
        ok = cnt >= g
        for prev in seen:  # a rotation that lands on an earlier choice adds nothing
            ok &= ~np.all(prev == chosen, axis=-1)
        seen.append(chosen)
        slot = 2 + np.arange(kk) * d + o
        rows, cols = members[:, None], slot[None, :]
        node[rows, cols] = nodes
        score[rows, cols] = sc
        option[rows, cols] = o
        valid[rows, cols] = ok
        devs[rows, cols, :g] = chosen


def _bins(state: ClusterState, requests: Sequence[PodRequest], node: np.ndarray,
          devs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bin entries of every slot and the bins' normalized free capacity.

    Bins: cpu of node x at x, memory at N + x, FPGA at 2N + x, device (x, e) at
    3N + x * D + e; the dummy (padding, +inf) at 3N + N * D."""
    n, dmax = state.num_nodes, state.max_devices
    dummy = 3 * n + n * dmax
    cap_units = np.maximum(state.capacity[:, [CPU, MEM, FPGA]].astype(np.float64), 1.0)
    free = state.free_res[:, [CPU, MEM, FPGA]].astype(np.float64) / cap_units
    dev_free = state.gpu_free.astype(np.float64).reshape(-1) / MILLI_PER_DEVICE
    cap = np.concatenate([free.T.reshape(-1), dev_free, [np.inf]])
    vec = np.array([r.vector for r in requests], dtype=np.float64).reshape(len(requests), -1)
    milli = np.array([r.gpu_milli for r in requests], dtype=np.float64)
    placed = node >= 0
    safe = np.maximum(node, 0)
    res = np.stack([vec[:, CPU], vec[:, MEM], vec[:, FPGA]], axis=1)  # [P, 3]
    amt_node = res[:, None, :] / cap_units[safe]  # [P, K, 3]
    bin_node = safe[..., None] + n * np.arange(3)
    use = placed[..., None] & (amt_node > 0)
    bin_node = np.where(use, bin_node, dummy)
    amt_node = np.where(use, amt_node, 0.0)
    dev_use = devs >= 0
    bin_dev = np.where(dev_use, 3 * n + safe[..., None] * dmax + np.maximum(devs, 0), dummy)
    amt_dev = np.where(dev_use, (milli / MILLI_PER_DEVICE)[:, None, None], 0.0)
    return (np.concatenate([bin_node, bin_dev], axis=2),
            np.concatenate([amt_node, amt_dev], axis=2), cap)
