"""AcceleratorFit: each pod on the smallest accelerator node that hosts it, so the large
nodes stay whole for the pods only they can host."""

from __future__ import annotations

import pytest

from smartsched.scheduling.framework import ProfileScheduler
from smartsched.scheduling.registry import profile_from_dict
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node, pod

DOC = {"name": "tiers", "filters": ["NodeResourcesFit"],
       "score": [{"name": "AcceleratorFit", "weight": 10},
                 {"name": "NodeResourcesFit", "args": {"strategy": "MostAllocated"}}],
       "tie_break": "first"}


@pytest.mark.parametrize(("gpus", "milli", "cpu", "expected"), [
    (0, 0, 1000, "cpu"),  # a pod without GPUs keeps off accelerator nodes
    (1, 500, 1000, "t4x1"),  # a share: the smallest GPU node
    (2, 1000, 1000, "t4x4"),  # two GPUs: the 1-GPU node cannot host it
    (4, 1000, 1000, "t4x4"),
    (8, 1000, 1000, "a100x8"),  # only the big node hosts it
    (1, 1000, 30000, "a100x8"),  # the small nodes lack the cpu: the big one, not nothing
])
def test_the_smallest_node_that_hosts_the_pod(gpus: int, milli: int, cpu: int,
                                              expected: str) -> None:
    spec = cluster(node("a100x8", cpu=64000, gpus=8), node("t4x4", cpu=16000, gpus=4, model="T4"),
                   node("t4x1", cpu=8000, gpus=1, model="T4"), node("cpu", cpu=16000))
    st = ClusterState(spec)
    d = ProfileScheduler(profile_from_dict(DOC), seed=0).decide(
        st, st.compile(pod("p", cpu=cpu, num_gpu=gpus, gpu_milli=milli)))
    assert spec.nodes[d.node].name == expected
