"""The policy choosing within a heuristic's shortlist: ``rl:PATH?base=<profile>&k=<n>``.

The base profile keeps every lever it has (routes, filters, preemption, gang
reservations, descheduling, queue order); the policy only swaps the node among the
base's ``k`` best where the base places a pod. ``k=1`` must be the base exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smartsched.bench.simulate import simulate
from smartsched.model.errors import UnknownReferenceError, ValidationError
from smartsched.scheduling.base import SplitScheduler, make_scheduler
from smartsched.scheduling.run import build_run

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "ppo_mixed_small"
TIMING = ("decision_latency_us", "decisions_per_second")


def _flat(d: Any, path: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        return {k2: v2 for k, v in d.items() if k not in TIMING
                for k2, v2 in _flat(v, f"{path}.{k}").items()}
    if isinstance(d, list | tuple):
        return {k2: v2 for i, v in enumerate(d) for k2, v2 in _flat(v, f"{path}[{i}]").items()}
    return {path: repr(d)}


def _report(scheduler: str) -> dict[str, Any]:
    rep = simulate("small", "mixed", scheduler, seed=3, hours=3, warmup_hours=1, plots=False)
    return _flat(rep["metrics"])


def test_a_shortlist_of_one_is_the_base_profile_exactly() -> None:
    """With k=1 the policy has nothing to choose: every figure of the run (timings aside)
    equals the composite's own run -- its preemptions, reservations and descheduling
    moves included."""
    base = _report("composite")
    same = _report(f"rl:{SHIPPED}?base=composite&k=1")
    assert same == base
    steered = _report(f"rl:{SHIPPED}?base=composite&k=4")
    assert steered != base  # and with a real shortlist the policy does change something


def test_every_steered_placement_is_in_the_base_routes_top_k() -> None:
    """Each node the policy picks is among the k best-scored nodes of the pod's route
    (ties at the k-th score count as in), and the base's own choice is always allowed."""
    k = 3
    sched = make_scheduler(f"rl:{SHIPPED}?base=composite&k={k}", 0)
    run = build_run("small", "mixed", sched, seed=5, hours=2, warmup_hours=0)
    sl = sched.shortlist
    assert isinstance(sl.base, SplitScheduler)
    checked = 0
    while checked < 300:
        req = run.next_decision()
        if req is None:
            break
        route = sl.route(req.request)
        ok, _ = route.feasible(run.engine.state, req.request)
        state_nodes = run.engine.state.num_nodes
        run.decide(req)
        node = run.engine.table.node[req.pod_index]
        if node < 0 or ok.sum() < 2:  # rejected, deferred or preempting: the base's call
            continue
        scores = route.last_scores
        assert scores is not None and scores.shape == (state_nodes,)
        kth = np.sort(scores[ok])[::-1][min(k, int(ok.sum())) - 1]
        assert ok[node] and scores[node] >= kth - 1e-9
        checked += 1
    assert checked > 50
    assert sl.decisions > 0 and 0 < sl.changed <= sl.decisions


def test_the_base_profiles_twin_hooks_come_along() -> None:
    base = make_scheduler("composite", 0)
    sched = make_scheduler(f"rl:{SHIPPED}?base=composite&k=2&classes=batch,ai-train", 0)
    assert sched.deschedule_interval_s == base.deschedule_interval_s is not None
    assert sched.queue_sort == base.queue_sort
    assert sched.shortlist.classes == frozenset({"batch", "ai-train"})
    again = make_scheduler(f"rl:{SHIPPED}?base=composite&classes=batch&classes=ai-train", 0)
    assert again.shortlist.classes == sched.shortlist.classes
    plain = make_scheduler(f"rl:{SHIPPED}", 0)
    assert plain.deschedule_interval_s is None and plain.queue_sort == "priority"


@pytest.mark.parametrize(("query", "field"), [
    ("base=composite&k=0", "scheduler.k"),
    ("base=composite&k=two", "scheduler.k"),
    ("base=composite&k=" + "9" * 5000, "scheduler.k"),
    ("base=composite&k=\u0663", "scheduler.k"),
    ("k=3", "scheduler.k"),
    ("classes=batch", "scheduler.classes"),
    ("base=composite&classes=gaming", "scheduler.classes"),
    ("base=", "scheduler.base"),
    ("base=composite&filters=composite-online", "scheduler.filters"),
    (f"base=rl:{SHIPPED}", "scheduler.base"),
])
def test_bad_shortlist_options_name_the_field(query: str, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        make_scheduler(f"rl:{SHIPPED}?{query}", 0)
    assert e.value.field == field


def test_an_unknown_base_profile_is_named() -> None:
    with pytest.raises((UnknownReferenceError, ValidationError)):
        make_scheduler(f"rl:{SHIPPED}?base=no-such-profile&k=2", 0)


def test_the_env_offers_the_base_shortlist_as_its_action_mask() -> None:
    """Training within a shortlist: the base places warm-up pods and every pod it rejects,
    defers or preempts for; each step offers between two and k nodes, the base's own
    choice among them, and taking it applies the base's decision as it is."""
    from smartsched.rl.env import SchedulingEnv

    env = SchedulingEnv({"cluster": "small", "hours": 2, "warmup_hours": 0.5, "seed": 4,
                         "base": "composite", "shortlist_k": 3, "max_decisions": 150})
    obs, _ = env.reset()
    assert env.shortlist is not None
    rng = np.random.default_rng(0)
    n = env.engine.state.num_nodes
    steps = 0
    done = False
    while not done:
        mask = obs["action_mask"]
        offered = np.flatnonzero(mask[:n])
        assert 2 <= offered.size <= 3 and mask[n:].sum() == 0
        base = env._base_decision
        assert base is not None and base.node in offered
        a = int(base.node) if steps % 2 else int(rng.choice(offered))
        pod = env.offered.pod_index
        obs, reward, term, trunc, _ = env.step(a)
        assert np.isfinite(reward)
        assert env.engine.table.node[pod] == a
        steps += 1
        done = term or trunc
    assert steps > 20


def test_a_policy_trained_in_a_shortlist_deploys_in_the_same_one(tmp_path: Path) -> None:
    """The export records the env's ``base``; ``rl:PATH`` then runs within that base's
    shortlist (its k, unless the query sets another), with no option needed."""
    import json
    import shutil

    folder = tmp_path / "policy"
    shutil.copytree(SHIPPED, folder)
    meta_path = folder / "smartsched_policy.json"
    meta = json.loads(meta_path.read_text())
    meta["env"].update({"base": "composite", "shortlist_k": 2})
    meta_path.write_text(json.dumps(meta))
    sched = make_scheduler(f"rl:{folder}", 0)
    assert sched.trained_on_shortlist and sched.shortlist.k == 2
    assert make_scheduler(f"rl:{folder}?k=4", 0).shortlist.k == 4
    rep = simulate("small", "mixed", f"rl:{folder}", seed=3, hours=2, warmup_hours=0.5,
                   plots=False)
    assert rep["decisions"] > 0 and sched.shortlist.base is not None
    plain = make_scheduler(f"rl:{SHIPPED}", 0)
    assert not plain.trained_on_shortlist and plain.shortlist is None


def test_the_packaged_shortlist_recipe_builds_its_env() -> None:
    from smartsched.rl.config import load_train_config
    from smartsched.rl.env import SchedulingEnv

    root = Path(__file__).resolve().parents[2]
    cfg = load_train_config(root / "rllib_configs" / "ppo_shortlist.yaml")
    env = SchedulingEnv(cfg.env)
    assert env.cfg.base == "composite" and env.cfg.shortlist_k == 3
    with pytest.raises(ValidationError) as e:
        SchedulingEnv({**cfg.env, "shortlist_k": 0})
    assert e.value.field == "env.shortlist_k"


def test_the_scorers_argmax_within_choices_is_the_masked_argmax() -> None:
    """``FastScorer.best(obs, choices)`` picks what argmax over the full forward pass's
    logits picks once everything outside ``choices`` is masked, decision after decision
    (its shortcut through reference logits included)."""
    sched = make_scheduler(f"rl:{SHIPPED}", 0)
    run = build_run("small", "mixed", "k8s-default", seed=2, hours=2, warmup_hours=0)
    sched.prepare(run.engine.source_pods)
    rng = np.random.default_rng(1)
    tried = 0
    while tried < 120:
        req = run.next_decision()
        if req is None:
            break
        st = run.engine.state
        ok, ctx = sched.filters.feasible(st, req.request)
        if ok.sum() >= 3:
            obs = sched._observe(st, ctx, ok, False)
            n = st.num_nodes
            choices = ok & (rng.random(n) < 0.4)
            choices[np.flatnonzero(ok)[0]] = True
            logits = sched.scorer.logits(obs)[:n]
            want = int(np.argmax(np.where(choices, logits, -np.inf)))
            assert sched.scorer.best(obs, choices) == want
            tried += 1
        run.decide(req)
    assert tried >= 60
