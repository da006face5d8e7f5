"""CarbonShift waits for cleaner hours within the deadline; GridCarbon picks the cleaner
grid; pods' own carbon is their share of their node's dynamic power."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from smartsched.carbon.outlook import outlook
from smartsched.model.carbon import CarbonSeries
from smartsched.model.cluster import ClusterSpec, Site, Zone
from smartsched.model.errors import ValidationError
from smartsched.model.pod import PodClass
from smartsched.scheduling.base import make_scheduler
from smartsched.scheduling.framework import ProfileScheduler
from smartsched.scheduling.registry import profile_from_dict
from smartsched.scheduling.runner import run
from smartsched.twin.engine import Engine, EngineConfig
from smartsched.twin.power import PowerModel
from tests.builders import node, pod

# Dirty for the first 3 hours of every day, clean after.
DIRTY_MORNING = CarbonSeries(np.array([1000.0] * 3 + [100.0] * 21), 3600.0, "dirty-morning")


def _spec(*series: CarbonSeries) -> ClusterSpec:
    sites = tuple(Site(f"s{i}", carbon=c, pue=1.0) for i, c in enumerate(series))
    zones = tuple(Zone(f"z{i}", f"s{i}") for i in range(len(series)))
    nodes = tuple(node(f"n{i}", cpu=8000, zone=f"z{i}") for i in range(len(series)))
    return ClusterSpec("grids", sites, zones, nodes)


def _run(spec, pods, scheduler, hours=30.0):
    e = Engine(spec, pods, EngineConfig(power_management=False, horizon_s=hours * 3600.0))
    return e, run(e, make_scheduler(scheduler, 0) if isinstance(scheduler, str) else scheduler)


def _batch(pid="job", deadline_h=24.0, duration_h=1.0, **kw):
    return pod(pid, cpu=4000, pod_class=PodClass.BATCH, priority=100, arrival=0.0,
               duration=duration_h * 3600.0, deadline=deadline_h * 3600.0, **kw)


def test_carbon_shift_waits_for_the_clean_hours_and_emits_less() -> None:
    spec = _spec(DIRTY_MORNING)
    e, m = _run(spec, [_batch()], "green-batch")
    start = e.table.started_at[0]
    assert 3 * 3600.0 <= start < 4 * 3600.0  # at the first flush of the clean hours
    assert e.table.finished_at[0] <= e.table.deadline[0]
    e2, m2 = _run(spec, [_batch()], "composite-batch")
    assert e2.table.started_at[0] == 0.0
    assert m["pod_carbon_kg"]["batch"] < 0.2 * m2["pod_carbon_kg"]["batch"]
    assert m["pods"]["deadline_missed"] == 0


def test_carbon_shift_never_waits_past_the_latest_start_less_the_margin() -> None:
    # 1 h of work due in 2.5 h, margin 1 h: at most 0.5 h of slack -> it starts now.
    e, _ = _run(_spec(DIRTY_MORNING), [_batch(deadline_h=2.5)], "green-batch")
    assert e.table.started_at[0] == 0.0
    # Online pods (and pods without a deadline) never wait.
    online = pod("web", cpu=1000, pod_class=PodClass.ONLINE, arrival=0.0, duration=3600.0)
    nodl = pod("nodl", cpu=1000, pod_class=PodClass.BATCH, arrival=0.0, duration=3600.0)
    e, _ = _run(_spec(DIRTY_MORNING), [online, nodl], "green-batch")
    assert (e.table.started_at == 0.0).all()


def test_grid_carbon_prefers_the_cleaner_site() -> None:
    spec = _spec(CarbonSeries.constant(500.0), CarbonSeries.constant(100.0))
    e, _ = _run(spec, [_batch(deadline_h=2.0)], "green-batch")
    assert e.table.node[0] == 1
    # PUE counts: the clean grid behind a wasteful site loses (250 x 1.0 < 100 x 3.0).
    sites = (dataclasses.replace(spec.sites[0], pue=1.0,
                                 carbon=CarbonSeries.constant(250.0)),
             dataclasses.replace(spec.sites[1], pue=3.0))
    e, _ = _run(dataclasses.replace(spec, sites=sites), [_batch(deadline_h=2.0)], "green-batch")
    assert e.table.node[0] == 0


def test_pod_carbon_is_the_dynamic_part_of_the_cluster_carbon() -> None:
    spec = _spec(CarbonSeries.constant(300.0))
    p = pod("w", cpu=4000, arrival=0.0, duration=7200.0)
    e, m = _run(spec, [p], "first-fit", hours=2.0)
    idle_w = PowerModel.of(spec, e.state.gpu_model, e.state.gpu_count).idle_w.sum()
    idle_kg = idle_w * 7200.0 / 3.6e6 * 300.0 / 1000
    assert m["pod_carbon_kg"]["batch"] == pytest.approx(m["carbon_kg"] - idle_kg, rel=0.02)
    assert m["pod_carbon_kg"]["batch"] > 0


def test_outlook_of_a_repeating_day_and_of_an_offset() -> None:
    o = outlook(DIRTY_MORNING)
    assert o.expected(0.0, 5).tolist() == [1000.0, 1000.0, 1000.0, 100.0, 100.0]
    shifted = outlook(DIRTY_MORNING.with_offset(2 * 3600.0))
    assert shifted.expected(0.0, 3).tolist() == [1000.0, 100.0, 100.0]


@pytest.mark.parametrize(("patch", "field"), [
    ({"defer": ["GridCarbon"]}, "mine.defer[0]"),
    ({"defer": [{"name": "CarbonShift", "args": {"classes": ["gaming"]}}]},
     "mine.defer[0].args.classes[0]"),
    ({"defer": [{"name": "CarbonShift", "args": {"margin_h": -1}}]},
     "mine.defer[0].args.margin_h"),
])
def test_bad_defer_plugins_name_the_field(patch, field) -> None:
    with pytest.raises(ValidationError) as e:
        profile_from_dict({"name": "mine", "filters": ["NodeResourcesFit"], **patch})
    assert e.value.field == field


def test_a_deferred_job_keeps_slack_to_run_again_once() -> None:
    # 4 h of work due at 10 h; dirty until 3 h. Without checkpoints it keeps a whole
    # re-run (4 h) and the 1 h margin: it may wait at most an hour, so it starts by then
    # (at a flush) although the clean hours come later.
    e, _ = _run(_spec(DIRTY_MORNING), [_batch(deadline_h=10.0, duration_h=4.0)], "green-batch")
    assert e.table.started_at[0] <= 3600.0 + 300.0
    # With a checkpoint every 30 min only that much is kept back: it waits for 3 h.
    e, _ = _run(_spec(DIRTY_MORNING), [_batch(deadline_h=10.0, duration_h=4.0,
                                              checkpoint_interval_s=1800.0)], "green-batch")
    assert 3 * 3600.0 <= e.table.started_at[0] < 4 * 3600.0
    assert e.table.finished_at[0] <= e.table.deadline[0]


def test_residency_decides_where_carbon_may_move_work() -> None:
    from smartsched.scheduling.compliance import attach, load_policy

    spec = _spec(CarbonSeries.constant(500.0), CarbonSeries.constant(100.0))
    job = dataclasses.replace(_batch(deadline_h=2.0), tenant="bank")
    e = Engine(spec, [job], EngineConfig(power_management=False, horizon_s=7200.0))
    attach(e.state, load_policy({"tenants": ["bank"], "residency": {"bank": ["s0"]}}))
    run(e, make_scheduler("green-batch", 0))
    assert e.table.node[0] == 0  # the dirtier grid, where the tenant's data must stay


# ------------------------------------------------------------------------ GreenScore
def _green_profile(**args) -> dict:
    return {"name": "gs", "filters": ["NodeResourcesFit", "NodeAffinity"],
            "score": [{"name": "GreenScore", "weight": 1, "args": args}]}


def test_green_score_prefers_the_greener_site_then_the_busier_node() -> None:
    # Same grid intensity, but site 1 has a renewable mix and a better PUE.
    mixed = CarbonSeries(np.array([300.0]), 3600.0, "mix", renewable=np.array([0.8]))
    spec = _spec(CarbonSeries.constant(300.0), mixed)
    spec = dataclasses.replace(spec, sites=(dataclasses.replace(spec.sites[0], pue=1.6),
                                            dataclasses.replace(spec.sites[1], pue=1.1)))
    sched = ProfileScheduler(profile_from_dict(_green_profile()), 0)
    e, _ = _run(spec, [_batch(deadline_h=2.0)], sched)
    assert e.table.node[0] == 1
    flipped = dataclasses.replace(spec, sites=(
        dataclasses.replace(spec.sites[0], pue=1.1, carbon=mixed),
        dataclasses.replace(spec.sites[1], pue=1.6, carbon=CarbonSeries.constant(300.0))))
    e, _ = _run(flipped, [_batch(deadline_h=2.0)], sched)
    assert e.table.node[0] == 0
    # One site, two nodes: the one already working draws its idle watts anyway, so the
    # pod there raises work per watt more (efficiency only, so the site terms cannot tie).
    one = ClusterSpec("one", (Site("s0", pue=1.0),), (Zone("z0", "s0"),),
                      (node("idle", cpu=8000, zone="z0"),
                       node("busy", cpu=8000, zone="z0", labels={"role": "busy"})))
    first = pod("first", cpu=4000, pod_class=PodClass.BATCH, arrival=0.0, duration=7200.0,
                node_selector=(("role", "busy"),))
    later = pod("later", cpu=2000, pod_class=PodClass.BATCH, arrival=60.0, duration=3600.0)
    sched = ProfileScheduler(profile_from_dict(_green_profile(
        weights={"pue": 0, "renewable": 0, "efficiency": 1})), 0)
    e, m = _run(one, [first, later], sched)
    assert e.table.node[1] == 1
    relabeled = dataclasses.replace(one, nodes=(
        node("idle", cpu=8000, zone="z0", labels={"role": "busy"}),
        node("busy", cpu=8000, zone="z0")))
    e2, _ = _run(relabeled, [first, later], sched)
    assert e2.table.node[1] == 0
    g = m["green"]
    assert g["pue_share"] == pytest.approx(1.0) and 0 < g["efficiency"] <= 1
    assert 0 < g["score"] <= 1


def test_green_score_bad_weights_are_named() -> None:
    with pytest.raises(ValidationError) as e:
        profile_from_dict(_green_profile(weights={"pue": -1}))
    assert "weights.pue" in e.value.field


def test_green_score_over_the_run_reads_the_forecast_not_the_hour() -> None:
    """Site 0 is clean only in the first hour of each day, site 1 dirty then and clean
    after: a 6-hour pod at hour 0 goes to site 0 by the share now, to site 1 by the share
    expected over its run (forecast from the series' own past, a repeating day here)."""
    clean_first = CarbonSeries(np.array([50.0] + [450.0] * 23), 3600.0, "clean-first")
    clean_after = CarbonSeries(np.array([450.0] + [50.0] * 23), 3600.0, "clean-after")
    spec = _spec(clean_first, clean_after)
    weights = {"pue": 0, "renewable": 1, "efficiency": 0}
    job = [_batch(deadline_h=8.0, duration_h=6.0)]
    now = ProfileScheduler(profile_from_dict(_green_profile(weights=weights)), 0)
    run_ = ProfileScheduler(profile_from_dict(_green_profile(weights=weights, over="run")), 0)
    assert _run(spec, job, now)[0].table.node[0] == 0
    assert _run(spec, job, run_)[0].table.node[0] == 1
    with pytest.raises(ValidationError) as e:
        profile_from_dict(_green_profile(over="tomorrow"))
    assert "over" in e.value.field


def test_the_expected_renewable_share_sees_only_the_past() -> None:
    """The grid's own share is forecast like the intensity: changing what comes after t
    does not change what is expected at t; without a share, it follows the intensity."""
    from smartsched.carbon.outlook import expected_renewable

    rng = np.random.default_rng(0)
    n = 24 * 60  # long enough for the lag regression (five weeks of past and more)
    share = np.clip(0.4 + 0.3 * np.sin(np.arange(n) * 2 * np.pi / 24)
                    + 0.05 * rng.standard_normal(n), 0, 1)
    ci = np.full(n, 300.0)
    t = 24 * 45 * 3600.0
    a = CarbonSeries(ci, 3600.0, "a", renewable=share)
    future = share.copy()
    future[24 * 45:] = 1.0 - future[24 * 45:]
    b = CarbonSeries(ci, 3600.0, "b", renewable=future)
    ea, eb = expected_renewable(a, t, 12), expected_renewable(b, t, 12)
    assert np.allclose(ea, eb) and ((ea >= 0) & (ea <= 1)).all()
    assert not np.allclose(ea, share[24 * 45: 24 * 45 + 12], atol=1e-6)  # a forecast
    plain = CarbonSeries(np.array([490.0 / 2] * 24), 3600.0, "half")  # gas 490 g/kWh
    assert np.allclose(expected_renewable(plain, 0.0, 5), 0.5)
