"""``PUT /v1/nodes`` spanning two sites is all-or-nothing, also when a placement reaches the
second site while the first applies.

Driven in process: the real route and ``Ingress``/``SiteDeployment`` classes (their Serve
wrappers' ``func_or_class``), with handles that call the site objects on this event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from smartsched.model.pod import Pod
from smartsched.serving.schemas import NodesRequest

SITES = ("mec-0", "mec-1")
Y = "mec-1-n-00000"  # the mec-1 node the update shrinks (the only one left schedulable)


class _Method:
    def __init__(self, fn: Callable[..., Any], after: Callable[[], Awaitable[None]]) -> None:
        self.fn, self.after = fn, after

    async def remote(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0)  # a real handle call always awaits
        out = self.fn(*args, **kwargs)
        if inspect.isawaitable(out):
            out = await out
        await self.after()
        return out


class Handle:
    """A deployment handle onto a site object in this process: ``h.m.remote(...)`` awaits
    ``site.m(...)``, then ``after()`` (where a test slips something in)."""

    def __init__(self, site: Any) -> None:
        self.site = site
        self.after: Callable[[], Awaitable[None]] = _nothing

    def __getattr__(self, name: str) -> _Method:
        return _Method(getattr(self.site, name), lambda: self.after())


async def _nothing() -> None:
    return None


def _args(tmp_path: Path) -> dict[str, Any]:
    return {"cluster": "medium", "auth": {"disabled": True},
            "journal_dir": str(tmp_path / "journal")}


def _service(tmp_path: Path) -> tuple[Any, dict[str, Any], dict[str, Handle]]:
    from smartsched.serving.app import Ingress, SiteDeployment

    deployments = {s: SiteDeployment.func_or_class(_args(tmp_path), s) for s in SITES}
    handles = {s: Handle(d) for s, d in deployments.items()}
    plain = Ingress.func_or_class.__mro__[1]  # the class under Serve's ASGI wrapper
    ing = plain.__new__(plain)
    plain.__init__(ing, _args(tmp_path), {}, dict(handles))
    return ing, deployments, handles


def _request() -> Any:
    return SimpleNamespace(state=SimpleNamespace(), method="PUT",
                           url=SimpleNamespace(path="/v1/nodes"), headers={})


def _view(site: Any) -> dict[str, Any]:
    """What a node update must leave as it was when it is refused: node rows, reservations
    (where each pod sits), what is allocated."""
    p = site.tier.placer
    return {"nodes": sorted(repr(n) for n in p.spec.nodes),
            "registered": sorted(p.registered),
            "reservations": {rid: sorted((b.pod.id, p.state.names[b.node], b.devices)
                                         for b in r.bookings)
                             for rid, r in p.reservations.items()},
            "allocated": p.state.allocated.tolist(), "names": list(p.state.names)}


def _replayed(tmp_path: Path, site: str) -> dict[str, Any]:
    """The view of ``site`` rebuilt from its journal (a restarted replica)."""
    from smartsched.serving.app import SiteDeployment

    journal = Path(_args(tmp_path)["journal_dir"]) / f"{site}.jsonl"
    copy = tmp_path / "replay" / site
    copy.mkdir(parents=True, exist_ok=True)
    (copy / f"{site}.jsonl").write_bytes(journal.read_bytes())
    args = {**_args(tmp_path), "journal_dir": str(copy)}
    d = SiteDeployment.func_or_class(args, site)
    try:
        return _view(d)
    finally:
        d.tier.placer.journal.close()


async def _answer(e: Exception) -> tuple[int, dict[str, Any]]:
    from smartsched.serving.app import app_api

    for cls in type(e).__mro__:
        if cls in app_api.exception_handlers:
            resp = await app_api.exception_handlers[cls](_request(), e)
            return resp.status_code, json.loads(resp.body)
    raise e


async def _put(ing: Any, nodes: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    from smartsched.serving.app import put_nodes

    try:
        return 200, await put_nodes(NodesRequest(nodes=nodes), _request(), ing)
    except Exception as e:  # answered as the service's error handlers answer it
        return await _answer(e)


def _setup(deployments: dict[str, Any]) -> None:
    """mec-1: every node but Y cordoned, so a pod placed there lands on Y."""
    placer = deployments["mec-1"].tier.placer
    placer.apply_node_updates([(i, n.name, {"unschedulable": True})
                               for i, n in enumerate(placer.spec.nodes) if n.name != Y])


UPDATE = [{"name": "fresh-0", "site": "mec-0", "cpu_milli": 8000, "memory_mib": 8192},
          {"name": "mec-0-n-00001", "site": "mec-0", "labels": {"pool": "blue"}},
          {"name": Y, "site": "mec-1", "cpu_milli": 1000}]
BIG = Pod(id="big", cpu_milli=8000, memory_mib=1024)


def _applied(deployments: dict[str, Any]) -> dict[str, bool]:
    p0, p1 = (deployments[s].tier.placer for s in SITES)
    return {"mec-0": "fresh-0" in p0.state.names and p0.spec.nodes[
                p0.state.node_index("mec-0-n-00001")].labels.get("pool") == "blue",
            "mec-1": int(p1.state.capacity[p1.state.node_index(Y), 0]) == 1000}


@pytest.fixture(autouse=True)
def _no_current_ingress() -> Any:
    from smartsched.serving import replica

    yield
    replica._CURRENT.clear()


def test_a_placement_between_two_sites_applies_never_half_applies_an_update(
        tmp_path: Path) -> None:
    """Before: mec-0 applied (and journaled) its part, then a placement reached mec-1 and
    took the room the update shrinks, and mec-1's part failed with 409: half-applied, the
    client told it failed. Now either both sites apply it or neither keeps it."""

    async def run() -> None:
        ing, deployments, handles = _service(tmp_path)
        _setup(deployments)
        before = {s: _view(deployments[s]) for s in SITES}
        placed: list[asyncio.Task] = []

        async def inject() -> None:  # once mec-0 holds the update: a placement at mec-1
            if placed or not _applied(deployments)["mec-0"]:
                return
            placed.append(asyncio.ensure_future(
                handles["mec-1"].place.remote([BIG], 600.0, "late")))
            for _ in range(20):
                await asyncio.sleep(0)

        handles["mec-0"].after = inject
        status, body = await _put(ing, UPDATE)
        assert placed, "the placement was not slipped in"
        late = (await asyncio.wait_for(placed[0], 5))[0]
        applied = _applied(deployments)
        if status == 200:  # applied at both; the placement came after (Y is too small now)
            assert applied == {"mec-0": True, "mec-1": True}
            assert not late["placed"]
        else:  # refused: a clear 409 naming the row, and neither site keeps anything
            assert status == 409 and body["detail"][0]["loc"] == ["nodes", "2"], body
            assert applied == {"mec-0": False, "mec-1": False}, (applied, body)
            assert _view(deployments["mec-0"]) == before["mec-0"]
            assert "fresh-0" not in ing.node_site
        for s in SITES:  # the journal replays to what the site holds
            assert _replayed(tmp_path, s) == _view(deployments[s])

    asyncio.run(run())


def test_a_conflict_at_one_site_leaves_every_site_as_it_was_and_a_retry_succeeds(
        tmp_path: Path) -> None:
    """A live reservation on Y: a clear 409 naming Y's row, both sites (and their journals)
    exactly as before, the new name not claimed, no site held; released, the same update
    applies at both."""

    async def run() -> None:
        ing, deployments, handles = _service(tmp_path)
        _setup(deployments)
        (r,) = await handles["mec-1"].place.remote([BIG], 600.0, "blocker")
        assert r["placed"] and r["node"] == Y
        before = {s: _view(deployments[s]) for s in SITES}
        status, body = await _put(ing, UPDATE)
        assert status == 409, body
        assert body["detail"][0]["loc"] == ["nodes", "2"]
        assert "release it first" in body["detail"][0]["msg"]
        for s in SITES:
            assert _view(deployments[s]) == before[s]
            assert _replayed(tmp_path, s) == before[s]
        assert "fresh-0" not in ing.node_site
        # Nothing is held: both sites place at once.
        for s in SITES:
            got = await asyncio.wait_for(handles[s].place.remote(
                [Pod(id=f"small-{s}", cpu_milli=100, memory_mib=64)], 60.0, None), 2)
            assert got[0]["placed"]
            await handles[s].release.remote(got[0]["reservation_id"].split("~", 1)[1])
        await handles["mec-1"].release.remote(r["reservation_id"].split("~", 1)[1])
        status, body = await _put(ing, UPDATE)
        assert status == 200, body
        assert _applied(deployments) == {"mec-0": True, "mec-1": True}
        assert ing.node_site["fresh-0"] == "mec-0"
        for s in SITES:
            assert _replayed(tmp_path, s) == _view(deployments[s])

    asyncio.run(run())


def test_two_updates_spanning_the_same_sites_at_once_both_apply(tmp_path: Path) -> None:
    """Each holds the sites it prepared: two at once (in opposite orders) must not wait on
    each other's held sites until the holds lapse."""

    async def run() -> None:
        ing, deployments, _ = _service(tmp_path)
        one = [{"name": "mec-0-n-00002", "site": "mec-0", "labels": {"a": "1"}},
               {"name": "mec-1-n-00002", "site": "mec-1", "labels": {"a": "1"}}]
        two = [{"name": "mec-1-n-00003", "site": "mec-1", "labels": {"b": "2"}},
               {"name": "mec-0-n-00003", "site": "mec-0", "labels": {"b": "2"}}]
        got = await asyncio.wait_for(asyncio.gather(_put(ing, one), _put(ing, two)), 5)
        assert [status for status, _ in got] == [200, 200], got
        for s in SITES:
            p = deployments[s].tier.placer
            labels = {n.name: n.labels for n in p.spec.nodes}
            assert labels[f"{s}-n-00002"]["a"] == "1" and labels[f"{s}-n-00003"]["b"] == "2"

    asyncio.run(run())


def test_a_held_site_lets_placements_through_once_its_update_ends_or_lapses() -> None:
    """The site-level protocol: prepared, placements wait; aborted, they go on at once; a
    refused prepare holds nothing; a hold whose ingress is gone lapses, and its late
    commit is checked again."""
    from smartsched.model.presets import load_cluster
    from smartsched.serving.hierarchy import Hierarchy
    from smartsched.serving.site import NodeUpdateConflict
    from smartsched.serving.tiers import SiteTier

    h = Hierarchy.from_spec(load_cluster("medium"))

    async def run() -> None:
        tier = SiteTier(h, "mec-0", "k8s-default")
        node = tier.placer.spec.nodes[0].name
        label = [(0, node, {"labels": {"x": "y"}})]
        pod = Pod(id="p", cpu_milli=100, memory_mib=64)
        await tier.prepare_node_updates("t1", label, {})
        waiting = asyncio.ensure_future(tier.place([pod], 60.0, None))
        single = asyncio.ensure_future(tier.apply_node_updates(label, {}))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not waiting.done() and not single.done()
        assert tier.abort_node_updates("t1") and not tier.abort_node_updates("t1")
        (r,) = await asyncio.wait_for(waiting, 2)
        await asyncio.wait_for(single, 2)
        assert r["placed"]
        # Refused: nothing held, nothing changed.
        big = [(0, r["node"], {"cpu_milli": 50})]
        with pytest.raises(NodeUpdateConflict):
            await tier.prepare_node_updates("t2", big, {})
        assert tier._node_hold is None
        # Lapsed: placements go on; the late commit is checked against what they took.
        tier.placer.release(r["reservation_id"].split("~", 1)[1])
        await tier.apply_node_updates([(i, n.name, {"unschedulable": True}) for i, n in
                                       enumerate(tier.placer.spec.nodes) if n.name != node], {})
        shrink = [(0, node, {"cpu_milli": 150})]
        await tier.prepare_node_updates("t3", shrink, {}, hold_s=0.05)
        (r2,) = await asyncio.wait_for(
            tier.place([Pod(id="q", cpu_milli=8000, memory_mib=64)], 60.0, None), 2)
        assert r2["placed"] and r2["node"] == node and tier._node_hold is None
        with pytest.raises(NodeUpdateConflict):
            await tier.commit_node_updates("t3", shrink, {})

    asyncio.run(run())


def _fake_clocks(deployments: dict[str, Any]) -> dict[str, float]:
    """Each site's hold clock, moved by the test."""
    now = {s: 0.0 for s in SITES}
    for s in SITES:
        deployments[s].tier.hold_clock = lambda s=s: now[s]
    return now


def test_a_hold_lost_before_the_commits_applies_nothing_and_a_retry_succeeds(
        tmp_path: Path) -> None:
    """mec-0 is prepared, then its hold lapses (another site was slow to check its part)
    and a placement comes, which drops the hold and may take the room the check counted
    on. Before, mec-1 committed and mec-0 was checked again: an update half-applied
    whenever that check failed. Now the lost hold is found before any commit: a 503 to
    retry, no site changed (journals included); the retry applies at both."""

    async def run() -> None:
        ing, deployments, handles = _service(tmp_path)
        _setup(deployments)
        now = _fake_clocks(deployments)
        before = _view(deployments["mec-1"])
        placed: list[Any] = []

        async def lapse_then_place() -> None:
            tier = deployments["mec-0"].tier
            if placed or tier._node_hold is None:
                return
            now["mec-0"] += 60.0  # past the hold
            placed.append(await tier.place([Pod(id="late", cpu_milli=100, memory_mib=64)],
                                           600.0, None))

        handles["mec-0"].after = lapse_then_place
        status, body = await _put(ing, UPDATE)
        assert placed and placed[0][0]["placed"], "the placement was not slipped in"
        assert status == 503, body
        assert "no site applied it" in body["detail"][0]["msg"]
        assert _applied(deployments) == {"mec-0": False, "mec-1": False}
        assert _view(deployments["mec-1"]) == before
        assert "fresh-0" not in ing.node_site
        for s in SITES:
            assert deployments[s].tier._node_hold is None  # nothing left held
            assert _replayed(tmp_path, s) == _view(deployments[s])
        handles["mec-0"].after = _nothing
        status, body = await _put(ing, UPDATE)
        assert status == 200, body
        assert _applied(deployments) == {"mec-0": True, "mec-1": True}

    asyncio.run(run())


def test_a_hold_that_lapsed_with_nothing_after_it_is_renewed_and_holds_until_the_commit(
        tmp_path: Path) -> None:
    """A lapsed hold nothing came after is still true: confirmed, it is renewed, so a
    placement arriving between the confirmation and the commit waits for the commit."""

    async def run() -> None:
        ing, deployments, handles = _service(tmp_path)
        now = _fake_clocks(deployments)
        site = deployments["mec-0"]
        confirm = site.confirm_node_hold
        waiting: list[asyncio.Future] = []

        async def lapse() -> None:
            if site.tier._node_hold is not None and not waiting:
                now["mec-0"] += 60.0

        async def confirm_then_place(token: str) -> bool:
            ok = await confirm(token)
            waiting.append(asyncio.ensure_future(site.tier.place(
                [Pod(id="between", cpu_milli=100, memory_mib=64)], 600.0, None)))
            for _ in range(20):
                await asyncio.sleep(0)
            assert not waiting[0].done(), "the renewed hold let a placement through"
            return ok

        handles["mec-0"].after = lapse
        site.confirm_node_hold = confirm_then_place
        status, body = await _put(ing, UPDATE)
        assert status == 200, body
        assert _applied(deployments) == {"mec-0": True, "mec-1": True}
        (r,) = await asyncio.wait_for(waiting[0], 2)  # after the commit: placed
        assert r["placed"]

    asyncio.run(run())


def test_a_site_failing_its_commit_after_another_applied_says_so(tmp_path: Path) -> None:
    """A site that breaks between the phases (its replica dies, its disk fails): the
    update may be half-applied, and the answer says which site applied and which may not
    have, rather than a refusal the client would read as nothing applied. The failure's
    own message (replica ids, paths) is not in it; the failed site keeps its new names."""
    from ray.serve.exceptions import ReplicaUnavailableError

    async def run() -> None:
        ing, deployments, _ = _service(tmp_path)

        async def broken(*_a: Any, **_k: Any) -> Any:
            raise ReplicaUnavailableError("rep-xyz-1234")

        deployments["mec-0"].commit_node_updates = broken
        status, body = await _put(ing, UPDATE)
        assert status == 409, body
        msg = body["detail"][0]["msg"]
        assert "site mec-0 failed or restarted" in msg
        assert "site(s) mec-1 applied their part, site(s) mec-0 may not have" in msg
        assert "rep-xyz" not in json.dumps(body)
        assert _applied(deployments)["mec-1"] is True
        assert ing.node_site.get("fresh-0") == "mec-0"  # may be there: not claimable elsewhere
        assert deployments["mec-0"].tier._node_hold is None  # let go
        # What the answer asks: the same update sent again once the site is back applies
        # where it had not and changes nothing where it had (one copy of every node).
        del deployments["mec-0"].commit_node_updates  # the class's own again
        p1 = deployments["mec-1"].tier.placer
        before = (list(p1.state.names), p1.state.capacity.copy())
        status, body = await _put(ing, UPDATE)
        assert status == 200, body
        assert _applied(deployments) == {"mec-0": True, "mec-1": True}
        assert list(p1.state.names) == before[0]
        assert (p1.state.capacity == before[1]).all()
        names = deployments["mec-0"].tier.placer.state.names
        assert list(names).count("fresh-0") == 1

    asyncio.run(run())


def test_a_one_site_update_whose_answer_is_lost_keeps_its_new_names(tmp_path: Path) -> None:
    """The site applied the update, then its answer was lost (the replica died, or the
    request was cancelled): the new name was forgotten, so another site could register it
    and the node be booked at two (review of probe round 4). A refusal still forgets it."""
    from ray.serve.exceptions import ReplicaUnavailableError

    from smartsched.model.errors import ValidationError

    async def run() -> None:
        ing, deployments, _ = _service(tmp_path)
        site = deployments["mec-0"]
        real = site.apply_node_updates

        async def applied_then_lost(*a: Any, **k: Any) -> Any:
            out = real(*a, **k)
            if inspect.isawaitable(out):
                await out
            raise ReplicaUnavailableError("rep-xyz-1234")

        site.apply_node_updates = applied_then_lost
        node = {"name": "lost-0", "site": "mec-0", "cpu_milli": 8000, "memory_mib": 8192}
        status, _ = await _put(ing, [node])
        assert status == 503
        assert ing.node_site.get("lost-0") == "mec-0"
        status, body = await _put(ing, [{**node, "site": "mec-1"}])
        assert status == 422 and "belongs to mec-0" in body["detail"][0]["msg"]

        async def refused(*_a: Any, **_k: Any) -> Any:
            raise ValidationError("nodes.0.cpu_milli", "refused")

        site.apply_node_updates = refused
        status, _ = await _put(ing, [{**node, "name": "refused-0"}])
        assert status == 422 and "refused-0" not in ing.node_site

    asyncio.run(run())
