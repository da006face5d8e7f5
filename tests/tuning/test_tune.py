"""A tiny Tune run through `smartsched tune`: Pareto table, plot, weights YAML, TensorBoard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from smartsched.cli import main
from smartsched.objectives.scenarios import load_scenarios

ROOT = Path(__file__).resolve().parents[2]

TINY_SWEEP = """
train_config: {root}/rllib_configs/ppo_default.yaml
train_overrides:
  env: {{hours: 1, warmup_hours: 0, max_decisions: 60}}
  env_runners: {{num_env_runners: 0, num_envs_per_env_runner: 1}}
  training: {{train_batch_size_per_learner: 64, minibatch_size: 32, num_epochs: 1}}
  model: {{hidden: 16}}
search_space:
  utilization: {{low: 0.2, high: 2.0}}
  qos: {{low: 0.05, high: 3.0, log: true}}
  energy: 0.1
objectives:
  utilization_pct: {{metric: [usage_on_pct.cpu, usage_on_pct.gpu], mode: max,
                     component: utilization}}
  waiting_pod_hours: {{metric: pods.waiting_pod_hours, mode: min, component: qos}}
  energy_kwh: {{metric: energy_kwh, mode: min, component: energy}}
evaluation: {{cluster: small, workload: mixed, hours: 1, warmup_hours: 0, seeds: [7]}}
num_samples: 2
max_concurrent: 2
reports: 1
iterations_per_report: 1
searcher: optuna
asha: {{grace_period: 1}}
trial_cpus: 1
output_dir: {out}
"""


@pytest.mark.slow
def test_tiny_sweep_writes_front_and_weights(ray_session, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    f = tmp_path / "sweep.yaml"
    f.write_text(TINY_SWEEP.format(root=ROOT, out=out))
    r = CliRunner().invoke(main, ["tune", "--sweep", str(f), "--json",
                                  str(tmp_path / "s.json")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "s.json").read_text())
    trials = summary["trials"]
    assert len(trials) == 2
    # Every trial trained with its own searched weights and was measured on the twin.
    assert len({t["weights"]["qos"] for t in trials}) == 2
    for t in trials:
        assert t["iterations"] == 1 and t["values"]["utilization_pct"] > 0
        assert t["weights"]["energy"] == 0.1 and t["checkpoint"]
    assert any(t["pareto"] for t in trials)
    assert "| k8s-default |" in (out / "pareto.md").read_text()
    assert (out / "pareto.png").stat().st_size > 10_000
    rec = load_scenarios(out / "recommended_weights.yaml")
    assert set(rec) == set(load_scenarios())
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "tune").rglob("*"))


def test_bad_sweep_is_named(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("search_space: {qos: {low: 3, high: 1}}\n")
    r = CliRunner().invoke(main, ["tune", "--sweep", str(f)])
    assert r.exit_code == 2 and "sweep.search_space.qos" in r.output
