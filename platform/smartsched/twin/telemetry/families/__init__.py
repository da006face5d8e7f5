"""The telemetry model, one pure function per metric family.

Each family maps plain numpy inputs to the catalogue columns it owns
(``base.Columns``) and, where it keeps lagged state (load averages,
temperatures), returns the new state instead of keeping it; none mutates its
inputs. ``TelemetrySynth.sample`` gathers the inputs from the twin, calls them
in dependency order (pods -> sockets -> memory pressure -> disk -> memory ->
network -> CPU -> GPU -> power/thermal) and assembles the vector.
"""

from smartsched.twin.telemetry.families.base import Columns
from smartsched.twin.telemetry.families.cpu import cpu_family
from smartsched.twin.telemetry.families.disk import disk_family
from smartsched.twin.telemetry.families.gpu import GpuHeat, gpu_family
from smartsched.twin.telemetry.families.memory import (
    MemoryPressure,
    memory_family,
    memory_pressure,
)
from smartsched.twin.telemetry.families.network import network_family, packets_per_second
from smartsched.twin.telemetry.families.pods import PodUse, pod_family, pod_use
from smartsched.twin.telemetry.families.sockets import SocketUse, gpu_socket_weights, socket_use
from smartsched.twin.telemetry.families.thermal import Temperatures, power_thermal_family

__all__ = [
    "Columns",
    "GpuHeat",
    "MemoryPressure",
    "PodUse",
    "SocketUse",
    "Temperatures",
    "cpu_family",
    "disk_family",
    "gpu_family",
    "gpu_socket_weights",
    "memory_family",
    "memory_pressure",
    "network_family",
    "packets_per_second",
    "pod_family",
    "pod_use",
    "power_thermal_family",
    "socket_use",
]
