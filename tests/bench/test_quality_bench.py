"""``smartsched bench quality``: twin settings reach every run, and the table carries the
device-locality columns."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from smartsched.bench.quality import _one, run_quality_bench
from smartsched.cli import main
from smartsched.model.errors import ValidationError


def test_engine_settings_reach_the_twin() -> None:
    # A share outside [0, 1] can only fail if the setting reached EngineConfig.
    with pytest.raises(ValidationError, match="gpu_comm_share"):
        _one(("mixed", "small", "k8s-default", 1, 2.0, 1.0, {"gpu_comm_share": 1.5}))


def test_table_has_the_locality_columns_and_records_the_settings() -> None:
    res = run_quality_bench([("mixed", "small")], ["numa-aware"], [1], hours=3.0,
                            warmup_hours=1.0, workers=1, echo=lambda _: None,
                            engine={"gpu_comm_share": 0.3})
    assert res["engine"] == {"gpu_comm_share": 0.3}
    assert "multi-GPU cross-socket %" in res["table"]
    assert "multi-GPU costly cross-socket %" in res["table"]
    (run,) = res["runs"]
    loc = run["metrics"]["device_locality"]  # seed 1 starts a multi-GPU pod in the window
    assert loc is not None and loc["multi_gpu_starts"] >= 1
    assert loc["costly_cross_socket_pct"] == 0.0  # NUMA-aware keeps them on one socket


def test_cli_refuses_a_share_outside_its_range() -> None:
    r = CliRunner().invoke(main, ["bench", "quality", "--gpu-comm-share", "1.5"])
    assert r.exit_code != 0 and "gpu-comm-share" in r.output
