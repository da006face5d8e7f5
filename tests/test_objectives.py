"""Scenario profiles and dynamic weight rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from smartsched.model.errors import UnknownReferenceError, ValidationError
from smartsched.objectives.dynamic import ClusterCondition, DynamicRules, DynamicWeights
from smartsched.objectives.scenarios import load_scenarios, scenario


def test_packaged_scenarios() -> None:
    s = load_scenarios()
    assert {"balanced", "ai-training", "online-peak", "finance-batch", "green"} <= set(s)
    assert s["green"].energy > s["balanced"].energy
    assert s["online-peak"].qos > s["balanced"].qos
    with pytest.raises(UnknownReferenceError):
        scenario("party")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("x: {weights: {speed: 1}}", "scenarios.x.weights.speed"),
        ("x: {weights: {qos: -1}}", "scenarios.x.weights.qos"),
        ("x: {weights: {qos: high}}", "scenarios.x.weights.qos"),
        ("x: {weights: {qos: 0, cost: 0}}", "scenarios.x.weights"),
        ("x: {wieghts: {qos: 1}}", "scenarios.x.weights"),
        ("x: {weights: {qos: 1}, colour: red}", "scenarios.x.colour"),
    ],
)
def test_bad_scenarios_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(text + "\n")
    with pytest.raises(ValidationError) as e:
        load_scenarios(f)
    assert e.value.field == field


def _cond(**kw) -> ClusterCondition:
    base = {"time_s": 14 * 3600.0, "online_recent_rate": 1.0, "online_baseline_rate": 1.0,
            "ai_backlog": 0, "nodes": 40}
    return ClusterCondition(**{**base, **kw})


def test_rules_fire_on_constructed_conditions() -> None:
    dw = DynamicWeights(DynamicRules(), load_scenarios())
    assert dw.rules.choose(_cond())[0] == "balanced"
    assert dw.rules.choose(_cond(online_recent_rate=3.5))[0] == "online-peak"
    assert dw.rules.choose(_cond(ai_backlog=4))[0] == "ai-training"
    assert dw.rules.choose(_cond(ai_backlog=3))[0] == "balanced"
    assert dw.rules.choose(_cond(time_s=2 * 3600.0))[0] == "green"
    # Surge outranks backlog, backlog outranks night.
    assert dw.rules.choose(_cond(online_recent_rate=5, ai_backlog=9))[0] == "online-peak"
    assert dw.rules.choose(_cond(time_s=3600.0, ai_backlog=9))[0] == "ai-training"


def test_weights_switch_and_log_why() -> None:
    profiles = load_scenarios()
    dw = DynamicWeights(DynamicRules(), profiles)
    dw.update(_cond())
    assert dw.log == []
    w = dw.update(_cond(online_recent_rate=4.0))
    assert w.tolist() == pytest.approx(profiles["online-peak"].vector().tolist())
    assert dw.log[-1]["profile"] == "online-peak" and "4.0x" in dw.log[-1]["reason"]
    dw.update(_cond())
    assert dw.log[-1]["profile"] == "balanced" and len(dw.log) == 2


def test_blend_moves_part_of_the_way() -> None:
    profiles = load_scenarios()
    dw = DynamicWeights(DynamicRules(blend=0.5), profiles)
    w = dw.update(_cond(time_s=3600.0))
    expect = 0.5 * profiles["balanced"].vector() + 0.5 * profiles["green"].vector()
    assert w.tolist() == pytest.approx(expect.tolist())


def _snap(**kw: float) -> dict[str, float]:
    from smartsched.model.pod import POD_CLASSES

    base = {"time_s": 0.0, "alloc_cpu_frac_s": 0.0, "alloc_gpu_frac_s": 0.0,
            "gpu_alloc_frac": 0.0, "cpu_alloc_frac": 0.0, "pending_s": 0.0,
            "pending_gpu_frac_s": 0.0, "contended_s": 0.0, "energy_j": 0.0,
            "cost_usd": 0.0, "carbon_g": 0.0, "jain": 1.0, "contended_share_s": 0.0,
            "cross_zone_share_s": 0.0,
            **{f"pending_s.{c}": 0.0 for c in POD_CLASSES}}
    return {**base, **kw}


def test_component_formulas_on_constructed_metrics() -> None:
    from smartsched.objectives.reward import RewardWeights, StepReward

    # 10 nodes, 50 USD/h all on, 2 kW idle.
    r = StepReward(RewardWeights(), nodes=10, cost_per_hour=50.0, idle_watts=2000.0,
                   fill_mode=False)
    r.components(_snap())
    c = r.components(_snap(
        time_s=3600.0, alloc_cpu_frac_s=0.6 * 3600, alloc_gpu_frac_s=0.2 * 3600,
        # one hour: 5 online pods waiting, 4 batch pods waiting, 1 in contention
        **{"pending_s.online": 5 * 3600.0, "pending_s.batch": 4 * 3600.0},
        pending_s=9 * 3600.0, contended_s=3600.0, pending_gpu_frac_s=0.25 * 3600,
        cost_usd=25.0, energy_j=2000.0 * 3600 * 1.5, carbon_g=2.0 * 1.5 * 200.0, jain=0.8,
        # a fifth of the online pods contended for the hour; 30 % of app traffic crossed
        contended_share_s=0.2 * 3600, cross_zone_share_s=0.3 * 3600,
    ))
    assert c["utilization"] == pytest.approx(0.4)  # (0.6 + 0.2) / 2 for one hour
    # (2 x 5 online + 0.5 x 4 batch + 1 contended) / 10 nodes + 0.25 of the GPUs waited
    assert c["qos"] == pytest.approx(-((10 + 2 + 1) / 10 + 0.25))
    assert c["cost"] == pytest.approx(-0.5)  # half the all-on price
    assert c["energy"] == pytest.approx(-1.5)  # 1.5 idle-cluster hours
    assert c["carbon"] == pytest.approx(-0.75)  # same energy on a 200 g/kWh grid, ref 400
    assert c["fairness"] == pytest.approx(-0.2)
    assert c["contention"] == pytest.approx(-0.2)  # a share, not divided by nodes
    assert c["traffic"] == pytest.approx(-0.3)
    # Fill mode: utilization is the change of GPU allocation, no time passes.
    f = StepReward(RewardWeights(), 10, 50.0, 2000.0, fill_mode=True)
    f.components(_snap(gpu_alloc_frac=0.5))
    assert f.components(_snap(gpu_alloc_frac=0.52))["utilization"] == pytest.approx(0.02)


def test_weights_refuse_bad_values() -> None:
    from smartsched.objectives.reward import RewardWeights

    with pytest.raises(ValidationError) as e:
        RewardWeights.from_mapping({"carbon": -1})
    assert e.value.field == "reward_weights.carbon"
    with pytest.raises(ValidationError) as e:
        RewardWeights.from_mapping({"co2": 1})
    assert e.value.field == "reward_weights.co2"
