"""A tiny training run through `smartsched train`, its checkpoint as `rl:PATH`, and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from smartsched.bench.simulate import simulate
from smartsched.cli import main

TINY = """
env: {cluster: small, hours: 1, max_decisions: 100}
env_runners: {num_env_runners: 0, num_envs_per_env_runner: 1}
training: {train_batch_size_per_learner: 128, minibatch_size: 64, num_epochs: 1}
model: {hidden: 16}
iterations: 2
checkpoint_every: 1
output_dir: OUT
"""


@pytest.mark.slow
def test_train_checkpoint_rl_profile_and_resume(ray_session, tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY.replace("OUT", str(out)))
    runner = CliRunner()
    r = runner.invoke(main, ["train", "--config", str(cfg)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "iter    2" in r.output
    assert (out / "latest").read_text().strip() == "iter_000002"
    policy = out / "policy"
    assert (policy / "smartsched_policy.json").is_file()
    assert (out / "tensorboard").is_dir() and any((out / "tensorboard").iterdir())

    # The exported policy is a scheduler, on a larger cluster than it was trained on.
    rep = simulate("medium", "mixed", f"rl:{policy}", hours=2, seed=5, plots=False)
    assert rep["decisions"] > 0 and rep["metrics"]["pods"]["placed"] > 0
    assert rep["weights_log"] == []  # fixed weights never move
    # Weights from a scenario, moved by the dynamic rules: midnight is night -> green.
    rep = simulate("small", "mixed", f"rl:{policy}?weights=balanced&dynamic=true", hours=2,
                   seed=5, plots=False)
    assert rep["weights_log"] and rep["weights_log"][0]["profile"] == "green"
    assert "night" in rep["weights_log"][0]["reason"]

    r = runner.invoke(main, ["train", "--config", str(cfg), "--resume", "--iterations", "1"],
                      catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "resumed from" in r.output and "iter    3" in r.output
    meta = json.loads((policy / "smartsched_policy.json").read_text())
    assert meta["iteration"] == 3


@pytest.mark.slow
def test_policy_trained_on_forecast_and_telemetry_features_carries_both(
        ray_session, tmp_path: Path, tiny_forecaster: Path, tiny_projection: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    from smartsched.scheduling.base import make_scheduler

    out = tmp_path / "run"
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY.replace("OUT", str(out)).replace(
        "max_decisions: 100}", f"max_decisions: 100, forecaster: '{tiny_forecaster}', "
                               f"telemetry: '{tiny_projection}'}}"))
    r = CliRunner().invoke(main, ["train", "--config", str(cfg), "--iterations", "1"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    policy = out / "policy"
    meta = json.loads((policy / "smartsched_policy.json").read_text())
    assert meta["env"]["forecaster"] == "forecaster"
    assert (policy / "forecaster" / "forecaster.pt").is_file()
    assert meta["env"]["telemetry"] == "telemetry"
    assert (policy / "telemetry" / "projection.npz").is_file()
    sched = make_scheduler(f"rl:{policy}", 0)
    assert sched.forecaster == str(policy / "forecaster")
    assert sched.telemetry == str(policy / "telemetry")
    # The twin attaches it, and the wider observation matches the module's input.
    rep = simulate("small", "mixed", f"rl:{policy}", hours=2, seed=5, plots=False)
    assert rep["metrics"]["pods"]["placed"] > 0

    # Outside the twin nobody fills the telemetry columns: the scheduler says so, once.
    import logging

    from smartsched.model.presets import load_cluster
    from smartsched.twin.state import ClusterState
    from smartsched.workloads.resolve import load_workload

    spec = load_cluster("small")
    state = ClusterState(spec)
    pods = load_workload("mixed", spec, 1, 0)[:2]
    sched.prepare(pods)
    with caplog.at_level(logging.WARNING, logger="smartsched.rl.policy"):
        for pod in pods:
            sched.decide(state, state.compile(pod))
    warned = [r for r in caplog.records if "telemetry components" in r.getMessage()]
    assert len(warned) == 1


def test_bad_train_config_is_named(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("training: {minibatch_size: 0}\n")
    r = CliRunner().invoke(main, ["train", "--config", str(cfg)])
    assert r.exit_code == 2
    assert "training.minibatch_size" in r.output
    cfg.write_text("env: {clusterr: small}\n")
    r = CliRunner().invoke(main, ["train", "--config", str(cfg)])
    assert r.exit_code == 2 and "env.clusterr" in r.output


def test_unknown_policy_path(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["simulate", "--scheduler", f"rl:{tmp_path}/nope",
                                  "--no-plots"])
    assert r.exit_code == 2 and "no trained policy" in r.output
    r = CliRunner().invoke(main, ["simulate", "--scheduler", f"rl:{tmp_path}/p?colour=red",
                                  "--no-plots"])
    assert r.exit_code == 2 and "scheduler.colour" in r.output
    r = CliRunner().invoke(main, ["simulate", "--scheduler", f"rl:{tmp_path}/p?dynamic=maybe",
                                  "--no-plots"])
    assert r.exit_code == 2 and "scheduler.dynamic" in r.output


CONFIGS = sorted((Path(__file__).parents[2] / "rllib_configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_train_configs_build_their_env(path: Path, monkeypatch) -> None:
    """Every config under rllib_configs/ parses and its env builds (forecaster and
    telemetry projection found, observation width as the config implies)."""
    from smartsched.rl.config import load_train_config
    from smartsched.rl.env import SchedulingEnv
    from smartsched.rl.features import FORECAST_COLS, NODE_FEATURES

    monkeypatch.chdir(path.parents[1])  # paths in the configs are relative to the repo
    cfg = load_train_config(path)
    env = SchedulingEnv(cfg.env)
    width = NODE_FEATURES + (FORECAST_COLS if cfg.env.get("forecaster") else 0)
    if cfg.env.get("telemetry"):
        from smartsched.twin.telemetry.reduction import TelemetryProjection

        width += TelemetryProjection.load(path.parents[1] / cfg.env["telemetry"]).k
    assert env.observation_space["nodes"].shape[1] == width
