"""Sequences across a restart: idempotent retries of requests answered before the service
(its sites and its cloud tier) restarted from the journal."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from smartsched.model.pod import Pod
from smartsched.model.presets import load_cluster
from smartsched.serving.hierarchy import Hierarchy
from smartsched.serving.journal import Journal
from smartsched.serving.site import SitePlacer, site_subspec
from smartsched.serving.tiers import CloudTier, SiteTier


def _pod(name: str, cpu: int = 1000, **kw) -> Pod:
    return Pod(id=name, cpu_milli=cpu, memory_mib=1024, **kw)


@pytest.fixture(scope="module")
def medium() -> Hierarchy:
    return Hierarchy.from_spec(load_cluster("medium"))


def _booked(sites: dict[str, SiteTier]) -> list[str]:
    return sorted(b.pod.id for s in sites.values() for r in s.placer.reservations.values()
                  for b in r.bookings)


def test_a_batch_retried_after_a_site_restart_is_answered_whole(medium: Hierarchy,
                                                                  tmp_path: Path) -> None:
    """A batch's pods are one reservation each; the journal recovers those still held. A
    retry after the restart gets every pod answered, in order: the held ones with their
    bookings (not booked twice), the others (unplaced the first time, or released since)
    placed again -- it used to get only the last reservation's pod back."""
    spec = site_subspec(medium.spec, ["mec-0"])
    path = tmp_path / "mec-0.jsonl"
    a = SitePlacer(spec, "k8s-default", journal=Journal(path))
    big = int(a.state.capacity[:, 0].max()) + 1
    pods = [_pod("a"), _pod("b"), _pod("c"), _pod("huge", cpu=big)]
    first = a.place(pods, 600, request_id="batch-1")
    assert [r.placed for r in first] == [True, True, True, False]
    a.confirm(first[0].reservation_id)
    a.release(first[2].reservation_id)
    a.journal.close()  # the replica's process ends

    b = SitePlacer(spec, "k8s-default", journal=Journal(path))
    again = b.place(pods, 600, request_id="batch-1")
    assert [r.pod_id for r in again] == ["a", "b", "c", "huge"]
    assert [r.reservation_id for r in again[:2]] == [r.reservation_id for r in first[:2]]
    assert again[2].placed and again[2].reservation_id != first[2].reservation_id
    assert not again[3].placed
    assert sorted(b.pod.id for r in b.reservations.values() for b in r.bookings) == [
        "a", "b", "c"]
    assert b.place(pods, 600, request_id="batch-1") == again  # and stays the answer


def _hierarchy_sites(h: Hierarchy, root: Path) -> dict[str, SiteTier]:
    sites: dict[str, SiteTier] = {}
    for r in h.regions:
        sites[r] = SiteTier(h, r, "k8s-default", journal_dir=str(root))
    for e in h.edges:
        sites[e] = SiteTier(h, e, "k8s-default", parent=sites[h.parent[e]].place,
                            journal_dir=str(root))
    return sites


def _stop(sites: dict[str, SiteTier], cloud: CloudTier | None = None) -> None:
    for s in sites.values():
        assert s.placer.journal is not None
        s.placer.journal.close()
    if cloud is not None and cloud.journal is not None:
        cloud.journal.close()


def _cloud(h: Hierarchy, sites: dict[str, SiteTier], freer: str,
           journal: Journal | None) -> CloudTier:
    async def free() -> dict[str, dict[str, float]]:  # ``freer`` ranks first
        return {r: {"cpu": 1.0 if r == freer else 0.1, "memory": 1.0, "gpu": 1.0}
                for r in h.regions}

    return CloudTier(h, {r: sites[r].place for r in h.regions},
                     {e: sites[e].place for e in h.edges}, free,
                     **({"journal": journal} if journal is not None else {}))


def test_a_cloud_retry_after_a_restart_never_books_twice(medium: Hierarchy,
                                                          tmp_path: Path) -> None:
    """The cloud tier's answers are journaled: a retry after the service restarted is
    answered as before, even when the ranking now puts another region first (it used to
    be placed again there: booked in both regions; and a batch whose pods the site
    recovered in part was a 500)."""
    journal = tmp_path / "cloud.answers.jsonl"
    sites = _hierarchy_sites(medium, tmp_path)
    cloud = _cloud(medium, sites, "region-a", Journal(journal))
    batch = [_pod("x"), _pod("y"), _pod("z", cpu=10**6)]
    first = asyncio.run(cloud.place(batch, 600, "*:k1", shown_id="k1"))
    single = asyncio.run(cloud.place([_pod("s")], 600, "*:k2", shown_id="k2"))
    assert {r["region"] for r in first if r["placed"]} == {"region-a"}
    assert [r["placed"] for r in first] == [True, True, False]
    _stop(sites, cloud)

    sites = _hierarchy_sites(medium, tmp_path)
    cloud = _cloud(medium, sites, "region-b", Journal(journal))  # region-b ranks first now
    assert asyncio.run(cloud.place(batch, 600, "*:k1", shown_id="k1")) == first
    assert asyncio.run(cloud.place([_pod("s")], 600, "*:k2", shown_id="k2")) == single
    assert _booked(sites) == ["s", "x", "y"]
    # The key still binds its body after the restart.
    from smartsched.serving.tiers import IdempotencyConflict

    with pytest.raises(IdempotencyConflict):
        asyncio.run(cloud.place([_pod("s", cpu=2000)], 600, "*:k2", shown_id="k2"))
    _stop(sites, cloud)


def test_a_cloud_that_forgot_the_answer_still_answers_a_partly_recovered_batch(
        medium: Hierarchy, tmp_path: Path) -> None:
    """Without the cloud's record (a journal-less tier, or a key past its window), the
    retry reaches the site, which recovered only the reservations still held: every pod
    is answered (it was a KeyError, a 500)."""
    sites = _hierarchy_sites(medium, tmp_path)
    cloud = _cloud(medium, sites, "region-a", None)
    batch = [_pod("x"), _pod("y"), _pod("z", cpu=10**6)]
    first = asyncio.run(cloud.place(batch, 600, "*:k1"))
    _stop(sites)

    sites = _hierarchy_sites(medium, tmp_path)
    cloud = _cloud(medium, sites, "region-a", None)
    again = asyncio.run(cloud.place(batch, 600, "*:k1"))
    assert [r["reservation_id"] for r in again[:2]] == [r["reservation_id"]
                                                        for r in first[:2]]
    assert not again[2]["placed"]
    assert _booked(sites) == ["x", "y"]
    _stop(sites)


def test_the_cloud_answers_journal_is_rewritten_as_the_answers_it_keeps(
        medium: Hierarchy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal holds the kept answers and at most as many events again: it is
    rewritten when it doubles, not on every request once the window is full."""
    from smartsched.serving import tiers

    monkeypatch.setattr(tiers, "IDEMPOTENCY_KEEP", 3)
    sites = _hierarchy_sites(medium, tmp_path)
    path = tmp_path / "cloud.answers.jsonl"
    cloud = _cloud(medium, sites, "region-a", Journal(path, compact_after=1))
    answers = [asyncio.run(cloud.place([_pod(f"p{i}")], 600, f"*:k{i}")) for i in range(8)]
    # Rewritten to the 3 kept answers, then the later requests' lines (a "sent" before
    # each answer, since 2026-12-07): at most twice the kept state and one request's two.
    ops = [json.loads(line)["op"] for line in path.open()]
    assert ops[:3] == ["answer"] * 3 and len(ops) <= 2 * 3 + 2, ops
    _stop(sites, cloud)
    sites = _hierarchy_sites(medium, tmp_path)
    cloud = _cloud(medium, sites, "region-b", Journal(path))
    for i in (5, 6, 7):
        assert asyncio.run(cloud.place([_pod(f"p{i}")], 600, f"*:k{i}")) == answers[i]
    assert len(_booked(sites)) == 8
    _stop(sites, cloud)
