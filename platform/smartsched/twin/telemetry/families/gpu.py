"""GPU: per-device SM and memory activity, framebuffer, board power, clocks, PCIe/NVLink, ECC.

    rho        = node GPU use / node GPU allocation (0 if nothing allocated)
    SM util    = clip(allocated share (1000 - free)/1000 * rho, 0, 1)   per device
    SM active  = SM util * (0.55 + 0.35 * train), occupancy = active * (0.35 + 0.25 * train),
                 tensor = active * (0.2 + 0.4 * train),  train/infer = the node's share
                 of GPU use by training / inference pods
    copy util  = SM util * (0.3 + 0.2 * infer)
    FB used    = 300 MiB context + allocated share * (memory - reserved - 300 MiB)
                 * (0.55 + 0.4 * min(rho, 1))  on allocated devices; reserved =
                 max(1 % of memory, 256 MiB); free = memory - reserved - used
    power      = idle + (max - idle) * SM util    (the device model's watts, 0 off)
    SM clock   = 210 MHz + (boost - 210) * min(SM util / 0.05, 1) * (1 - 0.12 SM util)
    PCIe rx    = 25 GB/s * SM util * (0.04 + 0.25 infer + 0.06 train);
                 tx = rx * (0.3 + 0.3 infer)  (inference moves more)
    NVLink     = 300 GB/s * SM util * train * 0.4 each way, NVLink models with 2+ GPUs
    ECC, PCIe replays: rare events (3e-6 * (0.5 + SM util) single-bit, 3e-9
                 double-bit, 1e-4 * PCIe rx / 25 GB/s replays per second), drawn
                 from the seeded noise by the synthesizer

Heat for the thermal family (steady state over inlet air, before the 60 s lag):
die rise = 55 C * power / max power; HBM rise = 5 C + 0.6 * die rise + 15 C * copy util.
"""

from __future__ import annotations

from typing import Final, NamedTuple

import numpy as np

from smartsched.model.pod import POD_CLASS_IDS, PodClass
from smartsched.twin.telemetry.families.base import Columns, slot_mask

PCIE_BPS: Final = 25e9
NVLINK_BPS: Final = 300e9
GPU_TEMP_RISE_C: Final = 55.0  # above inlet at full board power
GPU_CONTEXT_MIB: Final = 300.0
SM_IDLE_MHZ: Final = 210.0
SM_BOOST_MHZ: Final = {"T4": 1590.0, "P100": 1480.0, "V100M16": 1530.0, "V100M32": 1530.0,
                       "A10": 1695.0, "A100": 1410.0, "H100": 1980.0, "L4": 2040.0}
SM_BOOST_DEFAULT_MHZ: Final = 1500.0
ECC_SBE_PER_S: Final = 3e-6
ECC_DBE_PER_S: Final = 3e-9
PCIE_REPLAY_PER_S: Final = 1e-4
_TRAIN, _INFER = POD_CLASS_IDS[PodClass.AI_TRAIN], POD_CLASS_IDS[PodClass.AI_INFER]


class GpuHeat(NamedTuple):
    """[N, G] steady-state temperature rise over the inlet air of each GPU die and its HBM."""

    die: np.ndarray
    hbm: np.ndarray


def sm_utilization(gpu_free: np.ndarray, gpu_count: np.ndarray, node_gpu: np.ndarray,
                   gpu_alloc: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per device: (SM utilization [N, slots], allocated share [N, slots], node rho [N]).

    ``gpu_free``: [N, G] free milli per device (``ClusterState.gpu_free``, G <= slots);
    ``node_gpu``: [N] milli the node's pods use; ``gpu_alloc``: [N] milli allocated.
    """
    n = gpu_count.shape[0]
    free = np.zeros((n, slots))
    free[:, : gpu_free.shape[1]] = gpu_free
    alloc_share = np.where(slot_mask(gpu_count, slots), (1000.0 - free) / 1000.0, 0.0)
    rho = np.where(gpu_alloc > 0, node_gpu / np.maximum(gpu_alloc, 1.0), 0.0)
    return np.clip(alloc_share * rho[:, None], 0.0, 1.0), alloc_share, rho


def board_power_w(sm: np.ndarray, idle_w: np.ndarray, max_w: np.ndarray,
                  powered: np.ndarray) -> np.ndarray:
    """[N, G] watts of each device: ``idle + (max - idle) * SM util``, 0 powered off."""
    idle, peak = idle_w[:, None], max_w[:, None]
    return powered[:, None] * (idle + (peak - idle) * sm)


def gpu_family(*, gpu_free: np.ndarray, gpu_count: np.ndarray, gpu_alloc: np.ndarray,
               node_gpu: np.ndarray, gpu_cls: np.ndarray, powered: np.ndarray,
               idle_w: np.ndarray, max_w: np.ndarray, memory_mib: np.ndarray,
               boost_mhz: np.ndarray, nvlink: np.ndarray,
               slots: int) -> tuple[Columns, GpuHeat]:
    """The GPU columns ([N, slots] per device) and the devices' heat.

    Per node [N]: ``gpu_count``, ``gpu_alloc`` (allocated milli), ``node_gpu`` (used
    milli), ``gpu_cls`` [N, classes] devices used by class, ``powered`` (1.0 unless
    off), per-device ``idle_w``/``max_w`` (``twin.power.PowerModel``), ``memory_mib``,
    ``boost_mhz``, ``nvlink`` (NVLink model with 2+ GPUs). ``gpu_free``: [N, G].
    """
    pw = powered
    sm, alloc_share, rho = sm_utilization(gpu_free, gpu_count, node_gpu, gpu_alloc, slots)
    used = np.maximum(gpu_cls.sum(axis=1), 1e-9)
    train = (gpu_cls[:, _TRAIN] / used)[:, None]
    infer = (gpu_cls[:, _INFER] / used)[:, None]
    active = sm * (0.55 + 0.35 * train)
    copy = sm * (0.3 + 0.2 * infer)
    total = memory_mib[:, None]
    reserved = np.maximum(0.01 * total, 256.0)
    fb_used = np.where(alloc_share > 0, GPU_CONTEXT_MIB + alloc_share * (
        total - reserved - GPU_CONTEXT_MIB) * (0.55 + 0.4 * np.minimum(rho, 1.0))[:, None],
        0.0)
    power = board_power_w(sm, idle_w, max_w, pw)
    peak = max_w[:, None]
    die_rise = GPU_TEMP_RISE_C * np.where(peak > 0, power / np.maximum(peak, 1e-9), 0.0)
    boost = boost_mhz[:, None]
    rx = PCIE_BPS * sm * (0.04 + 0.25 * infer + 0.06 * train)
    nv = NVLINK_BPS * sm * train * 0.4 * nvlink[:, None]
    return {
        "DCGM_FI_DEV_GPU_UTIL": 100.0 * sm,
        "DCGM_FI_PROF_SM_ACTIVE": active,
        "DCGM_FI_PROF_SM_OCCUPANCY": active * (0.35 + 0.25 * train),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": active * (0.2 + 0.4 * train),
        "DCGM_FI_DEV_MEM_COPY_UTIL": 100.0 * copy,
        "DCGM_FI_DEV_FB_USED": fb_used,
        "DCGM_FI_DEV_FB_FREE": total - reserved - fb_used,
        "DCGM_FI_DEV_POWER_USAGE": power,
        "DCGM_FI_DEV_SM_CLOCK": pw[:, None] * (
            SM_IDLE_MHZ + (boost - SM_IDLE_MHZ) * np.minimum(sm / 0.05, 1.0) * (1 - 0.12 * sm)),
        "DCGM_FI_PROF_PCIE_RX_BYTES": rx,
        "DCGM_FI_PROF_PCIE_TX_BYTES": rx * (0.3 + 0.3 * infer),
        "DCGM_FI_PROF_NVLINK_TX_BYTES": nv,
        "DCGM_FI_PROF_NVLINK_RX_BYTES": nv,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ECC_SBE_PER_S * (0.5 + sm),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": np.broadcast_to(ECC_DBE_PER_S * pw[:, None], sm.shape),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": PCIE_REPLAY_PER_S * rx / PCIE_BPS,
    }, GpuHeat(die=die_rise, hbm=5.0 + 0.6 * die_rise + 15.0 * copy)
