"""The hierarchy's decision flow in process: sites, gangs, reservations, escalation, spill-over."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smartsched.model.errors import UnknownReferenceError
from smartsched.model.pod import Pod, PodClass
from smartsched.model.presets import load_cluster
from smartsched.serving.hierarchy import Hierarchy
from smartsched.serving.site import SitePlacer, site_subspec
from smartsched.serving.tiers import CloudTier, SiteTier


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _pod(i: int | str, cpu: int = 1000, **kw) -> Pod:
    return Pod(id=f"p{i}", cpu_milli=cpu, memory_mib=1024, **kw)


@pytest.fixture(scope="module")
def medium() -> Hierarchy:
    return Hierarchy.from_spec(load_cluster("medium"))


def test_hierarchy_from_preset(medium: Hierarchy) -> None:
    assert medium.regions == ("region-a", "region-b")
    assert set(medium.edges) == {"mec-0", "mec-1"}
    assert all(medium.parent[e] in medium.regions for e in medium.edges)
    with pytest.raises(UnknownReferenceError):
        Hierarchy.from_spec(load_cluster("medium"), {"mec-9": "region-a"})


def test_site_never_overbooks_and_reservations_expire(medium: Hierarchy) -> None:
    clock = Clock()
    site = SitePlacer(site_subspec(medium.spec, ["mec-0"]), "k8s-default", clock=clock)
    cap = int(site.state.capacity[:, 0].sum())
    pods = [_pod(i, cpu=4000) for i in range(cap // 4000 + 5)]
    res = site.place(pods, ttl_s=30)
    placed = [r for r in res if r.placed]
    assert 0 < len(placed) < len(pods)  # the site filled, and refused the rest
    assert (site.state.allocated <= site.state.capacity).all()
    refused = next(r for r in res if not r.placed)
    assert refused.reason == "0/4 nodes are available: 4 Insufficient cpu"
    assert refused.plugins == ("NodeResourcesFit",)  # which filter said no, not a string
    # Confirmed reservations survive their TTL; the others are freed.
    keep = placed[0].reservation_id
    site.confirm(keep)
    clock.t += 31
    assert site.expire() == len(placed) - 1
    assert site.state.allocated[:, 0].sum() == 4000
    site.release(keep)
    assert site.state.allocated.sum() == 0
    with pytest.raises(UnknownReferenceError):
        site.release(keep)


def test_gang_is_all_or_nothing_and_retry_is_idempotent(medium: Hierarchy) -> None:
    site = SitePlacer(site_subspec(medium.spec, ["mec-0"]), "k8s-default")
    before = site.state.allocated.copy()
    big = int(site.state.capacity[:, 0].max())
    gang = [_pod(f"g{i}", cpu=big, gang_id="g", gang_size=40) for i in range(40)]
    res = site.place(gang, ttl_s=60)
    assert not any(r.placed for r in res) and "gang not placed" in res[0].reason
    assert np.array_equal(site.state.allocated, before)  # members placed first were released
    a = site.place([_pod("x")], 60, request_id="req-1")
    b = site.place([_pod("x")], 60, request_id="req-1")
    assert a[0].reservation_id == b[0].reservation_id and len(site.reservations) == 1


def _cloud(h: Hierarchy, profile: str = "k8s-default") -> tuple[CloudTier, dict[str, SiteTier]]:
    sites: dict[str, SiteTier] = {}
    for r in h.regions:
        sites[r] = SiteTier(h, r, profile)
    for e in h.edges:
        sites[e] = SiteTier(h, e, profile, parent=sites[h.parent[e]].place)

    async def free() -> dict[str, dict[str, float]]:
        return {r: sites[r].free() for r in h.regions}

    cloud = CloudTier(h, {r: sites[r].place for r in h.regions},
                      {e: sites[e].place for e in h.edges}, free)
    return cloud, sites


def test_edge_first_then_escalation_then_spill_over(medium: Hierarchy) -> None:
    cloud, sites = _cloud(medium)
    run = asyncio.run
    edge_pod = _pod("e", pod_class=PodClass.EDGE_RT, origin_site="mec-0", latency_slo_ms=20)
    r = run(cloud.place([edge_pod], 60, None))[0]
    assert r["placed"] and r["tier"] == "edge" and r["site"] == "mec-0"
    # Fill mec-0, then the next edge pod escalates to its parent region.
    cap = int(sites["mec-0"].placer.state.capacity[:, 0].sum())
    run(cloud.place([_pod(f"f{i}", cpu=8000, pod_class=PodClass.EDGE_RT, origin_site="mec-0",
                          latency_slo_ms=20) for i in range(cap // 8000 + 2)], 60, None))
    r = run(cloud.place([_pod("e2", cpu=8000, pod_class=PodClass.EDGE_RT,
                              origin_site="mec-0", latency_slo_ms=20)], 60, None))[0]
    assert r["placed"] and r["tier"] == "region" and r["region"] == medium.parent["mec-0"]
    assert [s["outcome"] for s in r["reasons"]][:1] == ["escalated"]
    assert r["reasons"][0]["plugins"] == ["NodeResourcesFit"]  # why the edge said no
    # Compliance: a pod allowed only in region-b lands there and nowhere else.
    only_b = [_pod(f"b{i}", cpu=16000, allowed_regions=("region-b",)) for i in range(400)]
    res = run(cloud.place(only_b, 60, None))
    assert {x["region"] for x in res if x["placed"]} == {"region-b"}
    assert not res[-1]["placed"] and "no allowed region" in res[-1]["reasons"][-1]["reason"]
    # region-b is full now for big pods: unrestricted ones spill over to region-a.
    r = run(cloud.place([_pod("s", cpu=16000)], 60, None))[0]
    assert r["placed"] and r["region"] == "region-a"


def test_cloud_retry_returns_the_same_answer(medium: Hierarchy) -> None:
    cloud, sites = _cloud(medium)
    a = asyncio.run(cloud.place([_pod("z")], 60, "same"))
    b = asyncio.run(cloud.place([_pod("z")], 60, "same"))
    assert a == b
    assert sum(len(s.placer.reservations) for s in sites.values()) == 1


def test_a_request_id_reused_with_another_body_is_a_conflict(medium: Hierarchy) -> None:
    from smartsched.serving.tiers import IdempotencyConflict

    cloud, sites = _cloud(medium)
    asyncio.run(cloud.place([_pod("z")], 60, "key"))
    asyncio.run(cloud.place([_pod("z", arrival=99.0)], 60, "key"))  # a retry, received later
    for other in ([_pod("z", cpu=2000)], [_pod("y")], [_pod("z"), _pod("y")]):
        with pytest.raises(IdempotencyConflict, match="different body"):
            asyncio.run(cloud.place(other, 60, "key"))
    with pytest.raises(IdempotencyConflict):
        asyncio.run(cloud.place([_pod("z")], 61, "key"))  # the TTL is part of the request
    assert sum(len(s.placer.reservations) for s in sites.values()) == 1


def test_concurrent_requests_with_one_key_and_different_bodies_place_once(
        medium: Hierarchy) -> None:
    """The key binds its body before the first await: requests in flight together with
    one key and different bodies get one placement and 409s, not one booking each; the
    refusal names the id as the client sent it, not the service's derived key."""
    from smartsched.serving.tiers import IdempotencyConflict

    cloud, sites = _cloud(medium)

    async def race() -> list:
        return await asyncio.gather(*(cloud.place([_pod(f"d{i}", cpu=100 + i)], 60, "*:k1",
                                                  shown_id="k1") for i in range(12)),
                                    return_exceptions=True)

    out = asyncio.run(race())
    placed = [o for o in out if not isinstance(o, BaseException)]
    refused = [o for o in out if isinstance(o, IdempotencyConflict)]
    assert len(placed) == 1 and len(refused) == 11
    assert "'k1'" in str(refused[0]) and "*:" not in str(refused[0])
    assert sum(len(s.placer.reservations) for s in sites.values()) == 1


def test_a_site_never_answers_another_body_with_an_old_booking(medium: Hierarchy) -> None:
    """The sites keep their own answers (each sees part of the traffic, so they remember
    a key longer than the cloud tier): a key the cloud has forgotten, reused with the same
    pod ids and another body, is a new request there, not the old booking replayed."""
    cloud, sites = _cloud(medium)
    first = asyncio.run(cloud.place([_pod("z", cpu=1000)], 60, "*:k"))[0]
    cloud.answers.clear()
    cloud._bodies.clear()  # the cloud's window has rolled past the key
    again = asyncio.run(cloud.place([_pod("z", cpu=3000)], 60, "*:k"))[0]
    assert again["placed"] and again["reservation_id"] != first["reservation_id"]
    booked = sorted(b.request.vector[0] for s in sites.values()
                    for r in s.placer.reservations.values() for b in r.bookings)
    assert booked == [1000, 3000]


def test_journal_recovers_reservations_after_restart(medium: Hierarchy, tmp_path) -> None:
    from smartsched.serving.journal import Journal

    clock = Clock()
    spec = site_subspec(medium.spec, ["mec-0"])
    path = tmp_path / "mec-0.jsonl"
    a = SitePlacer(spec, "k8s-default", clock=clock, journal=Journal(path))
    gpu = Pod(id="g", cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=1000)
    kept = a.place([gpu], ttl_s=10, request_id="r-keep")[0]
    a.confirm(kept.reservation_id)
    short = a.place([_pod("s")], ttl_s=5)[0]
    gone = a.place([_pod("d")], ttl_s=500)[0]
    a.release(gone.reservation_id)
    with path.open("a") as f:
        f.write('{"op": "reserve", "rid": "torn')  # a crash mid-write
    clock.t += 6  # 'short' expires while the replica is down
    a.journal.close()  # the replica's process ends
    b = SitePlacer(spec, "k8s-default", clock=clock, journal=Journal(path))
    assert set(b.reservations) == {kept.reservation_id}
    # Same allocation as before the restart, less the reservation that expired.
    assert np.array_equal(b.state.allocated,
                          a.state.allocated - _alloc_of(a, short.reservation_id))
    # The retry after the restart gets the same answer; the device stays booked.
    again = b.place([gpu], ttl_s=10, request_id="r-keep")[0]
    assert again.reservation_id == kept.reservation_id and again.devices == kept.devices
    node = b.state.node_index(kept.node)
    assert b.state.gpu_free[node, kept.devices[0]] == 0


def test_a_journal_is_private_to_one_instance(tmp_path) -> None:
    """Files 0600 in a 0700 directory; a second instance on the same journal is refused
    at start (it would share and overwrite the first one's reservations)."""
    import stat

    from smartsched.serving.journal import Journal, JournalInUse

    path = tmp_path / "j" / "region-a.jsonl"
    first = Journal(path)
    first.append({"op": "release", "rid": "x"})
    first.rewrite([{"op": "release", "rid": "y"}])  # compaction keeps the mode
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    with pytest.raises(JournalInUse, match="another service instance"):
        Journal(path, lock_wait_s=0)
    first.close()
    second = Journal(path, lock_wait_s=0)  # the first one has gone: the journal is free
    assert [e["rid"] for e in second.replay()] == ["y"]
    second.close()


def _alloc_of(site: SitePlacer, rid: str) -> np.ndarray:
    out = np.zeros_like(site.state.allocated)
    for bk in site.reservations[rid].bookings:
        out[bk.node] += site.state.charged(bk.request)
    return out


def test_nodes_register_change_and_survive_restart(medium: Hierarchy, tmp_path) -> None:
    from smartsched.model.cluster import NodeSpec
    from smartsched.model.errors import SmartSchedError
    from smartsched.serving.journal import Journal

    spec = site_subspec(medium.spec, ["mec-0"])
    zone = spec.zones[0].name
    path = tmp_path / "mec-0.jsonl"
    a = SitePlacer(spec, "k8s-default", journal=Journal(path))
    new = NodeSpec(name="mec-0-new", cpu_milli=64000, memory_mib=262144, zone=zone,
                   labels={"pool": "fast"})
    assert a.upsert_nodes([new])["changed"] == 1
    r = a.place([_pod("f", cpu=8000, node_selector=(("pool", "fast"),))], 600)[0]
    assert r.placed and r.node == "mec-0-new"
    # Shrinking the node below its reservation is refused and changes nothing.
    small = NodeSpec(name="mec-0-new", cpu_milli=4000, memory_mib=262144, zone=zone,
                     labels={"pool": "fast"})
    with pytest.raises(SmartSchedError, match="mec-0-new"):
        a.upsert_nodes([small])
    assert a.state.capacity[a.state.node_index("mec-0-new"), 0] == 64000
    # Usage only: no rebuild, the node's observed use is set.
    a.upsert_nodes([new], {"mec-0-new": (0.5, 0.25, 0.0)})
    assert a.state.usage[a.state.node_index("mec-0-new"), 0] == 32000
    with pytest.raises(UnknownReferenceError):
        a.upsert_nodes([NodeSpec(name="x", cpu_milli=1000, memory_mib=1024, zone="nowhere")])
    a.journal.close()
    b = SitePlacer(spec, "k8s-default", journal=Journal(path))  # restart
    i = b.state.node_index("mec-0-new")
    assert b.state.allocated[i, 0] == 8000 and b.state.labels[i].any()


@pytest.mark.parametrize("hot", ["edge0-00000", "edge0-00001"])
def test_site_pulls_usage_from_prometheus_and_load_aware_avoids_the_busy_node(hot: str) -> None:
    """With `prometheus` configured a site reads its nodes' actual usage (in the background
    of requests, applied between decisions); a load-aware site then places on the node
    Prometheus reports cool. A failing Prometheus is reported, last values kept."""
    import time

    from smartsched.serving.config import UsageFromPrometheus
    from tests.prometheus.test_source import Scripted, vector

    cool = "edge0-00001" if hot == "edge0-00000" else "edge0-00000"
    now = time.time()
    prom = Scripted([
        (200, vector((hot, 15.0), (cool, 0.5), t=now), 0.0),  # cpu cores (of 16)
        (200, vector((hot, now), (cool, now), t=now), 0.0),  # freshness
        (200, vector((hot, 1e9), (cool, 1e9), t=now), 0.0),  # memory bytes
        (200, vector((hot, 0.0), (cool, 0.0), t=now), 0.0),  # gpu %
        (200, vector((hot, now), (cool, now), t=now), 0.0),  # gpu freshness
        (503, {"status": "error", "error": "down"}, 0.0),  # every later query
    ])
    try:
        h = Hierarchy.from_spec(load_cluster("small"))
        cfg = UsageFromPrometheus(url=prom.url, interval_s=0.05, timeout_s=1)
        tier = SiteTier(h, "mec-0", "load-aware", usage=cfg)

        async def scenario() -> tuple[list, dict, dict]:
            status = await tier.refresh_usage()
            placed = await tier.place([_pod("p1", cpu=2000)], 60.0, None)
            await asyncio.sleep(0.1)  # due again: the next request starts a refresh
            await tier.place([_pod("p2", cpu=1000)], 60.0, None)
            for _ in range(100):  # the background refresh (all 503s, retried) reports
                if tier.summary()["usage_from_prometheus"].get("errors"):
                    break
                await asyncio.sleep(0.05)
            return placed, status, tier.summary()

        placed, status, summary = asyncio.run(scenario())
        assert status["errors"] == [] and status["stale_values"] == 0
        assert placed[0]["placed"] and placed[0]["node"] == cool
        i = tier.placer.state.index[hot]
        assert tier.placer.state.usage[i, 0] == pytest.approx(15_000.0)  # kept after 503s
        later = summary["usage_from_prometheus"]
        assert later["errors"] and all("http 503" in e for e in later["errors"])
    finally:
        prom.close()


def _one_node_site(tmp_path, preemption: bool) -> SitePlacer:
    from smartsched.serving.journal import Journal
    from tests.builders import cluster, node

    spec = cluster(node("only", cpu=4000, mem=65536))
    return SitePlacer(spec, "k8s-default", journal=Journal(tmp_path / "s.jsonl"),
                      preemption=preemption)


def test_the_service_preempts_lower_priority_reservations_only_when_enabled(tmp_path) -> None:
    from smartsched.serving.journal import Journal

    site = _one_node_site(tmp_path, preemption=True)
    low = site.place([_pod("low", cpu=3000, priority=100)], ttl_s=500, request_id="r-low")[0]
    mid = site.place([_pod("mid", cpu=1000, priority=900)], ttl_s=500)[0]
    assert low.placed and mid.placed
    high = site.place([_pod("high", cpu=2000, priority=1000)], ttl_s=500)[0]
    # The 100 goes (the minimal victim), not the 900; the answer names it.
    assert high.placed and high.preempted == ((low.reservation_id, ("plow",)),)
    assert set(site.reservations) == {mid.reservation_id, high.reservation_id}
    assert site.state.allocated[0, 0] == 3000
    # A retry of the preempted request is placed anew, not answered "placed" from the cache.
    again = site.place([_pod("low", cpu=3000, priority=100)], ttl_s=500, request_id="r-low")[0]
    assert not again.placed
    # Equal or higher priority is never a victim (900 left: mid is 900, high 1000).
    peer = site.place([_pod("peer", cpu=2000, priority=900)], ttl_s=500)[0]
    assert not peer.placed and peer.preempted == ()
    # The journal agrees: after a restart the preempted reservation is gone.
    site.journal.close()
    b = SitePlacer(site.spec, "k8s-default", journal=Journal(tmp_path / "s.jsonl"))
    assert set(b.reservations) == {mid.reservation_id, high.reservation_id}


def test_a_request_never_preempts_its_own_placements(tmp_path) -> None:
    site = _one_node_site(tmp_path, preemption=True)
    pods = [_pod("low", cpu=3000, priority=100), _pod("high", cpu=2000, priority=1000)]
    out = site.place(pods, ttl_s=500, request_id="r1")
    assert out[0].placed and not out[1].placed and "this same request" in out[1].reason
    assert set(site.reservations) == {out[0].reservation_id}
    assert site.place(pods, ttl_s=500, request_id="r1") == out  # the cached answer is true


def test_without_preemption_or_for_a_gang_the_service_refuses_and_keeps_everything(
        tmp_path) -> None:
    off = _one_node_site(tmp_path / "off", preemption=False)
    low = off.place([_pod("low", cpu=4000, priority=100)], ttl_s=500)[0]
    high = off.place([_pod("high", cpu=2000, priority=1000)], ttl_s=500)[0]
    assert not high.placed and "service.preemption: false" in high.reason
    assert set(off.reservations) == {low.reservation_id}
    on = _one_node_site(tmp_path / "on", preemption=True)
    low = on.place([_pod("low", cpu=4000, priority=100)], ttl_s=500)[0]
    gang = [_pod(f"m{k}", cpu=1000, priority=1000, gang_id="g", gang_size=2) for k in range(2)]
    out = on.place(gang, ttl_s=500)
    assert not any(r.placed for r in out)  # a gang reserves in the twin; it never preempts
    assert set(on.reservations) == {low.reservation_id}


def test_a_node_update_changes_only_what_it_names(medium: Hierarchy) -> None:
    """PUT /v1/nodes semantics at the site: a known node keeps every field the update
    leaves out (an unchanged node is no change and keeps its rack); new nodes need their
    size; FPGA and power fields are settable; bad values name nodes.<row>.<field>."""
    from smartsched.model.errors import ValidationError

    spec = site_subspec(medium.spec, ["region-a"])
    site = SitePlacer(spec, "k8s-default")
    node = next(n for n in spec.nodes if n.num_gpu > 0)
    # Usage only, and a resend of the node as it is: nothing changes, nothing is rebuilt.
    state_before = site.state
    out = site.apply_node_updates([(0, node.name, {}),
                                   (1, spec.nodes[0].name, {"cpu_milli": spec.nodes[0].cpu_milli})],
                                  {node.name: (0.5, 0.5, 0.0)})
    assert out == {"changed": 0, "usage": 1} and site.state is state_before
    # A cordon keeps the rack, GPUs, labels and power model.
    site.apply_node_updates([(0, node.name, {"unschedulable": True})])
    now = next(n for n in site.spec.nodes if n.name == node.name)
    assert now.unschedulable and (now.rack, now.num_gpu, now.gpu_model, now.labels) == (
        node.rack, node.num_gpu, node.gpu_model, node.labels)
    # A new FPGA node with its own power model.
    site.apply_node_updates([(0, "fpga-0", {"cpu_milli": 32000, "memory_mib": 65536,
                                            "num_fpga": 2, "fpga_model": "VU9P",
                                            "idle_watts": 90.0, "max_watts": 400.0})])
    fpga = next(n for n in site.spec.nodes if n.name == "fpga-0")
    assert (fpga.num_fpga, fpga.host_max_watts, fpga.zone) == (2, 400.0, spec.zones[0].name)
    bad = [({"memory_mib": 1024}, "nodes.3.cpu_milli"),  # a new node needs its size
           ({"cpu_milli": 1000, "memory_mib": 1024, "taints": ["a b"]}, "nodes.3.taints"),
           ({"cpu_milli": 1000, "memory_mib": 1024, "taints": ["k=v:Sometimes"]},
            "nodes.3.taints"),
           ({"cpu_milli": 1000, "memory_mib": 1024, "num_fpga": 1, "fpga_model": "X"},
            "nodes.3.fpga_model"),
           # a model of no device: refused as for GPUs (it was kept and journaled)
           ({"cpu_milli": 1000, "memory_mib": 1024, "fpga_model": "VU9P"},
            "nodes.3.fpga_model"),
           ({"cpu_milli": 1000, "memory_mib": 1024, "idle_watts": 500.0, "max_watts": 100.0},
            "nodes.3.idle_watts"),
           # one given, the other implied (105 W for one core): power must rise with load
           ({"cpu_milli": 1000, "memory_mib": 1024, "idle_watts": 100000.0},
            "nodes.3.idle_watts")]
    for changes, field in bad:
        with pytest.raises(ValidationError) as e:
            site.apply_node_updates([(3, "new-node", changes)])
        assert e.value.field == field, (changes, e.value)
    assert "new-node" not in site.state.names


def test_node_updates_cannot_grow_the_label_table_or_the_site_without_bound(
        medium: Hierarchy, monkeypatch: pytest.MonkeyPatch) -> None:
    """Labels and taints are node x vocabulary tables: nodes that each carry their own
    labels grow them with the square of the node count. An update that would pass the
    bound is refused naming the field, and the site keeps what it had; so is one that
    would take a site past its node limit."""
    from smartsched.model.errors import ValidationError
    from smartsched.serving import site as site_mod
    from smartsched.twin import state as state_mod

    spec = site_subspec(medium.spec, ["mec-0"])
    site = SitePlacer(spec, "k8s-default")
    before = site.state
    monkeypatch.setattr(state_mod, "MAX_TABLE_CELLS", 20_000)  # the same rule, smaller
    n = len(spec.nodes)
    ok = [(i, f"ok-{i}", {"cpu_milli": 1000, "memory_mib": 1024, "labels": {"pool": "a"}})
          for i in range(10)]
    assert site.apply_node_updates(ok)["changed"] == 10  # shared labels: a narrow table
    unique = [(i, f"u-{i}", {"cpu_milli": 1000, "memory_mib": 1024,
                             "labels": {f"k{j}": f"{i}" for j in range(40)}})
              for i in range(60)]  # (n + 70) nodes x ~2,400 pairs: past 20,000 cells
    with pytest.raises(ValidationError) as e:
        site.apply_node_updates(unique)
    assert e.value.field == "nodes.labels" and "distinct label pairs" in e.value.message
    taints = [(0, "t-0", {"cpu_milli": 1000, "memory_mib": 1024,
                          "taints": [f"k{j}=v:NoSchedule" for j in range(64)]})]
    monkeypatch.setattr(state_mod, "MAX_TABLE_CELLS", (n + 11) * 63)
    with pytest.raises(ValidationError) as e:
        site.apply_node_updates(taints)
    assert e.value.field == "nodes.taints"
    assert site.state.num_nodes == n + 10 and "u-0" not in site.state.names
    assert site.state is not before and site.spec.nodes[-1].name == "ok-9"
    monkeypatch.setattr(site_mod, "MAX_SITE_NODES", n + 12)
    with pytest.raises(ValidationError) as e:
        site.apply_node_updates([(i, f"more-{i}", {"cpu_milli": 1000, "memory_mib": 1024})
                                 for i in range(3)])
    assert e.value.field == "nodes" and f"{n + 13:,} nodes" in e.value.message
    assert site.apply_node_updates([(0, "more-0", {"cpu_milli": 1000, "memory_mib": 1024})])


def test_a_dry_run_checks_the_rebooking_and_changes_nothing(medium: Hierarchy) -> None:
    from smartsched.model.errors import SmartSchedError

    spec = site_subspec(medium.spec, ["mec-0"])
    site = SitePlacer(spec, "k8s-default")
    r = site.place([_pod("big", cpu=8000)], ttl_s=600)[0]
    assert r.placed
    before, spec_before = site.state.capacity.copy(), site.spec
    with pytest.raises(SmartSchedError, match=r.node):
        site.apply_node_updates([(0, r.node, {"cpu_milli": 1000})], dry_run=True)
    ok = site.apply_node_updates([(0, r.node, {"labels": {"pool": "x"}})], dry_run=True)
    assert ok["changed"] == 1
    assert np.array_equal(site.state.capacity, before) and site.spec is spec_before
    assert next(n for n in site.spec.nodes if n.name == r.node).labels.get("pool") != "x"


def test_journal_codec_round_trips_every_pod_field() -> None:
    """A recovered reservation holds the pod it was made for: every field, nested tuples
    included (image layers came back as lists before)."""
    import json

    from smartsched.model.pod import UsageKind, UsageProfile
    from smartsched.serving.journal import pod_from_dict, pod_to_dict
    from smartsched.serving.tiers import request_fingerprint

    pod = Pod("p", 1500, 2048, num_gpu=1, gpu_milli=500, pod_class=PodClass.AI_INFER,
              tenant="t", priority=7, gpu_models=("A100",), node_selector=(("k", "v"),),
              tolerations=("gpu",), allowed_regions=("region-a",), origin_site="mec-0",
              latency_slo_ms=20.0, arrival=3.0, duration=60.0, deadline=900.0,
              gang_id="g", gang_size=2, app="web", traffic_mbps=5.0,
              usage=UsageProfile(kind=UsageKind.DIURNAL, mean=0.5),
              checkpoint_interval_s=30.0, image="img:1",
              image_layers=(("sha256:" + "a" * 64, 300),))
    back = pod_from_dict(json.loads(json.dumps(pod_to_dict(pod))))
    assert back == pod
    # The idempotency fingerprint sees every field the client gives, not the arrival stamp.
    import dataclasses

    assert request_fingerprint([pod], 30) == request_fingerprint(
        [dataclasses.replace(pod, arrival=99.0)], 30)
    assert request_fingerprint([pod], 30) != request_fingerprint(
        [dataclasses.replace(pod, image_layers=(("sha256:" + "b" * 64, 300),))], 30)
    assert request_fingerprint([pod], 30) != request_fingerprint([pod], 31)


def _validated_site(tmp_path, mode: str) -> SitePlacer:
    from smartsched.scheduling.sandbox import SandboxConfig
    from smartsched.serving.journal import Journal
    from tests.builders import cluster, node

    spec = cluster(node("only", cpu=4000, mem=65536))
    return SitePlacer(spec, "k8s-default", journal=Journal(tmp_path / "s.jsonl"),
                      preemption=True, sandbox_mode=mode,
                      sandbox=SandboxConfig(max_arrivals=0))


def test_a_preemption_the_sandbox_refuses_changes_nothing(tmp_path) -> None:
    from smartsched.serving.journal import Journal

    site = _validated_site(tmp_path, "risky")
    web = site.place([_pod("web", cpu=4000, priority=100, pod_class=PodClass.ONLINE)],
                     ttl_s=500, request_id="r-web")[0]
    assert web.placed and web.validation is None  # one pod, no preemption: not risky
    allocated = site.state.allocated.copy()
    state_obj = site.state
    high = site.place([_pod("high", cpu=2000, priority=1000)], ttl_s=500)[0]
    # The online pod would have nowhere to go for the whole horizon: refused, with why.
    assert not high.placed and "refused by sandbox validation" in high.reason
    assert "online_pending_s +600.0" in high.reason
    assert high.validation is not None and not high.validation["accepted"]
    assert set(site.reservations) == {web.reservation_id}
    assert site.state is state_obj and np.array_equal(site.state.allocated, allocated)
    assert site.place([_pod("web", cpu=4000, priority=100, pod_class=PodClass.ONLINE)],
                      ttl_s=500, request_id="r-web")[0].placed  # its answer kept
    # Nothing of the refused request reached the journal.
    site.journal.close()
    again = SitePlacer(site.spec, "k8s-default", journal=Journal(tmp_path / "s.jsonl"))
    assert set(again.reservations) == {web.reservation_id}


def test_a_refused_preemption_of_two_pods_of_one_request_keeps_its_whole_answer(
        tmp_path) -> None:
    """Each victim took its pod out of its request's answer; the undo put back the answer as
    the last victim found it (one pod short), so a retry booked that pod a second time."""
    site = _validated_site(tmp_path, "risky")
    web = site.place([_pod(f"web{i}", cpu=2000, priority=100, pod_class=PodClass.ONLINE)
                      for i in range(2)], ttl_s=500, request_id="r-web")
    assert all(r.placed for r in web) and len(site.reservations) == 2
    high = site.place([_pod("high", cpu=4000, priority=1000)], ttl_s=500)[0]
    assert not high.placed and "refused by sandbox validation" in high.reason
    again = site.place([_pod(f"web{i}", cpu=2000, priority=100, pod_class=PodClass.ONLINE)
                        for i in range(2)], ttl_s=500, request_id="r-web")
    assert [r.reservation_id for r in again] == [r.reservation_id for r in web]
    assert len(site.reservations) == 2 and site.state.allocated[0, 0] == 4000


def test_a_request_asking_for_validation_gets_the_verdict_and_is_kept(tmp_path) -> None:
    site = _validated_site(tmp_path, "request")
    out = site.place([_pod("a", cpu=1000), _pod("b", cpu=1000)], ttl_s=500, validate=True)
    assert all(r.placed for r in out)
    assert all(r.validation["accepted"] and r.validation["kind"] == "batch" for r in out)
    assert len(site.reservations) == 2 and site.state.allocated[0, 0] == 2000
    plain = site.place([_pod("c", cpu=1000)], ttl_s=500)[0]
    assert plain.placed and plain.validation is None  # not asked, not risky
    off = _validated_site(tmp_path / "off", "off")
    assert off.sandbox is None
    assert off.place([_pod("d")], ttl_s=500, validate=True)[0].validation is None


def test_the_cloud_passes_the_request_option_down(medium: Hierarchy) -> None:
    from smartsched.serving.tiers import IdempotencyConflict

    cloud, _ = _cloud(medium)
    r = asyncio.run(cloud.place([_pod("v")], 60, "req-v", True))[0]
    assert r["placed"] and r["validation"]["accepted"]
    with pytest.raises(IdempotencyConflict):  # the option is part of what the key binds
        asyncio.run(cloud.place([_pod("v")], 60, "req-v", False))


def test_sandbox_settings_naming_unknown_sites_or_profiles_are_refused() -> None:
    from smartsched.model.errors import ValidationError
    from smartsched.serving.app import service_hierarchy
    from smartsched.serving.config import parse_service_config

    with pytest.raises(ValidationError) as e:
        service_hierarchy(parse_service_config({"sandbox": {"sites": {"region-z": "all"}}}))
    assert e.value.field == "service.sandbox.sites.region-z"
    with pytest.raises(ValidationError) as e:
        parse_service_config({"sandbox": {"mode": "sometimes"}})
    assert e.value.field == "service.sandbox.mode"
    from smartsched.serving.app import build_app

    with pytest.raises(ValidationError) as e:
        build_app({"auth": {"disabled": True},
                   "sandbox": {"settings": {"rollout": "no-such-profile"}}})
    assert e.value.field == "service.sandbox.settings.rollout"


def test_the_service_preempts_within_a_tenant_only() -> None:
    """With preemption on, priority (from the request) may evict one's own tenant's lower
    pods, never another tenant's: else any token could evict everyone."""
    from smartsched.serving.site import SitePlacer
    from tests.builders import cluster, node, pod

    placer = SitePlacer(cluster(node("n1", cpu=8000)), "k8s-default", preemption=True)
    low = placer.place([pod("retail-low", cpu=6000, tenant="retail")], ttl_s=600)[0]
    assert low.placed
    other = placer.place([pod("bank-high", cpu=6000, tenant="bank", priority=1000)],
                         ttl_s=600)[0]
    assert not other.placed and "another tenant" in other.reason
    own = placer.place([pod("retail-high", cpu=6000, tenant="retail", priority=1000)],
                       ttl_s=600)[0]
    assert own.placed and own.preempted and own.preempted[0][0] == low.reservation_id


def test_regions_rank_by_green_score_and_sites_report_it(medium: Hierarchy) -> None:
    import dataclasses

    from smartsched.model.carbon import CarbonSeries
    from smartsched.serving.hierarchy import RankWeights

    only_green = RankWeights(latency=0, load=0, price=0, carbon=0, green=1)
    free = {r: {"cpu": 0.5, "gpu": 0.5, "memory": 0.5} for r in medium.regions}
    clean = CarbonSeries(np.array([300.0]), 3600.0, "clean", renewable=np.array([0.9]))
    dirty = CarbonSeries(np.array([300.0]), 3600.0, "dirty", renewable=np.array([0.1]))

    def with_grids(a: CarbonSeries, b: CarbonSeries) -> Hierarchy:
        sites = tuple(dataclasses.replace(s, carbon={"region-a": a, "region-b": b}[s.name])
                      if s.name in ("region-a", "region-b") else s for s in medium.spec.sites)
        return Hierarchy.from_spec(dataclasses.replace(medium.spec, sites=sites))

    for a, b, first in ((clean, dirty, "region-a"), (dirty, clean, "region-b")):
        h = with_grids(a, b)
        ranked = h.rank_regions(_pod("g"), free, 0.0, only_green)
        assert ranked[0][0] == first and "GreenScore" in ranked[0][1]
        assert h.green(first, 0.5, 0.0) > h.green(ranked[1][0], 0.5, 0.0)
    # At equal grids and PUE, the busier region's nodes do more work per watt.
    h = with_grids(clean, clean)
    assert h.green("region-a", 0.9, 0.0) > h.green("region-a", 0.1, 0.0)

    clock = Clock()
    tier = SiteTier(medium, "region-a", "k8s-default", clock=clock)
    empty = tier.summary()["green"]
    assert empty["use_from"] == "allocation" and empty["efficiency"] == 0.0
    site = medium.site("region-a")
    assert empty["pue_share"] == pytest.approx(1 / site.pue)
    assert empty["renewable_share"] == pytest.approx(site.carbon.renewable_at(0.0))
    asyncio.run(tier.place([_pod(i, cpu=8000) for i in range(20)], 30, None))
    busy = tier.summary()["green"]
    assert 0 < busy["efficiency"] <= 1 and busy["score"] > empty["score"]

    # Per node: every powered-on node of the site, the busy ones scoring higher than idle.
    per_node = tier.node_green()
    st = tier.placer.state
    assert set(per_node) == {n.name for n in st.spec.nodes}
    booked = st.allocated[:, 0] > 0
    names = [n.name for n in st.spec.nodes]
    busy_min = min(per_node[n] for n, b in zip(names, booked, strict=True) if b)
    idle_max = max(per_node[n] for n, b in zip(names, booked, strict=True) if not b)
    assert busy_min > idle_max and all(0 <= v <= 1 for v in per_node.values())


def _loads(sites: dict[str, SiteTier], busy: set[str]) -> Any:
    """The cloud's view of the regions' loads, with the ``busy`` ones (as it changes
    between two tries) shown nearly full."""
    async def free() -> dict[str, dict[str, float]]:
        return {r: ({k: 0.01 for k in t.free()} if r in busy else t.free())
                for r, t in sites.items()}
    return free


def test_a_retry_while_the_first_try_is_in_flight_gets_its_answer(medium: Hierarchy) -> None:
    """A retry with the same request id while the first try still waited at its region
    ranked the regions afresh: when the loads had changed it was booked in the other
    region (one request, two reservations; probe round 7). It now waits for the first
    try and answers as it did."""
    sites: dict[str, SiteTier] = {r: SiteTier(medium, r, "k8s-default") for r in medium.regions}
    gate = asyncio.Event()
    calls: list[str] = []
    busy: set[str] = set()

    def region(name: str) -> Any:
        async def place(*a: Any, **k: Any) -> Any:
            calls.append(name)
            if len(calls) == 1:
                await gate.wait()  # the first try waits there (a hold, a slow site)
            return await sites[name].place(*a, **k)
        return place

    free = _loads(sites, busy)

    cloud = CloudTier(medium, {r: region(r) for r in medium.regions}, {}, free)

    async def race() -> tuple[Any, Any]:
        first = asyncio.create_task(cloud.place([_pod("once")], 60, "rid"))
        while not calls:
            await asyncio.sleep(0.01)
        busy.add(calls[0])  # the loads change: a fresh ranking puts the other region first
        retry = asyncio.create_task(cloud.place([_pod("once")], 60, "rid"))
        await asyncio.sleep(0.05)
        assert not retry.done()  # waiting for the first try, not placed elsewhere
        gate.set()
        return await first, await retry

    a, b = asyncio.run(race())
    assert a == b and a[0]["placed"]
    assert calls == [calls[0]]  # one try reached a region
    assert sum(len(s.placer.reservations) for s in sites.values()) == 1


def _first_answer_lost(sites: dict[str, SiteTier], calls: list[str]) -> Any:
    """A handle maker for each region: the call books at the site, and the first call's
    answer is lost (the hop broke, or the ingress died) after the site booked."""
    def region(name: str) -> Any:
        async def place(*a: Any, **k: Any) -> Any:
            calls.append(name)
            got = await sites[name].place(*a, **k)
            if len(calls) == 1:
                raise ConnectionError("the answer was lost")
            return got
        return place
    return region


def test_a_retry_after_a_try_that_booked_and_failed_goes_back_to_that_region(
        medium: Hierarchy) -> None:
    """The region booked the pod, then its answer was lost (the request failed: a 503 to
    the client). The retry ranked the regions afresh and, the loads having changed, was
    booked in the other region: two bookings for one pod until the first's TTL ran out
    (probe round 7). It now goes first where the failed try went, whose own key answers
    with the booking."""
    sites: dict[str, SiteTier] = {r: SiteTier(medium, r, "k8s-default") for r in medium.regions}
    calls: list[str] = []
    busy: set[str] = set()

    region = _first_answer_lost(sites, calls)

    free = _loads(sites, busy)

    cloud = CloudTier(medium, {r: region(r) for r in medium.regions}, {}, free)
    with pytest.raises(ConnectionError):
        asyncio.run(cloud.place([_pod("once")], 60, "rid"))
    busy.add(calls[0])  # a fresh ranking now puts the other region first
    (r,) = asyncio.run(cloud.place([_pod("once")], 60, "rid"))
    assert r["placed"] and r["region"] == calls[0] and calls == [calls[0], calls[0]]
    assert sum(len(s.placer.reservations) for s in sites.values()) == 1


def test_a_retry_after_the_ingress_died_mid_request_goes_back_to_that_region(
        medium: Hierarchy, tmp_path: Path) -> None:
    """Where a failed try went was kept in the ingress's memory only: when the ingress
    itself died mid-request (the case its 503 asks clients to retry), the new one ranked
    afresh and booked the pod in a second region (probe round 8: 1 live round in 6). It is
    journaled before each call, as the answers are."""
    from smartsched.serving.journal import Journal

    sites: dict[str, SiteTier] = {r: SiteTier(medium, r, "k8s-default") for r in medium.regions}
    calls: list[str] = []
    busy: set[str] = set()

    region = _first_answer_lost(sites, calls)

    free = _loads(sites, busy)
    handles = {r: region(r) for r in medium.regions}
    first = CloudTier(medium, handles, {}, free, journal=Journal(tmp_path / "cloud.jsonl"))
    with pytest.raises(ConnectionError):
        asyncio.run(first.place([_pod("once")], 60, "rid"))
    first.journal.close()
    busy.add(calls[0])  # a fresh ranking now puts the other region first
    again = CloudTier(medium, handles, {}, free, journal=Journal(tmp_path / "cloud.jsonl"))
    (r,) = asyncio.run(again.place([_pod("once")], 60, "rid"))
    assert r["placed"] and r["region"] == calls[0] and calls == [calls[0], calls[0]]
    assert sum(len(s.placer.reservations) for s in sites.values()) == 1
    again.journal.close()  # the answer is kept; the note of where it went is not
    third = CloudTier(medium, handles, {}, free, journal=Journal(tmp_path / "cloud.jsonl"))
    assert "rid" in third.answers and not third._sent


def test_a_batch_retried_after_a_lost_answer_meets_each_site_under_its_first_key(
        medium: Hierarchy) -> None:
    """A review of the retry routing: with the regions of the whole failed try put first
    for every pod, a two-pod batch reached the sites in other combinations, under new
    keys, and was booked again (4 reservations for 2 pods). Each pod now goes where it
    went, and every call of the failed try ended before it was raised."""
    sites: dict[str, SiteTier] = {r: SiteTier(medium, r, "k8s-default") for r in medium.regions}
    lost = {"on": True}
    busy: set[str] = set()

    def region(name: str) -> Any:
        async def place(*a: Any, **k: Any) -> Any:
            got = await sites[name].place(*a, **k)
            if lost["on"] and name == "region-b":
                raise ConnectionError("the answer was lost")
            return got
        return place

    free = _loads(sites, busy)

    cloud = CloudTier(medium, {r: region(r) for r in medium.regions}, {}, free)
    pods = [_pod("a"), _pod("b")]
    with pytest.raises(ConnectionError):
        asyncio.run(cloud.place(pods, 60, "rid"))
    first = {s: len(t.placer.reservations) for s, t in sites.items()}
    assert sum(first.values()) == 2  # both booked; one answer lost
    lost["on"] = False
    busy.add("region-a")  # a fresh ranking would send both elsewhere
    res = asyncio.run(cloud.place(pods, 60, "rid"))
    assert all(r["placed"] for r in res)
    assert {s: len(t.placer.reservations) for s, t in sites.items()} == first
