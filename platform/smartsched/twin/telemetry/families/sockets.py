"""Socket placement: where each running pod's threads and memory live, and what that loads.

Pods run on a socket: a GPU pod on its GPUs' sockets, split by the node's
allocated GPU milli on each socket (uniform over the node's sockets when none
is allocated); any other pod on one socket chosen by a seeded hash of the pod.

    socket utilization = spill(socket's pods' CPU / (node CPU / sockets))
        (``physics.spill_to_free_sockets``: overflow moves to free sockets)
    heaviness          = ``physics.memory_heaviness``: 0 at 2, 1 at 6 GiB
                         requested per core
    heavy share        = sum(heaviness * pod cores) / node cores used
    bandwidth          = min(sum(pod cores * (0.5 + 4.5 * heaviness) GB/s)
                             + 0.5 GB/s if powered, 150 GB/s)         per socket
    bandwidth util     = sum over sockets of bandwidth / (sockets * 150 GB/s)

These are inputs of the CPU, memory and power families, not columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from smartsched.twin.telemetry import physics as ph
from smartsched.twin.telemetry.families.pods import PodUse
from smartsched.twin.usage import _hash01

SOCKET_BW_PEAK: Final = 150e9
BW_PER_CORE_LIGHT: Final = 0.5e9
BW_PER_CORE_HEAVY: Final = 5e9
BASE_BW_PER_SOCKET: Final = 0.5e9
SOCKET_HASH_SALT: Final = 1


@dataclass(frozen=True, slots=True, eq=False)
class SocketUse:
    """Per node and socket ([N, S]; [N] where noted), 0 in slots a node lacks.

    Attributes:
        util: CPU utilization of each socket, 0..1 (after spilling).
        memory_mib: memory the socket's pods use.
        bandwidth_bps: memory bandwidth drawn, bytes/s.
        bandwidth_util: [N] bandwidth over the node's peak.
        heavy_share: [N] CPU-weighted memory heaviness of the node's pods.
    """

    util: np.ndarray
    memory_mib: np.ndarray
    bandwidth_bps: np.ndarray
    bandwidth_util: np.ndarray
    heavy_share: np.ndarray


def gpu_socket_weights(gpu_free: np.ndarray, gpu_socket: np.ndarray, gpu_exists: np.ndarray,
                       present: np.ndarray) -> np.ndarray:
    """[N, S] share of the node's allocated GPU milli on each socket (uniform if none).

    ``gpu_free``, ``gpu_socket``, ``gpu_exists``: [N, G] as in ``ClusterState``;
    ``present``: [N, S] sockets the node has.
    """
    alloc = np.where(gpu_exists, 1000 - gpu_free, 0).astype(np.float64)
    w = np.zeros((gpu_free.shape[0], present.shape[1]))
    for s in range(present.shape[1]):  # a loop over socket slots, vectorized over nodes
        w[:, s] = (alloc * (gpu_socket == s)).sum(axis=1)
    tot = w.sum(axis=1, keepdims=True)
    uniform = present / present.sum(axis=1, keepdims=True)
    return np.where(tot > 0, w / np.where(tot > 0, tot, 1.0), uniform)


def pod_sockets(index: np.ndarray, node: np.ndarray, sockets: np.ndarray,
                seed: int) -> np.ndarray:
    """[P] the socket a non-GPU pod runs on: a seeded hash of the pod over its node's sockets."""
    s = sockets[node]
    h = _hash01(index, np.full(index.size, SOCKET_HASH_SALT), seed)
    return np.minimum((h * s).astype(np.int64), s - 1)


@np.errstate(divide="ignore", invalid="ignore")
def socket_use(pods: PodUse, *, cores_used: np.ndarray, cap_cpu: np.ndarray, sockets: np.ndarray,
               present: np.ndarray, gpu_weights: np.ndarray, powered: np.ndarray,
               seed: int) -> SocketUse:
    """Place ``pods`` on sockets and sum their CPU, memory and bandwidth per socket.

    ``cores_used``: [N] node CPU use in cores; ``cap_cpu``: [N] capacity (milli);
    ``sockets``: [N] count; ``present``: [N, S]; ``gpu_weights``: [N, S] from
    ``gpu_socket_weights``; ``powered``: [N] 1.0 unless powered off.
    """
    n, slots = present.shape
    nd = pods.node
    gpu_pod = pods.request_gpu > 0
    cpu_only = ~gpu_pod
    sock = pod_sockets(pods.index, nd, sockets, seed)

    def per_socket(w: np.ndarray) -> np.ndarray:
        out = np.bincount(nd[cpu_only] * slots + sock[cpu_only], w[cpu_only],
                          minlength=n * slots).reshape(n, slots)
        return out + np.bincount(nd[gpu_pod], w[gpu_pod], minlength=n)[:, None] * gpu_weights

    pod_cores = pods.cpu / 1000.0
    heavy = ph.memory_heaviness(pods.request_mem, pods.request_cpu)
    heavy_share = np.where(
        cores_used > 0, np.bincount(nd, heavy * pod_cores, minlength=n) / cores_used, 0.0)
    bw_pod = pod_cores * (BW_PER_CORE_LIGHT + (BW_PER_CORE_HEAVY - BW_PER_CORE_LIGHT) * heavy)
    local_cpu = cap_cpu / sockets
    util = ph.spill_to_free_sockets(per_socket(pods.cpu) / local_cpu[:, None], present)
    bw = np.where(present, np.minimum(
        per_socket(bw_pod) + BASE_BW_PER_SOCKET * powered[:, None], SOCKET_BW_PEAK), 0.0)
    return SocketUse(util=util, memory_mib=per_socket(pods.mem), bandwidth_bps=bw,
                     bandwidth_util=bw.sum(axis=1) / (sockets * SOCKET_BW_PEAK),
                     heavy_share=heavy_share)
