"""Pure data: resources, cluster topology, pods and their validation."""

from smartsched.model.cluster import ClusterSpec, NodeSpec, Site, Zone
from smartsched.model.errors import (
    InfeasibleDecisionError,
    SmartSchedError,
    UnknownReferenceError,
    ValidationError,
)
from smartsched.model.pod import Pod, PodClass, UsageKind, UsageProfile

__all__ = [
    "ClusterSpec",
    "InfeasibleDecisionError",
    "NodeSpec",
    "Pod",
    "PodClass",
    "Site",
    "SmartSchedError",
    "UnknownReferenceError",
    "UsageKind",
    "UsageProfile",
    "ValidationError",
    "Zone",
]
