"""Memory: use, page cache, pressure and swap, bandwidth, NUMA locality.

    system     = 1.5 GiB + 1 % of the node (0 powered off)
    fraction   = (pods' memory + system) / node memory
    pressure   = ``saturation_loss(fraction, 0.85)``: 0 below 85 %, 1 when full
    swap       = ``saturation_loss(fraction, 0.90)`` (8 GiB per node, LimitedSwap):
                 swap-in 2000, swap-out 3000 pages/s at full swap pressure,
                 swap free = 8 GiB * (1 - 0.8 * swap pressure)
    major faults/s = 0.2 + 3000 * pressure (powered)
    page faults/s  = 500 + 100 * pods + 2000 * cores used + major faults
    PSI memory     = 0.6 * pressure waiting, 35 % of that stalled
    cached     = free room * (0.2 + 0.5 * min(disk reads / 200 MB/s, 1))
    dirty      = min(5 s of disk writes, 20 % of cached)
    available  = room - 20 % of cached; free = room - cached

Bandwidth per socket comes from the socket placement (``families.sockets``).
NUMA-remote ratio of a socket (nodes with 2+ sockets):

    3 % + 25 % * beyond + 90 % * own, at most 95 %
    beyond = the node's memory fraction beyond one socket's share
             (0 at 1/S, 1 when full)
    own    = share of the socket's own pods' memory beyond its local share
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from smartsched.twin.telemetry import physics as ph
from smartsched.twin.telemetry.families.base import MIB, Columns

SYSTEM_MEMORY_MIB: Final = 1536.0
SYSTEM_MEMORY_SHARE: Final = 0.01
SWAP_BYTES: Final = 8.0 * (1 << 30)
PRESSURE_ONSET: Final = 0.85
SWAP_ONSET: Final = 0.9
MAJOR_FAULTS_PER_S: Final = 3000.0
SWAP_IN_PER_S: Final = 2000.0
SWAP_OUT_PER_S: Final = 3000.0
NUMA_REMOTE_FLOOR: Final = 0.03
NUMA_REMOTE_MAX: Final = 0.95


@dataclass(frozen=True, slots=True, eq=False)
class MemoryPressure:
    """[N] how full each node's memory is, and what that costs (read by disk and CPU).

    Attributes:
        demand_mib: pods' memory + the system's, MiB (may exceed the node).
        fraction: ``demand_mib`` over node memory.
        pressure, swap_pressure: 0..1 from 85 % and 90 % use.
        major_faults, swap_in, swap_out: per second.
    """

    demand_mib: np.ndarray
    fraction: np.ndarray
    pressure: np.ndarray
    swap_pressure: np.ndarray
    major_faults: np.ndarray
    swap_in: np.ndarray
    swap_out: np.ndarray


def memory_pressure(node_mem: np.ndarray, cap_mem: np.ndarray,
                    powered: np.ndarray) -> MemoryPressure:
    """Pressure from the pods' memory use ``node_mem`` [N] MiB on nodes of ``cap_mem`` MiB."""
    sys_mem = powered * (SYSTEM_MEMORY_MIB + SYSTEM_MEMORY_SHARE * cap_mem)
    demand = node_mem + sys_mem
    frac = demand / cap_mem
    press = ph.saturation_loss(frac, PRESSURE_ONSET)
    swap_press = ph.saturation_loss(frac, SWAP_ONSET)
    return MemoryPressure(
        demand_mib=demand, fraction=frac, pressure=press, swap_pressure=swap_press,
        major_faults=powered * (0.2 + MAJOR_FAULTS_PER_S * press),
        swap_in=SWAP_IN_PER_S * swap_press, swap_out=SWAP_OUT_PER_S * swap_press,
    )


def numa_remote_ratio(fraction: np.ndarray, socket_mib: np.ndarray, cap_mem: np.ndarray,
                      sockets: np.ndarray, present: np.ndarray,
                      powered: np.ndarray) -> np.ndarray:
    """[N, S] share of each socket's memory accesses that go to another socket (0 on 1 socket)."""
    local_mem = (cap_mem / sockets)[:, None]
    one = 1.0 / sockets
    beyond = np.clip((fraction - one) / np.maximum(1.0 - one, 1e-9), 0.0, 1.0)[:, None]
    own = np.maximum(socket_mib - local_mem, 0.0) / np.maximum(socket_mib, 1.0)
    remote = np.minimum(NUMA_REMOTE_FLOOR + 0.25 * beyond + 0.9 * own, NUMA_REMOTE_MAX)
    return np.where((sockets[:, None] > 1) & present, remote * powered[:, None], 0.0)


def memory_family(pressure: MemoryPressure, *, cap_mem: np.ndarray, powered: np.ndarray,
                  pods_n: np.ndarray, cores_used: np.ndarray, disk_read_bps: np.ndarray,
                  disk_write_bps: np.ndarray, bandwidth_bps: np.ndarray,
                  socket_mib: np.ndarray, sockets: np.ndarray,
                  present: np.ndarray) -> Columns:
    """The memory columns of every node.

    ``cap_mem``: [N] MiB; ``powered``: [N] 1.0 unless off; ``pods_n``: [N] running
    pods; ``cores_used``: [N]; ``disk_read_bps``/``disk_write_bps``: [N] bytes/s
    over the node's disks; ``bandwidth_bps``, ``socket_mib``: [N, S] from the
    socket placement; ``sockets``: [N]; ``present``: [N, S].
    """
    p, pw = pressure, powered
    n = cap_mem.shape[0]
    used_mib = np.minimum(p.demand_mib, cap_mem)
    room = cap_mem - used_mib
    cached = pw * room * (0.2 + 0.5 * np.minimum(disk_read_bps / 200e6, 1.0))
    psi = pw * np.clip(0.6 * p.pressure, 0.0, 1.0)
    return {
        "node_memory_MemTotal_bytes": cap_mem * MIB,
        "smartsched_node_memory_used_bytes": used_mib * MIB,
        "node_memory_Cached_bytes": cached * MIB,
        "node_memory_Dirty_bytes": np.minimum(disk_write_bps * 5.0, 0.2 * cached * MIB),
        "node_memory_MemFree_bytes": (room - cached) * MIB,
        "node_memory_MemAvailable_bytes": (room - 0.2 * cached) * MIB,
        "node_memory_SwapTotal_bytes": np.full(n, SWAP_BYTES),
        "node_memory_SwapFree_bytes": SWAP_BYTES * (1.0 - 0.8 * p.swap_pressure),
        "node_vmstat_pgfault": pw * (500.0 + 100.0 * pods_n + 2000.0 * cores_used)
        + p.major_faults,
        "node_vmstat_pgmajfault": p.major_faults,
        "node_vmstat_pswpin": p.swap_in,
        "node_vmstat_pswpout": p.swap_out,
        "node_pressure_memory_waiting_seconds_total": psi,
        "node_pressure_memory_stalled_seconds_total": 0.35 * psi,
        "smartsched_node_memory_bandwidth_bytes_per_second": bandwidth_bps,
        "smartsched_node_memory_numa_remote_ratio": numa_remote_ratio(
            p.fraction, socket_mib, cap_mem, sockets, present, pw),
    }
