"""Gang co-location (``WindowProblem.colocate``): each pair of one gang's members on the
same node adds to the objective. The exact solver, the annealer (both moves) and the
passes after it agree with enumeration, keep feasibility, and trade a better score for
co-location only when the term is worth it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartsched.model.errors import ValidationError
from smartsched.optimize.annealer import anneal, greedy_assignment
from smartsched.optimize.exact import solve_exact
from smartsched.optimize.lns import ruin_recreate
from smartsched.optimize.placer import AnnealOptions, parse_spec
from smartsched.optimize.problem import WindowProblem
from smartsched.optimize.repair import polish, repair
from tests.optimize.test_solvers import enumerate_optimum, random_problem


def _colocated(seed: int, mu: float, **kw) -> WindowProblem:
    pr = random_problem(seed, **kw)
    out = dataclasses.replace(pr, colocate=mu)  # lam_g = 1.5 max worth + 1 covers mu <= 0.3
    out.validate()
    return out


def test_pairs_count_members_sharing_a_node() -> None:
    pr = _colocated(0, 0.2, pods=7, nodes=3, slots=3, tight=2.0, gangs=2)
    assign = np.zeros(pr.num_pods, dtype=np.int64)
    assert pr.colocated_pairs(assign) == 0
    g0 = np.flatnonzero(pr.group == 0)
    # Put every member of gang 0 that can go on a common node there.
    common = set.intersection(*[set(pr.node[i, 1:pr.nslots[i]].tolist()) for i in g0])
    if not common:
        pytest.skip("no node common to the gang")
    n = min(common)
    for i in g0:
        assign[i] = int(np.flatnonzero(pr.node[i] == n)[0])
    assert pr.colocated_pairs(assign) == g0.size * (g0.size - 1) // 2
    base = dataclasses.replace(pr, colocate=0.0)
    assert pr.objective(assign) == pytest.approx(base.objective(assign)
                                                 + 0.2 * pr.colocated_pairs(assign))
    assert pr.energy(assign) == pytest.approx(base.energy(assign)
                                              - 0.2 * pr.colocated_pairs(assign))


@pytest.mark.parametrize("seed", range(8))
def test_exact_and_annealer_reach_the_enumerated_optimum_with_co_location(seed: int) -> None:
    pr = _colocated(seed, 0.3, pods=7, nodes=3, slots=3, tight=1.2, gangs=2)
    opt = enumerate_optimum(pr)
    ex = solve_exact(pr, time_limit_s=10)
    assert ex.optimal and ex.objective == pytest.approx(opt, abs=1e-7)
    assert ex.bound >= opt - 1e-6
    for method, move in (("sa", "heat-bath"), ("pt", "heat-bath"), ("sa", "metropolis")):
        res = anneal(pr, sweeps=200, replicas=8, method=method, move=move, seed=seed,
                     batch=4)
        # The incremental bookkeeping never claims less energy than the answer has.
        assert res.energy <= res.trace[-1][2] + 1e-9
        fixed, _ = repair(pr, res.assign)
        fixed, _ = polish(pr, fixed, 200)
        fixed, _ = ruin_recreate(pr, fixed, 100, seed=seed)
        assert pr.objective(fixed) == pytest.approx(opt, abs=1e-7), (method, move)


def _two_nodes_one_gang(mu: float) -> WindowProblem:
    """A gang of two, two nodes each with room for both: split, each member gets its
    better-scored node (cost -0.03 vs -0.01); together they share node 0 or node 1."""
    value = np.array([1.0, 1.0])
    cost = np.array([[1.0, -0.03, -0.01], [1.0, -0.03, -0.01]])
    node = np.array([[-1, 0, 1], [-1, 1, 0]])
    bins = np.array([[[2], [0], [1]], [[2], [1], [0]]])
    amount = np.array([[[0.0], [0.4], [0.4]], [[0.0], [0.4], [0.4]]])
    pr = WindowProblem(value=value, cost=cost, nslots=np.array([3, 3]), node=node, bins=bins,
                       amount=amount, cap=np.array([1.0, 1.0, np.inf]),
                       devices=np.full((2, 3, 1), -1), lam0=3.0, lam1=2.0, num_nodes=2,
                       group=np.array([0, 0]), lam_g=4.0, colocate=mu)
    pr.validate()
    return pr


@pytest.mark.parametrize(("mu", "together"), [(0.0, False), (0.01, False), (0.05, True)])
def test_co_location_wins_only_when_it_is_worth_more_than_the_scores(mu: float,
                                                                     together: bool) -> None:
    """Split scores 0.06, together 0.04: a pair worth 0.05 tips it, 0.01 does not."""
    pr = _two_nodes_one_gang(mu)
    ex = solve_exact(pr, time_limit_s=10)
    res = anneal(pr, sweeps=100, replicas=4, seed=0, batch=2)
    for assign in (ex.assign, res.assign):
        nodes = pr.node[[0, 1], assign]
        assert (nodes[0] == nodes[1]) == together and np.all(assign > 0)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), tight=st.floats(0.05, 2.0), mu=st.floats(0.0, 0.3))
def test_every_pass_keeps_gangs_whole_and_never_lowers_the_objective(seed: int, tight: float,
                                                                     mu: float) -> None:
    pr = _colocated(seed, mu, pods=10, nodes=3, slots=3, tight=tight, gangs=2)
    res = anneal(pr, sweeps=5, replicas=2, seed=seed, batch=3)
    fixed, _ = repair(pr, res.assign)
    assert np.isfinite(pr.objective(fixed))
    p, _ = polish(pr, fixed, 100)
    out, _ = ruin_recreate(pr, p, 30, seed=seed)
    assert pr.objective(out) >= pr.objective(p) - 1e-12 >= pr.objective(fixed) - 2e-12
    assert pr.partial_groups(out).size == 0 and pr.overflow(out).size == 0
    assert np.isfinite(pr.objective(repair(pr, greedy_assignment(pr))[0]))


def test_bad_co_location_is_named() -> None:
    with pytest.raises(ValidationError, match=r"problem\.colocate"):
        _two_nodes_one_gang(-0.1)
    pr = random_problem(0)
    with pytest.raises(ValidationError, match=r"problem\.colocate"):
        dataclasses.replace(pr, colocate=0.1).validate()  # no gangs
    with pytest.raises(ValidationError, match=r"problem\.lam_g"):
        dataclasses.replace(_two_nodes_one_gang(0.0), colocate=3.0).validate()
    with pytest.raises(ValidationError, match="colocate"):
        AnnealOptions(colocate=-1.0)
    with pytest.raises(ValidationError, match=r"scheduler\.colocate"):
        parse_spec("fgd?colocate=lots")
    assert parse_spec("fgd?colocate=0.2")[1].colocate == 0.2


def test_ruin_and_recreate_brings_a_split_gang_onto_one_node() -> None:
    """Nothing is left out, yet with co-location a round that puts the gang back on one
    node raises the objective; without it there is nothing to gain."""
    split = np.array([1, 1])  # member 0 on node 0, member 1 on node 1
    pr = _two_nodes_one_gang(0.05)
    out, kept = ruin_recreate(pr, split, rounds=20, seed=0)
    assert kept >= 1 and pr.node[0, out[0]] == pr.node[1, out[1]]
    assert pr.objective(out) == pytest.approx(enumerate_optimum(pr))
    plain = _two_nodes_one_gang(0.0)
    assert ruin_recreate(plain, split, rounds=20, seed=0)[1] == 0
