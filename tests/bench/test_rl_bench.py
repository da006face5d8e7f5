"""bench rl's in-process measurements (figures only, no timing assertions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from smartsched.bench.rl import (
    _steered_latency,
    env_and_model_split,
    inference_latency,
    rllib_sampling,
)

ROOT = Path(__file__).resolve().parents[2]
ENSEMBLE = (f"{ROOT}/models/ppo_shortlist_online_s0"
            f"?ensemble={ROOT}/models/ppo_shortlist_online_s2")


def test_env_and_model_split() -> None:
    r = env_and_model_split(None, steps=40)
    assert r["steps"] == 40 and r["steps_per_second"] > 0
    assert abs(r["twin_share"] + r["model_share"] - 1.0) < 1e-9


def test_inference_latency_untrained(data_dir: Path) -> None:
    r = inference_latency(None, nodes=1600, decisions=20)
    assert r["decisions"] == 19 and r["p99_ms"] >= r["p50_ms"] > 0


def test_a_shortlist_policy_is_timed_on_the_decisions_it_chose_in(data_dir: Path) -> None:
    """A policy steering online pods within the composite's shortlist never decides on the
    openb trace; it is timed on the mixed workload, and only where it chose: the count
    timed is the shortlist's own count of decisions (the first, which builds caches, is
    reported apart)."""
    from smartsched.bench.speed import replicated_cluster
    from smartsched.rl.policy import make_rl_scheduler

    sched = make_rl_scheduler(ENSEMBLE, 42)
    assert sched.members  # the ensemble was built, so every member is timed
    r = _steered_latency(sched, replicated_cluster("medium", 240), decisions=12)
    assert r["nodes"] == 240 and r["workload"] == "mixed"
    assert r["decisions"] == 12 and sched.shortlist.decisions == 13
    assert r["p99_ms"] >= r["p50_ms"] > 0


def test_bench_rl_options_need_latency_only() -> None:
    from click.testing import CliRunner

    from smartsched.cli import main

    r = CliRunner().invoke(main, ["bench", "rl", "--policy", ENSEMBLE, "--skip-sampling"])
    assert r.exit_code != 0 and "--latency-only" in r.output, r.output
    # A shortlist policy without options too: parts 1 and 2 would run it without its base.
    plain = f"{ROOT}/models/ppo_shortlist_online_s0"
    r = CliRunner().invoke(main, ["bench", "rl", "--policy", plain, "--skip-sampling"])
    assert r.exit_code != 0 and "shortlist" in r.output and "--latency-only" in r.output
    r = CliRunner().invoke(main, ["bench", "rl", "--latency-only", "--sizes", "1"])
    assert r.exit_code == 2 and "--sizes" in r.output, r.output


def test_bench_rl_refuses_bad_sampling_options_naming_them() -> None:
    from click.testing import CliRunner

    from smartsched.cli import main

    for args, name in ((["--envs-per-runner", "0"], "--envs-per-runner"),
                       (["--envs-per-runner", "8,x"], "--envs-per-runner"),
                       (["--rounds", "0"], "--rounds")):
        r = CliRunner().invoke(main, ["bench", "rl", "--skip-sampling", *args])
        assert r.exit_code == 2 and name in r.output, r.output


@pytest.mark.slow
def test_rllib_sampling_reports_each_round(ray_session) -> None:
    r = rllib_sampling(rounds=2, num_envs_per_env_runner=2)
    assert r["steps"] >= 2 * 2 * 1000 and r["steps_per_second"] > 0
    assert len(r["rounds_steps_per_second"]) == 2
    assert all(x > 0 for x in r["rounds_steps_per_second"])
