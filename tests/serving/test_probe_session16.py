"""Probe session 16: what earlier probes of the placement service missed -- an edge entry's
retry after a restart, metric labels and audit records sized by client input, a pod id
that split its own reason."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from smartsched.model.errors import SmartSchedError
from smartsched.model.pod import Pod, PodClass
from smartsched.model.presets import load_cluster
from smartsched.serving.audit_trail import Trail
from smartsched.serving.config import EdgeAutonomy, parse_service_config
from smartsched.serving.hierarchy import Hierarchy
from smartsched.serving.metrics import ServiceMetrics
from smartsched.serving.schemas import PodSpec
from smartsched.serving.site import SitePlacer, site_subspec
from smartsched.serving.tiers import SiteTier


@pytest.fixture(scope="module")
def medium() -> Hierarchy:
    return Hierarchy.from_spec(load_cluster("medium"))


def test_an_edge_entry_retry_after_a_restart_never_gets_another_bodys_booking(
        medium: Hierarchy, tmp_path: Path) -> None:
    """Before: the entry's request-id bindings live in memory, the site's answers in its
    journal; after a restart ``request_id`` R with another body (30x the CPU) got the first
    body's booking back, ``placed: true`` on room it does not hold."""
    from smartsched.serving.edge_entry import EdgeEntry

    cfg = parse_service_config({"cluster": "medium", "auth": {"disabled": True}})

    async def run() -> None:
        first = SiteTier(medium, "mec-0", "k8s-default", journal_dir=str(tmp_path))
        a = (await EdgeEntry(cfg, "mec-0", first).place(
            [PodSpec(id="x", cpu_milli=100)], 60.0, "R")).placements[0]
        assert a.placed
        first.placer.journal.close()  # the replica's process ends
        tier = SiteTier(medium, "mec-0", "k8s-default", journal_dir=str(tmp_path))
        entry = EdgeEntry(cfg, "mec-0", tier)
        try:
            b = (await entry.place([PodSpec(id="x", cpu_milli=3000, memory_mib=2048)],
                                   60.0, "R")).placements[0]
        except SmartSchedError:  # 409: R is bound to the first body, as before the restart
            b = None
        if b is not None:  # or a booking of its own, holding what it asks
            assert b.reservation_id != a.reservation_id
        held = [bk.pod.cpu_milli for r in tier.placer.reservations.values()
                for bk in r.bookings]
        assert sorted(held) in ([100], [100, 3000])
        # The same body retried after the restart is still the first answer.
        c = (await entry.place([PodSpec(id="x", cpu_milli=100)], 60.0, "R")).placements[0]
        assert c.reservation_id == a.reservation_id
        assert len(tier.placer.reservations) == len(held)

    asyncio.run(run())


def test_queued_escalations_do_not_make_a_metric_series_per_request(
        medium: Hierarchy) -> None:
    """Before: a pod queued at a cut-off edge was counted under its reason's tail, which
    names the escalation (the request id, or a random one): one new Prometheus series per
    request, for as long as the region is unreachable."""

    async def down(*_: Any) -> list:
        raise ConnectionError("link down")

    edge = SiteTier(medium, "mec-0", "k8s-default", parent=down,
                    autonomy=EdgeAutonomy(reconcile_every_s=3600))
    metrics = ServiceMetrics()
    for i in range(5):
        pod = Pod(id=f"big{i}", cpu_milli=200_000, memory_mib=1024,
                  pod_class=PodClass.EDGE_RT, origin_site="mec-0", latency_slo_ms=50)
        rid = f"request-{i}" if i % 2 else None
        res = asyncio.run(edge.place([pod], 60.0, rid))
        assert res[0]["escalation"]["state"] == "queued"
        metrics.observe_placements(res)
    text = metrics.render()[0].decode()
    series = [ln for ln in text.splitlines() if ln.startswith("smartsched_rejections_total")]
    assert len(series) == 1, series
    assert "request-" not in text and "@mec-0" not in text


def test_a_refused_credential_writes_a_bounded_audit_record() -> None:
    """Before: anyone without a token could write their whole path (60 kB) into the signed
    audit log per refusal, 100 refusals a second."""
    records: list[dict[str, Any]] = []

    class Log:
        stopped = None

        def append(self, kind: str, who: str, payload: dict, tenant: str = "") -> None:
            records.append(payload)

    trail = Trail(None)
    trail.log = Log()
    trail.refused("DELETE" * 1000, "/v1/reservations/" + "z" * 60_000, 401)
    (rec,) = records
    assert len(rec["path"]) <= 256 and len(rec["method"]) <= 256
    assert rec["path"].startswith("/v1/reservations/zzz")
    assert rec["path_length"] == len("/v1/reservations/") + 60_000


def test_a_pod_id_with_a_colon_does_not_split_its_own_reason(medium: Hierarchy) -> None:
    """Before: ``{"id": "job: ABC", "cpu_milli": 1000000}`` was answered with the reason
    "ABC: 0/96 nodes are available: ..." (the reason was cut at the first ": " of
    "<pod id>: <why>")."""
    placer = SitePlacer(site_subspec(medium.spec, ["region-a"]), "k8s-default")
    (res,) = placer.place([Pod(id="job: ABC", cpu_milli=1_000_000, memory_mib=1)], 60.0)
    assert not res.placed
    assert res.reason.startswith("0/") and "ABC" not in res.reason
    gang = [Pod(id=f"m: {i}", cpu_milli=1_000_000, memory_mib=1, gang_id="g", gang_size=2)
            for i in range(2)]
    out = placer.place(gang, 60.0)
    assert all(r.reason.startswith("gang not placed (m: 0: 0/") for r in out)


def test_answers_kept_for_retries_are_bounded_by_pods_not_only_by_count(
        medium: Hierarchy) -> None:
    """Up to 10,000 answers were kept whatever their size: a client sending 1,000-pod
    batches that fit nowhere made each site (and the cloud) hold ~1 MB per answer, ~10 GB
    in all. Now the pods answered are bounded too (the newest answer always kept)."""
    import smartsched.serving.site as site_mod

    site = SitePlacer(site_subspec(medium.spec, ["mec-0"]), "k8s-default")
    assert site.answers.keep_pods == site_mod.IDEMPOTENCY_KEEP_PODS
    site.answers = site_mod.AnswerCache(keep_pods=50)  # a small bound, the same rule
    huge = [Pod(id=f"p{i}", cpu_milli=4_000_000, memory_mib=1) for i in range(20)]
    for r in range(10):
        site.place(huge, 60.0, request_id=f"r{r}")
        assert site.answers.pods <= 50 or len(site.answers) == 1
    assert list(site.answers) == ["r8", "r9"] and site.answers.pods == 40
    assert site.place(huge, 60.0, request_id="r9")[0].placed is False  # a retry: kept


def test_the_cloud_tiers_answers_are_bounded_by_pods_too() -> None:
    from smartsched.serving.site import AnswerCache

    cache = AnswerCache(keep=10, keep_pods=5, size=lambda a: len(a[1]))
    for i in range(4):
        cache[f"k{i}"] = ("body", [{}, {}])
        cache.trim()
    assert list(cache) == ["k2", "k3"] and cache.pods == 4
    cache["k4"] = ("body", [{}] * 9)  # larger than the bound alone: kept, the rest go
    cache.trim()
    assert list(cache) == ["k4"] and cache.pods == 9
