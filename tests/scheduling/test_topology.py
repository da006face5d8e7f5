"""Topology-aware binding and NUMA-aware scoring."""

from __future__ import annotations

import numpy as np

from smartsched.scheduling.framework import CycleContext
from smartsched.scheduling.plugins.binders import BestFitGpu, TopologyAwareGpu
from smartsched.scheduling.plugins.topology import NumaAware
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node, pod


def _state() -> ClusterState:
    # 8 GPUs: switches (0,1) (2,3) (4,5) (6,7); sockets alternate: s0 = 0,1,4,5; s1 = 2,3,6,7.
    st = ClusterState(cluster(node("g", cpu=64000, mem=262144, gpus=8),
                              node("h", cpu=64000, mem=262144, gpus=8)))
    busy = st.compile(pod("busy", num_gpu=1, gpu_milli=1000))
    for d in (1, 3, 6):
        st.allocate(0, busy, (d,))
    return st


def test_topology_layout() -> None:
    st = _state()
    assert st.gpu_switch[0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert st.gpu_socket[0].tolist() == [0, 0, 1, 1, 0, 0, 1, 1]


def test_binder_prefers_one_switch_then_one_socket() -> None:
    st = _state()
    two = CycleContext(st, st.compile(pod("two", num_gpu=2, gpu_milli=1000)))
    assert TopologyAwareGpu().devices(two, 0) == (4, 5)
    assert BestFitGpu().devices(two, 0) == (0, 2)  # the default crosses sockets
    three = CycleContext(st, st.compile(pod("three", num_gpu=3, gpu_milli=1000)))
    assert TopologyAwareGpu().devices(three, 0) == (0, 4, 5)  # all on socket 0


def test_numa_aware_score() -> None:
    st = _state()
    both = np.ones(2, bool)
    four = CycleContext(st, st.compile(pod("four", num_gpu=4, gpu_milli=1000)))
    # node g: free 0,2,4,5,7 -> no switch with 4, sockets hold 3 and 2 -> 2 sockets: 75/2
    # node h: all free -> 4 fit on one socket but not under one switch -> 75
    assert NumaAware().score(four, both).tolist() == [37.5, 75.0]
    two = CycleContext(st, st.compile(pod("two", num_gpu=2, gpu_milli=1000)))
    assert NumaAware().score(two, both).tolist() == [100.0, 100.0]
    one = CycleContext(st, st.compile(pod("one", num_gpu=1, gpu_milli=500)))
    assert NumaAware().score(one, both).tolist() == [100.0, 100.0]
