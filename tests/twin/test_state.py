"""ClusterState: the one definition of fit, device binding, exact accounting, forks."""

from __future__ import annotations

import numpy as np
import pytest

from smartsched.model.errors import InfeasibleDecisionError
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node, pod


def _state() -> ClusterState:
    return ClusterState(cluster(
        node("cpu", cpu=4000, mem=8192),
        node("gpu", cpu=16000, mem=65536, gpus=4, model="T4"),
        node("v100", cpu=16000, mem=65536, gpus=2, model="V100M32"),
    ))


def test_resource_fit_cpu_memory_and_devices() -> None:
    st = _state()
    assert st.resource_fit(st.compile(pod("a", cpu=4000))).tolist() == [True, True, True]
    assert st.resource_fit(st.compile(pod("b", cpu=5000))).tolist() == [False, True, True]
    share = st.compile(pod("s", num_gpu=1, gpu_milli=300))
    assert st.resource_fit(share).tolist() == [False, True, True]
    three = st.compile(pod("w", num_gpu=3, gpu_milli=1000))
    assert st.resource_fit(three).tolist() == [False, True, False]
    model = st.compile(pod("m", num_gpu=1, gpu_milli=1000, gpu_models=("V100M32",)))
    assert st.resource_fit(model).tolist() == [False, False, True]


def test_best_fit_device_choice_and_exact_release() -> None:
    st = _state()
    a = st.compile(pod("a", num_gpu=1, gpu_milli=700))
    st.allocate(1, a, st.pick_devices(1, a))  # device 0 -> 300 left
    b = st.compile(pod("b", num_gpu=1, gpu_milli=200))
    dev = st.pick_devices(1, b)
    assert dev == (0,)  # tightest fit: the device with 300 left
    st.allocate(1, b, dev)
    whole = st.compile(pod("w", num_gpu=3, gpu_milli=1000))
    assert st.pick_devices(1, whole) == (1, 2, 3)
    before = (st.allocated.copy(), st.gpu_free.copy(), st.free_res.copy())
    st.allocate(1, whole, (1, 2, 3))
    st.release(1, whole, (1, 2, 3))
    assert np.array_equal(st.allocated, before[0])
    assert np.array_equal(st.gpu_free, before[1])
    assert np.array_equal(st.free_res, before[2])
    assert np.array_equal(st.free_res, st.capacity - st.allocated)


@pytest.mark.parametrize(
    ("node_idx", "p", "devices"),
    [
        (0, pod("big", cpu=5000), ()),
        (1, pod("g", num_gpu=1, gpu_milli=1000), (7,)),
        (1, pod("g", num_gpu=2, gpu_milli=1000), (0, 0)),
        (1, pod("g", num_gpu=1, gpu_milli=500), ()),
        (1, pod("m", num_gpu=1, gpu_milli=500, gpu_models=("A100",)), (0,)),
        (9, pod("x"), ()),
    ],
)
def test_allocate_refuses_and_changes_nothing(node_idx: int, p, devices) -> None:
    st = _state()
    snap = (st.allocated.copy(), st.gpu_free.copy())
    with pytest.raises(InfeasibleDecisionError):
        st.allocate(node_idx, st.compile(p), devices)
    assert np.array_equal(st.allocated, snap[0]) and np.array_equal(st.gpu_free, snap[1])


def test_allocate_refuses_a_pod_past_the_nodes_pod_limit() -> None:
    # NodeSpec.max_pods is a limit of the state itself, not only of the filters: a driver
    # that skips them (a journal replay, a fork's trial) cannot bind a pod past it.
    st = ClusterState(cluster(node("a", cpu=8000, mem=65536, max_pods=2), node("b")))
    for k in range(2):
        st.allocate(0, st.compile(pod(f"p{k}")), ())
    snap = (st.allocated.copy(), st.pod_count.copy(), len(st.bound))
    with pytest.raises(InfeasibleDecisionError, match="admits 2 pods"):
        st.allocate(0, st.compile(pod("third")), ())
    assert np.array_equal(st.allocated, snap[0]) and np.array_equal(st.pod_count, snap[1])
    assert len(st.bound) == snap[2]
    st.allocate(1, st.compile(pod("elsewhere")), ())  # no limit on b
    st.release(0, st.bound.requests[0], ())  # a slot given back is a slot again
    st.allocate(0, st.compile(pod("third")), ())


def test_down_node_does_not_fit() -> None:
    st = _state()
    st.up[1] = False
    assert not st.resource_fit(st.compile(pod("a")))[1]


def test_fork_is_independent() -> None:
    st = _state()
    f = st.fork()
    r = f.compile(pod("a", num_gpu=1, gpu_milli=500))
    f.allocate(1, r, (0,))
    assert st.allocated.sum() == 0 and st.gpu_free[1, 0] == 1000
    assert f.allocated[1, 0] == 1000 and f.gpu_free[1, 0] == 500


def test_fragmentation_with_only_cpu_task_types() -> None:
    from smartsched.twin.fragmentation import cluster_fragmentation, typical_pods

    st = _state()
    target = typical_pods([pod("c1"), pod("c2", cpu=2000)], include_cpu_pods=True)
    total, idle = cluster_fragmentation(st, target)
    assert total == 100.0 and idle == 100.0  # every idle GPU is unusable by CPU-only tasks


def test_fit_checks_over_many_requests_agree_with_each_requests_fit() -> None:
    """The queue asks ``fit_checks`` for many waiting pods at once; each row must be what
    ``resource_fit`` (what NodeResourcesFit filters with) says for that pod alone."""
    from smartsched.twin.state import RequestBatch

    st = _state()
    first = st.compile(pod("x", cpu=3000, num_gpu=1, gpu_milli=800))
    st.allocate(1, first, st.pick_devices(1, first))
    st.be_allocatable[:] = [[1000, 4096], [2000, 4096], [0, 0]]
    rng = np.random.default_rng(5)
    reqs = []
    for i in range(200):
        gpus = int(rng.choice([0, 1, 2, 3]))
        kw = {"num_gpu": gpus, "gpu_milli": int(rng.integers(100, 1001)) if gpus == 1
              else (1000 if gpus else 0)}
        if gpus and rng.random() < 0.3:
            kw["gpu_models"] = (str(rng.choice(["T4", "V100M32"])),)
        reqs.append(st.compile(pod(f"p{i}", cpu=int(rng.integers(0, 17)) * 1000,
                                   mem=int(rng.integers(1, 70000)),
                                   best_effort=bool(rng.random() < 0.2) and gpus == 0, **kw)))
    every = np.ones((len(reqs), st.num_nodes), dtype=bool)
    for _, mask in st.fit_checks(RequestBatch.of(reqs)):
        every &= mask
    alone = np.stack([st.resource_fit(r) for r in reqs])
    np.testing.assert_array_equal(every, alone)
    assert alone.any() and not alone.all()  # the draws cover both outcomes
    nodes = np.array([2, 0])  # a subset of nodes, in any order
    some = np.ones((len(reqs), 2), dtype=bool)
    for _, mask in st.fit_checks(RequestBatch.of(reqs), nodes):
        some &= mask
    np.testing.assert_array_equal(some, alone[:, nodes])
