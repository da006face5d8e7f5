"""FGD-paper heuristics against hand-worked examples."""

from __future__ import annotations

import numpy as np

from smartsched.model.pod import Pod
from smartsched.scheduling.framework import CycleContext
from smartsched.scheduling.plugins.gpu import FGD, BestFit, DotProd, GpuClustering, GpuPacking
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node, pod


def _ctx(st: ClusterState, p: Pod) -> CycleContext:
    return CycleContext(st, st.compile(p))


def test_fgd_worked_example() -> None:
    # One node, 2 GPUs with 1000 and 600 free. Workload: half 500-milli shares, half 1 whole GPU.
    st = ClusterState(cluster(node("g", cpu=64000, mem=262144, gpus=2)))
    st.allocate(0, st.compile(pod("used", num_gpu=1, gpu_milli=400)), (1,))
    fgd = FGD()
    fgd.prepare([pod("s", cpu=1000, num_gpu=1, gpu_milli=500),
                 pod("w", cpu=1000, num_gpu=1, gpu_milli=1000)])
    ctx = _ctx(st, pod("new", cpu=1000, num_gpu=1, gpu_milli=200))
    # F before = 0.5*0 + 0.5*600 = 300.
    # device 0 -> [800, 600]: shares fine (0), no whole GPU left (1400): F = 700, delta -400
    # device 1 -> [1000, 400]: 400 stranded for both types: F = 400, delta -100
    expected = int(100 / (1 + np.exp(0.1)))  # 47
    assert fgd.score(ctx, np.ones(1, bool)).tolist() == [expected]
    assert fgd.devices(ctx, 0) == (1,)


def test_fgd_cache_tracks_node_changes() -> None:
    st = ClusterState(cluster(node("g0", cpu=64000, mem=262144, gpus=2),
                              node("g1", cpu=64000, mem=262144, gpus=2)))
    fgd = FGD()
    fgd.prepare([pod("w", num_gpu=1, gpu_milli=1000), pod("s", num_gpu=1, gpu_milli=500)])
    p = pod("x", num_gpu=1, gpu_milli=500)
    first = fgd.score(_ctx(st, p), np.ones(2, bool)).copy()
    assert first[0] == first[1]
    st.allocate(0, st.compile(pod("y", num_gpu=1, gpu_milli=500)), (0,))
    second = fgd.score(_ctx(st, p), np.ones(2, bool))
    fresh = FGD()
    fresh.prepare([pod("w", num_gpu=1, gpu_milli=1000), pod("s", num_gpu=1, gpu_milli=500)])
    assert second.tolist() == fresh.score(_ctx(st, p), np.ones(2, bool)).tolist()
    assert second[0] != first[0] and second[1] == first[1]


def _packing_state() -> ClusterState:
    st = ClusterState(cluster(node("idle", cpu=64000, mem=262144, gpus=4),
                              node("part", cpu=64000, mem=262144, gpus=4)))
    st.allocate(1, st.compile(pod("u", num_gpu=1, gpu_milli=700)), (2,))
    return st


def test_gpu_packing_cases() -> None:
    st = _packing_state()
    both = np.ones(2, bool)
    share = GpuPacking().score(_ctx(st, pod("s", num_gpu=1, gpu_milli=200)), both)
    # idle node, 4 free GPUs: max(33-4, 4) = 29; part: uses device 2 (300 free):
    # 100 - floor(300*100/1000)//10 = 97
    assert share.tolist() == [29, 97]
    whole = GpuPacking().score(_ctx(st, pod("w", num_gpu=2, gpu_milli=1000)), both)
    assert whole.tolist() == [29, 48]  # part: two fully free GPUs taken -> max(50-2, 33)
    assert GpuPacking().score(_ctx(st, pod("c")), both).tolist() == [0, 0]


def test_bestfit_dotprod_clustering() -> None:
    st = ClusterState(cluster(node("small", cpu=8000, mem=65536, gpus=2),
                              node("big", cpu=64000, mem=262144, gpus=8)))
    both = np.ones(2, bool)
    p = pod("p", cpu=1000, num_gpu=1, gpu_milli=500)
    # raw: small 0.5*7000/128000 + 0.5*1500/8000 -> 87; big 0.5*63000/128000 + 0.5*7500/8000 -> 28
    assert BestFit().score(_ctx(st, p), both).tolist() == [100, 0]
    # small: 0.5*(8000/128000*1000/128000 + 2000/8000*500/8000) -> int(99.19) = 99
    assert DotProd().score(_ctx(st, p), both)[0] == 99
    # empty nodes: base 25*(8000-gpu_left)//8000 + 25 (no GPU pods)
    assert GpuClustering().score(_ctx(st, p), both).tolist() == [18 + 25, 0 + 25]
    st.allocate(0, st.compile(pod("q", num_gpu=1, gpu_milli=500)), (0,))
    # same-tag pod only on "small": 25*(8000-1500)//8000 + 75
    assert GpuClustering().score(_ctx(st, p), both).tolist() == [20 + 75, 25]
    assert GpuClustering().score(_ctx(st, pod("w", num_gpu=1, gpu_milli=1000)),
                                 both).tolist() == [20 + 0, 25]


def test_fgd_warm_start_gives_identical_scores() -> None:
    from smartsched.scheduling.plugins.gpu import FgdArgs

    st = _packing_state()
    workload = [pod("a", num_gpu=1, gpu_milli=500), pod("b", num_gpu=2, gpu_milli=1000),
                pod("c", cpu=2000)]
    cold, warm = FGD(), FGD(FgdArgs(warm=True))
    cold.prepare(workload)
    warm.prepare(workload)
    for p in (pod("x", num_gpu=1, gpu_milli=300), *workload):
        ctx = _ctx(st, p)
        assert warm.score(ctx, np.ones(2, bool)).tolist() == cold.score(
            _ctx(st, p), np.ones(2, bool)).tolist()
    assert len(warm._cache) >= 3  # every workload shape was scored on the first call
