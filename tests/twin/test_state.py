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
