"""Sequences of reservations and node updates at one site: what a node update may take
away, and how a refusal names what stands in its way."""

from __future__ import annotations

import pickle

import pytest

from smartsched.model.pod import Pod
from smartsched.model.presets import load_cluster
from smartsched.serving.hierarchy import Hierarchy
from smartsched.serving.site import SitePlacer, site_subspec


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def medium() -> Hierarchy:
    return Hierarchy.from_spec(load_cluster("medium"))


def test_an_expired_reservation_does_not_block_a_node_update(medium: Hierarchy) -> None:
    """place (short TTL) -> the TTL passes -> shrink the node: the update applies (it was
    refused, telling the operator to release a reservation that had expired)."""
    clock = Clock()
    site = SitePlacer(site_subspec(medium.spec, ["mec-0"]), "k8s-default", clock=clock)
    r = site.place([Pod(id="p", cpu_milli=8000, memory_mib=1024)], ttl_s=5)[0]
    assert r.placed
    clock.t += 6
    for dry_run in (True, False):
        out = site.apply_node_updates([(0, r.node, {"cpu_milli": 1000})], dry_run=dry_run)
        assert out["changed"] == 1
    assert site.reservations == {}
    i = site.state.node_index(r.node)
    assert site.state.capacity[i, 0] == 1000 and site.state.allocated[i, 0] == 0


def test_a_node_update_refused_for_a_live_reservation_names_its_row(medium: Hierarchy) -> None:
    """The refusal (409) names the update's row, as every other node-update error does,
    and survives the trip across Ray as the same error."""
    from smartsched.serving.site import NodeUpdateConflict

    site = SitePlacer(site_subspec(medium.spec, ["mec-0"]), "k8s-default")
    r = site.place([Pod(id="p", cpu_milli=8000, memory_mib=1024)], ttl_s=600)[0]
    other = next(n.name for n in site.spec.nodes if n.name != r.node)
    for dry_run in (True, False):
        with pytest.raises(NodeUpdateConflict) as e:
            site.apply_node_updates([(3, other, {"labels": {"a": "b"}}),
                                     (4, r.node, {"cpu_milli": 1000})], dry_run=dry_run)
        assert e.value.field == "nodes.4"
        assert r.reservation_id in e.value.message and "release it first" in e.value.message
    back = pickle.loads(pickle.dumps(e.value))
    assert (type(back), back.field, back.message) == (NodeUpdateConflict, e.value.field,
                                                       e.value.message)
    assert str(back) == f"nodes.4: {e.value.message}"
    assert r.reservation_id in site.reservations


def test_a_node_update_keeps_when_booked_pods_are_expected_to_leave(medium: Hierarchy) -> None:
    """The rebuilt state re-booked every pod as never leaving, so a gang's reservation
    planned on nodes as if their declared durations had been forgotten."""
    site = SitePlacer(site_subspec(medium.spec, ["mec-0"]), "k8s-default")
    r = site.place([Pod(id="p", cpu_milli=1000, memory_mib=1024, duration=300.0)],
                   ttl_s=600)[0]
    bound = site.state.bound

    def until() -> float:
        return float(bound.until[bound.used & (bound.node == site.state.node_index(r.node))][0])

    expected = until()
    assert expected < float("inf")
    other = next(n.name for n in site.spec.nodes if n.name != r.node)
    site.apply_node_updates([(0, other, {"labels": {"a": "b"}})])
    bound = site.state.bound  # the rebuilt state's
    assert until() == expected


def test_a_node_update_may_set_how_many_pods_a_node_admits(medium: Hierarchy) -> None:
    from smartsched.serving.schemas import NodeUpdate

    site = SitePlacer(site_subspec(medium.spec, ["mec-0"]), "k8s-default")
    names = [n.name for n in site.spec.nodes]
    updates = [NodeUpdate(name=n, site="mec-0", max_pods=1) for n in names]
    site.apply_node_updates([(i, u.name, u.changes()) for i, u in enumerate(updates)], {})
    answers = [site.place([Pod(id=f"p{i}", cpu_milli=10, memory_mib=10)], 60)[0]
               for i in range(len(names) + 1)]
    placed = [a for a in answers if a.placed]
    assert len({a.node for a in placed}) == len(placed)  # one pod per node at most
    assert not answers[-1].placed and "Too many pods" in answers[-1].reason
