"""CPU: per-socket utilization, run queue and load averages, caches, IPC, clocks, PSI.

``demand`` d is the node's CPU use over its capacity (above 1 when pods burst
past it), u = min(d, 1); per-socket utilization comes from the socket
placement (``families.sockets``).

    run queue   = rint(1 + cores*min(d,1) + 2*u'/(1-u') + cores*max(d-1, 0)),
                  u' = min(d, 0.98) (``physics.run_queue_length``): it grows
                  sharply above ~90 %
    blocked     = rint(0.5 * disk queue depth + 10 * memory pressure)
    load 1/5/15 = exponential averages (60/300/900 s of simulated time) of
                  running + blocked; the first sample starts them at the target
    PSI cpu     = clip(0.02 * u'/(1-u') + max(d - 1, 0), 0, 1)
    run-queue latency (p50, p99) = (2 us, 50 us) * (1 + u'/(1-u')) * (1 + 4 max(d-1, 0))
    cache hits  = ``physics.cache_hit_ratios``: fall with pressure = 0.6 * share
                  of CPU use by memory-heavy pods + 0.4 * bandwidth utilization
                  (L1 > L2 > L3 always)
    IPC         = (0.5 + 1.8 * L3 hit) * (1 - 0.2 * socket util)
    clock       = 3.4 GHz idle -> 2.6 GHz all-core, linear in socket util
    LLC misses  = instructions * 0.3 * (1-L1)(1-L2)(1-L3),
                  instructions = IPC * clock * socket util * cores per socket
    context switches = 800 + 600 * pods + 4000 * cores used + 0.2 * packets
    interrupts  = 1500 + 1500 * cores used + packets / 32 + disk IOPS
    forks       = 0.3 + 0.15 * pods
    iowait      = (1 - u) * min(0.5, 0.5 * mean disk busy + 0.3 * PSI io)
    system      = 0.005 + u * (0.08 + 0.1 * min(packets / 1e6, 1))

Task counts and rates scale with ``powered`` (0 on a powered-off node, whose
other gauges the synthesizer zeroes).
"""

from __future__ import annotations

from typing import Final

import numpy as np

from smartsched.twin.telemetry import physics as ph
from smartsched.twin.telemetry.families.base import Columns

CPU_TURBO_HZ: Final = 3.4e9
CPU_ALLCORE_HZ: Final = 2.6e9
LOAD_TAUS_S: Final = (60.0, 300.0, 900.0)
RUNQ_LATENCY_BASE_S: Final = np.array([2e-6, 50e-6])  # catalogue.QUANTILES
LLC_MISS_SCALE: Final = 0.3


def load_averages(prev: np.ndarray | None, tasks: np.ndarray, elapsed_s: float) -> np.ndarray:
    """[N, 3] load1/5/15: ``prev`` moved towards ``tasks`` [N]; ``tasks`` itself if no ``prev``."""
    out = np.empty((tasks.shape[0], len(LOAD_TAUS_S)))
    for j, tau in enumerate(LOAD_TAUS_S):
        out[:, j] = tasks if prev is None else ph.first_order_lag(prev[:, j], tasks, elapsed_s,
                                                                   tau)
    return out


def cpu_family(*, cores: np.ndarray, demand: np.ndarray, socket_util: np.ndarray,
               sockets: np.ndarray, heavy_share: np.ndarray, bandwidth_util: np.ndarray,
               mem_pressure: np.ndarray, powered: np.ndarray, pods_n: np.ndarray,
               cores_used: np.ndarray, packets: np.ndarray, disk_queue: np.ndarray,
               disk_iops: np.ndarray, disk_busy: np.ndarray, io_pressure: np.ndarray,
               load: np.ndarray | None, elapsed_s: float) -> tuple[Columns, np.ndarray]:
    """The CPU columns and the new load averages [N, 3].

    Per node [N]: ``cores`` capacity, ``demand`` use / capacity, ``sockets``,
    ``heavy_share`` and ``bandwidth_util`` (socket placement), ``mem_pressure``
    0..1, ``powered`` 1.0 unless off, ``pods_n``, ``cores_used``, ``packets``/s,
    ``disk_queue`` (outstanding I/Os), ``disk_iops``, ``disk_busy`` (mean device
    utilization), ``io_pressure`` (PSI io waiting). ``socket_util``: [N, S].
    ``load``: the previous load averages (None on the first sample), moved over
    ``elapsed_s`` simulated seconds.
    """
    pw, d = powered, demand
    u = np.minimum(d, 1.0)
    running = pw * np.rint(1.0 + ph.run_queue_length(cores, d))
    blocked = pw * np.rint(0.5 * disk_queue + 10.0 * mem_pressure)
    new_load = load_averages(load, running + blocked, elapsed_s)
    qf = ph.queueing_factor(d)
    over = 1.0 + 4.0 * np.maximum(d - 1.0, 0.0)
    hit = ph.cache_hit_ratios(heavy_share, bandwidth_util)
    ipc = ph.instructions_per_cycle(hit[:, 2:3], socket_util)
    freq = CPU_TURBO_HZ - (CPU_TURBO_HZ - CPU_ALLCORE_HZ) * socket_util
    miss = LLC_MISS_SCALE * (1 - hit[:, 0]) * (1 - hit[:, 1]) * (1 - hit[:, 2])
    instr = ipc * freq * socket_util * (cores / sockets)[:, None]
    return {
        "smartsched_node_cpu_utilization_ratio": socket_util,
        "node_procs_running": running,
        "node_procs_blocked": blocked,
        "node_load1": new_load[:, 0].copy(),
        "node_load5": new_load[:, 1].copy(),
        "node_load15": new_load[:, 2].copy(),
        "node_context_switches_total": pw * (800.0 + 600.0 * pods_n + 4000.0 * cores_used
                                             + 0.2 * packets),
        "node_intr_total": pw * (1500.0 + 1500.0 * cores_used + packets / 32.0 + disk_iops),
        "node_forks_total": pw * (0.3 + 0.15 * pods_n),
        "node_pressure_cpu_waiting_seconds_total": pw * np.clip(
            0.02 * (qf - 1.0) + np.maximum(d - 1.0, 0.0), 0.0, 1.0),
        "smartsched_node_cpu_runqueue_latency_seconds": (
            RUNQ_LATENCY_BASE_S[None, :] * (qf * over)[:, None]),
        "smartsched_node_cpu_cache_hit_ratio": hit,
        "smartsched_node_cpu_instructions_per_cycle": ipc,
        "smartsched_node_cpu_frequency_hertz": freq,
        "smartsched_node_cpu_llc_misses_total": instr * miss[:, None],
        "smartsched_node_cpu_iowait_ratio": (1.0 - u) * np.minimum(
            0.5, 0.5 * disk_busy + 0.3 * io_pressure),
        "smartsched_node_cpu_system_ratio": pw * (
            0.005 + u * (0.08 + 0.1 * np.minimum(packets / 1e6, 1.0))),
    }, new_load
