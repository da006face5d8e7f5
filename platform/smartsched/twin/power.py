"""The twin's one power model: watts per node from its hardware, power state and use.

Owns the per-node electrical figures (idle and dynamic watts of the host and
of its accelerators, from ``NodeSpec`` and the device catalogue) and the one
formula that turns use into watts. The metrics (energy, carbon, the power
time series) and the telemetry synthesizer (node power, RAPL, GPU board power,
temperatures) both read it, so "how much does this node draw" has one answer.

  node watts = idle                              if powered on or booting
             + host_dyn * cpu_util               if powered on
             + gpu_dyn  * gpu_util               if powered on
  idle       = host idle + gpus * device idle
  gpu_dyn    = gpus * (device max - device idle)
  0 W        when powered off

Utilizations are fractions of capacity in [0, 1]. Site PUE is applied by the
metrics, not here: this is what the node itself draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smartsched.model.cluster import ClusterSpec
from smartsched.model.resources import DEVICE_MODELS, GPU_MODEL_IDS, GPU_MODEL_NAMES
from smartsched.twin.state import POWER_OFF, POWER_ON


@dataclass(frozen=True, eq=False)
class PowerModel:
    """Per-node watts, vectorized over nodes ([N] arrays)."""

    host_idle_w: np.ndarray
    host_dyn_w: np.ndarray
    gpu_idle_w: np.ndarray  # one device's idle watts (0 without GPUs)
    gpu_max_w: np.ndarray  # one device's full-load watts
    gpu_count: np.ndarray

    @staticmethod
    def of(spec: ClusterSpec, gpu_model: np.ndarray, gpu_count: np.ndarray) -> PowerModel:
        """The model of ``spec``'s nodes; ``gpu_model`` ids and counts as in ClusterState."""
        idle = np.array([0.0] + [DEVICE_MODELS[m].idle_watts for m in GPU_MODEL_NAMES])
        peak = np.array([0.0] + [DEVICE_MODELS[m].max_watts for m in GPU_MODEL_NAMES])
        host_idle = np.array([n.host_idle_watts for n in spec.nodes], dtype=np.float64)
        host_max = np.array([n.host_max_watts for n in spec.nodes], dtype=np.float64)
        return PowerModel(host_idle, host_max - host_idle, idle[gpu_model], peak[gpu_model],
                          np.asarray(gpu_count))

    @staticmethod
    def of_spec(spec: ClusterSpec) -> PowerModel:
        """The model of ``spec``'s nodes without a ClusterState (the service's ranking)."""
        model = np.array([GPU_MODEL_IDS[n.gpu_model] if n.num_gpu else 0 for n in spec.nodes],
                         dtype=np.int16)
        return PowerModel.of(spec, model, np.array([n.num_gpu for n in spec.nodes]))

    @property
    def idle_w(self) -> np.ndarray:
        """[N] watts of a powered-on node doing nothing."""
        return self.host_idle_w + self.gpu_count * self.gpu_idle_w

    @property
    def gpu_dyn_w(self) -> np.ndarray:
        """[N] watts all of a node's GPUs add at full use."""
        return self.gpu_count * (self.gpu_max_w - self.gpu_idle_w)

    @property
    def max_w(self) -> np.ndarray:
        """[N] watts of a node at full use."""
        return self.idle_w + self.host_dyn_w + self.gpu_dyn_w

    def dynamic_w(self, power: np.ndarray, cpu_util: np.ndarray,
                  gpu_util: np.ndarray) -> np.ndarray:
        """[N] watts above idle: only powered-on nodes do work."""
        return np.where(power == POWER_ON, self.host_dyn_w * cpu_util + self.gpu_dyn_w * gpu_util,
                        0.0)

    def node_w(self, power: np.ndarray, cpu_util: np.ndarray, gpu_util: np.ndarray) -> np.ndarray:
        """[N] watts each node draws: idle while not off, plus its dynamic watts."""
        powered = (power != POWER_OFF).astype(np.float64)
        return powered * (self.idle_w + self.dynamic_w(power, cpu_util, gpu_util))
