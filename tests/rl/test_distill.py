"""Policy distillation (``rl.distill``, ``smartsched distill``): a student network trained
on an ensemble's decisions in the twin.

Checked: the recorder keeps only decisions with a choice, with the teacher's
distribution over exactly the allowed actions, and answers the teacher's argmax (or,
with an actor, the actor's, counting agreement); a recorded day acts exactly as the
teacher alone does; fitting lowers the cross-entropy to the teacher and the exported
student loads through ``rl:PATH`` and scores as the module that was fitted; a DAgger
round is collected with the student acting; bad input (a teacher that is not a learned
policy, overlapping seeds, an output folder holding other files) is refused naming the
field, and nothing in that folder is touched.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from smartsched.bench.simulate import simulate
from smartsched.cli import main
from smartsched.model.errors import ValidationError
from smartsched.rl.artifact import read_module
from smartsched.rl.distill import (
    Recorder,
    Teaching,
    check_output_dir,
    collect,
    distill_policy,
    evaluate,
    fit,
)
from smartsched.rl.fast_scorer import FastScorer
from smartsched.scheduling.base import make_scheduler

MODELS = Path(__file__).resolve().parents[2] / "models"
S0, S3 = MODELS / "ppo_shortlist_online_s0", MODELS / "ppo_shortlist_online_s3"
PAIR = f"rl:{S0}?ensemble={S3}"
SHORT = {"cluster": "medium", "hours": 0.5, "warmup_hours": 0.0, "workers": 1}


def _obs(n: int = 5, cols: int = 48) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"nodes": rng.random((n, cols), dtype=np.float32),
            "pod": np.ones(19, np.float32), "weights": np.ones(8, np.float32),
            "action_mask": np.ones(n + 1, np.float32)}


class _Actor:
    def __init__(self, logits: np.ndarray) -> None:
        self.logits = logits

    def logits_at(self, obs: dict[str, np.ndarray], idx: np.ndarray) -> np.ndarray:
        return self.logits[idx]


def test_the_recorder_keeps_decisions_with_a_choice_and_answers_the_teachers_argmax() -> None:
    rec = Recorder(seed=7)
    obs = _obs()
    assert rec(obs, np.array([2]), np.array([0.0])) is None  # one allowed: nothing learnt
    logp = np.log(np.array([0.2, 0.5, 0.3]))
    assert rec(obs, np.array([0, 3, 4]), logp) == 3
    obs["nodes"][:] = -1  # the observation's buffers may be reused: a copy was kept
    data = rec.teaching()
    assert len(data) == 1 and data.seed.tolist() == [7]
    np.testing.assert_allclose(data.target[0], [0.2, 0, 0, 0.5, 0.3, 0], rtol=1e-6)
    assert data.obs["action_mask"][0].tolist() == [1, 0, 0, 1, 1, 0]  # what was allowed
    assert data.obs["nodes"][0].min() >= 0


def test_with_an_actor_the_actor_acts_and_agreement_is_counted() -> None:
    rec = Recorder(seed=0, actor=_Actor(np.array([0.0, 9.0, 0.0, 0.0, 1.0, 0.0])))
    logp = np.log(np.array([0.1, 0.6, 0.3]))
    assert rec(_obs(), np.array([1, 3, 4]), logp) == 1  # the actor's pick, the teacher's 3
    assert rec(_obs(), np.array([0, 1]), np.log(np.array([0.4, 0.6]))) == 1  # both say 1
    assert rec.agree == 1 and len(rec.teaching()) == 2


@pytest.mark.parametrize("teacher", [PAIR, f"rl:{S0}"], ids=["ensemble", "one policy"])
def test_a_recorded_day_decides_as_the_teacher_alone(teacher: str) -> None:
    """Recording changes nothing the teacher decides (the recorder answers its argmax;
    for one policy that is the argmax of its log-softmax, as ``FastScorer.best``)."""
    def figures(scheduler: object) -> str:
        rep = simulate("medium", "mixed", scheduler, seed=3, hours=0.5, warmup_hours=0,
                       plots=False)
        m = {k: v for k, v in rep["metrics"].items()
             if k not in ("decision_latency_us", "decisions_per_second")}
        return json.dumps(m, sort_keys=True, default=str)

    recorded = make_scheduler(teacher, 3)
    recorded.recorder = Recorder(seed=3)
    assert figures(recorded) == figures(teacher)
    assert len(recorded.recorder.teaching()) > 50


@pytest.fixture(scope="module")
def teaching() -> tuple[Teaching, Teaching]:
    train, stats = collect(PAIR, [1], **SHORT)
    val, _ = collect(PAIR, [2], **SHORT)
    assert stats[0]["decisions_with_choice"] == len(train) > 50
    return train, val


def test_fitting_moves_the_student_towards_the_teacher(teaching: tuple[Teaching, Teaching],
                                                       tmp_path: Path) -> None:
    train, val = teaching
    init = read_module(S0)
    init.eval()
    before = evaluate(init, train)
    student, history = fit(train, S0, val=val, epochs=3, lr=1e-3, echo=lambda _s: None)
    after = evaluate(student, train)
    assert after["kl"] < 0.8 * before["kl"]
    assert len(history) == 3 and all("val_kl" in h for h in history)
    # The kept epoch is the one with the lowest KL on the held-aside seed.
    assert evaluate(student, val)["kl"] == pytest.approx(min(h["val_kl"] for h in history),
                                                         rel=1e-5)


def test_the_exported_student_loads_as_a_policy_and_scores_as_fitted(
        teaching: tuple[Teaching, Teaching], tmp_path: Path) -> None:
    from smartsched.rl.distill import export_student

    train, _ = teaching
    student, _ = fit(train, S0, epochs=1, echo=lambda _s: None)
    out = export_student(student, S0, tmp_path / "student", {"teacher": PAIR})
    meta = json.loads((out / "smartsched_policy.json").read_text())
    assert meta["distilled"]["teacher"] == PAIR
    assert meta["env"]["base"] == "composite"  # acts within the teacher's shortlist
    sched = make_scheduler(f"rl:{out}", 0)
    obs = {k: v[0] for k, v in train.obs.items()}
    import torch
    from ray.rllib.core.columns import Columns

    with torch.no_grad():
        want = student.forward_inference(
            {Columns.OBS: {k: torch.from_numpy(v[None]) for k, v in obs.items()}}
        )[Columns.ACTION_DIST_INPUTS][0].numpy()
    idx = np.flatnonzero(obs["action_mask"])
    np.testing.assert_allclose(FastScorer(sched.module).logits_at(obs, idx), want[idx],
                               rtol=1e-4, atol=1e-4)


def test_a_dagger_round_collects_with_the_student_acting(tmp_path: Path) -> None:
    summary = distill_policy(PAIR, tmp_path / "student", seeds=[1], val_seeds=[2],
                             epochs=1, dagger_rounds=1, echo=lambda _s: None,
                             **SHORT)
    assert [r["acted_by"] for r in summary["rounds"]] == ["teacher", "student"]
    agreement = summary["rounds"][1]["collect"][0]["actor_agreement"]
    assert 0.5 < agreement <= 1.0
    assert summary["decisions"] == summary["rounds"][0]["decisions"] + summary["rounds"][1][
        "decisions"]
    assert (tmp_path / "student.distill.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["student", "student.distill.json"]
    assert summary["kept_round"] in (0, 1)
    make_scheduler(f"rl:{tmp_path / 'student'}", 0)


def test_bad_input_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as e:
        collect("k8s-default", [1], **SHORT)
    assert e.value.field == "teacher"
    with pytest.raises(ValidationError) as e:
        distill_policy(PAIR, tmp_path / "s", seeds=[1, 2], val_seeds=[2], **SHORT)
    assert e.value.field == "val_seeds"
    with pytest.raises(ValidationError) as e:
        distill_policy(PAIR, tmp_path / "s", seeds=[1], val_seeds=[2], dagger_rounds=-1,
                       **SHORT)
    assert e.value.field == "dagger_rounds"
    with pytest.raises(ValidationError) as e:
        collect(f"rl:{S0}?weights=green", [1], **SHORT)  # not carried by the student
    assert e.value.field == "teacher"
    with pytest.raises(ValidationError) as e:  # another action space than the teacher's
        distill_policy(PAIR, tmp_path / "s", seeds=[1], val_seeds=[2],
                       init=str(MODELS / "ppo_mixed_small"), **SHORT)
    assert e.value.field == "init" and "base" in e.value.message
    with pytest.raises(ValidationError) as e:  # the teacher's own folder is kept
        distill_policy(PAIR, S3, seeds=[1], val_seeds=[2], **SHORT)
    assert e.value.field == "output_dir"
    busy = tmp_path / "models"
    (busy / "forecast").mkdir(parents=True)
    (busy / "forecast" / "keep.json").write_text("{}")
    with pytest.raises(ValidationError) as e:
        check_output_dir(busy)
    assert e.value.field == "output_dir"
    assert (busy / "forecast" / "keep.json").read_text() == "{}"


def test_the_command_line_refuses_before_simulating(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["distill", "--teacher", "k8s-default",
                               "--output-dir", str(tmp_path / "s")])
    assert res.exit_code == 2 and "--teacher" in res.output and "rl:PATH" in res.output
    res = runner.invoke(main, ["distill", "--teacher", f"rl:{tmp_path / 'none'}",
                               "--output-dir", str(tmp_path / "s")])
    assert res.exit_code == 2 and "--teacher" in res.output
    res = runner.invoke(main, ["distill", "--teacher", PAIR, "--output-dir", str(S0)])
    assert res.exit_code == 2 and "--overwrite" in res.output  # a shipped model stays
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    res = runner.invoke(main, ["distill", "--teacher", PAIR, "--output-dir", str(busy),
                               "--seeds", "1", "--val-seeds", "2", "--hours", "0.5",
                               "--warmup-hours", "0"])
    assert res.exit_code != 0 and "output_dir" in res.output
    assert (busy / "notes.txt").read_text() == "mine"


def test_the_command_line_distills_a_student(tmp_path: Path) -> None:
    out = tmp_path / "student"
    res = CliRunner().invoke(main, ["distill", "--teacher", PAIR, "--output-dir", str(out),
                                    "--seeds", "1", "--val-seeds", "2", "--hours", "0.5",
                                    "--warmup-hours", "0", "--epochs", "1", "--workers", "1",
                                    "--json", str(tmp_path / "s.json")])
    assert res.exit_code == 0, res.output
    assert "agreement with the teacher" in res.output
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["val_decisions"] > 50 and 0.5 < summary["val_agreement"] <= 1.0
    make_scheduler(f"rl:{out}", 0)


def test_the_shipped_student_decides_as_the_four_it_was_distilled_from() -> None:
    """On a day none of them was collected on, the shipped student acting while the four
    label agrees with them on nearly every decision with a choice."""
    student = MODELS / "ppo_shortlist_online_distilled"
    members = "&".join(f"ensemble={MODELS}/ppo_shortlist_online_s{i}" for i in (1, 2, 3))
    four = f"rl:{S0}?{members}"
    _, stats = collect(four, [99], actor=str(student), **SHORT)
    assert stats[0]["decisions_with_choice"] > 50
    assert stats[0]["actor_agreement"] > 0.97
    meta = json.loads((student / "smartsched_policy.json").read_text())
    assert meta["distilled"]["dagger_rounds"] == 0 and meta["env"]["base"] == "composite"
