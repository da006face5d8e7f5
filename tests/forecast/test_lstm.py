"""A tiny LSTM run on a synthetic series, save/load, and the forecast commands."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from click.testing import CliRunner

from smartsched.cli import main
from smartsched.forecast.baselines import LastValue
from smartsched.forecast.data import Series
from smartsched.forecast.evaluate import point_metrics
from smartsched.forecast.lstm import LSTMForecaster, LSTMSettings
from smartsched.forecast.windows import make_windows


def _sine(n_series: int, steps: int, seed: int) -> list[Series]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_series):
        t = np.arange(steps)
        v = 50 + 20 * np.sin(2 * np.pi * t / 24 + rng.uniform(0, 6)) + rng.normal(0, 1, steps)
        out.append(Series(f"s{i}", 0.0, 300.0, ("cpu",), v.astype(np.float32)[:, None]))
    return out


def test_tiny_lstm_beats_last_value_on_sine_plus_noise(tmp_path: Path) -> None:
    train, val, test = _sine(12, 400, 0), _sine(3, 300, 1), _sine(3, 300, 2)
    w = [make_windows(s, 24, 3) for s in (train, val, test)]
    fc = LSTMForecaster(LSTMSettings(lookback=24, horizon=3, hidden=32, epochs=6, batch=128,
                                     lr=5e-3, seed=0))
    fc.fit(w[0], w[1])
    y = w[2].future[:, -1, 0]
    lstm = point_metrics(y, fc.predict(w[2])[:, -1, 0])["MAE"]
    last = point_metrics(y, LastValue().predict(w[2])[:, -1, 0])["MAE"]
    assert lstm < 0.8 * last  # a rising or falling sine: last value lags, the LSTM does not
    lo, hi = fc.interval(w[2])
    cover = ((y >= lo[:, -1, 0]) & (y <= hi[:, -1, 0])).mean()
    assert 0.6 < cover < 0.95  # calibrated to 80 % on validation
    back = LSTMForecaster.load(fc.save(tmp_path / "m"))
    np.testing.assert_allclose(back.predict(w[2]), fc.predict(w[2]), rtol=1e-5)


def test_forecast_commands_name_bad_input(tmp_path: Path) -> None:
    f = tmp_path / "bad.csv"
    pd.DataFrame({"series_id": ["a"], "time": [0], "cpu": [1.0]}).to_csv(f, index=False)
    r = CliRunner().invoke(main, ["forecast", "evaluate", "--data", str(f)])
    assert r.exit_code == 2 and "timestamp" in r.output
    r = CliRunner().invoke(main, ["forecast", "evaluate", "--model", str(tmp_path / "none"),
                                  "--data", str(f)])
    assert r.exit_code == 2


def test_twin_attaches_the_forecaster_for_a_profile(tmp_path: Path) -> None:
    """load-aware-forecast: after a full lookback of ticks the state carries predicted
    usage, LoadAware plans on it, and best-effort slack never exceeds what it leaves."""
    from smartsched.bench.simulate import simulate
    from smartsched.forecast.node_predictor import NodeUsagePredictor
    from smartsched.model.presets import load_cluster
    from smartsched.twin.state import ClusterState

    train = _sine(6, 200, 0)
    both = [Series(s.id, 0.0, 300.0, ("cpu", "mem"), np.repeat(s.values, 2, axis=1))
            for s in train]
    fc = LSTMForecaster(LSTMSettings(lookback=6, horizon=3, hidden=8, epochs=1, seed=0))
    fc.fit(make_windows(both, 6, 3))
    folder = fc.save(tmp_path / "fc")
    pred = NodeUsagePredictor.load(folder, 300.0)
    st = ClusterState(load_cluster("small"))
    st.usage[:, 0] = 0.5 * st.capacity[:, 0]
    outs = [pred.update(300.0 * i, st) for i in range(6)]
    assert all(o is None for o in outs[:5]) and outs[5].shape == (st.num_nodes, 2)
    assert (outs[5] >= 0).all()
    profile = tmp_path / "p.yaml"
    profile.write_text(f"name: la-fc\nforecaster: {folder}\nfilters: [NodeResourcesFit, "
                       "LoadAware]\nscore: [{name: LoadAware}]\n")
    rep = simulate("small", "mixed", str(profile), hours=3, seed=1, plots=False)
    assert rep["metrics"]["pods"]["placed"] > 0
    # The same wiring by hand: after the lookback the twin's state carries predictions.
    from smartsched.scheduling.base import make_scheduler
    from smartsched.scheduling.runner import run
    from smartsched.twin.engine import Engine, EngineConfig
    from smartsched.workloads.resolve import load_workload

    spec = load_cluster("small")
    engine = Engine(spec, load_workload("mixed", spec, 3, 1), EngineConfig(horizon_s=3 * 3600))
    engine.usage_predictor = NodeUsagePredictor.load(folder, 300.0)
    run(engine, make_scheduler("load-aware", 1))
    assert engine.state.predicted_usage is not None
    assert (engine.state.be_allocatable <= engine.state.capacity[:, :2]).all()
    with_step = tmp_path / "bad.yaml"
    with_step.write_text("name: x\nforecaster: 7\nfilters: [NodeResourcesFit]\n")
    import pytest

    from smartsched.model.errors import ValidationError

    with pytest.raises(ValidationError):
        simulate("small", "mixed", str(with_step), hours=1, plots=False)


def test_crossfit_forecasts_every_series_from_models_that_never_saw_its_job() -> None:
    from smartsched.forecast.crossfit import crossfit, fold_of

    rng = np.random.default_rng(3)
    series = []
    for j in range(9):  # nine jobs, two replicas each, a day and a bit long
        phase = rng.uniform(0, 6)
        for r in range(2):
            t = np.arange(310)
            v = 50 + 20 * np.sin(2 * np.pi * t / 24 + phase) + rng.normal(0, 1, 310)
            series.append(Series(f"job{j}-r{r}", 0.0, 300.0, ("cpu",),
                                 v.astype(np.float32)[:, None]))
    folds = [fold_of(s, 3, 0) for s in series]
    assert folds == [fold_of(s, 3, 0) for s in series]  # deterministic
    assert all(folds[2 * j] == folds[2 * j + 1] for j in range(9))  # a job stays together
    assert len(set(folds)) == 3
    logs: list[str] = []
    res = crossfit(series, folds=3, lookback=6, hidden=8, epochs=1, echo=logs.append)
    per_series = 310 - (288 + 3) - 3 + 1
    assert res["windows"] == per_series * len(series)  # every series, every origin, once
    assert res["machines_per_origin_median"] == len(series)
    for name in ("LSTM", "last value"):
        m = res["models"][name]["cpu"]
        assert np.isfinite(m["machine"]["MAE"]) and np.isfinite(m["aggregate"]["MAPE"])
    assert "coverage" in res["models"]["LSTM"]["cpu"]["machine"]
    assert sum("held out" in line for line in logs) == 3


def test_crossfit_with_too_few_jobs_names_the_problem() -> None:
    import pytest

    from smartsched.forecast.crossfit import crossfit
    from smartsched.model.errors import ValidationError

    t = np.arange(310, dtype=np.float32)
    series = [Series(f"job{j}-r0", 0.0, 300.0, ("cpu",), (50 + t % 7)[:, None])
              for j in range(2)]
    with pytest.raises(ValidationError, match="too few jobs"):
        crossfit(series, folds=5, lookback=6, hidden=8, epochs=1, echo=lambda _: None)
