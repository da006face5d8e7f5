"""Group commit of a site's journal: a request's events are fsynced once, before its
answer, and whatever a request applied is on disk even when it ends by an error."""

from __future__ import annotations

import json

import pytest

from smartsched.serving.journal import Journal
from smartsched.serving.site import SitePlacer
from tests.builders import cluster, node, pod


def _site(tmp_path, **journal_kw) -> SitePlacer:
    spec = cluster(*(node(f"n{i}", cpu=16000, mem=65536) for i in range(8)))
    return SitePlacer(spec, "k8s-default", journal=Journal(tmp_path / "s.jsonl", **journal_kw))


def _restart(site: SitePlacer, tmp_path) -> SitePlacer:
    site.journal.close()
    return SitePlacer(site.spec, "k8s-default", journal=Journal(tmp_path / "s.jsonl"))


def _lines(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]


def test_a_batch_is_one_fsync_and_every_reservation_survives_a_restart(tmp_path) -> None:
    site = _site(tmp_path)
    out = site.place([pod(f"p{i}", cpu=500) for i in range(60)], ttl_s=600)
    assert all(r.placed for r in out) and len({r.reservation_id for r in out}) == 60
    assert site.journal.fsyncs == 1  # 60 reserve events, one fsync
    site.place([pod("one", cpu=500)], ttl_s=600)
    assert site.journal.fsyncs == 2
    again = _restart(site, tmp_path)
    assert set(again.reservations) == set(site.reservations)
    assert again.state.allocated[:, 0].sum() == 61 * 500


def test_nested_groups_write_when_the_outermost_ends(tmp_path) -> None:
    j = Journal(tmp_path / "s.jsonl")
    with j.group():
        j.append({"op": "a"})
        with j.group():
            j.append({"op": "b"})
        assert (tmp_path / "s.jsonl").read_text() == ""  # nothing written yet
        j.append({"op": "c"})
    assert [e["op"] for e in _lines(tmp_path)] == ["a", "b", "c"]
    assert j.fsyncs == 1 and j.events == 3
    j.append({"op": "d"})  # outside a group: at once
    assert j.fsyncs == 2 and len(_lines(tmp_path)) == 4


def test_what_a_failing_request_applied_is_journaled(tmp_path, monkeypatch) -> None:
    """A request that raises half-way keeps (in memory) what it booked before the error;
    the journal must hold exactly that, or a restart would disagree with the state."""
    site = _site(tmp_path)
    real = site._place_one
    calls = {"n": 0}

    def flaky(p, alone=True):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("boom")
        return real(p, alone)

    monkeypatch.setattr(site, "_place_one", flaky)
    with pytest.raises(RuntimeError, match="boom"):
        site.place([pod(f"p{i}", cpu=500) for i in range(6)], ttl_s=600)
    assert len(site.reservations) == 3
    assert site.journal.fsyncs == 1
    again = _restart(site, tmp_path)
    assert set(again.reservations) == set(site.reservations)


def test_compaction_inside_a_group_keeps_each_reservation_once(tmp_path) -> None:
    site = _site(tmp_path, compact_after=5)
    first = site.place([pod(f"p{i}", cpu=500) for i in range(20)], ttl_s=600)
    site.release(first[0].reservation_id)
    site.place([pod(f"q{i}", cpu=500) for i in range(3)], ttl_s=600)
    rids = [e["rid"] for e in _lines(tmp_path) if e.get("op") == "reserve"]
    assert len(rids) == len(set(rids))  # the snapshot replaced the group's lines
    again = _restart(site, tmp_path)
    assert set(again.reservations) == set(site.reservations)
    assert len(again.reservations) == 22


def test_a_live_state_larger_than_the_compaction_limit_is_not_rewritten_per_event(
        tmp_path) -> None:
    """Once the live reservations outnumbered ``compact_after``, every event found the
    journal past its limit and rewrote the whole file (quadratic in the site's size)."""
    site = _site(tmp_path, compact_after=5)
    site.place([pod(f"p{i}", cpu=100) for i in range(12)], ttl_s=600)  # 12 live > 5
    writes = []
    real = site.journal.rewrite
    site.journal.rewrite = lambda events: (writes.append(len(events)), real(events))[1]
    for i in range(12):
        site.place([pod(f"q{i}", cpu=100)], ttl_s=600)
    assert len(writes) == 1  # once the file doubled, not once per request
    again = _restart(site, tmp_path)
    assert len(again.reservations) == 24
