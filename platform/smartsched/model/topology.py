"""Inside a node: NUMA sockets, PCIe switches, GPUs, FPGAs and NICs.

Owns the intra-node hardware graph (edges weighted by bandwidth and NUMA
distance) that topology-aware binding and the graph encoder read. Graphs are
built per *shape* (socket count, device count, model), not per node, so a
5,000-GPU cluster keeps a handful of graphs, not thousands.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

# Link bandwidths in GB/s and ACPI SLIT-style NUMA distances (10 = local).
PCIE_GBPS: Final = 32.0  # PCIe 4.0 x16
NVLINK_GBPS: Final = 300.0
INTER_SOCKET_GBPS: Final = 64.0
NIC_GBPS: Final = 12.5  # 100 Gb/s
LOCAL_NUMA: Final = 10
REMOTE_NUMA: Final = 21
GPUS_PER_SWITCH: Final = 2


@dataclass(frozen=True, slots=True)
class Component:
    """A vertex of the node graph: ``kind`` is socket, switch, gpu, fpga or nic."""

    kind: str
    index: int
    socket: int


@dataclass(frozen=True, slots=True)
class Link:
    """An undirected edge between two components, by position in ``NodeTopology.components``."""

    a: int
    b: int
    kind: str  # "upi", "pcie", "nvlink", "nic"
    bandwidth_gbps: float
    numa_distance: int


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """The hardware graph of one node shape."""

    components: tuple[Component, ...]
    links: tuple[Link, ...]

    def gpu_socket(self) -> tuple[int, ...]:
        """NUMA socket of each GPU, by GPU index."""
        return tuple(c.socket for c in self.components if c.kind == "gpu")

    def gpu_switch(self) -> tuple[int, ...]:
        """PCIe switch of each GPU, by GPU index (GPUs under one switch talk fastest over PCIe)."""
        return tuple(c.index // GPUS_PER_SWITCH for c in self.components if c.kind == "gpu")


@functools.cache
def node_topology(
    sockets: int, num_gpu: int, num_fpga: int = 0, nics: int = 1, nvlink: bool = False
) -> NodeTopology:
    """Build (and cache) the hardware graph of a node shape.

    Layout follows common 2-socket GPU servers: GPUs in pairs under PCIe
    switches, switches spread round-robin over sockets, one NIC per socket up to
    ``nics``; NVLink-capable models get an all-to-all NVLink mesh among GPUs.
    """
    sockets = max(1, sockets)
    comps: list[Component] = [Component("socket", s, s) for s in range(sockets)]
    links: list[Link] = []
    for s in range(1, sockets):
        for t in range(s):
            links.append(Link(t, s, "upi", INTER_SOCKET_GBPS, REMOTE_NUMA))
    num_switches = -(-num_gpu // GPUS_PER_SWITCH) if num_gpu else 0
    switch_pos: list[int] = []
    for w in range(num_switches):
        sock = w % sockets
        comps.append(Component("switch", w, sock))
        switch_pos.append(len(comps) - 1)
        links.append(Link(sock, len(comps) - 1, "pcie", PCIE_GBPS, LOCAL_NUMA))
    gpu_pos: list[int] = []
    for g in range(num_gpu):
        w = g // GPUS_PER_SWITCH
        comps.append(Component("gpu", g, w % sockets))
        gpu_pos.append(len(comps) - 1)
        links.append(Link(switch_pos[w], len(comps) - 1, "pcie", PCIE_GBPS, LOCAL_NUMA))
    if nvlink:
        for i in range(num_gpu):
            for j in range(i + 1, num_gpu):
                links.append(Link(gpu_pos[i], gpu_pos[j], "nvlink", NVLINK_GBPS, LOCAL_NUMA))
    for f in range(num_fpga):
        sock = f % sockets
        comps.append(Component("fpga", f, sock))
        links.append(Link(sock, len(comps) - 1, "pcie", PCIE_GBPS, LOCAL_NUMA))
    for n in range(max(1, nics)):
        sock = n % sockets
        comps.append(Component("nic", n, sock))
        links.append(Link(sock, len(comps) - 1, "nic", NIC_GBPS, LOCAL_NUMA))
    return NodeTopology(tuple(comps), tuple(links))


def fewest_sockets(per_socket: Sequence[int], k: int) -> int:
    """The fewest NUMA sockets that hold ``k`` devices, given each socket's device count
    (0 when ``k`` devices do not fit at all)."""
    total = 0
    for used, size in enumerate(sorted(per_socket, reverse=True), start=1):
        total += size
        if total >= k:
            return used
    return 0


def locality_stretch(sockets_used: int, fewest: int, nvlink: bool, comm_share: float) -> float:
    """How much longer a multi-GPU pod runs on devices spanning ``sockets_used`` NUMA
    sockets than on the closest devices its node could give it (``fewest`` sockets).

    The pod spends ``comm_share`` of its best-placed run exchanging data between its
    GPUs (gradients, activations); that part runs at the bandwidth of the slowest path
    between two of them. Over NVLink (an all-to-all mesh here) every pair has the same
    path, so nothing stretches. Over PCIe, a path inside one socket runs at the PCIe
    link's rate and one through the inter-socket link is charged the NUMA distance
    ratio (REMOTE_NUMA / LOCAL_NUMA = 2.1: peer-to-peer across sockets is staged
    through host memory, as ``nvidia-smi topo`` calls SYS against PIX/PHB). So a pod
    that could sit on one socket and spans two or more takes
    ``(1 - comm_share) + comm_share * 2.1`` of its time; a pod that must span sockets
    anyway (more GPUs than a socket has) is not stretched for it: its best placement
    already has a path through the inter-socket link.
    """
    if nvlink or comm_share <= 0 or fewest > 1 or sockets_used <= 1:
        return 1.0
    return (1.0 - comm_share) + comm_share * REMOTE_NUMA / LOCAL_NUMA
