"""The cloud tier's batch division (``ranking.division``): a batch's like pods shared by
region capacity, spill-over kept, edge-first and single-region pods left alone, the
split the same on a retry."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod, PodClass
from smartsched.model.presets import load_cluster
from smartsched.serving.config import ServiceConfig
from smartsched.serving.hierarchy import Hierarchy
from smartsched.serving.tiers import CloudTier, SiteTier


@pytest.fixture(scope="module")
def medium() -> Hierarchy:
    return Hierarchy.from_spec(load_cluster("medium"))


def _cloud(h: Hierarchy, division: str) -> tuple[CloudTier, dict[str, SiteTier]]:
    sites: dict[str, SiteTier] = {r: SiteTier(h, r, "k8s-default") for r in h.regions}
    for e in h.edges:
        sites[e] = SiteTier(h, e, "k8s-default", parent=sites[h.parent[e]].place)

    async def free() -> dict[str, dict[str, float]]:
        return {r: sites[r].free() for r in h.regions}

    cloud = CloudTier(h, {r: sites[r].place for r in h.regions},
                      {e: sites[e].place for e in h.edges}, free, division=division)
    return cloud, sites


def _batch(n: int, prefix: str = "b", cpu: int = 500, **kw) -> list[Pod]:
    return [Pod(id=f"{prefix}{i}", cpu_milli=cpu, memory_mib=256, **kw) for i in range(n)]


def _regions(results: list[dict]) -> Counter:
    return Counter(r["region"] for r in results if r["placed"])


def test_aggregated_sends_a_like_batch_to_one_region(medium: Hierarchy) -> None:
    cloud, _ = _cloud(medium, "aggregated")
    res = asyncio.run(cloud.place(_batch(60), 60, None))
    assert all(r["placed"] for r in res)
    assert len(_regions(res)) == 1


def test_by_capacity_divides_in_proportion_to_capacity(medium: Hierarchy) -> None:
    cloud, sites = _cloud(medium, "by_capacity")
    cap = {r: sites[r].free()["capacity_cpu"] for r in medium.regions}
    pods = _batch(90, cpu=500) + _batch(30, prefix="c", cpu=1000)  # two kinds, one need
    res = asyncio.run(cloud.place(pods, 60, None))
    assert all(r["placed"] for r in res)
    asked: Counter = Counter()
    for pod, r in zip(pods, res, strict=True):
        asked[r["region"]] += pod.cpu_milli
    total = sum(asked.values())
    for region in medium.regions:  # within one pod's demand of its share
        assert abs(asked[region] - total * cap[region] / sum(cap.values())) <= 1000
    # The answer says why a pod went where it did.
    assert any("divided by region capacity" in s["reason"] for s in res[0]["reasons"])


def test_a_full_region_still_spills_over(medium: Hierarchy) -> None:
    cloud, sites = _cloud(medium, "by_capacity")
    a, b = medium.regions
    # Fill region-a until it holds no more batch pods: its share must land in region-b.
    placer = sites[a].placer
    cores = int(placer.state.capacity[:, 0].sum()) // 500
    assert not placer.place(_batch(cores + 10, prefix="fill"), 600)[-1].placed
    res = asyncio.run(cloud.place(_batch(40), 60, None))
    assert all(r["placed"] for r in res)
    assert _regions(res) == Counter({b: 40})
    tried_a = [r for r in res if any(s["reason"].startswith(f"try {a}") for s in r["reasons"])]
    assert tried_a  # its share went to region-a first, was refused there, then spilled


def test_edge_first_and_single_region_pods_are_not_divided(medium: Hierarchy) -> None:
    cloud, _ = _cloud(medium, "by_capacity")
    edge = _batch(20, prefix="e", cpu=100, pod_class=PodClass.EDGE_RT, origin_site="mec-0",
                  latency_slo_ms=50)
    pinned = _batch(20, prefix="p", allowed_regions=("region-b",))
    res = asyncio.run(cloud.place(edge + pinned, 60, None))
    assert all(r["placed"] for r in res)
    assert {r["site"] for r in res[:20]} == {"mec-0"}
    assert _regions(res[20:]) == Counter({"region-b": 20})


def test_the_division_is_the_same_on_a_retry(medium: Hierarchy) -> None:
    cloud, sites = _cloud(medium, "by_capacity")
    pods = _batch(50)
    first = asyncio.run(cloud.place(pods, 60, "req-1"))
    booked = sum(len(sites[r].placer.reservations) for r in medium.regions)
    cloud.answers.clear()  # as after a restart that lost the cloud's answer
    again = asyncio.run(cloud.place(pods, 60, "req-1"))
    assert [r["reservation_id"] for r in again] == [r["reservation_id"] for r in first]
    assert sum(len(sites[r].placer.reservations) for r in medium.regions) == booked


def test_an_unknown_division_is_refused_by_name() -> None:
    with pytest.raises(Exception, match="division"):
        ServiceConfig.model_validate({"cluster": "small", "ranking": {"division": "spread"}})
    with pytest.raises(ValidationError, match=r"ranking\.division"):
        CloudTier(Hierarchy.from_spec(load_cluster("small")), {}, {}, None,  # type: ignore[arg-type]
                  division="spread")


def test_the_split_does_not_move_with_load(medium: Hierarchy) -> None:
    """Which region a pod goes to first depends on capacity and the request, not on the
    regions' load (which orders the ranking and changes between a request and its retry)."""
    splits = []
    for busy in medium.regions:
        cloud, sites = _cloud(medium, "by_capacity")

        async def free(busy: str = busy, sites: dict = sites) -> dict[str, dict[str, float]]:
            return {r: {**sites[r].free(), "cpu": 0.2 if r == busy else 0.9}
                    for r in medium.regions}

        cloud.free_of = free
        res = asyncio.run(cloud.place(_batch(31), 60, None))
        splits.append([r["region"] for r in res])
    assert splits[0] == splits[1] and len(set(splits[0])) == 2
