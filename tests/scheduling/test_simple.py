"""Profiles as schedulers: filters, reasons, first-fit and random."""

from __future__ import annotations

import pytest

from smartsched.model.errors import UnknownReferenceError
from smartsched.scheduling.base import make_scheduler, scheduler_names
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node, pod

TAINT = "nvidia.com/gpu=present:NoSchedule"


def _state() -> ClusterState:
    return ClusterState(cluster(
        node("cpu-a", cpu=4000, labels={"disk": "ssd"}),
        node("cpu-b", cpu=8000, zone="z2"),
        node("gpu", cpu=32000, mem=131072, gpus=4, model="T4", taints=(TAINT,)),
        node("off", cpu=64000, mem=131072, unschedulable=True),
    ))


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (pod("small"), [True, True, False, False]),
        (pod("ssd", node_selector=(("disk", "ssd"),)), [True, False, False, False]),
        (pod("nolabel", node_selector=(("disk", "nvme"),)), [False, False, False, False]),
        (pod("gpu", num_gpu=1, gpu_milli=500), [False, False, False, False]),
        (pod("gpu-tol", num_gpu=1, gpu_milli=500, tolerations=("nvidia.com/gpu",)),
         [False, False, True, False]),
        (pod("gpu-eq", num_gpu=1, gpu_milli=500, tolerations=("nvidia.com/gpu=present",)),
         [False, False, True, False]),
        (pod("gpu-wrong", num_gpu=1, gpu_milli=500, tolerations=("nvidia.com/gpu=absent",)),
         [False, False, False, False]),
        (pod("big", cpu=6000), [False, True, False, False]),
    ],
)
def test_feasible_mask(p, expected) -> None:
    st = _state()
    sched = make_scheduler("k8s-default")
    ok, _ = sched.feasible(st, st.compile(p))
    assert ok.tolist() == expected


def test_rejection_reasons_blame_first_failing_filter() -> None:
    st = _state()
    d = make_scheduler("k8s-default").decide(st, st.compile(pod("huge", cpu=40000)))
    assert d.node is None
    assert d.reasons == (
        "1 nodes: node(s) were unschedulable or down",
        "3 nodes: Insufficient cpu",
    )
    d = make_scheduler("k8s-default").decide(st, st.compile(pod("gpu", num_gpu=1,
                                                                   gpu_milli=100)))
    assert d.reasons == (
        "1 nodes: node(s) were unschedulable or down",
        "2 nodes: Insufficient gpu",
        "1 nodes: node(s) had untolerated taint",
    )


def test_first_fit_and_random_choose_feasible_nodes() -> None:
    st = _state()
    req = st.compile(pod("p", cpu=2000))
    assert make_scheduler("first-fit").decide(st, req).node == 0
    rnd = make_scheduler("random", seed=1)
    chosen = {rnd.decide(st, req).node for _ in range(50)}
    assert chosen == {0, 1}
    rejected = make_scheduler("first-fit").decide(st, st.compile(pod("x", cpu=99000)))
    assert rejected.node is None and rejected.reasons


def test_registry() -> None:
    assert {"first-fit", "random", "k8s-default", "fgd", "bestfit"} <= set(scheduler_names())
    with pytest.raises(UnknownReferenceError):
        make_scheduler("nope")
