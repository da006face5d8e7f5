"""The PCA projection, counter rates, the twin hook and the RL columns it feeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from smartsched.model.errors import ValidationError
from smartsched.twin.telemetry.reduction import (
    RateView,
    TelemetryFeatures,
    TelemetryProjection,
    fit_projection,
)


def test_projection_finds_the_latent_factors_and_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    latent = rng.normal(size=(2000, 2))
    mixing = rng.normal(size=(2, 30))
    X = latent @ mixing + 0.01 * rng.normal(size=(2000, 30))
    X[:, 5] = 7.0  # a constant column standardizes to 0
    X[::3, 7] = np.nan  # an absent instance is mean-imputed
    cols = [f"c{i}" for i in range(30)]
    proj = fit_projection(X, cols, 4)
    assert proj.explained[:2].sum() > 0.95 and proj.explained[2] < 0.03
    assert np.allclose(proj.components[:, 5], 0.0)
    Z = proj.transform(X)
    assert Z.shape == (2000, 4) and np.isfinite(Z).all()
    back = TelemetryProjection.load(proj.save(tmp_path / "p"))
    np.testing.assert_allclose(back.transform(X), Z, rtol=1e-6)
    assert back.columns == cols
    with pytest.raises(ValidationError, match="columns"):
        proj.transform(X[:, :10])
    with pytest.raises(ValidationError, match="components"):
        fit_projection(X, cols, 0)
    with pytest.raises(ValidationError, match="no telemetry projection"):
        TelemetryProjection.load(tmp_path / "missing")


def test_the_study_ablates_every_family() -> None:
    from smartsched.bench.telemetry_study import format_study, study

    _, res = study("small", "mixed", "k8s-default", 6.0, [0], 1, k=4, echo=lambda _: None)
    assert set(res["targets"]) == {"cpu", "gpu"}
    for row in res["targets"].values():  # every ablation produced a held-out figure
        assert np.isfinite(row["plain"]) and np.isfinite(row["all telemetry"])
        assert set(row["without"]) == {"cpu", "disk", "gpu", "memory", "network", "pods",
                                       "power"}
    text = format_study(res)
    assert "all telemetry but network" in text and "PC4" in text


def test_rate_view_turns_counters_into_per_second_rates() -> None:
    rv = RateView(np.array([False, True]))
    first = rv(np.array([[5.0, 100.0]]), 10.0)
    np.testing.assert_array_equal(first, [[5.0, np.nan]])  # no rate before two samples
    np.testing.assert_array_equal(rv(np.array([[6.0, 130.0]]), 20.0), [[6.0, 3.0]])


@pytest.fixture
def small_projection(tiny_projection: Path) -> Path:
    return tiny_projection


def test_the_twin_hook_fills_telemetry_features(small_projection: Path) -> None:
    from smartsched.model.presets import load_cluster
    from smartsched.scheduling.base import make_scheduler
    from smartsched.scheduling.runner import run
    from smartsched.twin.engine import Engine, EngineConfig
    from smartsched.workloads.resolve import load_workload

    proj = TelemetryProjection.load(small_projection)
    spec = load_cluster("medium")  # fitted on `small`, used on another cluster
    engine = Engine(spec, load_workload("mixed", spec, 1, 4), EngineConfig(horizon_s=3600))
    engine.telemetry_features = TelemetryFeatures(proj, spec, 4)
    run(engine, make_scheduler("k8s-default", 4))
    f = engine.state.telemetry_features
    assert f is not None and f.shape == (len(spec.nodes), 4) and np.isfinite(f).all()
    assert f.std(axis=0).max() > 0  # nodes differ


def test_env_appends_the_components_as_node_columns(small_projection: Path) -> None:
    from smartsched.rl.env import SchedulingEnv
    from smartsched.rl.features import NODE_FEATURES

    env = SchedulingEnv({"cluster": "small", "hours": 2, "max_decisions": 300,
                         "telemetry": str(small_projection)})
    assert env.observation_space["nodes"].shape[1] == NODE_FEATURES + 4
    obs, _ = env.reset(seed=2)
    st = env.engine.state
    n = st.num_nodes
    done, seen = False, False
    while not done:
        obs, _, term, trunc, _ = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
        done = term or trunc
        if not done and st.telemetry_features is not None:
            seen = True
            np.testing.assert_allclose(obs["nodes"][:n, NODE_FEATURES:],
                                       np.clip(st.telemetry_features, -10, 10), rtol=1e-6)
    assert seen


def test_study_names_runs_too_short_for_rates() -> None:
    from smartsched.bench.telemetry_study import study

    with pytest.raises(ValidationError, match="hours"):
        study("small", "mixed", "k8s-default", 0.001, [0], 1, k=2, echo=lambda _: None)
