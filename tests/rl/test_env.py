"""SchedulingEnv: gymnasium conformance, masks that admit only feasible nodes, honest reward."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from smartsched.model.errors import ValidationError
from smartsched.objectives.reward import COMPONENTS, RewardWeights, StepReward
from smartsched.rl.env import SchedulingEnv


def test_check_env() -> None:
    env = SchedulingEnv({"cluster": "small", "hours": 1, "max_decisions": 50})
    check_env(env, skip_render_check=True)


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["replay", "fill"]))
def test_mask_admits_only_feasible_nodes(seed: int, mode: str) -> None:
    env = SchedulingEnv({"cluster": "small", "hours": 2, "mode": mode, "max_decisions": 150,
                         "inflate": 0.6})
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    done = False
    while not done:
        mask = obs["action_mask"]
        n = env.engine.state.num_nodes
        allowed = np.flatnonzero(mask[:n])
        # Every admitted node really fits: the twin would accept it.
        for a in allowed:
            assert env.engine.state.resource_fit(env._req.request)[a]
        a = int(rng.choice(np.flatnonzero(mask)))
        obs, r, term, trunc, _ = env.step(a)  # raises if the twin refuses
        assert np.isfinite(r)
        done = term or trunc


def test_reward_is_the_weighted_twin_metrics() -> None:
    w = {"utilization": 1.0, "qos": 0.7, "cost": 0.3, "energy": 0.2, "fairness": 0.05,
         "carbon": 0.4}
    env = SchedulingEnv({"cluster": "small", "hours": 2, "max_decisions": None,
                         "reward_weights": w})
    obs, _ = env.reset(seed=4)
    first = env.engine.metrics.snapshot()
    total, done = 0.0, False
    sums = dict.fromkeys(COMPONENTS, 0.0)
    while not done:
        obs, r, term, trunc, info = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
        total += r
        for k, v in info["components"].items():
            sums[k] += v
        done = term or trunc
    last = env.engine.metrics.snapshot()
    from smartsched.model.pod import POD_CLASSES

    per_class = sum(last[f"pending_s.{c}"] for c in POD_CLASSES)
    assert per_class == pytest.approx(last["pending_s"])
    # Telescoping: the episode's components are the twin's totals, normalized once.
    ref = StepReward(RewardWeights(**w), env.engine.state.num_nodes,
                     float(env.engine.metrics.node_price_h.sum()),
                     float(env.engine.metrics.node_idle_w.sum()), fill_mode=False)
    ref.last = dict(first)
    expected = ref.components(last)
    for k in COMPONENTS:
        if k != "fairness":  # fairness weighs each span by the Jain index at its end
            assert sums[k] == pytest.approx(expected[k], rel=1e-9, abs=1e-12)
    assert total == pytest.approx(sum(w[k] * sums[k] for k in COMPONENTS), rel=1e-9)
    assert sums["utilization"] > 0 and sums["cost"] < 0


def test_env_config_errors_name_the_field() -> None:
    with pytest.raises(ValidationError) as e:
        SchedulingEnv({"clusterr": "small"})
    assert e.value.field == "env.clusterr"
    with pytest.raises(ValidationError) as e:
        SchedulingEnv({"reward_weights": {"speed": 1}})
    assert e.value.field == "reward_weights.speed"


def test_padding_masks_extra_nodes() -> None:
    env = SchedulingEnv({"cluster": "small", "hours": 1, "max_nodes": 40})
    obs, _ = env.reset(seed=0)
    assert obs["nodes"].shape == (40, env.observation_space["nodes"].shape[1])
    assert not obs["action_mask"][16:40].any()


def test_scenario_weights_sampling_and_dynamic_rules() -> None:
    from smartsched.objectives.scenarios import load_scenarios

    green = load_scenarios()["green"].vector()
    env = SchedulingEnv({"cluster": "small", "hours": 1, "reward_weights": "green"})
    obs, _ = env.reset(seed=0)
    assert np.allclose(obs["weights"], green)
    env = SchedulingEnv({"cluster": "small", "hours": 1, "weight_sampling": "scenarios"})
    seen = {tuple(env.reset(seed=s)[0]["weights"].round(3)) for s in range(12)}
    assert len(seen) >= 3  # different episodes optimize different scenarios
    # Dynamic: starting at midnight the night rule switches to "green" at the first check.
    env = SchedulingEnv({"cluster": "small", "hours": 2, "dynamic_weights": True,
                         "max_decisions": 30})
    obs, _ = env.reset(seed=1)
    done = False
    while not done:
        obs, _, term, trunc, _ = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
        done = term or trunc
    assert env.weights_log and env.weights_log[0]["profile"] == "green"
    assert "night" in env.weights_log[0]["reason"]
    assert np.allclose(obs["weights"], green)
    with pytest.raises(ValidationError):
        SchedulingEnv({"weight_sampling": "sometimes"})


def test_forecast_columns_carry_the_forecasters_prediction(tiny_forecaster) -> None:
    """With a forecaster the node features gain two columns: predicted cpu and memory use
    as fractions of capacity (current usage until the forecaster has a full lookback)."""
    from smartsched.model.resources import CPU, MEM
    from smartsched.rl.features import FORECAST_COLS, NODE_FEATURES

    plain = SchedulingEnv({"cluster": "small", "hours": 3, "max_decisions": 400})
    env = SchedulingEnv({"cluster": "small", "hours": 3, "max_decisions": 400,
                         "forecaster": f"{tiny_forecaster}?plan=median"})
    assert env.observation_space["nodes"].shape[1] == NODE_FEATURES + FORECAST_COLS
    assert plain.observation_space["nodes"].shape[1] == NODE_FEATURES
    obs, _ = env.reset(seed=3)
    plain_obs, _ = plain.reset(seed=3)
    st = env.engine.state
    assert env.engine.usage_predictor.plan == "median"
    n = st.num_nodes
    cap = st.capacity[:, [CPU, MEM]]
    cols = slice(NODE_FEATURES, NODE_FEATURES + FORECAST_COLS)
    np.testing.assert_allclose(obs["nodes"][:n, cols], st.usage[:, :2] / cap, atol=1e-6)
    # The fixed columns are the same as without a forecaster.
    np.testing.assert_array_equal(obs["nodes"][:, :NODE_FEATURES], plain_obs["nodes"])
    seen_prediction = False
    done = False
    while not done:
        obs, _, term, trunc, _ = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
        done = term or trunc
        if not done and st.predicted_usage is not None:
            seen_prediction = True
            np.testing.assert_allclose(obs["nodes"][:n, cols],
                                       np.clip(st.predicted_usage / cap, -10, 10), atol=1e-5)
    assert seen_prediction
    with pytest.raises(ValidationError, match="plan"):
        SchedulingEnv({"cluster": "small", "forecaster": f"{tiny_forecaster}?plan=mean"})
