"""Resource-GCN: a GATv2 encoder over the cluster's hardware topology, cached.

Owns the graph the policy's node embeddings are conditioned on. Vertices:
for every cluster node a host, its NUMA sockets, PCIe switches and GPUs; one
vertex per rack and per zone. Edges (both directions) carry
[bandwidth / 300 GB/s, NUMA distance / 21] as in ``model.topology``:

    socket - socket  UPI     64 GB/s, distance 21
    host   - socket          64 GB/s, distance 10
    socket - switch  PCIe    32 GB/s, distance 10
    switch - GPU     PCIe    32 GB/s, distance 10
    GPU    - GPU     NVLink 300 GB/s (NVLink models)
    host   - rack, rack - zone   network, 12.5 GB/s

Two GATv2 layers (Brody et al., "How Attentive are Graph Attention
Networks?", ICLR 2022; torch_geometric.nn.GATv2Conv with edge features) turn
static vertex features into host embeddings [N, out].

The graph and its inputs are static, so the embedding is cached: recomputed
only when the cluster (its static feature columns) or the encoder's weights
change (tracked through the parameters' in-place version counters). In
training the encoder runs once per forward pass for the whole batch — the
samples of a batch share one cluster — so gradients still reach it.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
from torch import nn
from torch_geometric.nn import GATv2Conv

from smartsched.model.topology import GPUS_PER_SWITCH
from smartsched.rl.observation import NVLINK_COL, RACK_COL, SOCKETS_COL, STATIC_COLS, ZONE_COL

# Vertex types (one-hot in the vertex features).
HOST, SOCKET, SWITCH, GPU_V, RACK, ZONE = range(6)
N_TYPES = 6


def build_graph(static: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Vertices, edges and edge attributes from the static node columns of one sample.

    ``static`` is [N, len(STATIC_COLS)] (see ``rl.observation.STATIC_COLS``); rows
    with zero cpu capacity are padding and get no vertices. Returns
    (vertex features [V, F_v], edge_index [2, E], edge_attr [E, 2], host vertex of
    each node [N], -1 for padding). Loops over nodes here are fine: this runs once
    per cluster, not per decision.
    """
    col = {c: i for i, c in enumerate(STATIC_COLS)}
    n = static.shape[0]
    feats: list[np.ndarray] = []
    src: list[int] = []
    dst: list[int] = []
    attr: list[tuple[float, float]] = []

    def vertex(kind: int, extra: np.ndarray | None = None) -> int:
        v = np.zeros(N_TYPES + 3, dtype=np.float32)
        v[kind] = 1.0
        if extra is not None:
            v[N_TYPES:] = extra
        feats.append(v)
        return len(feats) - 1

    def edge(a: int, b: int, bw: float, dist: float) -> None:
        src.extend((a, b))
        dst.extend((b, a))
        attr.extend(((bw / 300.0, dist / 21.0),) * 2)

    host_of = np.full(n, -1, dtype=np.int64)
    racks: dict[float, int] = {}
    zones: dict[int, int] = {}
    for i in range(n):
        cap = static[i, [col[0], col[1], col[2]]]
        if cap[0] <= 0:
            continue
        h = host_of[i] = vertex(HOST, cap)
        zone = int(np.argmax(static[i, col[ZONE_COL]: col[ZONE_COL] + (SOCKETS_COL - ZONE_COL)]))
        if zone not in zones:
            zones[zone] = vertex(ZONE)
        rack_key = float(static[i, col[RACK_COL]])
        if rack_key not in racks:
            racks[rack_key] = vertex(RACK)
            edge(racks[rack_key], zones[zone], 12.5, 0.0)
        edge(h, racks[rack_key], 12.5, 0.0)
        sockets = max(1, round(float(static[i, col[SOCKETS_COL]]) * 4))
        socks = [vertex(SOCKET) for _ in range(sockets)]
        for s in socks:
            edge(h, s, 64.0, 10.0)
        for a in range(sockets):
            for b in range(a + 1, sockets):
                edge(socks[a], socks[b], 64.0, 21.0)
        gpus = round(float(cap[2]) * 8)
        switches = [vertex(SWITCH) for _ in range(-(-gpus // GPUS_PER_SWITCH))]
        for w, sw in enumerate(switches):
            edge(socks[w % sockets], sw, 32.0, 10.0)
        gv = [vertex(GPU_V) for _ in range(gpus)]
        for g, v in enumerate(gv):
            edge(switches[g // GPUS_PER_SWITCH], v, 32.0, 10.0)
        if static[i, col[NVLINK_COL]] > 0:
            for a in range(gpus):
                for b in range(a + 1, gpus):
                    edge(gv[a], gv[b], 300.0, 10.0)
    if not feats:  # all padding (e.g. a terminal or dummy observation)
        return (np.zeros((0, N_TYPES + 3), np.float32), np.zeros((2, 0), np.int64),
                np.zeros((0, 2), np.float32), host_of)
    return (np.stack(feats), np.array([src, dst], dtype=np.int64),
            np.array(attr, dtype=np.float32).reshape(-1, 2), host_of)


class TopologyEncoder(nn.Module):
    """Two GATv2 layers over the hardware graph -> one embedding per cluster node."""

    def __init__(self, out_dim: int = 32, hidden: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.out_dim = out_dim
        in_dim = N_TYPES + 3
        self.conv1 = GATv2Conv(in_dim, hidden, heads=heads, edge_dim=2, concat=False)
        self.conv2 = GATv2Conv(hidden, out_dim, heads=heads, edge_dim=2, concat=False)
        self._graphs: dict[str, tuple[torch.Tensor, ...]] = {}
        self._cache: tuple[str, int, torch.Tensor] | None = None

    def _weights_version(self) -> int:
        return sum(p._version for p in self.parameters())

    def _graph(self, static: torch.Tensor) -> tuple[str, tuple[torch.Tensor, ...]]:
        arr = static.detach().cpu().numpy()
        key = hashlib.sha1(arr.tobytes()).hexdigest() + str(arr.shape)
        if key not in self._graphs:
            x, ei, ea, host = build_graph(arr)
            self._graphs[key] = (torch.from_numpy(x), torch.from_numpy(ei), torch.from_numpy(ea),
                                 torch.from_numpy(host))
            if len(self._graphs) > 8:
                self._graphs.pop(next(iter(self._graphs)))
        return key, self._graphs[key]

    def forward(self, static: torch.Tensor) -> torch.Tensor:
        """[N, len(STATIC_COLS)] static columns of one sample -> [N, out_dim] (0 for padding)."""
        key, (x, ei, ea, host) = self._graph(static)
        if x.shape[0] == 0:
            return torch.zeros(static.shape[0], self.out_dim, dtype=static.dtype)
        version = self._weights_version()
        if (not torch.is_grad_enabled() and self._cache is not None
                and self._cache[0] == key and self._cache[1] == version):
            return self._cache[2]
        h = torch.relu(self.conv1(x, ei, ea))
        h = self.conv2(h, ei, ea)
        emb = torch.zeros(static.shape[0], self.out_dim, dtype=h.dtype)
        real = host >= 0
        emb[real] = h[host[real]]
        if not torch.is_grad_enabled():
            self._cache = (key, version, emb)
        return emb
