"""Power and thermal: node power, energy, RAPL, inlet/outlet air, temperatures, fans.

    node power = the twin's power model (``twin.power.PowerModel.node_w``: idle
                 + host dynamic * CPU use + GPU dynamic * GPU use; 0 W powered
                 off), without noise; the energy counter integrates it
    RAPL       package = 60 % of the host's share per socket,
                 (host idle + host dynamic * socket util) / sockets;
                 DRAM = 4 W + 20 W * bandwidth / 150 GB/s    per socket
    inlet      = 20 C + up to 4 C per node (seeded) + 3 C * rack power / rack peak
    outlet     = inlet + 20 C * node power / node peak power
    package    = inlet + 0.35 C/W * package watts, 20 s lag
    GPU die    = inlet + die rise, HBM = inlet + HBM rise (0 powered off), 60 s lag
                 (rises from ``families.gpu``: full board power = inlet + 55 C)
    throttles  = 2/s per C of package above 90 C
    fans       = clip(0.25 + 0.75 * (hottest package or GPU - 45 C) / 40 C, 0.25, 1)

Lags are first-order (``physics.first_order_lag``) over simulated time; the
first sample starts at the steady state. A powered-off node relaxes to the
inlet air.
"""

from __future__ import annotations

from typing import Final, NamedTuple

import numpy as np

from smartsched.twin.power import PowerModel
from smartsched.twin.state import POWER_OFF
from smartsched.twin.telemetry import physics as ph
from smartsched.twin.telemetry.families.base import Columns
from smartsched.twin.telemetry.families.gpu import GpuHeat
from smartsched.twin.telemetry.families.sockets import SOCKET_BW_PEAK

INLET_BASE_C: Final = 20.0
INLET_SPREAD_C: Final = 4.0
RACK_HEAT_C: Final = 3.0
PKG_SHARE: Final = 0.6
PKG_C_PER_W: Final = 0.35
DRAM_IDLE_W: Final = 4.0
DRAM_DYN_W: Final = 20.0
OUTLET_RISE_C: Final = 20.0  # exhaust over inlet at full load
THROTTLE_C: Final = 90.0
TAU_CPU_S: Final = 20.0
TAU_GPU_S: Final = 60.0


class Temperatures(NamedTuple):
    """The lagged thermal state: [N, S] package, [N, G] GPU die and HBM, degrees C."""

    package: np.ndarray
    gpu: np.ndarray
    hbm: np.ndarray


def inlet_air_c(node_w: np.ndarray, max_w: np.ndarray, rack: np.ndarray,
                offset_c: np.ndarray) -> np.ndarray:
    """[N] inlet air: ``20 C + offset + 3 C * rack watts / rack peak watts``."""
    rack_w = np.bincount(rack, node_w)
    rack_max = np.bincount(rack, max_w)
    return INLET_BASE_C + offset_c + RACK_HEAT_C * (rack_w / rack_max)[rack]


def power_thermal_family(*, model: PowerModel, power_state: np.ndarray, cpu_util: np.ndarray,
                         gpu_util: np.ndarray, socket_util: np.ndarray,
                         bandwidth_bps: np.ndarray, sockets: np.ndarray,
                         socket_present: np.ndarray, gpu_present: np.ndarray, heat: GpuHeat,
                         rack: np.ndarray, inlet_offset_c: np.ndarray,
                         temps: Temperatures | None,
                         elapsed_s: float) -> tuple[Columns, Temperatures]:
    """The power and thermal columns, and the new temperatures.

    ``model``: the twin's power model; per node [N]: ``power_state``
    (``ClusterState.power``), ``cpu_util``/``gpu_util`` 0..1, ``sockets``, ``rack``
    index, ``inlet_offset_c``; [N, S]: ``socket_util``, ``bandwidth_bps``,
    ``socket_present``; [N, G]: ``gpu_present``; ``heat`` from ``gpu_family``.
    ``temps``: the previous temperatures (None on the first sample), moved over
    ``elapsed_s`` simulated seconds.
    """
    pw = (power_state != POWER_OFF).astype(np.float64)
    node_w = model.node_w(power_state, cpu_util, gpu_util)
    max_w = model.max_w
    host_s = np.where(socket_present, pw[:, None] * (
        model.host_idle_w[:, None] + model.host_dyn_w[:, None] * socket_util)
        / sockets[:, None], 0.0)
    pkg = PKG_SHARE * host_s
    inlet = inlet_air_c(node_w, max_w, rack, inlet_offset_c)
    steady = Temperatures(package=inlet[:, None] + PKG_C_PER_W * pkg,
                          gpu=inlet[:, None] + heat.die,
                          hbm=inlet[:, None] + heat.hbm * pw[:, None])
    if temps is None:
        new = steady
    else:
        new = Temperatures(
            package=ph.first_order_lag(temps.package, steady.package, elapsed_s, TAU_CPU_S),
            gpu=ph.first_order_lag(temps.gpu, steady.gpu, elapsed_s, TAU_GPU_S),
            hbm=ph.first_order_lag(temps.hbm, steady.hbm, elapsed_s, TAU_GPU_S))
    hottest = np.maximum(np.where(socket_present, new.package, -np.inf).max(axis=1),
                         np.where(gpu_present, new.gpu, -np.inf).max(axis=1))
    return {
        "smartsched_node_power_watts": node_w,
        "smartsched_node_energy_joules_total": node_w,
        "node_rapl_package_joules_total": pkg,
        "node_rapl_dram_joules_total": np.where(
            socket_present, pw[:, None] * DRAM_IDLE_W + DRAM_DYN_W * bandwidth_bps
            / SOCKET_BW_PEAK, 0.0),
        "smartsched_node_inlet_temp_celsius": inlet,
        "smartsched_node_outlet_temp_celsius": inlet + OUTLET_RISE_C * node_w / max_w,
        "node_hwmon_temp_celsius": new.package.copy(),
        "DCGM_FI_DEV_GPU_TEMP": new.gpu.copy(),
        "DCGM_FI_DEV_MEMORY_TEMP": new.hbm.copy(),
        "node_cpu_package_throttles_total": 2.0 * np.maximum(new.package - THROTTLE_C, 0.0),
        "smartsched_node_fan_duty_ratio": pw * np.clip(
            0.25 + 0.75 * (hottest - 45.0) / 40.0, 0.25, 1.0),
    }, new
