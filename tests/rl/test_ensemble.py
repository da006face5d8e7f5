"""An ensemble of training seeds: ``rl:PATH?ensemble=PATH2`` sums the members'
log-probabilities over the allowed actions and takes the argmax.

Checked: a policy in an ensemble with itself decides exactly as alone (the same
distribution twice has the same argmax); with a second, different member the choice is
the argmax of the summed log-softmaxes, computed here independently from each member's
logits; members trained otherwise (another shortlist, other columns) are refused naming
the member; a live reload holds a member's path to the models_dir like the policy's own.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from smartsched.bench.simulate import simulate
from smartsched.model.errors import ValidationError
from smartsched.rl.policy import MAX_ENSEMBLE
from smartsched.scheduling.base import make_scheduler
from smartsched.scheduling.run import build_run

MODELS = Path(__file__).resolve().parents[2] / "models"
SHIPPED = MODELS / "ppo_mixed_small"


def _perturbed(tmp_path: Path, scale: float, name: str) -> Path:
    """A copy of the shipped policy whose weights are scaled and jittered (a stand-in for
    another training seed of the same recipe)."""
    folder = tmp_path / name
    shutil.copytree(SHIPPED, folder)
    state = torch.load(folder / "module_weights.pt", weights_only=True)
    gen = torch.Generator().manual_seed(int(scale * 1000))
    state = {k: (v * scale + 0.05 * torch.randn(v.shape, generator=gen)
                 if v.is_floating_point() else v) for k, v in state.items()}
    torch.save(state, folder / "module_weights.pt")
    return folder


def _placements(scheduler: str) -> str:
    """Every figure of a short run, timings aside (what the decisions lead to)."""
    rep = simulate("small", "mixed", scheduler, seed=4, hours=2, warmup_hours=0, plots=False)
    metrics = {k: v for k, v in rep["metrics"].items()
               if k not in ("decision_latency_us", "decisions_per_second")}
    return json.dumps(metrics, sort_keys=True, default=str)


def test_a_policy_in_an_ensemble_with_its_copy_decides_as_alone(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(SHIPPED, copy)
    alone = _placements(f"rl:{SHIPPED}")
    assert _placements(f"rl:{SHIPPED}?ensemble={copy}") == alone


def test_a_member_named_twice_or_the_policy_itself_is_refused(tmp_path: Path) -> None:
    """Its vote would count twice (the probe's ``ensemble=$B`` and ``ensemble=s1&
    ensemble=s1`` were accepted)."""
    copy = tmp_path / "copy"
    shutil.copytree(SHIPPED, copy)
    for spec, field in ((f"rl:{SHIPPED}?ensemble={SHIPPED}", "scheduler.ensemble[0]"),
                        (f"rl:{SHIPPED}?ensemble={copy}&ensemble={copy}/",
                         "scheduler.ensemble[1]")):
        with pytest.raises(ValidationError) as e:
            make_scheduler(spec, 0)
        assert e.value.field == field and "same policy folder" in e.value.message


def test_the_choice_is_the_argmax_of_the_summed_log_probabilities(tmp_path: Path) -> None:
    other = _perturbed(tmp_path, 1.3, "seed-b")
    sched = make_scheduler(f"rl:{SHIPPED}?ensemble={other}", 0)
    lead_only = make_scheduler(f"rl:{SHIPPED}", 0)
    member_only = make_scheduler(f"rl:{other}", 0)
    run = build_run("small", "mixed", sched, seed=6, hours=2, warmup_hours=0)
    checked = differs = 0
    while checked < 200:
        req = run.next_decision()
        if req is None:
            break
        state = run.engine.state
        ok, ctx = sched.filters.feasible(state, req.request)
        if ok.sum() >= 2:
            obs = sched._observe(state, ctx, ok, False)
            allowed = obs["action_mask"] > 0
            total = np.zeros(allowed.size)
            for scorer in (lead_only.scorer, member_only.scorer):
                lg = scorer.logits(obs).astype(np.float64)
                z = lg[allowed] - lg[allowed].max()
                total[allowed] += z - np.log(np.exp(z).sum())
            want = int(np.argmax(np.where(allowed, total, -np.inf)))
            assert sched._pick(obs) == want
            differs += int(lead_only.scorer.best(obs) != member_only.scorer.best(obs))
            checked += 1
        run.decide(req)
    assert checked >= 50
    assert differs > 0  # the members disagree somewhere, so the sum decided something


def test_members_trained_otherwise_are_refused_naming_the_member(tmp_path: Path) -> None:
    # Another shortlist: the shipped shortlist policy acts within the composite's top 3.
    with pytest.raises(ValidationError) as e:
        make_scheduler(f"rl:{SHIPPED}?ensemble={MODELS / 'ppo_shortlist_small'}", 0)
    assert e.value.field == "scheduler.ensemble[0]" and "env.base" in e.value.message
    # Other observed columns.
    odd = tmp_path / "odd"
    shutil.copytree(SHIPPED, odd)
    meta = json.loads((odd / "smartsched_policy.json").read_text())
    meta["env"]["heuristic_features"] = False
    (odd / "smartsched_policy.json").write_text(json.dumps(meta))
    fine = tmp_path / "fine"
    shutil.copytree(SHIPPED, fine)
    with pytest.raises(ValidationError) as e:
        make_scheduler(f"rl:{SHIPPED}?ensemble={fine}&ensemble={odd}", 0)
    assert e.value.field == "scheduler.ensemble[1]" and "heuristic_features" in e.value.message
    # Not a policy at all.
    with pytest.raises(ValidationError) as e:
        make_scheduler(f"rl:{SHIPPED}?ensemble={tmp_path / 'nothing'}", 0)
    assert "no trained policy" in e.value.message


@pytest.mark.parametrize(("query", "says"), [
    ("ensemble=", "must name a policy folder"),
    ("&".join([f"ensemble={SHIPPED}"] * (MAX_ENSEMBLE + 1)), f"at most {MAX_ENSEMBLE}"),
])
def test_bad_ensemble_options_are_named(query: str, says: str) -> None:
    with pytest.raises(ValidationError) as e:
        make_scheduler(f"rl:{SHIPPED}?{query}", 0)
    assert e.value.field == "scheduler.ensemble" and says in e.value.message


def test_a_live_reload_holds_members_to_the_models_dir(tmp_path: Path) -> None:
    """A member named without a slash (``ensemble=seed2``) is a path all the same: it was
    left as written, so the replica read it from its working directory."""
    from smartsched.serving.config import resolve_reload_profile

    root = str(tmp_path.resolve())
    assert resolve_reload_profile("rl:a?ensemble=seed2", root) == \
        f"rl:{root}/a?ensemble={root}/seed2"
    with pytest.raises(ValidationError) as e:
        resolve_reload_profile("rl:a?ensemble=/etc", root)
    assert e.value.field == "profile"


def test_members_find_alike_rows_once_per_decision(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every member brings all rows up to date from the same observation; the alike rows
    are found once per decision between them (``DistinctMemo``), and the choices stay
    those the independent sum gives (the test above)."""
    import smartsched.rl.fast_scorer as fs

    other = _perturbed(tmp_path, 1.3, "seed-b")
    third = _perturbed(tmp_path, 0.7, "seed-c")
    found: list[int] = []
    orig = fs._distinct
    monkeypatch.setattr(fs, "_distinct", lambda x, sid: found.append(1) or orig(x, sid))
    sched = make_scheduler(f"rl:{SHIPPED}?ensemble={other}&ensemble={third}", 0)
    picks: list[int] = []
    pick = sched._pick
    monkeypatch.setattr(sched, "_pick", lambda obs, *a: picks.append(1) or pick(obs, *a))
    # On `medium`: `small` has 16 nodes, fewer than a search for alike rows is worth.
    run = build_run("medium", "mixed", sched, seed=6, hours=1, warmup_hours=0)
    run.drive(max_decisions=150)
    assert len(picks) > 50 and 0 < len(found) <= len(picks)  # three members, one search
    assert sched._memo is not None and sched._memo.x is None  # cleared after each decision


def test_the_memo_answers_only_the_same_rows_and_ids() -> None:
    from types import SimpleNamespace

    import smartsched.rl.fast_scorer as fs

    memo = fs.DistinctMemo()
    owner = SimpleNamespace(memo=memo)
    x = np.zeros((20, 4), np.float32)  # every row alike
    one = np.zeros(20, np.int64)
    two = np.repeat(np.arange(2), 10)
    a = fs.FastScorer._distinct_rows(owner, x, one)
    b = fs.FastScorer._distinct_rows(owner, x, two)  # other ids: its own answer
    assert a is not None and b is not None and a[0].size == 1 and b[0].size == 2
    assert fs.FastScorer._distinct_rows(owner, x, two.copy()) is b  # equal ids: shared
    assert fs.FastScorer._distinct_rows(owner, x.copy(), two) is not b  # other rows object
    memo.clear()
    assert memo.x is None and memo.found is None
