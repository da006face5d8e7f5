"""Gang reservation and backfill in the service (issue 15, item 2): a gang that cannot
start holds the room that frees soonest, other pods backfill around it, it starts there
when due, and a hold nobody comes back for is dropped."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from smartsched.model.pod import Pod, PodClass
from smartsched.model.presets import GPU_NODE_TAINT, load_cluster
from smartsched.serving.site import SitePlacer, site_subspec

HOST = "kubernetes.io/hostname"


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _gpu_pod(pid: str, gpus: int, duration: float | None = None, **kw) -> Pod:
    return Pod(id=pid, cpu_milli=1000, memory_mib=1024, num_gpu=gpus, gpu_milli=1000,
               pod_class=kw.pop("pod_class", PodClass.AI_TRAIN), duration=duration,
               tolerations=(GPU_NODE_TAINT,), **kw)


def _gang(name: str, size: int = 2) -> list[Pod]:
    return [_gpu_pod(f"{name}-{i}", 8, 3600.0, gang_id=name, gang_size=size)
            for i in range(size)]


def _site(clock: Clock, holds: bool = True) -> SitePlacer:
    spec = site_subspec(load_cluster("medium"), ["region-a"])
    spec = replace(spec, nodes=tuple(replace(n, labels={**n.labels, HOST: n.name})
                                     for n in spec.nodes))
    return SitePlacer(spec, "composite-accelerators", clock=clock, sandbox_mode="off",
                      gang_reservations=holds)


def _fill_a100(site: SitePlacer) -> dict[str, str]:
    """One 1-GPU pod on each A100 node, ending after 600 s (node 0) .. 600 + 300 k s:
    no A100 node has 8 GPUs free. Returns node -> its reservation id."""
    a100 = [i for i, n in enumerate(site.spec.nodes) if n.gpu_model == "A100"]
    rids = {}
    for k, i in enumerate(a100):
        pod = _gpu_pod(f"small-{k}", 1, 600.0 + 300.0 * k,
                       node_selector=((HOST, site.spec.nodes[i].name),))
        r = site.place([pod], ttl_s=1e6)[0]
        assert r.placed and r.node == site.spec.nodes[i].name, r.reason
        site.confirm(r.reservation_id)
        rids[r.node] = r.reservation_id
    return rids


def test_a_gang_holds_the_room_that_frees_first_and_starts_there() -> None:
    clock = Clock()
    site = _site(clock)
    rids = _fill_a100(site)
    res = site.place(_gang("train"), ttl_s=120)
    assert not any(r.placed for r in res)
    room = res[0].extra["gang_room"]
    first_two = list(rids)[:2]  # the nodes whose pods end first (600 s, 900 s)
    assert sorted(room["nodes"]) == sorted(first_two)
    assert room["due_at"] == clock.t + 900.0 and room["held_until"] == room["due_at"] + 120
    assert "room held on 2 node(s)" in res[0].reason

    # Backfill: a pod that would still run when the gang is due keeps off the held
    # nodes; one that ends before may use them.
    pin = ((HOST, first_two[0]),)
    long = site.place([_gpu_pod("long", 1, 5000.0, node_selector=pin)], ttl_s=60)[0]
    assert not long.placed and "reserved for a waiting gang" in long.reason
    short = site.place([_gpu_pod("short", 1, 100.0, node_selector=pin)], ttl_s=60)[0]
    assert short.placed and short.node == first_two[0]
    site.release(short.reservation_id)

    # The pods there end (released), the gang comes back when due: it starts there.
    clock.t += 900.0
    for node in first_two:
        site.release(rids[node])
    again = site.place(_gang("train"), ttl_s=120)
    assert all(r.placed for r in again)
    assert sorted(r.node for r in again) == sorted(first_two)
    assert len(site.state.reservations) == 0 and not site._holds


def test_a_lower_priority_pod_does_not_take_held_room_in_the_service() -> None:
    """In the twin a pod ranking below the gang may use its held room (the gang evicts it
    when due); the service never lets a gang preempt, so such a pod took the room for good
    and the gang came back to find it gone (probe round 4)."""
    clock = Clock()
    site = _site(clock)
    rids = _fill_a100(site)
    lead = _gang("train")
    lead = [replace(p, priority=100) for p in lead]
    room = site.place(lead, ttl_s=120)[0].extra["gang_room"]
    for i, node in enumerate(room["nodes"]):
        site.release(rids[node])  # their pods leave early: the room is free now
        low = _gpu_pod(f"low-{i}", 1, None, priority=0, node_selector=((HOST, node),))
        got = site.place([low], ttl_s=60)[0]
        assert not got.placed and "reserved for a waiting gang" in got.reason
    clock.t = room["due_at"]
    again = site.place(lead, ttl_s=120)
    assert all(r.placed for r in again)
    assert sorted(r.node for r in again) == sorted(room["nodes"])


def test_a_hold_nobody_comes_back_for_is_dropped_and_holds_are_opt_in() -> None:
    clock = Clock()
    site = _site(clock)
    _fill_a100(site)
    room = site.place(_gang("gone"), ttl_s=60)[0].extra["gang_room"]
    assert len(site.state.reservations) == 1
    clock.t = room["held_until"] + 1
    site.expire()
    assert len(site.state.reservations) == 0 and not site._holds

    off = _site(Clock(), holds=False)
    _fill_a100(off)
    res = off.place(_gang("train"), ttl_s=60)
    assert not res[0].placed and "gang_room" not in res[0].extra
    assert len(off.state.reservations) == 0


def test_a_booked_pod_is_expected_to_leave_after_its_duration() -> None:
    clock = Clock()
    site = _site(clock)
    r = site.place([_gpu_pod("d", 1, 500.0), _gpu_pod("n", 1)], ttl_s=60)
    b = site.state.bound
    live = np.flatnonzero(b.used)
    until = sorted(b.until[live].tolist())
    assert all(x.placed for x in r) and until[0] == site.state.now + 500.0
    assert np.isinf(until[1])


def test_the_answer_carries_the_hold_through_the_tiers() -> None:
    import asyncio

    from smartsched.serving.hierarchy import Hierarchy
    from smartsched.serving.schemas import Placement
    from smartsched.serving.tiers import CloudTier, SiteTier

    h = Hierarchy.from_spec(load_cluster("medium"))
    sites = {r: SiteTier(h, r, "composite-accelerators", gang_reservations=True)
             for r in h.regions}

    async def free():
        return {r: sites[r].free() for r in h.regions}

    def dropper(tier: SiteTier):
        async def drop(gang: str) -> bool:
            return tier.drop_gang_hold(gang)
        return drop

    cloud = CloudTier(h, {r: t.place for r, t in sites.items()}, {}, free,
                      drop_holds={r: dropper(t) for r, t in sites.items()})
    # Every A100 of both regions busy for an hour: a gang of two 8-GPU members waits.
    busy = {}
    for r, tier in sites.items():
        pods = [_gpu_pod(f"{r}-busy-{k}", 7, 3600.0, gpu_models=("A100",)) for k in range(8)]
        res = asyncio.run(tier.place(pods, 1e6, None))
        assert all(x["placed"] for x in res)
        busy[r] = res
    out = asyncio.run(cloud.place(_gang("big"), 60, None))
    assert not out[0]["placed"]
    room = Placement.model_validate(out[0]).gang_room
    assert room is not None and len(room.nodes) == 2 and room.due_at > room.held_until - 61
    # Both regions were tried and each made a hold: only the one the answer names stays.
    held = [r for r, t in sites.items() if len(t.placer.state.reservations)]
    assert len(held) == 1
    # Room frees in the other region: the gang is placed there and lets go of its hold.
    other = next(r for r in sites if r not in held)
    for x in busy[other][:4]:
        sites[other].release(x["reservation_id"].split("~", 1)[-1])
    again = asyncio.run(cloud.place(_gang("big"), 60, None))
    assert all(x["placed"] for x in again) and {x["region"] for x in again} == {other}
    assert not any(len(t.placer.state.reservations) for t in sites.values())


def _held(site: SitePlacer) -> dict[str, list[str]]:
    """Gang -> the names of the nodes its hold covers in the site's state."""
    names = site.state.names
    return {g: sorted(names[n] for n in r.nodes)
            for g, r in site.state.reservations.by_gang.items()}


def test_a_node_update_keeps_the_room_held_for_a_gang() -> None:
    """A node update rebuilds the site's state: the room an answer promised (gang_room)
    stays held, on the same nodes by name, and other pods still keep off it. It used to
    be dropped while ``_holds`` still listed the gang (a broken promise)."""
    clock = Clock()
    site = _site(clock)
    _fill_a100(site)
    room = site.place(_gang("train"), ttl_s=120)[0].extra["gang_room"]
    assert _held(site) == {"train": sorted(room["nodes"])}
    held_node = room["nodes"][0]
    other = next(n.name for n in site.spec.nodes if n.name not in room["nodes"])
    # A new node, a change to a node the hold does not cover, a change to a held node.
    new = {"cpu_milli": 4000, "memory_mib": 8192, "zone": site.spec.zones[0].name}
    for updates in ([(0, "fresh-node", new)],
                    [(0, other, {"labels": {HOST: other, "team": "x"}})],
                    [(0, held_node, {"labels": {HOST: held_node, "rack": "r1"}})]):
        for dry_run in (True, False):
            assert site.apply_node_updates(updates, dry_run=dry_run)["changed"] == 1
        assert _held(site) == {"train": sorted(room["nodes"])}
        assert set(site._holds) == {"train"}
    # The held room still keeps off a pod that would run past the gang's due time.
    pin = ((HOST, held_node),)
    long = site.place([_gpu_pod("long", 1, 5000.0, node_selector=pin)], ttl_s=60)[0]
    assert not long.placed and "reserved for a waiting gang" in long.reason
    # And the hold still lapses as promised.
    clock.t = room["held_until"] + 1
    site.expire()
    assert _held(site) == {} and not site._holds


def test_holds_are_soft_state_across_a_restart_but_not_a_node_update(tmp_path) -> None:
    """Holds are not journaled (soft state): a restart starts with none, in the state and
    in ``_holds`` alike, and replaying the journal's node updates brings none back; a node
    update in the running site keeps them."""
    from smartsched.serving.journal import Journal

    clock = Clock()
    spec = _site(clock).spec
    path = tmp_path / "region-a.jsonl"
    site = SitePlacer(spec, "composite-accelerators", clock=clock, sandbox_mode="off",
                      gang_reservations=True, journal=Journal(path))
    _fill_a100(site)
    room = site.place(_gang("train"), ttl_s=120)[0].extra["gang_room"]
    node = room["nodes"][0]
    site.apply_node_updates([(0, node, {"labels": {HOST: node, "rack": "r1"}})])
    assert _held(site) == {"train": sorted(room["nodes"])} and set(site._holds) == {"train"}
    site.journal.close()

    again = SitePlacer(spec, "composite-accelerators", clock=clock, sandbox_mode="off",
                       gang_reservations=True, journal=Journal(path))
    assert _held(again) == {} and not again._holds
    assert again.spec.nodes == site.spec.nodes  # the node update itself was journaled
    assert len(again.reservations) == len(site.reservations)
    again.journal.close()


def test_a_request_the_sandbox_refuses_gives_back_the_gangs_hold_whole() -> None:
    """The gang's hold was let go of as it was placed, then the sandbox refused the request
    and the state came back with the held room but the site's list of holds did not: the
    room stayed held for ever (nothing left to expire it)."""
    from smartsched.scheduling.sandbox import Verdict

    clock = Clock()
    base = _site(clock)
    site = SitePlacer(base.spec, "composite-accelerators", clock=clock, sandbox_mode="all",
                      gang_reservations=True)
    assert site.sandbox is not None
    site.sandbox.validate = lambda *a, **k: Verdict(True, "placement")  # type: ignore
    rids = _fill_a100(site)
    room = site.place(_gang("train"), ttl_s=120)[0].extra["gang_room"]
    for node in room["nodes"]:  # the held nodes free early: the gang fits now
        site.release(rids[node])
    site.sandbox.validate = lambda *a, **k: Verdict(False, "gang", hard=("no",))  # type: ignore
    res = site.place(_gang("train"), ttl_s=120)
    assert not any(r.placed for r in res) and "refused by sandbox" in res[0].reason
    assert "train" in site._holds and len(site.state.reservations) == 1
    clock.t = room["held_until"] + 1
    site.expire()
    assert not site._holds and len(site.state.reservations) == 0
