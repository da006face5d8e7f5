"""An MEC site cut off from its region keeps deciding, queues escalations and reconciles
without a duplicate placement or a double-booked device (issue 22, part 2)."""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest

from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod, PodClass
from smartsched.model.presets import GPU_NODE_TAINT, load_cluster
from smartsched.serving.config import EdgeAutonomy
from smartsched.serving.hierarchy import Hierarchy
from smartsched.serving.tiers import CloudTier, SiteTier


class Link:
    """The edge's handle to its region, with faults to inject: ``cut`` (the call fails),
    ``lose_reply`` (the region books, the answer never arrives), ``slow_s``."""

    def __init__(self, target) -> None:
        self.target = target
        self.cut = False
        self.lose_reply = False
        self.slow_s = 0.0
        self.calls = 0

    async def __call__(self, pods, ttl_s, rid, validate=False):
        self.calls += 1
        if self.cut:
            raise ConnectionError("link down")
        if self.slow_s:
            await asyncio.sleep(self.slow_s)
        res = await self.target(pods, ttl_s, rid, validate)
        if self.lose_reply:
            raise ConnectionResetError("reply lost")
        return res


def _edge_pod(i, cpu=8000, gpu=False) -> Pod:
    return Pod(id=f"e{i}", cpu_milli=cpu, memory_mib=1024, pod_class=PodClass.EDGE_RT,
               origin_site="mec-0", latency_slo_ms=50, num_gpu=int(gpu),
               gpu_milli=1000 * int(gpu), tolerations=(GPU_NODE_TAINT,) if gpu else ())


def _service(autonomy: EdgeAutonomy | None = None):
    h = Hierarchy.from_spec(load_cluster("medium"))
    sites: dict[str, SiteTier] = {r: SiteTier(h, r, "k8s-default") for r in h.regions}
    links = {}
    for e in h.edges:
        links[e] = Link(sites[h.parent[e]].place)
        sites[e] = SiteTier(h, e, "k8s-default", parent=links[e],
                            autonomy=autonomy or EdgeAutonomy(reconcile_every_s=3600))

    async def free():
        return {r: sites[r].free() for r in h.regions}

    cloud = CloudTier(h, {r: sites[r].place for r in h.regions},
                      {e: sites[e].place for e in h.edges}, free)
    return h, cloud, sites, links["mec-0"]


def _fill_edge(cloud: CloudTier, sites: dict[str, SiteTier]) -> int:
    cap = int(sites["mec-0"].placer.state.capacity[:, 0].sum())
    n = cap // 8000
    # 7.9 cores each: two per 16-core edge node, a few hundred millicores left on each
    res = asyncio.run(cloud.place([_edge_pod(f"fill{i}", cpu=7900) for i in range(n)], 60,
                                  "fill"))
    assert all(r["placed"] and r["site"] == "mec-0" for r in res)
    return n


def _bookings(sites: dict[str, SiteTier]) -> Counter:
    """pod id -> how many reservations hold it, over every site."""
    c: Counter = Counter()
    for s in sites.values():
        for res in s.placer.reservations.values():
            c.update(b.pod.id for b in res.bookings)
    return c


def _no_device_double_booked(sites: dict[str, SiteTier]) -> None:
    for s in sites.values():
        st = s.placer.state
        assert (st.allocated <= st.capacity + 1e-9).all()
        used: Counter = Counter()
        for res in s.placer.reservations.values():
            for b in res.bookings:
                if b.pod.gpu_milli == 1000:  # whole GPUs: a device holds one pod
                    used.update((b.node, d) for d in b.devices)
        assert all(v == 1 for v in used.values()), used


def test_a_cut_off_edge_keeps_deciding_queues_and_reconciles_once() -> None:
    h, cloud, sites, link = _service()
    _fill_edge(cloud, sites)
    link.cut = True
    small = Pod(id="esmall", cpu_milli=100, memory_mib=64, pod_class=PodClass.EDGE_RT,
                origin_site="mec-0", latency_slo_ms=50)
    asked = [small, *[_edge_pod(f"x{i}", gpu=True) for i in range(3)]]
    res = asyncio.run(cloud.place(asked, 60, "req-1"))
    # The edge decides on its own: what fits there is placed there.
    assert res[0]["placed"] and res[0]["site"] == "mec-0"
    for r in res[1:]:  # the rest is queued, booked nowhere, not spilled elsewhere
        assert not r["placed"] and r["escalation"]["state"] == "queued"
        assert r["reasons"][-1]["outcome"] == "queued"
        assert "unreachable" in r["reasons"][-1]["reason"]
    assert not any(k.startswith("ex") for k in _bookings(sites))
    summary = sites["mec-0"].summary()["autonomy"]
    assert summary == {"region_reachable": False, "queued_escalations": 1, "queued_pods": 3}
    # A client retry while still cut: the same answer, nothing queued twice.
    again = asyncio.run(cloud.place(asked, 60, "req-1"))
    assert [r["escalation"] for r in again[1:]] == [r["escalation"] for r in res[1:]]
    assert len(sites["mec-0"].queued) == 1
    # Reconciling while still cut changes nothing.
    assert asyncio.run(sites["mec-0"].reconcile()) == {"reconciled": 0, "queued": 1}
    link.cut = False
    assert asyncio.run(sites["mec-0"].reconcile()) == {"reconciled": 1, "queued": 0}
    books = _bookings(sites)
    assert all(books[f"ex{i}"] == 1 for i in range(3)) and books["esmall"] == 1
    assert max(books.values()) == 1  # no pod placed twice anywhere
    _no_device_double_booked(sites)
    # The client's retry now gets the region's answer, once.
    final = asyncio.run(cloud.place(asked, 60, "req-1"))
    assert final[0] == res[0]
    for r in final[1:]:
        assert r["placed"] and r["region"] == h.parent["mec-0"]
        assert r["escalation"]["state"] == "reconciled"
        assert r["reasons"][0]["outcome"] == "queued"
        assert r["devices"] and r["node"] is not None
    assert max(_bookings(sites).values()) == 1
    view = sites["mec-0"].escalations()
    assert view["region_reachable"] and not view["queued"]
    assert [p["pod_id"] for p in view["reconciled"][0]["placements"]] == ["ex0", "ex1", "ex2"]
    assert sites["mec-0"].escalations(limit=0)["reconciled"] == []  # none, not all ([-0:])


def test_a_lost_reply_is_replayed_under_the_same_id_and_books_once() -> None:
    h, cloud, sites, link = _service()
    _fill_edge(cloud, sites)
    link.lose_reply = True  # the region books the pods; the edge never hears back
    res = asyncio.run(cloud.place([_edge_pod("lost0"), _edge_pod("lost1")], 60, "req-2"))
    assert all(r["escalation"]["state"] == "queued" for r in res)
    region = sites[h.parent["mec-0"]]
    assert _bookings({"r": region})["elost0"] == 1  # it did book, before the reply was lost
    link.lose_reply = False
    asyncio.run(sites["mec-0"].reconcile())
    books = _bookings(sites)
    assert books["elost0"] == 1 and books["elost1"] == 1  # the replay hit the region's record
    _no_device_double_booked(sites)


def test_a_region_that_does_not_answer_in_time_counts_as_unreachable() -> None:
    _, cloud, sites, link = _service(EdgeAutonomy(escalation_timeout_s=0.05,
                                                  reconcile_every_s=3600))
    _fill_edge(cloud, sites)
    link.slow_s = 1.0
    r = asyncio.run(cloud.place([_edge_pod("slow")], 60, None))[0]
    assert not r["placed"] and r["escalation"]["state"] == "queued"
    assert "no answer in 0.05 s" in r["reasons"][-1]["reason"]


def test_the_queue_is_bounded_and_says_so() -> None:
    _, cloud, sites, link = _service(EdgeAutonomy(max_queued_pods=2, reconcile_every_s=3600))
    _fill_edge(cloud, sites)
    link.cut = True
    a = asyncio.run(cloud.place([_edge_pod("q0"), _edge_pod("q1")], 60, "a"))
    assert all(r["escalation"] for r in a)
    b = asyncio.run(cloud.place([_edge_pod("q2")], 60, "b"))[0]
    assert not b["placed"] and b["escalation"]["state"] == "dropped"
    assert "queue is full" in b["reasons"][-1]["reason"]
    assert "eq2" not in _bookings(sites)  # and not spilled over to another region
    assert sites["mec-0"].summary()["autonomy"]["queued_pods"] == 2


def test_the_background_reconciler_replays_when_the_region_is_back() -> None:
    _, cloud, sites, link = _service(EdgeAutonomy(reconcile_every_s=0.02))
    _fill_edge(cloud, sites)
    link.cut = True

    async def scenario() -> None:
        r = (await cloud.place([_edge_pod("bg")], 60, "bg"))[0]
        assert r["escalation"]["state"] == "queued"
        await asyncio.sleep(0.1)
        assert sites["mec-0"].queued  # still cut: still queued
        link.cut = False
        for _ in range(100):
            await asyncio.sleep(0.02)
            if not sites["mec-0"].queued:
                break
        assert not sites["mec-0"].queued

    asyncio.run(scenario())
    assert _bookings(sites)["ebg"] == 1


def test_an_answer_from_the_region_is_not_a_partition() -> None:
    """A region that refuses a request (bad input) answers; the edge passes it on."""
    _, cloud, sites, _ = _service()
    _fill_edge(cloud, sites)

    async def refuse(pods, ttl_s, rid, validate=False):
        raise ValidationError("pods.0.cpu_milli", "refused by the region")

    sites["mec-0"].parent = refuse
    with pytest.raises(ValidationError):
        asyncio.run(sites["mec-0"].place([_edge_pod("v")], 60, None))
    assert not sites["mec-0"].queued


def test_autonomy_settings_are_validated() -> None:
    from smartsched.serving.config import parse_service_config

    with pytest.raises(ValidationError) as e:
        parse_service_config({"edge_autonomy": {"escalation_timeout_s": 0}})
    assert "escalation_timeout_s" in e.value.field
    with pytest.raises(ValidationError) as e:
        parse_service_config({"edge_autonomy": {"max_queued_pods": -1}})
    assert "max_queued_pods" in e.value.field
    assert np.isclose(parse_service_config({}).edge_autonomy.escalation_timeout_s, 10.0)


def test_a_restarted_edge_replays_the_escalations_it_had_queued(tmp_path) -> None:
    """The queue is journaled: an edge replica restarted while cut off (its state rebuilt
    from its journal) still holds what it queued, replays it once the region is back, and
    a restart after that replays nothing again."""
    h = Hierarchy.from_spec(load_cluster("medium"))
    region = SiteTier(h, h.parent["mec-0"], "k8s-default")
    link = Link(region.place)
    quiet = EdgeAutonomy(reconcile_every_s=3600)

    def edge() -> SiteTier:
        return SiteTier(h, "mec-0", "k8s-default", parent=link, autonomy=quiet,
                        journal_dir=str(tmp_path))

    first = edge()
    link.cut = True
    big = [_edge_pod(f"g{i}", gpu=True) for i in range(40)]  # more GPUs than mec-0 has
    res = asyncio.run(first.place(big, 600, "r1"))
    queued = [r for r in res if r.get("escalation")]
    assert queued and all(r["escalation"]["state"] == "queued" for r in queued)
    first.placer.journal.close()  # the replica dies

    second = edge()
    assert list(second.queued) == list(first.queued)
    assert [p.id for p in second.queued[next(iter(second.queued))].pods] == \
        [r["pod_id"] for r in queued]
    link.cut = False
    assert asyncio.run(second.reconcile()) == {"reconciled": 1, "queued": 0}
    booked = Counter(b.pod.id for r in region.placer.reservations.values()
                     for b in r.bookings)
    assert set(booked) >= {r["pod_id"] for r in queued} and max(booked.values()) == 1
    second.placer.journal.close()

    third = edge()
    assert not third.queued and not third.placer.escalations
    third.placer.journal.close()
