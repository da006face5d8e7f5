"""Lookahead on forks: it sees only the past, never touches the real state, keeps the
base's choice when the futures tie, and overrules it when a sampled future says so."""

from __future__ import annotations

import numpy as np
import pytest

from smartsched.model.errors import ValidationError
from smartsched.scheduling.base import make_scheduler
from smartsched.scheduling.lookahead import LookaheadScheduler
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node, pod

GPU_TAINT = ("nvidia.com/gpu=present:NoSchedule",)


def _gpu_pod(pid: str, gpus: int, cpu: int = 1000):
    return pod(pid, cpu=cpu, num_gpu=gpus, gpu_milli=1000, tolerations=GPU_TAINT)


def _state() -> ClusterState:
    spec = cluster(node("a", cpu=64000, mem=262144, gpus=8), node("b", cpu=64000, mem=262144,
                                                                   gpus=8))
    st = ClusterState(spec)
    busy = st.compile(_gpu_pod("busy", 4, cpu=32000))  # a: half its GPUs and CPU in use
    st.allocate(0, busy, st.pick_devices(0, busy))
    return st


def _arrays(st: ClusterState) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in vars(st).items() if isinstance(v, np.ndarray)}


def test_it_overrules_a_spreading_base_when_the_sampled_future_needs_a_whole_node() -> None:
    """k8s-default spreads a 1-GPU pod onto the empty node; every pod seen so far wanted
    8 GPUs, so the lookahead keeps that node whole -- and never writes the real state."""
    st = _state()
    la = LookaheadScheduler(make_scheduler("k8s-default"), make_scheduler("bestfit"), k=2,
                            horizon=2, samples=2, seed=1)
    base_choice = make_scheduler("k8s-default").decide(st, st.compile(_gpu_pod("x", 1)))
    assert base_choice.node == 1
    la._seen.extend(_gpu_pod(f"h{i}", 8) for i in range(10))  # the past: whole-node pods
    before = _arrays(st)
    d = la.decide(st, st.compile(_gpu_pod("x", 1)))
    assert d.node == 0 and la.changed == 1 and len(la.lookahead_seconds) == 1
    after = _arrays(st)
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_the_fragmentation_objective_charges_what_a_fork_strands() -> None:
    """objective=frag: the same overrule for the same reason, and the charge is the
    expected fragmented GPU the fork added on the nodes it changed (0 for a fork that
    changed nothing GPU-wise)."""
    st = _state()
    la = LookaheadScheduler(make_scheduler("k8s-default"), make_scheduler("bestfit"), k=2,
                            horizon=2, samples=2, seed=1, objective="frag")
    la._seen.extend(_gpu_pod(f"h{i}", 8) for i in range(10))
    assert la.decide(st, st.compile(_gpu_pod("x", 1))).node == 0
    fork = st.fork()
    assert la._frag_added(st, fork, {0, 1}, {}) == 0.0
    one = fork.compile(_gpu_pod("y", 1))
    fork.allocate(1, one, fork.pick_devices(1, one))  # b: 7 free GPUs, no 8-GPU pod fits
    assert la._frag_added(st, fork, {1}, {}) == pytest.approx(7000.0)


def test_ties_keep_the_base_choice_and_futures_come_only_from_the_past() -> None:
    st = _state()
    base = make_scheduler("k8s-default")
    la = LookaheadScheduler(base, make_scheduler("bestfit"), k=2, horizon=3, samples=2)
    drawn: list[str] = []
    roll = la._roll

    def spy(fork, seq, unit, touched):
        drawn.extend(p.id for p in seq)
        return roll(fork, seq, unit, touched)

    la._roll = spy  # type: ignore[method-assign]
    offered = []
    for i in range(30):  # small CPU pods: every future fits anywhere, so all ties
        p = pod(f"p{i}", cpu=100)
        req = st.compile(p)
        want = base.decide(st, req).node
        d = la.decide(st, req)
        assert d.node == want
        offered.append(p.id)
        # Draws for decision i come from the pods offered before it, never from it or later.
        assert set(drawn) <= set(offered[:-1])
        st.allocate(d.node, req, ())
    assert drawn and la.changed == 0


def test_bad_specs_name_the_field() -> None:
    for spec, field in (("lookahead:fgd?k=0", "scheduler.k"),
                        ("lookahead:fgd?horizon=x", "scheduler.horizon"),
                        ("lookahead:fgd?rollout=rl:models/ppo_mixed_small",
                         "scheduler.rollout"),
                        ("lookahead:fgd?objective=speed", "scheduler.objective"),
                        # no upper bound: 7 TiB asked for the draws, or hours a decision
                        ("lookahead:fgd?samples=1000000&horizon=1000000", "scheduler.horizon"),
                        ("lookahead:fgd?samples=100&horizon=1000", "scheduler.samples"),
                        ("lookahead:fgd?k=100000000", "scheduler.k"),
                        ("lookahead:fgd?history=10000000", "scheduler.history")):
        with pytest.raises(ValidationError) as e:
            make_scheduler(spec)
        assert e.value.field == field, spec
    s = make_scheduler("lookahead:fgd?k=3&horizon=5&samples=1")
    assert (s.k, s.horizon, s.samples) == (3, 5, 1) and s.name.startswith("lookahead:fgd?")


def test_a_lookahead_run_through_the_twin() -> None:
    """End to end: the run builder prepares it (FGD's typical pods), the twin applies its
    decisions, and its cost per decision is recorded."""
    from smartsched.bench.simulate import simulate

    rep = simulate("small", "mixed", "lookahead:fgd?k=2&horizon=4&samples=1", hours=0.5,
                   warmup_hours=0.0, seed=3, plots=False)
    m = rep["metrics"]
    assert m["pods"]["placed"] > 0


def test_the_learned_policy_ranks_candidates_for_the_lookahead() -> None:
    """With ``rl:`` as the base: its top-k by logits, the first being its own choice."""
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[2] / "models" / "ppo_mixed_small"
    la = make_scheduler(f"lookahead:rl:{shipped}?k=3&horizon=2&samples=1")
    st = _state()
    req = st.compile(pod("c", cpu=500))
    cands = la.base.ranked(st, req, 3)
    assert len(cands) == 2 and {n for n, _ in cands} == {0, 1}  # both nodes, best first
    assert cands[0][0] == la.base.decide(st, req).node
