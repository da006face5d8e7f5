"""HTTP schemas of the placement service (pydantic): what clients send and get back.

Owns the external contract of ``/v1/...``. A pod spec mirrors the model's
``Pod`` (same field names and units) and converts to it, so the service
validates exactly what the twin and the schedulers accept; a body that fails
gets a 422 naming the field. Bounds here are the model's bounds.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, StringConstraints

from smartsched.model.labels import DNS_SUBDOMAIN, MAX_SELECTOR_LABELS, label_problem
from smartsched.model.pod import Pod, PodClass
from smartsched.model.resources import (
    MAX_DEVICES_PER_NODE,
    MAX_NODE_CPU_MILLI,
    MAX_NODE_MEMORY_MIB,
    MILLI_PER_DEVICE,
)

Tier = Literal["cloud", "region", "edge"]
MAX_BATCH = 1000
# A reservation shorter than this expires before any client could confirm it (1e-320 s
# used to be placed, and gone at once).
MIN_TTL_S = 0.001

# Control characters (NUL, newlines, escapes), lone surrogates and the bidirectional
# controls (an RTL override makes a name read as another in a log or a terminal) have no
# place in a name, label or path, and break what they reach (file paths, logs, JSON
# answers, Kubernetes).
_NOT_TEXT = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff\u061c\u200e\u200f\u202a-\u202e"
                       r"\u2066-\u2069]")


# Beyond ASCII, also every invisible format character (zero-width spaces and joiners, the
# byte-order mark, soft hyphens: Unicode's Cf) and every space or separator but the
# ASCII space: "ba\u200bnk" or "a\u00a0b" read as "bank" and "a b" in a log, an audit
# record or a dashboard while naming something else.
_INVISIBLE = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp", "Zs"))
# ... and the letters and marks that draw nothing (Hangul fillers, the Braille blank, the
# combining grapheme joiner, Khmer's inherent vowels, Mongolian variation selectors).
_BLANK = frozenset("\u115f\u1160\u3164\uffa0\u2800\u034f\u17b4\u17b5"
                   "\u180b\u180c\u180d\u180f")


def _text(v: str) -> str:
    if _NOT_TEXT.search(v):
        raise ValueError("must not contain control characters, bidirectional controls or "
                         "lone surrogates")
    if not v.isascii() and any((unicodedata.category(c) in _INVISIBLE and c != " ")
                               or c in _BLANK for c in v):
        raise ValueError("must not contain invisible characters (zero-width, format "
                         "characters) or spaces other than the ASCII space")
    return v


Text = Annotated[str, AfterValidator(_text)]
# A name the service matches exactly (a region, a site, a GPU model): at most 253
# characters, a DNS name's longest.
Name = Annotated[str, StringConstraints(max_length=253), AfterValidator(_text)]
# Tenants as the service's configuration names them (``config._TENANT``): a tenant that
# merely looks like "bank" (another script's letters, upper case) is not bank.
# Tenant names, configured (serving.config) or on a pod.
TENANT_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


def _tenant(v: str) -> str:
    if not TENANT_NAME.fullmatch(v):
        raise ValueError("must be 1-63 lowercase letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit (as configured tenants are)")
    return v


TenantName = Annotated[str, AfterValidator(_tenant)]
# A request's idempotency key (its empty form said "at least 1 item", as for a list).
RequestId = Annotated[str, StringConstraints(min_length=1, max_length=128),
                      AfterValidator(_text)]


def _toleration(v: str) -> str:
    """A pod's toleration as the twin matches it: ``*`` (every taint), ``key``,
    ``key=value`` or a whole taint ``key[=value]:Effect`` (a malformed one was accepted and
    matched nothing)."""
    from smartsched.model.cluster import TAINT_RE

    if v != "*" and (len(v) > 317 or not TAINT_RE.fullmatch(v)):
        raise ValueError("malformed toleration: expected *, key, key=value or "
                         "key[=value]:Effect, Effect one of NoSchedule, PreferNoSchedule, "
                         "NoExecute")
    return v


Toleration = Annotated[str, AfterValidator(_text), AfterValidator(_toleration)]

# Kubernetes' own rules for what the node API registers: a node name is a DNS-1123
# subdomain (lowercase alphanumerics, '-' and '.'); a label key an optional DNS
# subdomain prefix and '/' then a name of at most 63 characters; a value the same
# characters, possibly empty. (Names like " ", "../x" or an RTL override would otherwise
# be stored, journaled and shown to every client.)


def _node_name(v: str) -> str:
    if len(v) > 253 or not DNS_SUBDOMAIN.fullmatch(v):
        raise ValueError("must be a DNS-1123 subdomain (lowercase letters, digits, '-' and "
                         "'.', starting and ending with a letter or digit), as Kubernetes "
                         "names nodes")
    return v


def _labels(v: dict[str, str] | None) -> dict[str, str] | None:
    for key, value in (v or {}).items():
        if (why := label_problem(key, value)) is not None:
            raise ValueError(why)
    return v


NodeName = Annotated[str, AfterValidator(_node_name)]
# Numbers and flags as JSON has them: ``true`` is not 1 and ``"100"`` not 100 (lax
# coercion would place a pod asking ``"cpu_milli": true`` with one millicore: a client
# bug answered with a silent wrong placement instead of a 422 naming the field). An
# integer is fine where a float is asked.
Int = Annotated[int, Strict()]
Num = Annotated[float, Strict()]
Flag = Annotated[bool, Strict()]


class PodSpec(BaseModel):
    """One pod, in the model's units (millicores, MiB, GPU milli of 1000 per device)."""

    id: Text = Field(min_length=1, max_length=253)
    cpu_milli: Int = Field(0, ge=0, le=MAX_NODE_CPU_MILLI)
    memory_mib: Int = Field(0, ge=0, le=MAX_NODE_MEMORY_MIB)
    num_gpu: Int = Field(0, ge=0, le=MAX_DEVICES_PER_NODE)
    gpu_milli: Int = Field(0, ge=0, le=MILLI_PER_DEVICE)
    num_fpga: Int = Field(0, ge=0, le=MAX_DEVICES_PER_NODE)
    pod_class: PodClass = Field(PodClass.BATCH, alias="class")
    tenant: TenantName = Field("default", description=(
        "1-63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"))
    priority: Int = Field(0, ge=-(2**31), le=2**31 - 1)
    gpu_models: list[Name] = Field(default_factory=list, max_length=32)
    # Label rules as the nodes' labels have them (a selector matches labels): a selector of
    # 64 values of 15,000 characters each was kept, with every pod a site was asked to
    # place, for the learner's experience -- ~1 MB a request in each region's memory.
    node_selector: Annotated[dict[Text, Text], AfterValidator(_labels)] = Field(
        default_factory=dict, max_length=MAX_SELECTOR_LABELS)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64)
    allowed_regions: list[Name] = Field(default_factory=list, max_length=64)
    origin_site: Name | None = None
    # allow_inf_nan=False: NaN was refused as "less than or equal to 1000000" (it is not
    # greater either); now "a finite number", as node usage is.
    latency_slo_ms: Num | None = Field(None, gt=0, le=1e6, allow_inf_nan=False)
    duration_s: Num | None = Field(None, gt=0, le=1e9, allow_inf_nan=False)
    # No '/': a tenant's gang ids are scoped as "<tenant>/<id>", and a shared-token
    # client naming "bank/g2" reached tenant bank's gang (and dropped its held room).
    gang_id: Text | None = Field(None, min_length=1, max_length=253, pattern=r"^[^/]+$")
    gang_size: Int = Field(1, ge=1, le=MAX_BATCH)  # a gang comes whole in one request
    app: Text | None = Field(None, min_length=1, max_length=253)

    # By its JSON name only (``class``): ``pod_class`` was accepted too, though the OpenAPI
    # document names ``class`` alone and forbids other fields (and ``class`` with
    # ``pod_class`` was a 422 calling ``pod_class`` extra).
    model_config = ConfigDict(extra="forbid")

    def to_pod(self, now: float) -> Pod:
        """The model's pod (its own checks apply: e.g. gpu_milli > 0 when num_gpu > 0)."""
        return Pod(
            id=self.id, cpu_milli=self.cpu_milli, memory_mib=self.memory_mib,
            num_gpu=self.num_gpu, gpu_milli=self.gpu_milli, num_fpga=self.num_fpga,
            pod_class=self.pod_class, tenant=self.tenant, priority=self.priority,
            gpu_models=tuple(self.gpu_models),
            node_selector=tuple(sorted(self.node_selector.items())),
            tolerations=tuple(self.tolerations), allowed_regions=tuple(self.allowed_regions),
            origin_site=self.origin_site, latency_slo_ms=self.latency_slo_ms, arrival=now,
            duration=self.duration_s, gang_id=self.gang_id, gang_size=self.gang_size,
            app=self.app,
        )


class PlacementRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: RequestId | None = Field(
        None, description="Idempotency key: a retry returns the same answer")
    pod: PodSpec
    # None: the service's configured default_ttl_s (a default of 60 here overrode it).
    ttl_s: Num | None = Field(None, ge=MIN_TTL_S, le=86_400, allow_inf_nan=False,
                              description="Reservation lifetime (default: the service's "
                              "default_ttl_s)")
    validate_: Flag = Field(False, alias="validate", description=(
        "Validate the placement in the twin's sandbox before it is made (the site's "
        "sandbox policy may validate it anyway)"))


class BatchPlacementRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: RequestId | None = None
    pods: list[PodSpec] = Field(min_length=1, max_length=MAX_BATCH)
    ttl_s: Num | None = Field(None, ge=MIN_TTL_S, le=86_400, allow_inf_nan=False,
                              description="Reservation lifetime (default: the service's "
                              "default_ttl_s)")
    validate_: Flag = Field(False, alias="validate", description=(
        "Validate the whole batch in the twin's sandbox before it is made"))


class StageReason(BaseModel):
    tier: Tier
    site: str
    outcome: Literal["placed", "escalated", "skipped", "full", "rejected", "queued"]
    reason: str
    # The filter plugins that rejected the pod at this stage (e.g. NodeResourcesFit).
    plugins: list[str] = Field(default_factory=list)


class Preempted(BaseModel):
    """A reservation released so that a higher-priority pod could be placed: its owner
    should evict these pods (the service no longer holds their room)."""

    reservation_id: str
    pod_ids: list[str]


class Validation(BaseModel):
    """The sandbox's verdict on the request this placement was part of."""

    accepted: bool
    kind: str
    reasons: list[str] = Field(default_factory=list)
    # figure -> {"with": value with the request, "without": value without it}
    figures: dict[str, dict[str, float]] = Field(default_factory=dict)
    horizon_s: float = 0.0
    arrivals: float = 0.0
    seconds: float = 0.0


class EscalationRef(BaseModel):
    """An escalation an MEC site could not make because its region was unreachable:
    ``queued`` (the pod is booked nowhere yet; retry with the same request id, or read
    ``GET /v1/admin/sites/{site}/escalations``), ``reconciled`` (this is the region's
    answer, given once it was back) or ``dropped`` (the queue was full: retry later with
    the same request id)."""

    id: str
    state: Literal["queued", "reconciled", "dropped"]


class GangRoom(BaseModel):
    """Room held for a gang that could not start (``service.gang_reservations``): on these
    nodes, due at ``due_at`` (epoch seconds: come back then), held until ``held_until``."""

    nodes: list[str]
    due_at: float
    held_until: float


class Placement(BaseModel):
    pod_id: str
    placed: bool
    region: str | None = None
    site: str | None = None
    zone: str | None = None
    node: str | None = None
    devices: list[int] = Field(default_factory=list)
    tier: Tier | None = None
    profile: str | None = None
    reservation_id: str | None = None
    expires_at: float | None = None
    reasons: list[StageReason] = Field(default_factory=list)
    preempted: list[Preempted] = Field(default_factory=list)
    validation: Validation | None = None
    escalation: EscalationRef | None = None
    gang_room: GangRoom | None = None


class PlacementResponse(BaseModel):
    request_id: str | None
    placements: list[Placement]


class NodeUsage(BaseModel):
    """Observed use of a node (fractions of capacity), e.g. from Prometheus."""

    model_config = ConfigDict(extra="forbid")
    cpu: Num = Field(ge=0, le=4, allow_inf_nan=False)
    memory: Num = Field(ge=0, le=4, allow_inf_nan=False)
    gpu: Num = Field(0.0, ge=0, le=4, allow_inf_nan=False)


class NodeUpdate(BaseModel):
    """A node to register, or changes to a known one.

    For a known node every field left out keeps its current value (so reporting usage,
    or cordoning, does not reset its rack, devices or power model); a new node needs
    ``cpu_milli`` and ``memory_mib`` and gets the model's defaults for the rest. Field
    names and units are the model's ``NodeSpec``.
    """

    model_config = ConfigDict(extra="forbid")
    name: NodeName = Field(min_length=1, max_length=253)
    site: Text = Field(min_length=1, max_length=253)
    zone: Text | None = Field(None, min_length=1, max_length=253)
    rack: Text | None = Field(None, min_length=1, max_length=253)
    cpu_milli: Int | None = Field(None, ge=1, le=MAX_NODE_CPU_MILLI)
    memory_mib: Int | None = Field(None, ge=1, le=MAX_NODE_MEMORY_MIB)
    num_gpu: Int | None = Field(None, ge=0, le=MAX_DEVICES_PER_NODE)
    gpu_model: Text | None = Field(None, max_length=64)
    num_fpga: Int | None = Field(None, ge=0, le=MAX_DEVICES_PER_NODE)
    fpga_model: Text | None = Field(None, max_length=64)
    sockets: Int | None = Field(None, ge=1, le=16)
    labels: Annotated[dict[Text, Text] | None, AfterValidator(_labels)] = Field(
        None, max_length=128)
    taints: list[Text] | None = Field(None, max_length=64)
    unschedulable: Flag | None = None
    idle_watts: Num | None = Field(None, ge=0, le=1e5, allow_inf_nan=False)
    max_watts: Num | None = Field(None, ge=0, le=1e5, allow_inf_nan=False)
    image_disk_mib: Int | None = Field(None, ge=0, le=64 * 1024 * 1024)
    pull_mbps: Num | None = Field(None, gt=0, le=1e6, allow_inf_nan=False)
    max_pods: Int | None = Field(None, ge=0, le=1_000_000)  # 0: no limit
    usage: NodeUsage | None = None

    def changes(self) -> dict[str, object]:
        """The node fields this update sets (not name, site or usage)."""
        out = self.model_dump(exclude_unset=True, exclude={"name", "site", "usage"})
        return {k: v for k, v in out.items() if v is not None}


class NodesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: list[NodeUpdate] = Field(min_length=1, max_length=10_000)


class Autonomy(BaseModel):
    """An MEC site's link to its region, as the site sees it."""

    region_reachable: bool
    queued_escalations: int
    queued_pods: int


class GreenTerms(BaseModel):
    """The site's GreenScore now (0..1, 1 greenest) and its three terms: 1/PUE, the grid's
    renewable share (from its generation mix, or estimated from intensity), and its
    nodes' work per watt relative to full load (from reported usage, else bookings)."""

    score: float
    pue_share: float
    renewable_share: float
    efficiency: float
    use_from: Literal["usage", "allocation"]


class SiteSummary(BaseModel):
    site: str
    tier: Tier
    nodes: int
    cpu_free_pct: float
    memory_free_pct: float
    gpu_free_pct: float
    gpus_total: int
    reservations: int
    profile: str
    autonomy: Autonomy | None = None
    green: GreenTerms | None = None


class RegionSummary(SiteSummary):
    edge_sites: list[SiteSummary] = Field(default_factory=list)


class ProfileUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    profile: Text = Field(min_length=1, max_length=1024,
                         description="A profile name, a profile YAML path or rl:<policy path>")
