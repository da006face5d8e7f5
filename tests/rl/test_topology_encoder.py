"""The Resource-GCN: graph built from the hardware topology, cached, trainable."""

from __future__ import annotations

import numpy as np
import torch

from smartsched.model.presets import load_cluster
from smartsched.rl.features import STATIC_COLS, FeatureBuilder
from smartsched.rl.topology_encoder import (
    GPU_V,
    HOST,
    RACK,
    SOCKET,
    SWITCH,
    ZONE,
    TopologyEncoder,
    build_graph,
)
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node


def _static(spec) -> np.ndarray:
    st = ClusterState(spec)
    fb = FeatureBuilder(spec, st, None)
    full = np.zeros((st.num_nodes, max(STATIC_COLS) + 1), dtype=np.float32)
    full[:, 0] = st.capacity[:, 0] / 128_000
    full[:, 1] = st.capacity[:, 1] / 1_048_576
    full[:, 2] = st.gpu_count / 8
    full[:, STATIC_COLS[3]:] = fb.static
    return full[:, list(STATIC_COLS)]


def test_graph_of_one_nvlink_node_and_one_cpu_node() -> None:
    spec = cluster(node("g", cpu=64000, mem=262144, gpus=8, model="A100"), node("c"))
    x, ei, ea, host = build_graph(_static(spec))
    kinds = x[:, :6].argmax(axis=1)
    counts = {k: int((kinds == k).sum()) for k in (HOST, SOCKET, SWITCH, GPU_V, RACK, ZONE)}
    assert counts == {HOST: 2, SOCKET: 4, SWITCH: 4, GPU_V: 8, RACK: 1, ZONE: 1}
    assert host.tolist() == [0, int(np.flatnonzero(kinds == HOST)[1])]
    # 28 NVLink pairs among 8 GPUs, both directions, at 300 GB/s.
    assert int((ea[:, 0] == 1.0).sum()) == 2 * 28
    # Cross-socket (UPI) edges carry NUMA distance 21.
    assert int((ea[:, 1] == 1.0).sum()) == 2 * 2  # one UPI link per 2-socket node
    assert ei.shape[1] == ea.shape[0] and ei.max() < x.shape[0]


def test_embedding_is_cached_until_weights_change() -> None:
    enc = TopologyEncoder(out_dim=8, hidden=8)
    static = torch.from_numpy(_static(load_cluster("small")))
    with torch.no_grad():
        a = enc(static)
        assert enc(static) is a  # cached: no recomputation
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.01)  # an optimizer step bumps the parameters' versions
        b = enc(static)
    assert b is not a and not torch.equal(a, b)
    assert a.shape == (16, 8)


def test_gradient_reaches_the_encoder() -> None:
    enc = TopologyEncoder(out_dim=4, hidden=4)
    static = torch.from_numpy(_static(load_cluster("small")))
    enc(static).sum().backward()
    assert all(p.grad is not None for p in enc.parameters() if p.requires_grad)
