"""The window model and its solvers on instances small enough to enumerate: the exact
solver finds the enumerated optimum, the annealer (with repair) reaches it, repair
always ends feasible, and a seed fixes the answer."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartsched.model.errors import ValidationError
from smartsched.optimize.annealer import anneal, greedy_assignment
from smartsched.optimize.exact import solve_exact
from smartsched.optimize.problem import WindowProblem
from smartsched.optimize.repair import polish, repair


def random_problem(seed: int, pods: int = 6, nodes: int = 3, slots: int = 3,
                   tight: float = 0.5, gangs: int = 0) -> WindowProblem:
    """Pods with up to ``slots`` candidate nodes each; a slot takes cpu and memory on its
    node (2 bins a node) and, for some pods, a device (one per node). ``gangs``: the
    first pods form that many gangs of 2 or 3 members."""
    rng = np.random.default_rng(seed)
    nb = 3 * nodes  # cpu, mem, one device per node
    kw = slots + 1
    value = rng.uniform(0.1, 1.0, pods)
    nslots = rng.integers(1, kw + 1, pods)
    node = np.full((pods, kw), -1)
    bins = np.full((pods, kw, 3), nb)
    amount = np.zeros((pods, kw, 3))
    cost = np.full((pods, kw), np.inf)
    cost[:, 0] = value
    devices = np.full((pods, kw, 1), -1)
    for i in range(pods):
        cand = rng.permutation(nodes)[: nslots[i] - 1]
        gpu = rng.random() < 0.5
        for c, n in enumerate(cand, start=1):
            node[i, c] = n
            bins[i, c, 0], bins[i, c, 1] = n, nodes + n
            amount[i, c, :2] = rng.uniform(0.05, 0.6, 2)
            if gpu:
                bins[i, c, 2] = 2 * nodes + n
                amount[i, c, 2] = rng.choice([0.25, 0.5, 1.0])
                devices[i, c, 0] = 0
            cost[i, c] = -0.3 * value.min() * rng.random()
    cap = np.concatenate([rng.uniform(tight * 0.5, tight * 1.5, 2 * nodes),
                          np.ones(nodes), [np.inf]])
    group = None
    big = value.max()
    if gangs:
        sizes = rng.integers(2, 4, gangs)
        group = np.full(pods, -1)
        group[: sizes.sum()] = np.repeat(np.arange(gangs), sizes)
        big = max(big, np.bincount(group[group >= 0], weights=value[group >= 0]).max())
    pr = WindowProblem(value=value, cost=cost, nslots=nslots, node=node, bins=bins,
                       amount=amount, cap=cap, devices=devices, lam0=1.5 * big + 1,
                       lam1=big, num_nodes=nodes, info={"score_step": 1e-3},
                       group=group, lam_g=1.5 * big + 1 if gangs else 0.0)
    pr.validate()
    return pr


def enumerate_optimum(pr: WindowProblem) -> float:
    best = float("-inf")
    for combo in itertools.product(*[range(int(n)) for n in pr.nslots]):
        best = max(best, pr.objective(np.array(combo)))
    return best


@pytest.mark.parametrize("seed", range(8))
def test_exact_and_annealer_reach_the_enumerated_optimum(seed: int) -> None:
    pr = random_problem(seed)
    opt = enumerate_optimum(pr)
    ex = solve_exact(pr, time_limit_s=10)
    assert ex.optimal
    assert ex.objective == pytest.approx(opt, abs=1e-7)
    assert ex.bound >= opt - 1e-6
    res = anneal(pr, sweeps=200, replicas=8, seed=seed, batch=4)
    fixed, _ = repair(pr, res.assign)
    assert pr.objective(fixed) == pytest.approx(opt, abs=1e-7)


@pytest.mark.parametrize("seed", range(8))
def test_gangs_all_or_nothing_exact_and_annealer_reach_the_enumerated_optimum(
        seed: int) -> None:
    pr = random_problem(seed, pods=7, nodes=3, slots=3, tight=0.6, gangs=2)
    opt = enumerate_optimum(pr)  # a gang placed in part is infeasible (-inf)
    ex = solve_exact(pr, time_limit_s=10)
    assert ex.optimal and ex.objective == pytest.approx(opt, abs=1e-7)
    assert pr.partial_groups(ex.assign).size == 0
    for method in ("sa", "pt"):
        res = anneal(pr, sweeps=200, replicas=8, method=method, seed=seed, batch=4)
        fixed, _ = repair(pr, res.assign)
        assert pr.partial_groups(fixed).size == 0
        assert pr.objective(fixed) == pytest.approx(opt, abs=1e-7)


def test_a_gang_in_part_costs_more_than_its_worth() -> None:
    pr = random_problem(5, pods=6, nodes=3, slots=3, tight=2.0, gangs=1)
    g = np.flatnonzero(pr.group == 0)
    whole = np.zeros(pr.num_pods, dtype=np.int64)
    whole[g] = [1 if pr.nslots[i] > 1 else 0 for i in g]
    if np.any(whole[g] == 0):
        pytest.skip("a member without candidates")
    part = whole.copy()
    part[g[0]] = 0
    assert pr.partial_groups(part).tolist() == [0]
    assert pr.objective(part) == float("-inf")
    assert pr.energy(part) > pr.energy(np.zeros(pr.num_pods, dtype=np.int64))
    assert pr.drop_partial(part.copy())[g].tolist() == [0] * g.size


def test_a_seed_fixes_the_answer_and_another_may_differ() -> None:
    pr = random_problem(3, pods=12, nodes=4, slots=3)
    a = anneal(pr, sweeps=30, seed=7)
    b = anneal(pr, sweeps=30, seed=7)
    assert np.array_equal(a.assign, b.assign) and a.energy == b.energy
    assert [t[2] for t in a.trace] == [t[2] for t in b.trace]


@pytest.mark.parametrize("method,move", [("sa", "heat-bath"), ("pt", "heat-bath"),
                                         ("sa", "metropolis"), ("pt", "metropolis")])
def test_every_method_never_ends_worse_than_its_start(method: str, move: str) -> None:
    pr = random_problem(11, pods=30, nodes=6, slots=4, tight=0.8)
    start = greedy_assignment(pr)
    res = anneal(pr, sweeps=20, method=method, move=move, seed=1)
    assert res.energy <= pr.energy(start) + 1e-9
    assert len(res.trace) == 20
    assert all(b[2] <= a[2] + 1e-12 for a, b in zip(res.trace, res.trace[1:], strict=False))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), tight=st.floats(0.05, 2.0),
       data=st.data())
def test_repair_ends_feasible_from_any_assignment(seed: int, tight: float,
                                                  data: st.DataObject) -> None:
    pr = random_problem(seed, pods=10, nodes=3, slots=3, tight=tight)
    assign = np.array([data.draw(st.integers(0, int(n) - 1)) for n in pr.nslots])
    fixed, moved = repair(pr, assign)
    assert pr.overflow(fixed).size == 0
    assert np.isfinite(pr.objective(fixed))
    # Repair only takes pods out and fills room: every change is one of those steps.
    assert int((fixed != assign).sum()) <= moved["removed"] + moved["added"]
    if pr.overflow(assign).size == 0:  # a feasible input is never made worse
        assert pr.objective(fixed) >= pr.objective(assign) - 1e-12


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), tight=st.floats(0.05, 2.0), data=st.data())
def test_repair_and_polish_never_leave_a_gang_in_part(seed: int, tight: float,
                                                      data: st.DataObject) -> None:
    pr = random_problem(seed, pods=10, nodes=3, slots=3, tight=tight, gangs=2)
    assign = np.array([data.draw(st.integers(0, int(n) - 1)) for n in pr.nslots])
    fixed, _ = repair(pr, assign)
    assert pr.overflow(fixed).size == 0 and pr.partial_groups(fixed).size == 0
    polished, _ = polish(pr, fixed, 200)
    assert np.isfinite(pr.objective(polished))
    assert pr.objective(polished) >= pr.objective(fixed) - 1e-12
    start = greedy_assignment(pr, np.random.default_rng(seed).permutation(pr.num_pods))
    assert np.isfinite(pr.objective(start))


def test_bad_input_is_named() -> None:
    pr = random_problem(0)
    with pytest.raises(ValidationError, match="sweeps"):
        anneal(pr, sweeps=0)
    with pytest.raises(ValidationError, match="method"):
        anneal(pr, method="quantum")
    with pytest.raises(ValidationError, match="replicas"):
        anneal(pr, replicas=True)
    with pytest.raises(ValidationError, match="assignment"):
        pr.energy(np.zeros(3, dtype=np.int64))
    with pytest.raises(ValidationError, match="time_limit_s"):
        solve_exact(pr, time_limit_s=0)
    bad = WindowProblem(value=np.array([]), cost=np.zeros((0, 1)), nslots=np.zeros(0, int),
                        node=np.zeros((0, 1), int), bins=np.zeros((0, 1, 1), int),
                        amount=np.zeros((0, 1, 1)), cap=np.array([np.inf]),
                        devices=np.zeros((0, 1, 1), int), lam0=1.0, lam1=1.0, num_nodes=1)
    with pytest.raises(ValidationError, match="window"):
        bad.validate()
    import dataclasses

    gp = random_problem(1, pods=6, gangs=1)
    with pytest.raises(ValidationError, match=r"problem\.group"):
        dataclasses.replace(gp, group=np.array([0, 0, 2, -1, -1, -1])).validate()
    with pytest.raises(ValidationError, match=r"problem\.lam_g"):
        dataclasses.replace(gp, lam_g=0.01).validate()


def test_exact_reports_unproven_when_time_runs_out() -> None:
    """A limit far too short for a big instance: the answer is a feasible incumbent (or
    none) and ``optimal`` says it is not proven."""
    pr = random_problem(5, pods=120, nodes=30, slots=6, tight=0.6)
    ex = solve_exact(pr, time_limit_s=0.01)
    if ex.assign is not None:
        assert pr.overflow(ex.assign).size == 0
    assert not ex.optimal or ex.bound >= ex.objective - 1e-6


@pytest.mark.parametrize("seed", range(6))
def test_polish_keeps_feasibility_and_never_lowers_the_objective(seed: int) -> None:
    from smartsched.optimize.repair import polish

    pr = random_problem(100 + seed, pods=30, nodes=5, slots=4, tight=0.6)
    base, _ = repair(pr, greedy_assignment(pr))
    out, kept = polish(pr, base, max_tries=500)
    assert pr.overflow(out).size == 0
    assert pr.objective(out) >= pr.objective(base) - 1e-12
    assert (kept > 0) == (pr.objective(out) > pr.objective(base) + 1e-12)
    again, _ = polish(pr, base, max_tries=500)
    assert np.array_equal(again, out)


def test_polish_takes_a_cheap_pod_out_for_a_dearer_one() -> None:
    """One bin; a cheap pod fills it; the dear pod left out can only go there: the chain
    swaps them (the cheap one has nowhere else)."""
    from smartsched.optimize.repair import polish

    pr = WindowProblem(
        value=np.array([0.2, 1.0]), cost=np.array([[0.2, -0.01], [1.0, -0.01]]),
        nslots=np.array([2, 2]), node=np.array([[-1, 0], [-1, 0]]),
        bins=np.array([[[1], [0]], [[1], [0]]]), amount=np.array([[[0.0], [0.8]],
                                                                  [[0.0], [0.5]]]),
        cap=np.array([1.0, np.inf]), devices=np.full((2, 2, 1), -1), lam0=2.0, lam1=1.0,
        num_nodes=1)
    out, kept = polish(pr, np.array([1, 0]))
    assert out.tolist() == [0, 1] and kept == 1
