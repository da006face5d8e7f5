"""A twin snapshot from Kubernetes objects: Nodes -> ClusterSpec/State, Pods -> model Pods.

Owns reading the real API's objects (the JSON form ``kubectl get -o json``
prints, or the client's ``V1Node`` / ``V1Pod``, converted to it) into the
twin's types, so the same profiles decide for a real cluster:

* quantities as Kubernetes writes them (``500m``, ``2Gi``, ``1e3``; what the API server
  would refuse is refused), a pod's requests rounded up to millicores and MiB (as
  kube-scheduler rounds up), a node's allocatable down;
* GPUs: ``nvidia.com/gpu`` (whole devices), the Alibaba GPU-sharing convention
  (node ``alibabacloud.com/gpu-count`` and label ``alibabacloud.com/gpu-card-model``;
  pod annotations ``alibabacloud.com/gpu-milli`` and ``gpu-count``), and the old
  ``alpha.kubernetes.io/nvidia-gpu``; the model from the card-model or
  ``nvidia.com/gpu.product`` label, mapped onto the device catalogue;
* zones and regions from ``topology.kubernetes.io/{zone,region}`` (or the
  ``failure-domain.beta`` labels); taints (NoSchedule / NoExecute), labels,
  ``spec.unschedulable``;
* pods: container requests (init containers as kube counts them), node
  selector and required node affinity (``In`` with one value -> a selector
  term), tolerations, priority, gang from the Coscheduling pod-group label and
  min-member annotation; pods already bound (``spec.nodeName``, not finished)
  are allocated on their node; one that does not fit it (its allocatable shrank,
  its GPUs went away) or whose devices cannot be read takes what room the node
  has left, so nothing more is bound onto a node already over its allocatable.

A malformed object is skipped and its reason recorded in ``Snapshot.skipped``
(and logged), never a crash.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Any

from smartsched.k8s.names import name_problem
from smartsched.model.cluster import ClusterSpec, NodeSpec, Site, Zone
from smartsched.model.errors import InfeasibleDecisionError, SmartSchedError, ValidationError
from smartsched.model.labels import MAX_SELECTOR_LABELS, label_problem
from smartsched.model.pod import Pod, PodClass
from smartsched.model.resources import (
    GPU_MODEL_NAMES,
    MAX_DEVICES_PER_NODE,
    MAX_NODE_CPU_MILLI,
    MAX_NODE_MEMORY_MIB,
    MILLI_PER_DEVICE,
)
from smartsched.twin.state import ClusterState

log = logging.getLogger(__name__)

ZONE_LABELS = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")
REGION_LABELS = ("topology.kubernetes.io/region", "failure-domain.beta.kubernetes.io/region")
GPU_MODEL_LABELS = ("alibabacloud.com/gpu-card-model", "nvidia.com/gpu.product")
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
POD_GROUP_LABEL_OLD = "pod-group.scheduling.sigs.k8s.io"
MIN_MEMBER_ANNOTATION = "scheduling.x-k8s.io/min-member"
# The most members a pod group may ask for (a larger number is a typo: it would wait for ever).
MAX_GANG_SIZE = 10_000
CLASS_LABEL = "smartsched.io/class"
# How long a pod is expected to run once started (seconds): what gang reservations plan
# on (a bound pod with it leaves at its start time plus this; without it, never).
DURATION_ANNOTATION = "smartsched.io/expected-duration-seconds"
MAX_DURATION_S = 10 * 365 * 86_400.0
MIB = 1 << 20


# Larger than any real quantity (bytes of memory included): beyond it a value is absurd, and
# turning a huge Decimal such as "1e400000" into an int would take seconds.
MAX_QUANTITY = Decimal(10) ** 18


# Kubernetes' quantity grammar (apimachinery resource.Quantity): a signed decimal, then a
# binary suffix, a decimal suffix or an integer exponent. The client's parser is looser
# (Python's Decimal also reads " 8", "8_0", "NaN", Arabic-Indic digits, "1K"): what the API
# server would refuse must be refused here too, not read as some number.
_QUANTITY = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
                       r"(?:[eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?")


def _q(value: Any, what: str) -> Decimal:
    """A resource quantity ("500m", "4Gi", 2); ValueError naming ``what`` if it is not one
    (as Kubernetes writes them), is negative, or is absurdly large."""
    from kubernetes.utils.quantity import parse_quantity

    if isinstance(value, bool) or not isinstance(value, str | int | float | Decimal) or (
            isinstance(value, str) and (len(value) > 64 or not _QUANTITY.fullmatch(value))):
        raise ValueError(f"{what}: not a quantity: {str(value)[:32]!r}")
    if isinstance(value, float):  # as written (0.1 is "0.1", not 0.1000000000000000055...)
        value = repr(value)
    try:
        q = parse_quantity(value)
    except (ValueError, TypeError, ArithmeticError) as e:
        raise ValueError(f"{what}: bad quantity {str(value)[:32]!r} ({e})") from None
    if not q.is_finite() or q < 0 or q > MAX_QUANTITY:
        raise ValueError(f"{what}: {str(value)[:32]!r} is negative or absurdly large")
    return q


def _milli(q: Decimal) -> int:
    """Millicores of a requested cpu quantity, rounded up as kube-scheduler's
    ``MilliValue`` does: 1.5m counted as 1m would let pods overbook a node."""
    return int((q * 1000).to_integral_value(rounding=ROUND_CEILING))


def _mib(q: Decimal) -> int:
    """MiB of a requested memory quantity in bytes, rounded up: the twin counts MiB, and a
    request of "1.5Mi" (or "100M") counted down would let pods overbook a node that
    kube-scheduler and the kubelet count in bytes. (A node's allocatable rounds down.)"""
    return int((q / MIB).to_integral_value(rounding=ROUND_CEILING))


def _whole(q: Decimal, what: str) -> int:
    """A count of devices (a GPU request, the GPU-sharing annotations): ValueError naming
    ``what`` unless whole, as the API server requires of extended resources (1.5 GPUs
    read as 1 would bind a pod onto a node one device short)."""
    if q != q.to_integral_value():
        raise ValueError(f"{what}: must be a whole number")
    return int(q)


def _mapping(obj: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    """``obj[key]`` as a mapping (absent or null: empty); ValueError naming ``where``."""
    v = obj.get(key)
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ValueError(f"{where}: must be an object, got {type(v).__name__}")
    return v


def _string_map(obj: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    """``obj[key]`` as Kubernetes has labels: non-empty string keys to string values (a
    whole number or a boolean, as a hand-written YAML list leaves them unquoted, as its
    text); else a ValueError naming ``where``. (Any value was turned into text: a label
    ``{"k": null}`` read as "None", and a pod selecting ``k: "None"`` passed the node.)"""
    out = {}
    for k, v in _mapping(obj, key, where).items():
        if isinstance(v, bool):  # a hand-written YAML list's unquoted ``true``
            v = "true" if v else "false"
        elif isinstance(v, int):  # ... or ``8``: the text it stands for
            v = str(v)
        if not isinstance(k, str) or not k or not isinstance(v, str):
            raise ValueError(f"{where}: each must map a non-empty string to a string")
        out[k] = v
    return out


def _list_of_mappings(obj: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    v = obj.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(x, Mapping) for x in v):
        raise ValueError(f"{where}: must be a list of objects")
    return v


def gpu_model(raw: str | None) -> str | None:
    """A card-model label ("V100", "Tesla-V100-SXM2-32GB", "NVIDIA-A100-SXM4-40GB") in the
    device catalogue's names, or None when it is not one we model."""
    if not raw:
        return None
    s = raw.upper().replace("_", "-")
    if "V100" in s:
        return "V100M32" if "32" in s else "V100M16"
    # Whole tokens (a variant letter allowed: A10G is an A10), never substrings: an L40S
    # is not an L4, an A40 not an A4-anything.
    tokens = re.split(r"[-\s/]+", s)
    for name in sorted(GPU_MODEL_NAMES, key=len, reverse=True):
        n = name.upper()
        if any(t == n or (len(t) == len(n) + 1 and t.startswith(n) and t[-1].isalpha())
               for t in tokens):
            return name
    return None


def to_plain(obj: Any) -> dict[str, Any]:
    """The API JSON form of a client object (V1Node, V1Pod) or a dict as it is."""
    if isinstance(obj, Mapping):
        return dict(obj)
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(obj)


@dataclass
class Snapshot:
    spec: ClusterSpec
    state: ClusterState
    pending: list[Pod]
    bound: dict[str, str] = field(default_factory=dict)  # pod key -> node
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # kind, name, reason


class NoUsableNode(SmartSchedError):
    """Not one node of a snapshot could be read; ``skipped``: (kind, name, why) of each."""

    def __init__(self, skipped: list[tuple[str, str, str]]) -> None:
        self.skipped = skipped
        super().__init__("no usable node in the snapshot: " + "; ".join(
            f"{n}: {r}" for _, n, r in skipped[:3]))


def object_name(obj: Any) -> str:
    """``metadata.name`` of an API object, or "?" when it has none (never raises)."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) and name else "?"


def node_spec(obj: Mapping[str, Any]) -> tuple[NodeSpec, str]:
    """(NodeSpec, region) of a Node object; raises ValueError naming the field (any object
    it cannot read is a ValueError too)."""
    if not isinstance(obj, Mapping):
        raise ValueError(f"node: must be an object, got {type(obj).__name__}")
    try:
        return _node_spec(obj)
    except ValueError:
        raise
    except (TypeError, AttributeError, KeyError, IndexError, ArithmeticError,
            RecursionError) as e:
        raise ValueError(f"node: malformed object ({type(e).__name__})") from None


def _node_spec(obj: Mapping[str, Any]) -> tuple[NodeSpec, str]:
    meta = _mapping(obj, "metadata", "metadata")
    name = meta.get("name")
    if not name or not isinstance(name, str):
        raise ValueError("metadata.name: missing or not a string")
    # The API server holds no such node (a hand-made or merged list sent to the
    # extender): the name could not be bound to, so the node is not a candidate.
    if (why := name_problem(name, "subdomain")) is not None:
        raise ValueError(f"metadata.name: {why}")
    labels = _string_map(meta, "labels", "metadata.labels")
    status = _mapping(obj, "status", "status")
    alloc = status.get("allocatable") or status.get("capacity")
    if not alloc:
        raise ValueError("status.allocatable: missing")
    if "cpu" not in alloc or "memory" not in alloc:
        raise ValueError("status.allocatable: needs cpu and memory")
    cpu_milli = int(_q(alloc["cpu"], "status.allocatable.cpu") * 1000)
    mem_mib = int(_q(alloc["memory"], "status.allocatable.memory") / MIB)
    gpus = 0
    for key in ("nvidia.com/gpu", "alibabacloud.com/gpu-count", "alpha.kubernetes.io/nvidia-gpu"):
        if key in alloc:
            gpus = int(_q(alloc[key], f"status.allocatable.{key}"))
            break
    model = ""
    if gpus > 0:
        raw = next((labels[k] for k in GPU_MODEL_LABELS if k in labels), None)
        mapped = gpu_model(raw)
        if mapped is None:
            raise ValueError(f"metadata.labels: GPU model {raw!r} is not one the twin models "
                             f"({', '.join(GPU_MODEL_NAMES)})")
        model = mapped
    # An empty label value is allowed by Kubernetes and means no zone (or region) given.
    zone = next((labels[k] for k in ZONE_LABELS if labels.get(k)), "default-zone")
    region = next((labels[k] for k in REGION_LABELS if labels.get(k)), "default-region")
    spec = _mapping(obj, "spec", "spec")
    taints = []
    # A taint or a cordon that cannot be read makes the node unusable, never untainted or
    # schedulable: a taint without its key or effect kept pods off nothing.
    for t in _list_of_mappings(spec, "taints", "spec.taints"):
        if not t.get("key") or t.get("effect") not in _EFFECTS:
            raise ValueError(f"spec.taints: each needs a key and an effect ("
                             f"{', '.join(_EFFECTS)})")
        if not isinstance(t["key"], str) or not isinstance(t.get("value", ""), str | None):
            # ``{"key": 1}`` became the taint "1:NoSchedule"
            raise ValueError("spec.taints: a taint's key and value must be strings")
        if t["effect"] != "PreferNoSchedule":  # a preference: scored upstream, not a filter
            taints.append(f"{t['key']}={t['value']}:{t['effect']}"
                          if t.get("value") else f"{t['key']}:{t['effect']}")
    unschedulable = spec.get("unschedulable")
    if unschedulable is not None and not isinstance(unschedulable, bool):
        raise ValueError(f"spec.unschedulable: must be true or false, got "
                         f"{str(unschedulable)[:32]!r}")
    # allocatable pods: the most it admits (0 admits none: it counts as cordoned)
    max_pods = int(_q(alloc["pods"], "status.allocatable.pods")) if "pods" in alloc else -1
    node = NodeSpec(name=str(name), cpu_milli=cpu_milli, memory_mib=mem_mib,
                    max_pods=max(max_pods, 0), zone=f"{region}/{zone}", num_gpu=gpus,
                    gpu_model=model, labels=labels, taints=tuple(taints),
                    unschedulable=bool(unschedulable) or max_pods == 0)
    return node, region


def _container_requests(c: Mapping[str, Any], where: str) -> dict[str, Decimal]:
    """One container's requests (an extended resource given only as a limit requests it:
    the API server defaults it so)."""
    res = _mapping(c, "resources", f"{where}.resources")
    req = {k: _q(v, f"{where}.resources.requests.{k}")
           for k, v in _mapping(res, "requests", f"{where}.resources.requests").items()}
    for k, v in _mapping(res, "limits", f"{where}.resources.limits").items():
        if k == "nvidia.com/gpu" and k not in req:
            req[k] = _q(v, f"{where}.resources.limits.{k}")
    return req


def _add(a: dict[str, Decimal], b: Mapping[str, Decimal]) -> dict[str, Decimal]:
    return {k: a.get(k, Decimal(0)) + b.get(k, Decimal(0)) for k in a.keys() | b.keys()}


def _max(a: dict[str, Decimal], b: Mapping[str, Decimal]) -> dict[str, Decimal]:
    return {k: max(a.get(k, Decimal(0)), b.get(k, Decimal(0))) for k in a.keys() | b.keys()}


def _requests(spec: Mapping[str, Any]) -> dict[str, Decimal]:
    """Effective requests as kube-scheduler counts them (``resource.PodRequests``): the
    app containers plus the sidecars (init containers with ``restartPolicy: Always``,
    which keep running beside them), at least the peak of the init phase (each ordinary
    init container beside the sidecars started before it); pod-level
    ``spec.resources.requests`` replace the containers' cpu, memory and hugepages when
    set; then the RuntimeClass's ``spec.overhead`` on top (a sandboxed runtime's VM)."""
    total: dict[str, Decimal] = {}
    for c in _list_of_mappings(spec, "containers", "spec.containers"):
        total = _add(total, _container_requests(c, "spec.containers"))
    sidecars: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for c in _list_of_mappings(spec, "initContainers", "spec.initContainers"):
        req = _container_requests(c, "spec.initContainers")
        if c.get("restartPolicy") == "Always":  # a sidecar: runs on with the app containers
            total = _add(total, req)
            sidecars = _add(sidecars, req)
            init_peak = _max(init_peak, sidecars)
        else:
            init_peak = _max(init_peak, _add(req, sidecars))
    total = _max(total, init_peak)
    pod_level = _mapping(_mapping(spec, "resources", "spec.resources"), "requests",
                         "spec.resources.requests")
    for k, v in pod_level.items():  # the resources pod-level requests may set (upstream's
        if k in ("cpu", "memory") or str(k).startswith("hugepages-"):  # IsSupported...)
            total[k] = _q(v, f"spec.resources.requests.{k}")
    overhead = {k: _q(v, f"spec.overhead.{k}")
                for k, v in _mapping(spec, "overhead", "spec.overhead").items()}
    return _add(total, overhead) if overhead else total


def pod_model(obj: Mapping[str, Any], arrival: float = 0.0,
              gang_sizes: Mapping[str, int] | None = None,
              enforce_affinity: bool = False, taints: Collection[str] | None = None) -> Pod:
    """The model's Pod for a Pod object; raises ValueError naming the field (any object it
    cannot read is a ValueError too, never another exception: callers answer 400 / skip).

    ``enforce_affinity``: the caller binds the pod itself (``smartsched k8s scheduler``),
    so required node affinity the model cannot express (several terms, NotIn, Exists,
    In with several values...) is refused rather than ignored: binding would break it.
    The extender leaves it to kube-scheduler, which checks it before asking.
    ``taints``: the nodes' taints, for tolerations exactly as upstream matches them (see
    ``_tolerations``)."""
    if not isinstance(obj, Mapping):
        raise ValueError(f"pod: must be an object, got {type(obj).__name__}")
    try:
        pod = _pod_model(obj, arrival, gang_sizes, taints)
        if enforce_affinity:
            _check_enforceable_affinity(obj)
            _check_tracked_resources(obj)
            _check_no_untracked_constraints(obj)
        return pod
    except ValueError:
        raise
    except (TypeError, AttributeError, KeyError, IndexError, ArithmeticError,
            RecursionError) as e:  # a shape the typed reads above do not cover
        raise ValueError(f"pod: malformed object ({type(e).__name__})") from None


_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
_GPU_INDEX = re.compile(r"[0-9]{1,2}(-[0-9]{1,2})*")  # device numbers, "0-3"


def _check_expression(e: Mapping[str, Any]) -> None:
    """A node selector requirement as the API server accepts it (ValueError otherwise)."""
    where = "nodeAffinity.matchExpressions"
    op, key, values = e.get("operator"), e.get("key"), e.get("values")
    if not isinstance(key, str) or not key:
        raise ValueError(f"{where}.key: missing or not a string")
    if op not in _OPERATORS:
        raise ValueError(f"{where}.operator: must be one of {', '.join(_OPERATORS)}")
    if values is not None and (not isinstance(values, list)
                               or not all(isinstance(v, str) for v in values)):
        raise ValueError(f"{where}.values: must be a list of strings")
    n = len(values or [])
    if op in ("In", "NotIn") and n == 0:
        raise ValueError(f"{where}.values: {op} needs at least one value")
    if op in ("Exists", "DoesNotExist") and n:
        raise ValueError(f"{where}.values: {op} takes no values")
    if op in ("Gt", "Lt") and (n != 1 or not (values[0].isascii()
                                              and values[0].lstrip("-").isdigit())):
        raise ValueError(f"{where}.values: {op} needs one integer")


def _check_enforceable_affinity(obj: Mapping[str, Any]) -> None:
    """ValueError unless the pod's required node affinity is none, or one term whose
    expressions are all ``In`` with one value (what ``_pod_model`` turns into a selector)."""
    spec = obj.get("spec") or {}
    aff = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = aff.get("nodeSelectorTerms") or []
    ok = not terms or (len(terms) == 1 and not terms[0].get("matchFields") and all(
        e.get("operator") == "In" and len(e.get("values") or []) == 1
        for e in terms[0].get("matchExpressions") or []))
    if not ok:
        raise ValueError("spec.affinity.nodeAffinity: this scheduler enforces required "
                         "node affinity of one term with In and one value per key only; "
                         "schedule this pod with kube-scheduler (and the extender)")


# Requests the twin tracks per node (ephemeral-storage is not tracked and not refused:
# nodes have it in plenty and kube-scheduler's own default profile rarely binds on it).
TRACKED_RESOURCES = frozenset({"cpu", "memory", "nvidia.com/gpu", "ephemeral-storage"})


def _check_tracked_resources(obj: Mapping[str, Any]) -> None:
    """ValueError naming a resource the pod requests that the twin does not track per node
    (hugepages, RDMA devices, other extended resources): binding it anywhere could
    overbook that resource, and the kubelet would then refuse the pod."""
    spec = obj.get("spec") or {}
    untracked = sorted(k for k, v in _requests(spec).items()
                       if v > 0 and k not in TRACKED_RESOURCES)
    if untracked:
        raise ValueError(f"spec.containers.resources: this scheduler does not track "
                         f"{', '.join(untracked)[:200]} per node; schedule this pod with "
                         "kube-scheduler (and the extender)")


def _check_no_untracked_constraints(obj: Mapping[str, Any]) -> None:
    """ValueError naming a placement rule of the pod that the twin does not check and a
    wrong node would break: required inter-pod (anti-)affinity, topology spread that
    must not be violated, host ports, and volumes claimed through PersistentVolumeClaims
    (a zonal volume cannot attach elsewhere, and a WaitForFirstConsumer claim is
    provisioned only when kube-scheduler's VolumeBinding names the node)."""
    spec = obj.get("spec") or {}
    affinity = spec.get("affinity") or {}
    rule = None
    for kind in ("podAffinity", "podAntiAffinity"):
        if ((affinity.get(kind) or {}).get("requiredDuringSchedulingIgnoredDuringExecution")):
            rule = f"spec.affinity.{kind}: required inter-pod rules"
    if any(isinstance(t, Mapping) and t.get("whenUnsatisfiable", "DoNotSchedule")
           == "DoNotSchedule" for t in spec.get("topologySpreadConstraints") or []):
        rule = "spec.topologySpreadConstraints: DoNotSchedule constraints"
    for group in ("containers", "initContainers"):
        for c in spec.get(group) or []:
            if any(isinstance(p, Mapping) and p.get("hostPort")
                   for p in (c.get("ports") or [] if isinstance(c, Mapping) else [])):
                rule = f"spec.{group}.ports.hostPort: host ports"
    for v in spec.get("volumes") or []:
        if isinstance(v, Mapping) and (v.get("persistentVolumeClaim") or v.get("ephemeral")):
            rule = (f"spec.volumes.{str(v.get('name'))[:63]}: volumes bound through a "
                    "PersistentVolumeClaim")
    if spec.get("resourceClaims"):  # allocated by kube-scheduler's DynamicResources plugin
        rule = "spec.resourceClaims: dynamic resource claims (DRA)"
    if rule is not None:
        raise ValueError(f"{rule} are not checked by this scheduler; schedule this pod with "
                         "kube-scheduler (and the extender)")


def _priority(v: Any) -> int:
    """``spec.priority`` as the API server has it: an int32 (absent: 0), never coerced
    from 1.9, true or "5"."""
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int) or not -(2**31) <= v < 2**31:
        raise ValueError(f"spec.priority: must be a 32-bit integer, got {str(v)[:32]!r}")
    return v


_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _tolerations(spec: Mapping[str, Any], taints: Collection[str] | None) -> tuple[str, ...]:
    """The pod's tolerations in the twin's form (``twin.state.taint_tolerated``); ValueError
    naming the field for one the API server would refuse (an unknown operator or effect,
    Equal without a key, Exists with a value).

    ``taints``: the nodes' taints (``key[=value]:Effect``), given where the caller binds:
    each toleration becomes the taints it tolerates by upstream's rule (``ToleratesTaint``:
    the effect, when set, must match; Exists any value, Equal the same value, "" included),
    which the twin's short forms cannot say (Exists with an effect tolerated every effect,
    so a NoSchedule toleration bound a pod onto a NoExecute taint that evicts it; Equal with
    an empty value tolerated no taint without one). Without them (the extender, where
    kube-scheduler has checked taints first) the short forms are kept."""
    out: list[str] = []
    for t in _list_of_mappings(spec, "tolerations", "spec.tolerations"):
        key, op, eff, val = (t.get("key") or "", t.get("operator") or "Equal",
                             t.get("effect") or "", t.get("value") or "")
        if op not in ("Equal", "Exists"):
            raise ValueError(f"spec.tolerations.operator: must be Equal or Exists, got "
                             f"{str(op)[:32]!r}")
        if eff not in ("", *_EFFECTS):
            raise ValueError(f"spec.tolerations.effect: must be one of {', '.join(_EFFECTS)} "
                             f"(or empty), got {str(eff)[:32]!r}")
        if op == "Equal" and not key:
            raise ValueError("spec.tolerations.key: required unless the operator is Exists")
        if op == "Exists" and val:
            raise ValueError("spec.tolerations.value: must be empty when the operator is "
                             "Exists")
        key, val = str(key), str(val)
        if taints is not None:
            for taint in taints:
                kv, _, t_eff = taint.rpartition(":")
                t_key, _, t_val = kv.partition("=")
                if ((not eff or eff == t_eff) and (not key or key == t_key)
                        and (op == "Exists" or val == t_val)):
                    out.append(taint)
        elif op == "Exists":
            out.append(key or "*")  # any value (and, here, any effect) of the key
        else:
            out.append(f"{key}={val}:{eff}" if eff else f"{key}={val}")
    return tuple(dict.fromkeys(out))


def _pod_model(obj: Mapping[str, Any], arrival: float,
               gang_sizes: Mapping[str, int] | None,
               taints: Collection[str] | None = None) -> Pod:
    meta = _mapping(obj, "metadata", "metadata")
    name = meta.get("name")
    if not name or not isinstance(name, str):
        raise ValueError("metadata.name: missing or not a string")
    ns = meta.get("namespace") or "default"
    if not isinstance(ns, str):
        raise ValueError("metadata.namespace: not a string")
    ann = {str(k): str(v) for k, v in _mapping(meta, "annotations",
                                               "metadata.annotations").items()}
    labels = {str(k): str(v) for k, v in _mapping(meta, "labels", "metadata.labels").items()}
    if not isinstance(obj.get("spec"), Mapping):  # a Pod always has one (its containers)
        raise ValueError("spec: missing or not an object")
    spec = _mapping(obj, "spec", "spec")
    if not _list_of_mappings(spec, "containers", "spec.containers"):  # as the API requires
        raise ValueError("spec.containers: a pod needs at least one container")
    req = _requests(spec)
    cpu = _milli(req.get("cpu", Decimal(0)))
    mem = _mib(req.get("memory", Decimal(0)))
    num_gpu, gpu_milli = 0, 0
    if "alibabacloud.com/gpu-milli" in ann:
        where = "metadata.annotations.alibabacloud.com/"
        gpu_milli = _whole(_q(ann["alibabacloud.com/gpu-milli"], f"{where}gpu-milli"),
                           f"{where}gpu-milli")
        num_gpu = _whole(_q(ann.get("alibabacloud.com/gpu-count", "1"), f"{where}gpu-count"),
                         f"{where}gpu-count")
        if not 1 <= gpu_milli <= MILLI_PER_DEVICE:
            raise ValueError(f"{where}gpu-milli: must be in [1, 1000], got {gpu_milli}")
        if num_gpu < 1:
            raise ValueError(f"{where}gpu-count: must be at least 1, got {num_gpu}")
    elif req.get("nvidia.com/gpu"):
        num_gpu = _whole(req["nvidia.com/gpu"], "spec.containers.resources.requests."
                         "nvidia.com/gpu")
        gpu_milli = MILLI_PER_DEVICE
    if cpu == mem == num_gpu == 0:
        # A pod requesting nothing (BestEffort) is legal, and kube-scheduler fits it
        # wherever a pod slot is free; the model needs some request: 1 millicore.
        cpu = 1
    selector = dict(_mapping(spec, "nodeSelector", "spec.nodeSelector"))
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items()):
        raise ValueError("spec.nodeSelector: keys and values must be strings")
    if len(selector) > MAX_SELECTOR_LABELS:  # a pod the extender keeps for its workload view
        raise ValueError(f"spec.nodeSelector: {len(selector):,} entries; at most "
                         f"{MAX_SELECTOR_LABELS}")
    for k, v in selector.items():  # the API server's rules: it would refuse such a pod
        if (why := label_problem(k, v)) is not None:
            raise ValueError(f"spec.nodeSelector: {why}")
    aff = _mapping(_mapping(_mapping(spec, "affinity", "spec.affinity"), "nodeAffinity",
                            "spec.affinity.nodeAffinity"),
                   "requiredDuringSchedulingIgnoredDuringExecution",
                   "spec.affinity.nodeAffinity.required")
    terms = _list_of_mappings(aff, "nodeSelectorTerms", "nodeAffinity.nodeSelectorTerms")
    for term in terms:  # the API server's checks: a known operator, values as it needs
        for e in _list_of_mappings(term, "matchExpressions", "nodeSelectorTerms.matchExpressions"):
            _check_expression(e)
    if len(terms) == 1:  # ORed terms would need more than a selector: keep the single-term case
        for e in terms[0].get("matchExpressions") or []:
            if e.get("operator") == "In" and len(e.get("values") or []) == 1:
                selector[e["key"]] = e["values"][0]
    models: tuple[str, ...] = ()
    for key in GPU_MODEL_LABELS:
        if key in selector:
            m = gpu_model(selector[key])
            if m:  # one the twin models: a device constraint as well as the label match
                models = (m,)
            # The label match stays either way, as kube-scheduler's NodeAffinity keeps it:
            # dropped, a CPU pod selecting the label passed nodes without it, and one
            # selecting an A100 40GB passed an 80GB node (probe round 5). A product the
            # catalogue lacks must not let the pod land on any GPU node either.
    regions = tuple(v for k, v in selector.items() if k in REGION_LABELS)
    for k in REGION_LABELS:
        selector.pop(k, None)
    tolerations = _tolerations(spec, taints)
    group = labels.get(POD_GROUP_LABEL) or labels.get(POD_GROUP_LABEL_OLD)
    gang_size = 1
    if group:
        raw_size = ann.get(MIN_MEMBER_ANNOTATION) or (gang_sizes or {}).get(group, 1)
        try:
            gang_size = int(raw_size)
        except (TypeError, ValueError):
            gang_size = 0
        if not 1 <= gang_size <= MAX_GANG_SIZE:
            raise ValueError(f"metadata.annotations.{MIN_MEMBER_ANNOTATION}: must be a whole "
                             f"number of pods in [1, {MAX_GANG_SIZE}], got "
                             f"{str(raw_size)[:32]!r}")
    duration = None
    if DURATION_ANNOTATION in ann:
        try:
            duration = float(ann[DURATION_ANNOTATION])
        except ValueError:
            duration = -1.0
        if not 0 < duration <= MAX_DURATION_S:  # NaN fails this too
            raise ValueError(f"metadata.annotations.{DURATION_ANNOTATION}: must be a number "
                             f"of seconds in (0, {MAX_DURATION_S:g}], got "
                             f"{ann[DURATION_ANNOTATION][:32]!r}")
    cls = labels.get(CLASS_LABEL, "batch")
    try:
        pod_class = PodClass(cls)
    except ValueError:
        raise ValueError(f"metadata.labels.{CLASS_LABEL}: unknown class {cls!r}") from None
    try:
        return Pod(id=f"{ns}/{name}", cpu_milli=cpu, memory_mib=mem, num_gpu=num_gpu,
                   gpu_milli=gpu_milli, pod_class=pod_class, tenant=ns,
                   priority=_priority(spec.get("priority")), gpu_models=models,
                   node_selector=tuple(sorted(selector.items())), tolerations=tolerations,
                   allowed_regions=regions, arrival=arrival,
                   gang_id=f"{ns}/{group}" if group else None,  # a PodGroup is namespaced
                   gang_size=gang_size, app=labels.get("app"), duration=duration)
    except ValidationError as e:  # named as the Pod object has it, not as the twin's model
        where = _POD_FIELD.get(e.field)
        if where is None:
            raise
        raise ValueError(f"{where}: {e.message}") from None


# The twin's pod fields as a Pod object writes them (an error named ``memory_mib`` meant
# nothing to whoever sent the Pod).
# The sums name every part they add (a too large spec.overhead was blamed on the
# containers' requests, a GPU request on the limits).
_POD_FIELD = {"cpu_milli": "spec.containers.resources.requests.cpu (with spec.overhead.cpu)",
              "memory_mib": "spec.containers.resources.requests.memory "
                            "(with spec.overhead.memory)",
              "num_gpu": "spec.containers.resources.nvidia.com/gpu (requests or limits)",
              "gpu_milli": "spec.containers.resources.limits (GPU share)"}


def _epoch(stamp: Any) -> float | None:
    """An RFC 3339 timestamp (``2026-12-02T10:00:00Z``) as epoch seconds; None if not one."""
    import datetime as dt

    if isinstance(stamp, dt.datetime):
        return stamp.timestamp()
    if not isinstance(stamp, str):
        return None
    try:
        t = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp()


def build_snapshot(nodes: Iterable[Any], pods: Iterable[Any] = (),
                   time_origin: float | None = None) -> Snapshot:
    """The twin's view of a cluster from its Node and Pod objects. ``time_origin``: the
    epoch second the state's clock counts from (the scheduler's start); given, a bound pod
    with an expected duration leaves at its start (``status.startTime``, else its creation)
    plus that duration on that clock, which gang reservations plan on."""
    skipped: list[tuple[str, str, str]] = []
    read: list[tuple[NodeSpec, str]] = []
    for raw in nodes:
        obj = to_plain(raw) if isinstance(raw, Mapping) or hasattr(raw, "to_dict") else raw
        try:
            node, region = node_spec(obj)
        except (ValueError, SmartSchedError) as e:
            name = object_name(obj)
            skipped.append(("Node", str(name), str(e)))
            log.warning("skipping node %s: %s", name, e)
            continue
        read.append((node, region))
    # Two nodes under one name (a list the API server cannot hold: a malformed or merged
    # list file) are two readings of one node that may disagree: neither is used (a
    # duplicate name failed the whole snapshot, so no pod was placed anywhere).
    twice = {n for n, c in Counter(node.name for node, _ in read).items() if c > 1}
    for name in sorted(twice):
        skipped.append(("Node", name, "metadata.name: more than one node has this name"))
        log.warning("skipping node %s: more than one node has this name", name)
    specs = [node for node, _ in read if node.name not in twice]
    regions = dict.fromkeys(region for node, region in read if node.name not in twice)
    if not specs:
        raise NoUsableNode(skipped)
    zones = sorted({n.zone for n in specs})
    spec = ClusterSpec("kubernetes", tuple(Site(r) for r in regions),
                       tuple(Zone(z, z.split("/", 1)[0]) for z in zones), tuple(specs))
    state = ClusterState(spec)
    pending: list[Pod] = []
    bound: dict[str, str] = {}
    for raw in pods:
        obj = to_plain(raw)
        # Any part may be of the wrong type in a malformed object: read none of it blindly
        # (one such pod raised out of every pass).
        meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
        key = f"{meta.get('namespace') or 'default'}/{meta.get('name', '?')}"
        status = obj.get("status")
        phase = status.get("phase") if isinstance(status, Mapping) else None
        if phase in ("Succeeded", "Failed"):
            continue
        try:
            pod = pod_model(obj)
        except (ValueError, SmartSchedError) as e:
            skipped.append(("Pod", key, str(e)))
            log.warning("skipping pod %s: %s", key, e)
            _hold_place(state, obj, key)
            continue
        node_name = obj["spec"].get("nodeName")  # pod_model read spec as an object
        if not node_name:
            pending.append(pod)
            continue
        if not isinstance(node_name, str) or node_name not in state.index:
            skipped.append(("Pod", key, f"bound to unknown node {str(node_name)[:64]!r}"))
            continue
        i = state.index[node_name]
        req = state.compile(pod)
        ann = meta.get("annotations") or {}  # pod_model read it as an object
        devices: tuple[int, ...] | None = None
        if "alibabacloud.com/gpu-index" in ann:
            raw_index = str(ann["alibabacloud.com/gpu-index"])
            if not _GPU_INDEX.fullmatch(raw_index):  # one bad pod must not stop the pass
                skipped.append(("Pod", key, "annotations.alibabacloud.com/gpu-index: not "
                                f"device numbers like 0-3 (got {raw_index[:32]!r})"))
                _take_what_is_left(state, i, req)
                continue
            devices = tuple(int(x) for x in raw_index.split("-"))
        until = float("inf")
        if time_origin is not None and pod.duration is not None:
            started = _epoch((status.get("startTime") if isinstance(status, Mapping)
                              else None) or meta.get("creationTimestamp"))
            if started is not None:
                until = started + pod.duration - time_origin
        try:
            state.allocate(i, req, devices if devices is not None else
                           state.pick_devices(i, req), until=until)
        except (InfeasibleDecisionError, ValueError, OverflowError) as e:
            skipped.append(("Pod", key, f"does not fit its node {node_name}: {e}"))
            _take_what_is_left(state, i, req)
            continue
        bound[key] = node_name
    return Snapshot(spec, state, pending, bound, skipped)


def _hold_place(state: ClusterState, obj: Mapping[str, Any], key: str) -> None:
    """A bound pod the model refuses (an unknown class label, a bad annotation, requests
    past the model's bounds) still runs on its node, and the kubelet counts it: it takes a
    pod slot there and what it requests of cpu, memory and whole GPUs, up to what the node
    has left. One whose requests cannot be read at all may be using anything there: the
    node reads as full (it took a slot only, and pods were bound beside it)."""
    spec = obj.get("spec")
    node_name = spec.get("nodeName") if isinstance(spec, Mapping) else None
    if not isinstance(node_name, str) or node_name not in state.index:
        return
    i = state.index[node_name]
    try:
        req = _requests(spec)  # type: ignore[arg-type]
        cpu = min(_milli(req.get("cpu", Decimal(0))), MAX_NODE_CPU_MILLI)
        mem = min(_mib(req.get("memory", Decimal(0))), MAX_NODE_MEMORY_MIB)
        gpus = min(int(req.get("nvidia.com/gpu", Decimal(0)).to_integral_value(ROUND_CEILING)),
                   MAX_DEVICES_PER_NODE)
    except (ValueError, SmartSchedError, TypeError, AttributeError, ArithmeticError,
            RecursionError):
        cpu, mem, gpus = MAX_NODE_CPU_MILLI, MAX_NODE_MEMORY_MIB, state.spec.nodes[i].num_gpu
    if cpu == mem == gpus == 0:  # requests nothing (BestEffort): its slot
        state.pod_count[i] += 1
        return
    pod = Pod(id="bound", cpu_milli=cpu, memory_mib=mem, num_gpu=gpus,  # key may be junk
              gpu_milli=MILLI_PER_DEVICE if gpus else 0)
    _take_what_is_left(state, i, state.compile(pod))


def _take_what_is_left(state: ClusterState, node: int, req: Any) -> None:
    """A bound pod that cannot be allocated on its node as it is (the node's allocatable
    shrank below its pods' requests, its GPUs went away, its devices are unreadable) still
    runs there: take the room the node has left of each resource it requests (on the
    freest devices), so the node reads as full there and no pass binds more onto it."""
    import numpy as np

    take = np.minimum(state.charged(req), state.free_res[node])
    state.allocated[node] += take
    state.free_res[node] -= take
    if req.num_gpu:
        free = state.gpu_free[node]
        for d in np.argsort(-free, kind="stable")[:req.num_gpu]:
            free[d] -= min(int(free[d]), req.gpu_milli)
        state._refresh_gpu_summary(node)  # the twin's own summaries of gpu_free
    state.pod_count[node] += 1
