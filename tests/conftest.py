"""Shared fixtures: the public-trace directory and small builders.

Under CI=true a missing data dir fails the tests that need it (CI must have
the traces); on a developer machine those tests are skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from smartsched.paths import data_dir as _data_dir

# The body limit of the service the tests deploy (tests/serving/conftest.py), which the
# session's Serve proxy enforces too (listen.DeclaredBodyLimit).
SERVICE_MAX_BODY_BYTES = 256 * 1024


@pytest.fixture(scope="session")
def data_dir() -> Path:
    d = _data_dir()
    if not (d / "alibaba-openb-gpu-2023").is_dir():
        msg = f"public traces not found at {d.resolve()} (set SMARTSCHED_DATA_DIR)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return d


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory: pytest.TempPathFactory):
    """One local Ray for the whole test session (2 CPUs, no dashboard, temp dirs)."""
    ray = pytest.importorskip("ray")
    import ray.tune.trainable.trainable as trainable

    root = tmp_path_factory.mktemp("ray")
    trainable.DEFAULT_STORAGE_PATH = str(root / "results")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Serve's proxy guarded as the embedded Ray of `smartsched serve` has it (ray_local).
    from smartsched.listen import PROXY_BODY_LIMIT_ENV, SERVE_PROXY_CALLBACK
    from smartsched.ray_local import SERVE_PROXY_CALLBACK_ENV

    os.environ.setdefault(SERVE_PROXY_CALLBACK_ENV, SERVE_PROXY_CALLBACK)
    # ... with the test service's body limit, as `smartsched serve` passes its config's.
    os.environ.setdefault(PROXY_BODY_LIMIT_ENV, str(SERVICE_MAX_BODY_BYTES))
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=str(root / "tmp"),
             log_to_driver=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_forecaster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cpu+mem LSTM forecaster with a 3-step lookback, trained for one epoch on sines:
    small enough to attach to any test twin and see predictions after three ticks."""
    import numpy as np

    from smartsched.forecast.data import Series
    from smartsched.forecast.lstm import LSTMForecaster, LSTMSettings
    from smartsched.forecast.windows import make_windows

    rng = np.random.default_rng(0)
    series = []
    for i in range(6):
        t = np.arange(200)
        v = 50 + 20 * np.sin(2 * np.pi * t / 24 + rng.uniform(0, 6)) + rng.normal(0, 1, 200)
        series.append(Series(f"s{i}", 0.0, 300.0, ("cpu", "mem"),
                             np.repeat(v.astype(np.float32)[:, None], 2, axis=1)))
    fc = LSTMForecaster(LSTMSettings(lookback=3, horizon=3, hidden=8, epochs=1, seed=0))
    fc.fit(make_windows(series, 3, 3))
    return fc.save(tmp_path_factory.mktemp("forecaster"))


@pytest.fixture(scope="session")
def tiny_projection(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-component telemetry projection fitted on 6 simulated hours of ``small``."""
    from smartsched.bench.telemetry_study import study

    proj, _ = study("small", "mixed", "k8s-default", 6.0, [0], 1, k=4, echo=lambda _: None)
    return proj.save(tmp_path_factory.mktemp("telemetry"))
