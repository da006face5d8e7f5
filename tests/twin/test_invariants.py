"""Property: random clusters, pods and decisions never over-allocate or go negative."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from smartsched.model.errors import InfeasibleDecisionError
from smartsched.model.pod import Pod
from smartsched.twin.engine import Decision, Engine, EngineConfig
from tests.builders import cluster, node

nodes_st = st.lists(
    st.tuples(
        st.integers(1000, 64000), st.integers(1024, 262144), st.sampled_from([0, 1, 2, 4, 8])
    ),
    min_size=1, max_size=6,
)
pods_st = st.lists(
    st.tuples(
        st.integers(0, 16000), st.integers(0, 65536),
        st.sampled_from([(0, 0), (1, 100), (1, 500), (1, 1000), (2, 1000), (4, 1000)]),
        st.floats(0, 1000), st.floats(1, 500),
    ),
    min_size=1, max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(nodes_st, pods_st, st.integers(0, 2**16))
def test_random_decisions_never_over_allocate(nodes, pods, seed) -> None:
    spec = cluster(*[node(f"n{i}", cpu=c, mem=m, gpus=g) for i, (c, m, g) in enumerate(nodes)])
    max_cpu = max(c for c, _, _ in nodes)
    pod_list = []
    for i, (c, m, (ng, gm), arr, dur) in enumerate(pods):
        if c == 0 and m == 0 and ng == 0:
            c = 100
        pod_list.append(Pod(id=f"p{i}", cpu_milli=min(c, max_cpu), memory_mib=m, num_gpu=ng,
                            gpu_milli=gm, arrival=arr, duration=dur))
    e = Engine(spec, pod_list, EngineConfig(seed=seed, power_management=False))
    rng = np.random.default_rng(seed)
    st_ = e.state
    steps = 0
    while e.next_decision() is not None and steps < 500:
        steps += 1
        # Propose any node, feasible or not; the twin must refuse the bad ones.
        n = int(rng.integers(0, st_.num_nodes))
        try:
            e.apply(Decision(n))
        except InfeasibleDecisionError:
            e.apply(Decision.reject("random proposal did not fit"))
        assert (st_.allocated <= st_.capacity).all()
        assert (st_.allocated >= 0).all()
        assert (st_.gpu_free >= 0).all() and (st_.gpu_free <= 1000).all()
        assert np.array_equal(st_.free_res, st_.capacity - st_.allocated)
        assert np.array_equal(st_.gpu_max_free, st_.gpu_free.max(axis=1))
        assert np.array_equal(st_.gpu_full, (st_.gpu_free == 1000).sum(axis=1))
        used_by_devices = np.where(st_.gpu_exists, 1000, 0).sum(1) - st_.gpu_free.sum(1)
        assert np.array_equal(used_by_devices, st_.allocated[:, 2])
