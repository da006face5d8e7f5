"""A bad sweep file is one named line before anything runs (no baseline run, no Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from smartsched.cli import main
from smartsched.model.errors import ValidationError
from smartsched.tuning import runner
from smartsched.tuning.runner import _metric
from smartsched.tuning.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[2]

SWEEP = """
train_config: {root}/rllib_configs/ppo_default.yaml
search_space:
  utilization: {utilization}
  energy: 0.1
objectives:
  utilization_pct: {{metric: {metric}, mode: max, component: utilization}}
  energy_kwh: {{metric: energy_kwh, mode: min, component: energy}}
evaluation: {{policy_options: "{options}"}}
seed: {seed}
output_dir: {out}
"""


def _sweep(tmp_path: Path, *, utilization: str = "{low: 0.2, high: 2.0}",
           metric: str = "usage_on_pct.cpu", options: str = "", seed: int = 0,
           extra: str = "") -> Path:
    f = tmp_path / "sweep.yaml"
    f.write_text(SWEEP.format(root=ROOT, utilization=utilization, metric=metric,
                              options=options, seed=seed, out=tmp_path / "out") + extra)
    return f


def test_a_good_sweep_loads(tmp_path: Path) -> None:
    sweep = load_sweep(_sweep(tmp_path, options="defer=false&weights=balanced", seed=2**32 - 1))
    assert sweep.searched()["utilization"].high == 2.0


@pytest.mark.parametrize(("metric", "says"), [
    ("[]", "at least one metric path"),
    ("''", "not a dotted metric path"),
    ("pods..waiting_pod_hours", "not a dotted metric path"),
])
def test_an_objective_without_a_usable_metric_path_is_named(tmp_path: Path, metric: str,
                                                             says: str) -> None:
    with pytest.raises(ValidationError) as e:
        load_sweep(_sweep(tmp_path, metric=metric))
    assert e.value.field == "sweep.objectives.utilization_pct.metric"
    assert says in e.value.message


def test_a_seed_optuna_cannot_take_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as e:
        load_sweep(_sweep(tmp_path, seed=2**32))
    assert e.value.field == "sweep.seed"


@pytest.mark.parametrize(("rng", "says"), [
    ("{low: 2, high: 1}", "high must be > low"),
    ("{low: 0, high: 1, log: true}", "log ranges need low > 0"),
    ("{low: .nan, high: 1}", "finite"),
])
def test_a_bad_range_says_why(tmp_path: Path, rng: str, says: str) -> None:
    with pytest.raises(ValidationError) as e:
        load_sweep(_sweep(tmp_path, utilization=rng))
    assert e.value.field.startswith("sweep.search_space.utilization")
    assert says in e.value.message and "valid number" not in e.value.message


@pytest.mark.parametrize(("options", "says"), [
    ("bogus=42&&&", "bogus: unknown rl: option"),
    ("defer=maybe", "defer: must be true or false"),
    ("k=0", "k: must be an integer"),
    ("weights=nope", "weights: unknown scenario"),
    ("filters=nope", "filters: unknown scheduler"),
])
def test_bad_policy_options_are_named_up_front(tmp_path: Path, options: str,
                                               says: str) -> None:
    with pytest.raises(ValidationError) as e:
        load_sweep(_sweep(tmp_path, options=options))
    assert e.value.field == "sweep.evaluation.policy_options"
    assert says in e.value.message


def _no_run(*_a: object, **_k: object) -> None:
    raise AssertionError("the sweep ran although its file is bad")


def test_overrides_that_break_minibatch_within_batch_fail_before_any_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "evaluate", _no_run)
    f = _sweep(tmp_path, extra="train_overrides: {training: {train_batch_size_per_learner: "
                               "1000, minibatch_size: 5000}}\n")
    r = CliRunner().invoke(main, ["tune", "--sweep", str(f)])
    assert r.exit_code == 2, r.output
    assert "training.minibatch_size: must be <= train_batch_size_per_learner" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()


def test_the_cli_names_a_bad_objective_in_one_line(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "evaluate", _no_run)
    r = CliRunner().invoke(main, ["tune", "--sweep", str(_sweep(tmp_path, metric="[]"))])
    assert r.exit_code == 2 and "sweep.objectives.utilization_pct.metric" in r.output


def test_a_metric_missing_from_the_report_names_its_objective() -> None:
    report = {"pods": {"waiting_pod_hours": 1.5, "total": 3}, "energy_kwh": 2.0}
    field = "sweep.objectives.q.metric"
    assert _metric(report, "pods.waiting_pod_hours", field) == 1.5
    with pytest.raises(ValidationError) as e:
        _metric(report, "no.such.metric", field)
    assert e.value.field == field and "energy_kwh, pods" in e.value.message
    with pytest.raises(ValidationError) as e:
        _metric(report, "pods", field)
    assert e.value.field == field and "not a number" in e.value.message


def test_num_samples_on_the_command_line_has_the_sweeps_bound(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["tune", "--sweep", str(_sweep(tmp_path)),
                                  "--num-samples", "1000000000"])
    assert r.exit_code == 2 and "'--num-samples'" in r.output


@pytest.mark.parametrize("name", ["reward_weights.yaml", "reward_weights_medium.yaml"])
def test_the_shipped_sweeps_still_load(name: str) -> None:
    assert load_sweep(ROOT / "tune_sweeps" / name).searched()


def test_a_trial_larger_than_the_machine_fails_before_the_baseline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tune queues a trial no node can host and waits for ever: after the baseline's runs,
    the sweep hung. The embedded Ray's size is known before anything runs."""
    import ray

    monkeypatch.setattr(runner, "evaluate", _no_run)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    r = CliRunner().invoke(main, ["tune", "--sweep", str(_sweep(tmp_path,
                                                                extra="trial_cpus: 1000\n"))])
    assert r.exit_code == 2, r.output
    assert ("sweep.trial_cpus: asks for 1001 CPUs (each trial: 1000 of its own and 1 for "
            "each of its 1 env runners)") in r.output
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()
