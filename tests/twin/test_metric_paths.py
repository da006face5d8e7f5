"""The twin's cheaper metric paths give the numbers of the plain ones: the reward-only mode
(``report_metrics: false``) leaves every reward snapshot as it was, the energy-rate cache
integrates exactly what recomputing at every event does, and a carbon read cached up to
``held_until`` is the series' value there."""

from __future__ import annotations

import numpy as np
import pytest

from smartsched.model.carbon import CarbonSeries
from smartsched.model.errors import ValidationError
from smartsched.scheduling.run import build_run
from smartsched.twin.config import EngineConfig
from smartsched.twin.events import EV_ARRIVE, EventHeap
from smartsched.twin.metrics import MetricsRecorder


def _snapshots(report_metrics: bool, scheduler: str = "bestfit",
               track_traffic: bool = False) -> list[dict[str, float]]:
    run = build_run("small", "mixed", scheduler, seed=7, hours=6, warmup_hours=1,
                    engine_overrides={"report_metrics": report_metrics,
                                      "track_traffic": track_traffic})
    out = []
    while (req := run.next_decision()) is not None:
        run.decide(req)
        out.append(run.engine.metrics.snapshot())
    out.append(run.engine.metrics.snapshot())
    return out


def test_reward_only_metrics_leave_every_reward_snapshot_as_it_was() -> None:
    full, lean = _snapshots(True), _snapshots(False, track_traffic=True)
    assert len(full) == len(lean) > 100
    assert full == lean  # exactly: the same floats at every decision
    assert full[-1]["cross_zone_share_s"] > 0 and full[-1]["contended_share_s"] >= 0
    # Without tracking, traffic is the one figure a lean run leaves at zero.
    untracked = _snapshots(False)
    assert all(u["cross_zone_share_s"] == 0.0 for u in untracked)
    assert [{**f, "cross_zone_share_s": 0.0} for f in full] == untracked


def test_cross_zone_share_on_a_hand_checked_app() -> None:
    """App 0 has three pods, two in zone 0 and one in zone 1; app 1 has one pod (no peers,
    no cross-zone traffic possible); one pod belongs to no app. Each of app 0's pods sends
    10 Mb/s: the zone-0 pods have half their peers elsewhere, the zone-1 pod all of them,
    so 20 of the 30 Mb/s between peers cross zones."""
    from types import SimpleNamespace

    table = SimpleNamespace(app=np.array([0, 0, 0, 1, -1]),
                            node=np.array([0, 1, 2, 0, 2]),
                            traffic_mbps=np.array([10.0, 10.0, 10.0, 50.0, 70.0]))
    state = SimpleNamespace(zone_id=np.array([0, 0, 1]), zone_names=["a", "b"])
    rec = SimpleNamespace(state=state, table=table, cross_zone_share_s=0.0)
    gb_per_h = MetricsRecorder._cross_zone(rec, np.arange(5), 300.0)
    assert gb_per_h == pytest.approx(20 * 3600 / 8 / 1000)
    assert rec.cross_zone_share_s == pytest.approx(300.0 * 2 / 3)
    # Nothing running with peers: no share accrues (and no division by zero).
    assert MetricsRecorder._cross_zone(rec, np.array([3, 4]), 300.0) == 0.0
    assert rec.cross_zone_share_s == pytest.approx(200.0)


def test_a_reward_only_run_has_no_report_and_says_why() -> None:
    run = build_run("small", "mixed", "bestfit", seed=7, hours=1,
                    engine_overrides={"report_metrics": False})
    run.drive()
    with pytest.raises(ValidationError) as e:
        run.report()
    assert e.value.field == "report_metrics"
    with pytest.raises(ValidationError) as e:
        EngineConfig(report_metrics="no")  # type: ignore[arg-type]
    assert e.value.field == "report_metrics"
    with pytest.raises(ValidationError) as e:
        EngineConfig(track_traffic=1)  # type: ignore[arg-type]
    assert e.value.field == "track_traffic"


def test_cached_energy_rates_integrate_what_recomputing_every_event_does(monkeypatch) -> None:
    def report() -> dict:
        run = build_run("medium", "mixed", "k8s-default", seed=3, hours=5, warmup_hours=1)
        run.drive()
        rep = run.report()
        rep.pop("decision_latency_us")
        rep.pop("decisions_per_second")
        return rep

    cached = report()
    plain_advance = MetricsRecorder.advance

    def advance_recomputing(self: MetricsRecorder, t0: float, t1: float) -> None:
        self._void_rates()  # no cache: the rates of every event are computed afresh
        plain_advance(self, t0, t1)

    monkeypatch.setattr(MetricsRecorder, "advance", advance_recomputing)
    assert report() == cached
    assert cached["energy_kwh"] > 0 and cached["carbon_kg"] > 0


@pytest.mark.parametrize("series", [
    CarbonSeries.diurnal(300.0, 120.0),
    CarbonSeries(np.array([100.0, 420.0, 250.0, 80.0]), 1800.0, "quarter", offset_s=700.0),
])
def test_a_carbon_value_holds_until_held_until_and_the_next_step_follows(series) -> None:
    rng = np.random.default_rng(0)
    for t in rng.uniform(0, 3 * 86400, 500).tolist():
        until = series.held_until(t)
        assert t < until
        assert series.at(until) == series.at(t)  # still on the step read at t
        assert series.at(np.nextafter(until, t)) == series.at(t)
        # Just past the step's end (the millisecond kept short, and a bit): the next step.
        nxt = until + 2e-3
        k = int((nxt + series.offset_s) // series.step_s) % series.values.size
        assert series.at(nxt) == series.values[k]
        assert k != int((t + series.offset_s) // series.step_s) % series.values.size


def test_events_at_one_instant_pop_by_kind_then_order_whatever_their_payloads() -> None:
    heap = EventHeap()
    heap.push(5.0, EV_ARRIVE, {"pod": 1})  # payloads that cannot be compared
    heap.push(5.0, EV_ARRIVE, {"pod": 2})
    heap.push(5.0, 1, [3])
    heap.push(1.0, EV_ARRIVE, None)
    order = [(ev.time, ev.kind, ev.payload) for ev in (heap.pop() for _ in range(4))]
    assert order == [(1.0, EV_ARRIVE, None), (5.0, 1, [3]), (5.0, EV_ARRIVE, {"pod": 1}),
                     (5.0, EV_ARRIVE, {"pod": 2})]
    assert not heap and heap.non_tick == 0
