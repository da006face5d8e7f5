"""Pareto front, recommendations and the sweep file's validation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from smartsched.model.errors import ValidationError
from smartsched.objectives.reward import COMPONENTS, RewardWeights
from smartsched.objectives.scenarios import load_scenarios
from smartsched.tuning import pareto
from smartsched.tuning.sweep import Objective, load_sweep

OBJ = {
    "util": Objective(metric="usage_on_pct.cpu", mode="max", component="utilization"),
    "wait": Objective(metric="pods.waiting_pod_hours", mode="min", component="qos"),
    "kwh": Objective(metric="energy_kwh", mode="min", component="energy"),
}


def test_pareto_mask_on_constructed_points() -> None:
    v = np.array([
        [50, 10, 100],  # A
        [40, 10, 100],  # dominated by A (less util, same rest)
        [60, 20, 100],  # B: more util, more wait -> a trade-off, kept
        [50, 10, 90],   # C: dominates A (less energy)
        [50, 10, 90],   # a tie with C: neither dominates the other
    ], dtype=float)
    mask = pareto.pareto_mask(v, ["max", "min", "min"])
    assert mask.tolist() == [False, False, True, True, True]
    assert pareto.pareto_mask(np.zeros((0, 3)), ["max", "min", "min"]).size == 0


def _row(trial: str, util: float, wait: float, kwh: float, w: dict[str, float]) -> dict:
    base = {"util": 40.0, "wait": 100.0, "kwh": 200.0}
    values = {"util": util, "wait": wait, "kwh": kwh}
    return {"trial": trial, "values": values, "relative": pareto.relative(values, base, OBJ),
            "base": base,
            "weights": {**dict.fromkeys(COMPONENTS, 0.1), **w}, "iterations": 4,
            "pareto": True}


def test_relative_and_scenario_recommendation(tmp_path: Path) -> None:
    rel = pareto.relative({"util": 50, "wait": 50, "kwh": 220},
                          {"util": 40, "wait": 100, "kwh": 200}, OBJ)
    # Symmetric: the change over the mean of the two figures, signed so larger is better.
    assert rel == pytest.approx({"util": 10 / 45, "wait": 50 / 75, "kwh": -20 / 210})
    # A baseline of 0 (nothing waited) still gives a bounded figure.
    assert pareto.relative({"util": 1, "wait": 3, "kwh": 1}, {"util": 1, "wait": 0, "kwh": 1},
                           OBJ)["wait"] == pytest.approx(-2.0)
    assert pareto.pct_change(3, 0) == "n/a" and pareto.pct_change(50, 40) == "+25 %"
    rows = [_row("packer", 60, 150, 150, {"utilization": 2.0}),
            _row("queue", 42, 40, 210, {"qos": 3.0}),
            _row("saver", 55, 120, 120, {"energy": 2.0})]
    scen = {"util-first": RewardWeights(utilization=1, qos=0, cost=0, energy=0, fairness=0),
            "latency": RewardWeights(utilization=0.1, qos=2, cost=0, energy=0, fairness=0),
            "green": RewardWeights(utilization=0.1, qos=0.1, cost=0, energy=2, fairness=0)}
    recs = pareto.recommend(rows, OBJ, scen)
    assert {k: v["trial"] for k, v in recs.items()} == {
        "util-first": "packer", "latency": "queue", "green": "saver"}
    # The YAML is a scenario-profile file: it loads back with the same weights.
    f = tmp_path / "rec.yaml"
    f.write_text(pareto.recommendations_yaml(recs, OBJ, "k8s-default"))
    back = load_scenarios(f)
    assert back["latency"].qos == 3.0 and back["green"].energy == 2.0
    table = pareto.markdown_table(rows, OBJ, {"util": 40, "wait": 100, "kwh": 200},
                                  "k8s-default")
    assert "| k8s-default |" in table and "-40 %" in table  # saver's energy: 120 vs 200 kWh
    pareto.plot_front(tmp_path / "p.png", rows, OBJ, {"util": 40, "wait": 100, "kwh": 200},
                      "k8s-default")
    assert (tmp_path / "p.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("search_space: {speed: {low: 0, high: 1}}\n", "sweep.search_space"),
        ("search_space: {qos: 1.0}\n", "sweep.search_space"),
        ("search_space: {qos: {low: 2, high: 1}}\n", "sweep.search_space.qos"),
        ("search_space: {qos: {low: 0, high: 1, log: true}}\n", "sweep.search_space.qos"),
        ("search_space: {qos: {low: 0, high: 1}}\nobjectives: {a: {metric: x, mode: up, "
         "component: qos}, b: {metric: y, mode: min, component: qos}}\n",
         "sweep.objectives.a.mode"),
        ("search_space: {qos: {low: 0, high: 1}}\nobjectives: {a: {metric: x, mode: max, "
         "component: speed}, b: {metric: y, mode: min, component: qos}}\n",
         "sweep.objectives.a.component"),
        ("search_space: {qos: {low: 0, high: 1}}\nobjectives: {a: {metric: x, mode: max, "
         "component: qos}, b: {metric: y, mode: min, component: qos}}\nnum_samples: 0\n",
         "sweep.num_samples"),
    ],
)
def test_bad_sweeps_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(text)
    with pytest.raises(ValidationError) as e:
        load_sweep(f)
    assert e.value.field.startswith(field), e.value


def test_packaged_sweep_is_valid() -> None:
    root = Path(__file__).resolve().parents[2]
    s = load_sweep(root / "tune_sweeps" / "reward_weights.yaml")
    assert len(s.objectives) >= 3 and s.searcher == "optuna"
    w = s.weights_of({"utilization": 1.1, "qos": 0.7, "energy": 0.3})
    assert w["utilization"] == 1.1 and w["cost"] == 0.2 and set(w) == set(COMPONENTS)


def test_the_medium_sweep_is_valid_and_trials_reserve_their_env_runners() -> None:
    """A trial with remote env runners reserves them with its own CPU as one placement
    group (Tune starts them inside it); without runners it asks only its own CPUs."""
    from ray import tune

    from smartsched.rl.config import load_train_config
    from smartsched.tuning.runner import trial_resources

    root = Path(__file__).resolve().parents[2]
    s = load_sweep(root / "tune_sweeps" / "reward_weights_medium.yaml")
    assert s.evaluation.cluster == "medium" and len(s.evaluation.seeds) >= 3
    assert {"online_contended_pct", "edge_slo_violations"} <= set(s.objectives)
    train = load_train_config(root / s.train_config).model_dump()
    pg = trial_resources(s.trial_cpus, train)
    assert isinstance(pg, tune.PlacementGroupFactory)
    runners = train["env_runners"]["num_env_runners"]
    assert pg.bundles == [{"CPU": s.trial_cpus}] + [{"CPU": 1.0}] * runners
    assert trial_resources(1.0, {"env_runners": {"num_env_runners": 0}}) == {"cpu": 1.0}
