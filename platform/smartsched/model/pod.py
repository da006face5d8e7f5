"""Pods and jobs: what a workload asks of the cluster.

Owns the ``Pod`` record (requests, placement constraints, timing, gang, usage
profile) and its validation. Pure data: the twin turns pods into arrays, the
schedulers read them; nothing here knows about nodes or time stepping.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, TypeVar

from smartsched.model.errors import ValidationError
from smartsched.model.images import check_image
from smartsched.model.priority import PREEMPT_LOWER, PREEMPTION_POLICIES
from smartsched.model.resources import (
    GPU_MODEL_IDS,
    MAX_DEVICES_PER_NODE,
    MAX_NODE_CPU_MILLI,
    MAX_NODE_MEMORY_MIB,
    MILLI_PER_DEVICE,
)


class PodClass(StrEnum):
    """Workload classes; each gets its own latency percentiles in the report."""

    ONLINE = "online"  # latency-sensitive service
    BATCH = "batch"
    AI_TRAIN = "ai-train"
    AI_INFER = "ai-infer"
    EDGE_RT = "edge-rt"  # real-time pod from an MEC site


_E = TypeVar("_E", bound=StrEnum)

POD_CLASSES: Final = tuple(PodClass)
POD_CLASS_IDS: Final = {c: i for i, c in enumerate(POD_CLASSES)}


class UsageKind(StrEnum):
    """Shape of a pod's actual use over time, as a fraction of its request."""

    CONSTANT = "constant"
    DIURNAL = "diurnal"  # mean + amplitude * cos(2*pi*(hour - peak_hour)/24)
    BURSTY = "bursty"  # mean, with seeded bursts to burst_factor in some windows


USAGE_KINDS: Final = tuple(UsageKind)


@dataclass(frozen=True, slots=True)
class UsageProfile:
    """Actual use as a fraction of the request, so the twin reports usage, not only allocation.

    A fraction above 1.0 is allowed (Burstable pods use more than they request);
    that is how co-located pods come to contend for a node.
    """

    kind: UsageKind = UsageKind.CONSTANT
    mean: float = 0.6
    amplitude: float = 0.0
    peak_hour: float = 14.0
    burst_factor: float = 1.0
    burst_probability: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", _enum(UsageKind, self.kind, "usage.kind"))
        _check_range("usage.mean", self.mean, 0.0, 4.0)
        _check_range("usage.amplitude", self.amplitude, 0.0, 4.0)
        _check_range("usage.peak_hour", self.peak_hour, 0.0, 24.0)
        _check_range("usage.burst_factor", self.burst_factor, 0.0, 10.0)
        _check_range("usage.burst_probability", self.burst_probability, 0.0, 1.0)


@dataclass(frozen=True, slots=True)
class Pod:
    """One pod (or one member of a gang job).

    Resource units: ``cpu_milli`` millicores, ``memory_mib`` MiB, ``num_gpu``
    devices each with ``gpu_milli`` of 1000 (the Alibaba trace form: a share of
    one GPU when ``gpu_milli < 1000``, or several whole GPUs). Times are seconds
    from the start of the simulation; ``duration=None`` runs until the end.
    """

    id: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0
    num_fpga: int = 0
    pod_class: PodClass = PodClass.BATCH
    tenant: str = "default"
    priority: int = 0
    gpu_models: tuple[str, ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[str, ...] = ()
    allowed_regions: tuple[str, ...] = ()
    origin_site: str | None = None
    latency_slo_ms: float | None = None
    arrival: float = 0.0
    duration: float | None = None
    deadline: float | None = None
    gang_id: str | None = None
    gang_size: int = 1
    app: str | None = None
    traffic_mbps: float = 0.0
    # Best-effort: cpu and memory come from the slack that other pods requested
    # but do not use (Koordinator's batch resources), and are throttled first.
    best_effort: bool = False
    usage: UsageProfile = field(default_factory=UsageProfile)
    # Kubernetes' preemptionPolicy: "PreemptLowerPriority" or "Never" (model.priority).
    preemption_policy: str = PREEMPT_LOWER
    # Work is saved this often (training checkpoints): an evicted pod resumes from its last
    # checkpoint and loses only what it did since. None: it restarts from the beginning.
    checkpoint_interval_s: float | None = None
    # The container image and its layers (digest, MiB): pulled onto the node before the
    # pod starts, unless cached there (model.images). None: no image modelled.
    image: str | None = None
    image_layers: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValidationError("id", f"must be a non-empty string, got {self.id!r}")
        _check_names(self)
        object.__setattr__(self, "pod_class", _enum(PodClass, self.pod_class, "class"))
        check_int("cpu_milli", self.cpu_milli, 0, MAX_NODE_CPU_MILLI)
        check_int("memory_mib", self.memory_mib, 0, MAX_NODE_MEMORY_MIB)
        check_int("num_gpu", self.num_gpu, 0, MAX_DEVICES_PER_NODE)
        check_int("gpu_milli", self.gpu_milli, 0, MILLI_PER_DEVICE)
        check_int("num_fpga", self.num_fpga, 0, MAX_DEVICES_PER_NODE)
        if self.num_gpu > 0 and self.gpu_milli == 0:
            raise ValidationError("gpu_milli", "must be > 0 when num_gpu > 0")
        if self.num_gpu == 0 and self.gpu_milli > 0:
            raise ValidationError("num_gpu", "must be >= 1 when gpu_milli > 0")
        if self.num_gpu > 1 and self.gpu_milli != MILLI_PER_DEVICE:
            raise ValidationError(
                "gpu_milli", "a pod asking several GPUs must take whole GPUs (1000 milli each)"
            )
        if self.cpu_milli == 0 and self.memory_mib == 0 and self.num_gpu == 0:
            raise ValidationError("cpu_milli", "a pod must request some cpu, memory or gpu")
        for name in self.gpu_models:
            if name not in GPU_MODEL_IDS:
                raise ValidationError("gpu_models", f"unknown GPU model {name!r}")
        check_int("priority", self.priority, -(2**31), 2**31 - 1)
        _check_float("arrival", self.arrival, 0.0)
        if self.duration is not None:
            _check_float("duration", self.duration, 0.0)
        if self.deadline is not None:
            _check_float("deadline", self.deadline, 0.0)
            if self.deadline < self.arrival:
                raise ValidationError("deadline", "is before arrival")
        if self.latency_slo_ms is not None:
            _check_float("latency_slo_ms", self.latency_slo_ms, 0.0)
        check_int("gang_size", self.gang_size, 1, 100_000)
        if self.gang_size > 1 and not self.gang_id:
            raise ValidationError("gang_id", "required when gang_size > 1")
        _check_float("traffic_mbps", self.traffic_mbps, 0.0)
        if not isinstance(self.best_effort, bool):
            raise ValidationError("best_effort", f"must be true or false, got {self.best_effort!r}")
        if self.preemption_policy not in PREEMPTION_POLICIES:
            raise ValidationError("preemption_policy", f"must be one of {PREEMPTION_POLICIES}, "
                                  f"got {self.preemption_policy!r}")
        check_image(self.image, self.image_layers)
        if self.checkpoint_interval_s is not None:
            _check_float("checkpoint_interval_s", self.checkpoint_interval_s, 0.0)
            if self.checkpoint_interval_s <= 0:
                raise ValidationError("checkpoint_interval_s", "must be > 0 (or absent)")

    @property
    def gpu_total_milli(self) -> int:
        """GPU milli the pod takes in all (num_gpu * gpu_milli)."""
        return self.num_gpu * self.gpu_milli

    @property
    def is_gpu_share(self) -> bool:
        """True for a pod that takes a fraction of one GPU."""
        return self.num_gpu == 1 and self.gpu_milli < MILLI_PER_DEVICE


# Characters no name may hold: they end up in logs, reports, metric labels and answers
# (a NUL or a newline in a trace's pod name split a log line or a CSV row).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _check_names(pod: Pod) -> None:
    """Every name a pod carries is a string without control characters (a file's column
    of lists or numbers would otherwise reach the twin, which keys tenants, regions and
    labels by name)."""
    if not isinstance(pod.tenant, str) or not pod.tenant:
        raise ValidationError("tenant", f"must be a non-empty string, got {pod.tenant!r}")
    for name in ("origin_site", "app", "gang_id"):
        v = getattr(pod, name)
        if v is not None and not isinstance(v, str):
            raise ValidationError(name, f"must be a string, got {v!r}")
    for name in ("id", "tenant", "app", "gang_id"):
        v = getattr(pod, name)
        if v is not None and _CONTROL.search(v):
            raise ValidationError(name, f"must not hold control characters, got {v[:64]!r}")
    for name in ("gpu_models", "tolerations", "allowed_regions"):
        v = getattr(pod, name)
        if not isinstance(v, tuple | list) or not all(isinstance(x, str) for x in v):
            raise ValidationError(name, f"must be a list of strings, got {v!r}")
    for pair in pod.node_selector:
        if not isinstance(pair, tuple | list) or len(pair) != 2 or not all(
                isinstance(x, str) for x in pair):
            raise ValidationError("node_selector", f"must be key=value pairs, got {pair!r}")


def _enum(enum: type[_E], value: object, field_name: str) -> _E:
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(e.value for e in enum)
        raise ValidationError(field_name, f"{value!r} is not one of: {allowed}") from None


def check_int(field_name: str, value: object, low: int, high: int) -> None:
    """Raise ValidationError naming ``field_name`` unless ``value`` is an int in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field_name, f"must be an integer, got {value!r}")
    if value < low:
        raise ValidationError(field_name, f"must be >= {low}, got {value}")
    if value > high:
        raise ValidationError(field_name, f"is absurdly large (more than {high})")


def _check_float(field_name: str, value: object, low: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field_name, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValidationError(field_name, f"must be finite, got {value}")
    if value < low:
        raise ValidationError(field_name, f"must be >= {low}, got {value}")


def _check_range(field_name: str, value: object, low: float, high: float) -> None:
    _check_float(field_name, value, low)
    assert isinstance(value, int | float)
    if value > high:
        raise ValidationError(field_name, f"must be <= {high}, got {value}")
