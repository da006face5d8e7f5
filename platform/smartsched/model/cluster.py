"""Cluster topology: sites (cloud regions and MEC edge sites), zones, racks and nodes.

Owns the static description of a cluster and its validation. A site carries
what placement trades off across locations: network latency, PUE, prices and
a carbon-intensity series. Nodes carry capacity, devices and scheduling
metadata. The twin compiles a ``ClusterSpec`` into numpy arrays; nothing here
changes over simulated time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from smartsched.model.carbon import CarbonSeries
from smartsched.model.errors import UnknownReferenceError, ValidationError
from smartsched.model.pod import Pod, check_int
from smartsched.model.resources import (
    DEVICE_MODELS,
    FPGA_MODEL_NAMES,
    GPU_MODEL_NAMES,
    MAX_DEVICES_PER_NODE,
    MAX_NODE_CPU_MILLI,
    MAX_NODE_MEMORY_MIB,
)
from smartsched.model.topology import NodeTopology, node_topology

SITE_KINDS: Final = ("cloud", "edge")
# Fibre round trip: about 1 ms per 100 km.
KM_PER_MS: Final = 100.0


# A Kubernetes taint as one string: key[=value][:Effect]. The key is a qualified name (an
# optional DNS-subdomain prefix and "/", then up to 63 name characters), the value a label
# value, the effect one of Kubernetes' three (absent: NoSchedule).
_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
TAINT_RE: Final = re.compile(
    rf"{_PREFIX}{_NAME}(?:=(?:{_NAME})?)?(?::(?:NoSchedule|PreferNoSchedule|NoExecute))?")


def check_taint(field_name: str, taint: object) -> None:
    """ValidationError naming ``field_name`` unless ``taint`` is ``key[=value][:Effect]``."""
    if not isinstance(taint, str) or len(taint) > 317 or not TAINT_RE.fullmatch(taint):
        raise ValidationError(field_name, "malformed taint: expected key[=value][:Effect], "
                              "Effect one of NoSchedule, PreferNoSchedule, NoExecute")


@dataclass(frozen=True, slots=True, eq=False)
class Site:
    """A cloud region or an MEC edge site.

    ``access_latency_ms`` is the latency from a client at the site to a node in
    it; distance between sites adds ``km / 100`` ms. Prices are USD per
    powered-on core-hour and GPU-hour; ``pue`` multiplies IT power.
    """

    name: str
    kind: str = "cloud"
    coords_km: tuple[float, float] = (0.0, 0.0)
    access_latency_ms: float = 5.0
    pue: float = 1.3
    price_core_hour: float = 0.04
    price_gpu_hour: float = 2.0
    carbon: CarbonSeries = field(default_factory=lambda: CarbonSeries.constant(400.0))

    def __post_init__(self) -> None:
        f = f"sites.{self.name}"
        if not self.name:
            raise ValidationError("sites.name", "must be non-empty")
        if self.kind not in SITE_KINDS:
            raise ValidationError(f"{f}.kind", f"{self.kind!r} is not one of {SITE_KINDS}")
        _positive(f"{f}.access_latency_ms", self.access_latency_ms, allow_zero=True)
        if not (1.0 <= self.pue <= 3.0):
            raise ValidationError(f"{f}.pue", f"must be within 1.0..3.0, got {self.pue}")
        _positive(f"{f}.price_core_hour", self.price_core_hour, allow_zero=True)
        _positive(f"{f}.price_gpu_hour", self.price_gpu_hour, allow_zero=True)

    def latency_ms_from(self, origin: Site) -> float:
        """Client latency from ``origin`` to a node in this site."""
        dx = self.coords_km[0] - origin.coords_km[0]
        dy = self.coords_km[1] - origin.coords_km[1]
        return self.access_latency_ms + math.hypot(dx, dy) / KM_PER_MS


@dataclass(frozen=True, slots=True)
class Zone:
    """An availability zone inside a site."""

    name: str
    site: str


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One machine. Capacity in millicores / MiB; devices are whole GPUs (1000 milli each)."""

    name: str
    cpu_milli: int
    memory_mib: int
    zone: str
    rack: str = "rack-0"
    num_gpu: int = 0
    gpu_model: str = ""
    num_fpga: int = 0
    fpga_model: str = ""
    sockets: int = 2
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[str, ...] = ()  # "key=value:NoSchedule" style; NoSchedule semantics
    unschedulable: bool = False
    idle_watts: float | None = None  # host without devices; default from size
    max_watts: float | None = None
    # Container images: disk kept for the image cache, and the registry pull bandwidth.
    image_disk_mib: int = 200 * 1024
    pull_mbps: float = 1000.0
    # Pods the node admits at once (the kubelet's allocatable "pods", 110 by default in
    # Kubernetes); 0: no limit (the twin's own clusters).
    max_pods: int = 0

    def __post_init__(self) -> None:
        f = f"nodes.{self.name}"
        if not self.name:
            raise ValidationError("nodes.name", "must be non-empty")
        check_int(f"{f}.cpu_milli", self.cpu_milli, 1, MAX_NODE_CPU_MILLI)
        check_int(f"{f}.memory_mib", self.memory_mib, 1, MAX_NODE_MEMORY_MIB)
        check_int(f"{f}.num_gpu", self.num_gpu, 0, MAX_DEVICES_PER_NODE)
        check_int(f"{f}.num_fpga", self.num_fpga, 0, MAX_DEVICES_PER_NODE)
        check_int(f"{f}.sockets", self.sockets, 1, 16)
        check_int(f"{f}.max_pods", self.max_pods, 0, 1_000_000)
        if self.num_gpu > 0 and not self.gpu_model:
            raise ValidationError(f"{f}.gpu_model", "required when num_gpu > 0 (one of "
                                  f"{', '.join(GPU_MODEL_NAMES)})")
        if self.num_gpu > 0 and self.gpu_model not in GPU_MODEL_NAMES:
            raise UnknownReferenceError(
                f"{f}.gpu_model",
                f"unknown GPU model {self.gpu_model!r} (known: {', '.join(GPU_MODEL_NAMES)})",
            )
        if self.num_gpu == 0 and self.gpu_model:
            raise ValidationError(f"{f}.gpu_model", "set but num_gpu is 0")
        if self.num_fpga == 0 and self.fpga_model:  # as for GPUs: a model of no device
            raise ValidationError(f"{f}.fpga_model", "set but num_fpga is 0")
        if self.num_fpga > 0 and not self.fpga_model:
            raise ValidationError(f"{f}.fpga_model", "required when num_fpga > 0 (one of "
                                  f"{', '.join(FPGA_MODEL_NAMES)})")
        if self.num_fpga > 0 and self.fpga_model not in FPGA_MODEL_NAMES:
            raise UnknownReferenceError(
                f"{f}.fpga_model", f"unknown FPGA model {self.fpga_model!r} "
                f"(known: {', '.join(FPGA_MODEL_NAMES)})")
        for t in self.taints:
            check_taint(f"{f}.taints", t)
        # A label a selector can never match (``edge: true`` is a bool, not "true"), or a
        # cordon written as text ("false" is truthy), would be wrong without a word.
        if not isinstance(self.labels, Mapping):
            raise ValidationError(f"{f}.labels", f"must be a mapping, got {self.labels!r}")
        for k, v in self.labels.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ValidationError(f"{f}.labels", f"keys and values must be strings "
                                      f"(quote them), got {k!r}: {v!r}")
        if not isinstance(self.unschedulable, bool):
            raise ValidationError(f"{f}.unschedulable",
                                  f"must be true or false, got {self.unschedulable!r}")
        for name in ("idle_watts", "max_watts"):
            w = getattr(self, name)
            if w is not None and (isinstance(w, bool) or not isinstance(w, int | float)
                                  or not 0 <= w <= 1e5):
                raise ValidationError(f"{f}.{name}", f"must be watts in [0, 1e5], got {w!r}")
        if (self.idle_watts is not None or self.max_watts is not None) \
                and self.host_idle_watts > self.host_max_watts:  # one given, the other implied
            raise ValidationError(f"{f}.idle_watts", f"{self.host_idle_watts:g} W exceeds "
                                  f"max_watts ({self.host_max_watts:g} W)")
        check_int(f"{f}.image_disk_mib", self.image_disk_mib, 0, 64 * 1024 * 1024)
        if isinstance(self.pull_mbps, bool) or not isinstance(self.pull_mbps, int | float) \
                or not 0 < self.pull_mbps <= 1e6:
            raise ValidationError(f"{f}.pull_mbps",
                                  f"must be a bandwidth in (0, 1e6] Mbit/s, got {self.pull_mbps!r}")

    @property
    def host_idle_watts(self) -> float:
        """Idle draw of the host without devices (about 1.5 W per core + 60 W base)."""
        if self.idle_watts is not None:
            return self.idle_watts
        return 60.0 + 1.5 * self.cpu_milli / 1000

    @property
    def host_max_watts(self) -> float:
        """Full-load draw of the host without devices (about 5 W per core + 100 W base)."""
        if self.max_watts is not None:
            return self.max_watts
        return 100.0 + 5.0 * self.cpu_milli / 1000

    def topology(self) -> NodeTopology:
        nvlink = self.num_gpu > 1 and DEVICE_MODELS[self.gpu_model].nvlink
        return node_topology(self.sockets, self.num_gpu, self.num_fpga, self.sockets, nvlink)


@dataclass(frozen=True, slots=True, eq=False)
class ClusterSpec:
    """A whole cluster: sites, zones and nodes, validated for consistency."""

    name: str
    sites: tuple[Site, ...]
    zones: tuple[Zone, ...]
    nodes: tuple[NodeSpec, ...]

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValidationError("nodes", "a cluster needs at least one node")
        site_names = _unique("sites", [s.name for s in self.sites])
        zone_names = _unique("zones", [z.name for z in self.zones])
        _unique("nodes", [n.name for n in self.nodes])
        for z in self.zones:
            if z.site not in site_names:
                raise UnknownReferenceError(f"zones.{z.name}.site", f"unknown site {z.site!r}")
        for n in self.nodes:
            if n.zone not in zone_names:
                raise UnknownReferenceError(f"nodes.{n.name}.zone", f"unknown zone {n.zone!r}")

    def site(self, name: str) -> Site:
        for s in self.sites:
            if s.name == name:
                return s
        raise UnknownReferenceError("site", f"unknown site {name!r}")

    def zone_site(self) -> dict[str, str]:
        return {z.name: z.site for z in self.zones}

    @property
    def total_cpu_milli(self) -> int:
        return sum(n.cpu_milli for n in self.nodes)

    @property
    def total_gpus(self) -> int:
        return sum(n.num_gpu for n in self.nodes)

    def validate_pods(self, pods: Sequence[Pod]) -> None:
        """Check pods against this cluster: unknown regions / origins, gangs larger than it.

        Raises ValidationError naming the field and the pod's row.
        """
        sites = {s.name for s in self.sites}
        total_cpu = self.total_cpu_milli
        total_mem = sum(n.memory_mib for n in self.nodes)
        total_gpu_milli = 1000 * self.total_gpus
        max_node_cpu = max(n.cpu_milli for n in self.nodes)
        gangs: dict[str, list[int]] = {}
        for row, p in enumerate(pods):
            for r in p.allowed_regions:
                if r not in sites:
                    raise UnknownReferenceError(
                        "allowed_regions", f"unknown region {r!r}", row=row, source=p.id
                    )
            if p.origin_site is not None and p.origin_site not in sites:
                raise UnknownReferenceError(
                    "origin_site", f"unknown site {p.origin_site!r}", row=row, source=p.id
                )
            if p.cpu_milli > max_node_cpu:
                raise ValidationError(
                    "cpu_milli",
                    f"{p.cpu_milli}m exceeds the largest node ({max_node_cpu}m)",
                    row=row,
                    source=p.id,
                )
            if p.gang_id:
                gangs.setdefault(p.gang_id, []).append(row)
        for gid, rows in gangs.items():
            members = [pods[r] for r in rows]
            size = members[0].gang_size
            if any(m.gang_size != size for m in members):
                raise ValidationError("gang_size", f"gang {gid!r} members disagree", row=rows[0])
            if len(members) != size:
                raise ValidationError(
                    "gang_size",
                    f"gang {gid!r} has {len(members)} members, gang_size says {size}",
                    row=rows[0],
                )
            need_cpu = sum(m.cpu_milli for m in members)
            need_mem = sum(m.memory_mib for m in members)
            need_gpu = sum(m.gpu_total_milli for m in members)
            if (
                size > len(self.nodes) * 1000
                or need_cpu > total_cpu
                or need_mem > total_mem
                or need_gpu > total_gpu_milli
            ):
                raise ValidationError(
                    "gang_size",
                    f"gang {gid!r} ({size} pods) is larger than the whole cluster",
                    row=rows[0],
                )


def _unique(field_name: str, names: Sequence[str]) -> set[str]:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise ValidationError(field_name, f"duplicate name {n!r}")
        seen.add(n)
    return seen


def _positive(field_name: str, value: float, allow_zero: bool = False) -> None:
    ok = isinstance(value, int | float) and math.isfinite(value)
    ok = ok and (value >= 0 if allow_zero else value > 0)
    if not ok:
        kind = "non-negative" if allow_zero else "positive"
        raise ValidationError(field_name, f"must be a {kind} number, got {value!r}")
