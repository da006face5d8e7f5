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
