"""The resource vector and the catalogue of accelerator models.

Owns the fixed resource indices used by every numpy array in the project
(capacity[N, R], allocated[N, R], requests[P, R]) and the known device models
with their physical properties. Pure data: no twin or scheduling logic here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from smartsched.model.errors import UnknownReferenceError

# Resource vector indices. GPU is the total GPU milli (1000 per device); the
# per-device split lives in ClusterState.gpu_free.
CPU: Final = 0  # millicores
MEM: Final = 1  # MiB
GPU: Final = 2  # GPU milli, summed over devices
FPGA: Final = 3  # whole FPGA devices
RESOURCE_NAMES: Final = ("cpu", "memory", "gpu", "fpga")
NUM_RESOURCES: Final = len(RESOURCE_NAMES)
MILLI_PER_DEVICE: Final = 1000

# Upper bounds that catch unit mistakes (bytes given as MiB, cores as millicores x1000).
MAX_NODE_CPU_MILLI: Final = 4_096_000  # 4096 cores
MAX_NODE_MEMORY_MIB: Final = 64 * 1024 * 1024  # 64 TiB
MAX_DEVICES_PER_NODE: Final = 16


@dataclass(frozen=True, slots=True)
class DeviceModel:
    """An accelerator model: power draw and relative price.

    Power figures are board TDP-class numbers (W) used by the twin's energy model;
    ``memory_gib`` is device memory; ``price_factor`` scales a region's GPU-hour price.
    """

    name: str
    kind: str  # "gpu" or "fpga"
    memory_gib: float
    idle_watts: float
    max_watts: float
    price_factor: float = 1.0
    nvlink: bool = False


# G1/G2/G3 are undisclosed Alibaba GPU codes in the openb trace; their power is
# an assumption (mid-range datacenter GPUs), documented in docs/architecture.md.
_MODELS: Final[tuple[DeviceModel, ...]] = (
    DeviceModel("T4", "gpu", 16, 10, 70, 0.35),
    DeviceModel("P100", "gpu", 16, 30, 250, 0.6),
    DeviceModel("V100M16", "gpu", 16, 40, 300, 0.9, nvlink=True),
    DeviceModel("V100M32", "gpu", 32, 40, 300, 1.0, nvlink=True),
    DeviceModel("A10", "gpu", 24, 25, 150, 0.6),
    DeviceModel("A100", "gpu", 80, 55, 400, 1.6, nvlink=True),
    DeviceModel("H100", "gpu", 80, 70, 700, 2.6, nvlink=True),
    DeviceModel("L4", "gpu", 24, 12, 72, 0.4),
    DeviceModel("G1", "gpu", 16, 30, 250, 0.7),
    DeviceModel("G2", "gpu", 32, 40, 300, 0.9),
    DeviceModel("G3", "gpu", 32, 40, 300, 1.0),
    DeviceModel("VU9P", "fpga", 64, 20, 85, 0.8),
)
DEVICE_MODELS: Final[dict[str, DeviceModel]] = {m.name: m for m in _MODELS}
GPU_MODEL_NAMES: Final[tuple[str, ...]] = tuple(m.name for m in _MODELS if m.kind == "gpu")
FPGA_MODEL_NAMES: Final[tuple[str, ...]] = tuple(m.name for m in _MODELS if m.kind == "fpga")
# Index 0 is "no GPU" so an int array can hold a node's model id.
GPU_MODEL_IDS: Final[dict[str, int]] = {name: i + 1 for i, name in enumerate(GPU_MODEL_NAMES)}
NO_GPU_MODEL: Final = 0


def gpu_model_id(name: str, field: str = "gpu_model") -> int:
    """Id of a GPU model name; raise naming ``field`` if the model is unknown."""
    try:
        return GPU_MODEL_IDS[name]
    except KeyError:
        known = ", ".join(GPU_MODEL_NAMES)
        raise UnknownReferenceError(field, f"unknown GPU model {name!r} (known: {known})") from None


def gpu_model_name(model_id: int) -> str:
    """Inverse of :func:`gpu_model_id` ("" for no GPU)."""
    return "" if model_id == NO_GPU_MODEL else GPU_MODEL_NAMES[model_id - 1]
