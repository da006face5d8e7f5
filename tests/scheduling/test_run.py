"""The run builder: every driver gets a twin with the hooks its scheduler asks for."""

from __future__ import annotations

from pathlib import Path

import pytest

from smartsched.model.errors import ValidationError
from smartsched.scheduling.base import TwinNeeds
from smartsched.scheduling.run import build_run

REPO = Path(__file__).resolve().parents[2]
FORECASTER = REPO / "models" / "forecast"


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Packaged forecast profiles name ``models/forecast`` relative to the working dir."""
    if not FORECASTER.is_dir():
        pytest.skip("models/forecast is not in this checkout")
    monkeypatch.chdir(REPO)


def test_a_forecasting_profile_runs_with_its_forecaster(in_repo: None) -> None:
    run = build_run("small", "mixed", "load-aware-forecast", hours=7.0)
    assert run.engine.usage_predictor is not None
    run.drive()
    assert run.engine.state.predicted_usage is not None  # a full lookback (6 h) was seen


def test_the_live_exporter_attaches_the_forecaster_too(in_repo: None) -> None:
    # Before the run builder, `telemetry serve --scheduler load-aware-forecast` built its
    # own engine and silently ran without the forecaster.
    from smartsched.prometheus.exporter import LiveTwin

    twin = LiveTwin("small", "mixed", "load-aware-forecast", hours=1.0)
    assert twin.engine.usage_predictor is not None


def test_a_split_profile_carries_what_its_routes_need(in_repo: None, tmp_path: Path) -> None:
    split = tmp_path / "split.yaml"
    split.write_text("name: my-split\nroutes:\n  online: load-aware-forecast\n"
                     "  default: k8s-default\n")
    run = build_run("small", "mixed", str(split), hours=1.0)
    assert run.engine.usage_predictor is not None


def test_needs_that_cannot_share_a_twin_are_named() -> None:
    with pytest.raises(ValidationError) as e:
        TwinNeeds(forecaster="a").merge(TwinNeeds(forecaster="b"), "routes")
    assert e.value.field == "routes.forecaster"
    assert TwinNeeds(forecaster="a").merge(TwinNeeds(telemetry="t"), "x") == TwinNeeds("a", "t")


@pytest.mark.parametrize(("key", "why"), [("colour", "unknown"), ("seed", "set by the run")])
def test_engine_overrides_are_checked(key: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why) as e:
        build_run("small", "mixed", "k8s-default", hours=1.0, engine_overrides={key: 1})
    assert e.value.field == f"engine.{key}"


def test_drive_stops_at_a_time_or_a_count_and_resumes() -> None:
    run = build_run("small", "mixed", "k8s-default", hours=2.0)
    assert run.drive(max_decisions=5) == 5
    run.drive(until_s=1800.0)
    req = run.next_decision()
    assert req is not None and req.time >= 1800.0  # offered, not decided
    run.drive()
    assert run.next_decision() is None
    rep = run.report()
    assert rep["pods"]["placed"] > 0
    assert len(run.engine.metrics.decision_seconds) == rep["pods"]["placed"] + sum(
        rep["rejections_by_reason"].values())


def test_settings_describe_the_run() -> None:
    run = build_run("small", "mixed", "fgd", seed=3, hours=2.0, warmup_hours=1.0)
    assert run.settings == {
        "scheduler": "fgd", "mode": "replay", "seed": 3, "cluster": "small",
        "nodes": len(run.cluster.nodes), "workload": "mixed", "inflate": None, "hours": 2.0,
        "warmup_hours": 1.0, "start_hours": None, "queue_sort": "priority",
        "failure_toleration_s": 300.0,
    }
    assert run.engine.config.horizon_s == 3 * 3600.0


@pytest.mark.parametrize(("kw", "field"), [
    ({"seed": -1}, "seed"), ({"seed": 2**32}, "seed"), ({"seed": 1.5}, "seed"),
    ({"warmup_hours": -2}, "warmup_hours"), ({"hours": float("nan")}, "hours"),
    ({"hours": 0}, "hours"), ({"start_hours": -1}, "start_hours"),
])
def test_out_of_range_run_numbers_name_their_field(kw: dict, field: str) -> None:
    from smartsched.model.errors import ValidationError

    with pytest.raises(ValidationError) as e:
        build_run("small", "mixed", "k8s-default", **kw)
    assert e.value.field == field


def test_a_replay_starting_after_the_trace_ends_is_refused() -> None:
    """It ran with no pod and still reported energy, cost and a perfect fairness."""
    from smartsched.model.errors import ValidationError

    with pytest.raises(ValidationError, match="past the trace's end") as e:
        build_run("small", "mixed", "k8s-default", hours=2.0, start_hours=500.0)
    assert e.value.field == "start_hours"


def test_a_trace_running_past_the_longest_run_is_refused_without_hours() -> None:
    """A pod at year 9999 made the whole-trace replay tick every 5 minutes for 8000
    years (it never finished); with --hours the run stops there, as it always did."""
    from smartsched.model.errors import ValidationError
    from smartsched.model.pod import Pod

    pods = [Pod(id="p0", cpu_milli=1000, memory_mib=64, arrival=0.0, duration=60.0),
            Pod(id="p1", cpu_milli=1000, memory_mib=64, arrival=253402300799.0,
                duration=1.0)]
    with pytest.raises(ValidationError, match="pass --hours") as e:
        build_run("small", pods, "k8s-default")
    assert e.value.field == "hours" and "'p1'" in e.value.message
    assert build_run("small", pods, "k8s-default", hours=1.0).drive() >= 1
