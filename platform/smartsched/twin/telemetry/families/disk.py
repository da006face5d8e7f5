"""Disk: I/O rates per device, service and wait times, I/O pressure.

Two NVMe devices per node: ``nvme0n1`` (OS, logs, images, swap) and
``nvme1n1`` (scratch, datasets).

    small reads/s  = 5 + 8 * pods (powered) + major faults + swap-in / 8     (16 KiB)
    large reads/s  = 150 * training pods (powered)                          (256 KiB)
    writes/s       = 10 + 12 * pods (powered) + swap-out / 8                 (32 KiB)
    split          small I/O 65 % / 35 %, large reads 10 % / 90 % over the two devices
    service time   read 80 us + mean size / 3 GB/s, write 20 us + 32 KiB / 2 GB/s
    utilization    rho = min(reads * read service + writes * write service, 0.98)
    await          = service * (1 + rho / (1 - rho))
    queue depth    = reads * read await + writes * write await   (Little's law)
    PSI io         = clip(0.5 * busiest device's rho + 0.3 * memory pressure, 0, 1)
                     waiting (powered), 30 % of that stalled
"""

from __future__ import annotations

from typing import Final

import numpy as np

from smartsched.twin.telemetry import physics as ph
from smartsched.twin.telemetry.families.base import KIB, Columns

DISK_SPLIT_SMALL: Final = np.array([0.65, 0.35])  # logs, images, swap: mostly the OS disk
DISK_SPLIT_LARGE: Final = np.array([0.1, 0.9])  # dataset reads: mostly the scratch disk
TRAIN_READ_IOPS: Final = 150.0
SMALL_READ_BYTES: Final = 16 * KIB
LARGE_READ_BYTES: Final = 256 * KIB
WRITE_BYTES: Final = 32 * KIB
NVME_READ_S: Final = 80e-6
NVME_WRITE_S: Final = 20e-6
NVME_READ_BPS: Final = 3e9
NVME_WRITE_BPS: Final = 2e9


def _pad(x: np.ndarray, width: int) -> np.ndarray:
    out = np.zeros(width)
    out[: min(width, x.size)] = x[:width]
    return out


@np.errstate(divide="ignore", invalid="ignore")
def disk_family(*, powered: np.ndarray, pods_n: np.ndarray, train_pods: np.ndarray,
                major_faults: np.ndarray, swap_in: np.ndarray, swap_out: np.ndarray,
                mem_pressure: np.ndarray, slots: int) -> Columns:
    """The disk columns: [N, slots] per device, PSI io per node.

    ``powered``: [N] 1.0 unless off; ``pods_n``, ``train_pods``: [N] running pods,
    all and AI training; ``major_faults``, ``swap_in``, ``swap_out``: [N] per second
    and ``mem_pressure`` [N] 0..1 (``families.memory.memory_pressure``).
    """
    pw = powered
    small_r = pw * (5.0 + 8.0 * pods_n) + major_faults + swap_in / 8.0
    large_r = pw * TRAIN_READ_IOPS * train_pods
    small_w = pw * (10.0 + 12.0 * pods_n) + swap_out / 8.0
    split_s = _pad(DISK_SPLIT_SMALL, slots)[None, :]
    split_l = _pad(DISK_SPLIT_LARGE, slots)[None, :]
    rd = small_r[:, None] * split_s + large_r[:, None] * split_l
    rd_bytes = (small_r[:, None] * split_s * SMALL_READ_BYTES
                + large_r[:, None] * split_l * LARGE_READ_BYTES)
    wr = small_w[:, None] * split_s
    s_r = NVME_READ_S + np.where(rd > 0, rd_bytes / rd, 0.0) / NVME_READ_BPS
    s_w = NVME_WRITE_S + WRITE_BYTES / NVME_WRITE_BPS
    rho = np.minimum(rd * s_r + wr * s_w, ph.U_CAP)
    qf = ph.queueing_factor(rho)
    await_r, await_w = s_r * qf, s_w * qf
    depth = rd * await_r + wr * await_w
    psi = pw * np.clip(0.5 * rho.max(axis=1) + 0.3 * mem_pressure, 0.0, 1.0)
    return {
        "node_disk_reads_completed_total": rd,
        "node_disk_writes_completed_total": wr,
        "node_disk_read_bytes_total": rd_bytes,
        "node_disk_written_bytes_total": wr * WRITE_BYTES,
        "node_disk_io_time_seconds_total": rho,
        "node_disk_read_time_seconds_total": rd * await_r,
        "node_disk_write_time_seconds_total": wr * await_w,
        "node_disk_io_time_weighted_seconds_total": depth,
        "node_disk_io_now": depth,
        "node_pressure_io_waiting_seconds_total": psi,
        "node_pressure_io_stalled_seconds_total": 0.3 * psi,
    }
