"""ClusterState: the cluster as structure-of-arrays numpy, and the one definition of "fits".

Owns node capacity, allocation, per-device free GPU milli, usage, labels and
taints as boolean matrices, node up/down and power state. ``resource_fit``
is the only place that decides whether a request fits a node's free
resources; schedulers' filters, the RL action mask and the placement service
all call it, so they can never disagree with the accounting in ``allocate``.

Must not import scheduling, rl or serving.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from smartsched.model.cluster import ClusterSpec
from smartsched.model.errors import (
    InfeasibleDecisionError,
    UnknownReferenceError,
    ValidationError,
)
from smartsched.model.pod import POD_CLASS_IDS, Pod
from smartsched.model.resources import (
    CPU,
    DEVICE_MODELS,
    FPGA,
    GPU,
    GPU_MODEL_IDS,
    MEM,
    MILLI_PER_DEVICE,
    NUM_RESOURCES,
)
from smartsched.twin.bound import BoundPods
from smartsched.twin.images import ImageCaches
from smartsched.twin.reservations import Reservations

# kube-scheduler's defaults for pods that request no cpu / memory, used by its
# NodeResourcesFit scoring ("non-zero requests").
DEFAULT_MILLI_CPU_REQUEST: Final = 100
DEFAULT_MEMORY_REQUEST_MIB: Final = 200
NO_SCHEDULE_EFFECTS: Final = ("NoSchedule", "NoExecute")

# Every mutation of a node stamps it with a number unique across all states and
# forks, so a plugin may cache per-node results keyed by (node, version). A new state
# starts its nodes at negative numbers of their own (never 0 for all): a state rebuilt
# from a changed node list must not match what was cached for the old one.
_VERSIONS = itertools.count(1)
_STATES = itertools.count(1)

_ALL_NODES: Final = slice(None)
# Room on top of free resources, per node: charged resources [N, R], best-effort pool
# [N, 2], GPU milli per device [N, D] (``BoundPods.room``).
Room = tuple[np.ndarray, np.ndarray, np.ndarray]

POWER_OFF: Final = 0
POWER_BOOTING: Final = 1
POWER_ON: Final = 2


@dataclass(frozen=True, slots=True, eq=False)
class PodRequest:
    """A pod compiled against a cluster's vocabularies, ready for vectorized checks.

    ``models_ok`` is indexed by GPU model id (None: any model). Label and
    toleration columns refer to ``ClusterState.label_vocab`` / ``taint_vocab``;
    ``selector_unknown`` is True when the selector names a label no node has.
    """

    pod: Pod
    vector: np.ndarray  # [R] int64: cpu, mem, gpu total milli, fpga
    nonzero: np.ndarray  # [2] int64: cpu, mem with kube's defaults for zero requests
    num_gpu: int
    gpu_milli: int
    models_ok: np.ndarray | None
    selector_cols: np.ndarray
    selector_unknown: bool
    tolerated: np.ndarray  # [T] bool over taint_vocab
    allowed_sites: np.ndarray | None  # [S] bool over site ids
    best_effort: bool = False
    origin: int = -1  # site id the pod's clients are at (-1: none)
    image: int = -1  # id in ``ClusterState.images`` (-1: no image modelled)


@dataclass(frozen=True, slots=True, eq=False)
class RequestBatch:
    """K requests as columns ([K, 1] each) to broadcast against nodes in fit checks."""

    cpu: np.ndarray
    memory: np.ndarray
    fpga: np.ndarray
    num_gpu: np.ndarray
    gpu_milli: np.ndarray
    best_effort: np.ndarray
    models_ok: np.ndarray | None  # [K, models + 1] bool; None: no request is constrained

    @staticmethod
    def of(reqs: Sequence[PodRequest]) -> RequestBatch:
        """The batch of ``reqs`` (each compiled against the same cluster)."""
        col = np.array([[r.vector[CPU], r.vector[MEM], r.vector[FPGA], r.num_gpu, r.gpu_milli]
                        for r in reqs], dtype=np.int64).reshape(len(reqs), 5)
        models = None
        if any(r.models_ok is not None for r in reqs):
            models = np.ones((len(reqs), len(GPU_MODEL_IDS) + 1), dtype=bool)
            for k, r in enumerate(reqs):
                if r.models_ok is not None:
                    models[k] = r.models_ok
        return RequestBatch(col[:, 0:1], col[:, 1:2], col[:, 2:3], col[:, 3:4], col[:, 4:5],
                            np.array([[r.best_effort] for r in reqs], dtype=bool)
                            .reshape(len(reqs), 1), models)


def gpu_tag(req: PodRequest) -> int:
    """Shape tag of a GPU pod: 0 for a GPU share, k for k whole GPUs."""
    return 0 if req.gpu_milli < MILLI_PER_DEVICE else req.num_gpu


def taint_tolerated(taint: str, toleration: str) -> bool:
    """Whether ``toleration`` tolerates ``taint``.

    Taints are ``key=value:Effect`` or ``key:Effect``. A toleration is ``key``
    (operator Exists), ``key=value`` (operator Equal), the full taint string, or
    ``*`` (Exists without a key: tolerates everything).
    """
    kv = taint.split(":", 1)[0]
    key = kv.split("=", 1)[0]
    return toleration == "*" or toleration in (taint, kv, key)


# Labels and taints are kept as node x vocabulary tables (one filter is one column
# test over every node). Their size is nodes x distinct pairs, which grows with the
# square of a cluster whose nodes each carry unique labels: bounded, so a node list or an
# update cannot make one state allocate gigabytes. 64 Mi cells (64 MiB) holds 8,000 nodes
# each with its own hostname label, or 5,000 nodes with 13,000 distinct pairs.
MAX_TABLE_CELLS: Final = 64 * 1024 * 1024


def _check_table_size(nodes: int, distinct: int, name: str, what: str) -> None:
    if nodes * distinct > MAX_TABLE_CELLS:
        raise ValidationError(
            f"nodes.{name}", f"{nodes:,} nodes with {distinct:,} {what} would need a "
            f"{nodes * distinct:,}-cell table (at most {MAX_TABLE_CELLS:,}): use fewer "
            f"distinct {name} or split the cluster into sites")


class ClusterState:
    """Mutable cluster state; ``fork()`` copies the arrays for sandbox runs.

    Arrays (N nodes, R resources, D = max devices per node):
      capacity[N,R], allocated[N,R], free_res[N,R] (= capacity - allocated)  int64
      gpu_free[N,D]  int32, milli free per device; 0 for devices that do not exist
      gpu_count[N]   int32, gpu_model[N] int16 (0: none)
      usage[N,3]     float64, actual cpu / memory / gpu-milli use (set by the engine)
      labels[N,L], taints[N,T]  bool
      up[N], unschedulable[N]  bool;  power[N] int8 (OFF / BOOTING / ON)
      zone_id[N], site_id[N], rack_id[N]  int32
      pod_count[N]   int32
    """

    def __init__(self, spec: ClusterSpec) -> None:
        nodes = spec.nodes
        n = len(nodes)
        self.spec = spec
        self.names: list[str] = [x.name for x in nodes]
        self.index: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        self.site_names: list[str] = [s.name for s in spec.sites]
        self.site_ids: dict[str, int] = {s: i for i, s in enumerate(self.site_names)}
        # Client latency from each site (as a pod's origin) to a node of each site [S, S].
        self.site_latency_ms = np.array([[t.latency_ms_from(o) for t in spec.sites]
                                         for o in spec.sites], dtype=np.float64)
        self.zone_names: list[str] = [z.name for z in spec.zones]
        site_idx = {s: i for i, s in enumerate(self.site_names)}
        zone_idx = {z: i for i, z in enumerate(self.zone_names)}
        zone_site = spec.zone_site()
        racks: dict[str, int] = {}

        self.capacity = np.zeros((n, NUM_RESOURCES), dtype=np.int64)
        self.capacity[:, CPU] = [x.cpu_milli for x in nodes]
        self.capacity[:, MEM] = [x.memory_mib for x in nodes]
        self.gpu_count = np.array([x.num_gpu for x in nodes], dtype=np.int32)
        self.capacity[:, GPU] = self.gpu_count.astype(np.int64) * MILLI_PER_DEVICE
        self.capacity[:, FPGA] = [x.num_fpga for x in nodes]
        self.allocated = np.zeros_like(self.capacity)
        self.free_res = self.capacity.copy()  # capacity - allocated, kept in step
        self.nonzero_alloc = np.zeros((n, 2), dtype=np.int64)  # cpu, mem with kube's defaults
        # Best-effort pool (cpu, mem): what BE pods requested, and what they may request:
        # threshold x capacity - usage of the other pods, refreshed at each usage sample.
        self.best_effort_threshold = 0.9
        self.be_allocated = np.zeros((n, 2), dtype=np.int64)
        self.be_allocatable = self.capacity[:, [CPU, MEM]] * self.best_effort_threshold
        self.max_devices = max(1, int(self.gpu_count.max()))
        dev = np.arange(self.max_devices)[None, :]
        self.gpu_exists = dev < self.gpu_count[:, None]
        self.gpu_free = np.where(self.gpu_exists, MILLI_PER_DEVICE, 0).astype(np.int32)
        # Per-node summaries of gpu_free, kept in step so fit checks are one compare:
        # the most free milli on any device, and the number of fully free devices.
        self.gpu_max_free = self.gpu_free.max(axis=1).astype(np.int32)
        self.gpu_full = self.gpu_count.copy()
        self.gpu_model = np.array(
            [GPU_MODEL_IDS[x.gpu_model] if x.num_gpu else 0 for x in nodes], dtype=np.int16
        )
        # Device topology: NUMA socket and PCIe switch of each GPU (-1 where none).
        self.gpu_socket = np.full((n, self.max_devices), -1, dtype=np.int16)
        self.gpu_switch = np.full((n, self.max_devices), -1, dtype=np.int16)
        # Whether a node's GPUs are meshed by NVLink (then no pair of them is far apart).
        self.gpu_nvlink = np.array([x.num_gpu > 1 and DEVICE_MODELS[x.gpu_model].nvlink
                                    for x in nodes], dtype=bool)
        for i, x in enumerate(nodes):
            if x.num_gpu:
                topo = x.topology()
                self.gpu_socket[i, : x.num_gpu] = topo.gpu_socket()
                self.gpu_switch[i, : x.num_gpu] = topo.gpu_switch()
        self.zone_id = np.array([zone_idx[x.zone] for x in nodes], dtype=np.int32)
        self.site_id = np.array([site_idx[zone_site[x.zone]] for x in nodes], dtype=np.int32)
        self.rack_id = np.array([racks.setdefault(x.rack, len(racks)) for x in nodes], np.int32)
        self.num_racks = len(racks)

        self.label_vocab: dict[str, int] = {}
        for x in nodes:
            for k, v in x.labels.items():
                self.label_vocab.setdefault(f"{k}={v}", len(self.label_vocab))
        self.taint_vocab: dict[str, int] = {}
        for x in nodes:
            for t in x.taints:
                self.taint_vocab.setdefault(t, len(self.taint_vocab))
        _check_table_size(n, len(self.label_vocab), "labels", "distinct label pairs")
        _check_table_size(n, len(self.taint_vocab), "taints", "distinct taints")
        self.labels = np.zeros((n, max(1, len(self.label_vocab))), dtype=bool)
        self.taints = np.zeros((n, max(1, len(self.taint_vocab))), dtype=bool)
        # Taint effect per vocabulary column; untyped taints ("key=value") mean NoSchedule.
        effects = [t.rsplit(":", 1)[1] if ":" in t else "NoSchedule" for t in self.taint_vocab]
        effects += ["NoSchedule"] * (self.taints.shape[1] - len(effects))
        self.taint_hard = np.array([e in NO_SCHEDULE_EFFECTS for e in effects], dtype=bool)
        self.taint_prefer = np.array([e == "PreferNoSchedule" for e in effects], dtype=bool)
        for i, x in enumerate(nodes):
            for k, v in x.labels.items():
                self.labels[i, self.label_vocab[f"{k}={v}"]] = True
            for t in x.taints:
                self.taints[i, self.taint_vocab[t]] = True

        self.up = np.ones(n, dtype=bool)
        self.unschedulable = np.array([x.unschedulable for x in nodes], dtype=bool)
        self.power = np.full(n, POWER_ON, dtype=np.int8)
        self.usage = np.zeros((n, 3), dtype=np.float64)
        # Allocation when ``usage`` was last sampled: pods placed since are not in it yet.
        self.usage_allocated = np.zeros_like(self.allocated)
        # Forecast of usage (same layout as ``usage``), when a forecaster provides one.
        self.predicted_usage: np.ndarray | None = None
        # Reduced telemetry [N, k] (twin.telemetry.reduction), when a projection provides it.
        self.telemetry_features: np.ndarray | None = None
        self.pod_count = np.zeros(n, dtype=np.int32)
        # Pods each node admits (NodeSpec.max_pods), None when no node has a limit.
        limits = np.array([x.max_pods for x in nodes], dtype=np.int64)
        self.max_pods: np.ndarray | None = (
            np.where(limits > 0, limits, np.iinfo(np.int32).max).astype(np.int32)
            if (limits > 0).any() else None)
        self.version = -((next(_STATES) << 32) + np.arange(n, dtype=np.int64))
        self.bound_frozen = False  # see ``fork(share_bound=True)``
        # Hard constraints every profile's filters end with (scheduling.compliance; the
        # twin only carries it, never imports it); forks share it.
        self.compliance: Any = None
        # Set by the engine when it offers a pod: simulated time and pods waiting.
        self.now = 0.0
        self.queue_length = 0
        self.queue_by_class = np.zeros(len(POD_CLASS_IDS), dtype=np.int64)  # per POD_CLASS_IDS
        # GPU pods per node by shape tag: column 0 = GPU-share pods, k = pods of k whole GPUs.
        self.gpu_pod_tags = np.zeros((n, self.max_devices + 1), dtype=np.int32)
        # Pods per app per node, for spreading and affinity plugins (kube's snapshot of pods).
        self.app_pods: dict[str, np.ndarray] = {}
        # Room promised to waiting gangs (twin.reservations).
        self.reservations = Reservations(n, NUM_RESOURCES)
        # Image layer caches and pulls of every node (twin.images).
        self.images = ImageCaches(spec)
        # Every bound pod as a row (node, priority, what it takes): preemption reads it.
        self.bound = BoundPods(n, NUM_RESOURCES, self.max_devices)
        # Pods of each app evicted by preemption and not running again yet (the engine keeps
        # it): a disruption budget counts them.
        self.disrupted: dict[str, int] = {}

    # ------------------------------------------------------------------ queries
    @property
    def num_nodes(self) -> int:
        return len(self.names)

    def node_index(self, name: str) -> int:
        try:
            return self.index[name]
        except KeyError:
            raise UnknownReferenceError("node", f"unknown node {name!r}") from None

    def compile(self, pod: Pod) -> PodRequest:
        """Compile ``pod`` against this cluster's vocabularies (labels, taints, sites)."""
        vec = np.array(
            [pod.cpu_milli, pod.memory_mib, pod.gpu_total_milli, pod.num_fpga], dtype=np.int64
        )
        models_ok = None
        if pod.gpu_models and pod.num_gpu > 0:
            models_ok = np.zeros(len(GPU_MODEL_IDS) + 1, dtype=bool)
            models_ok[[GPU_MODEL_IDS[m] for m in pod.gpu_models]] = True
        cols = [self.label_vocab.get(f"{k}={v}", -1) for k, v in pod.node_selector]
        tolerated = np.zeros(self.taints.shape[1], dtype=bool)
        for name, j in self.taint_vocab.items():
            tolerated[j] = any(taint_tolerated(name, t) for t in pod.tolerations)
        sites = None
        if pod.allowed_regions:
            sites = np.zeros(len(self.site_names), dtype=bool)
            for r in pod.allowed_regions:
                if r in self.site_names:
                    sites[self.site_names.index(r)] = True
        return PodRequest(
            pod=pod,
            vector=vec,
            nonzero=np.array([pod.cpu_milli or DEFAULT_MILLI_CPU_REQUEST,
                              pod.memory_mib or DEFAULT_MEMORY_REQUEST_MIB], dtype=np.int64),
            num_gpu=pod.num_gpu,
            gpu_milli=pod.gpu_milli,
            models_ok=models_ok,
            selector_cols=np.array([c for c in cols if c >= 0], dtype=np.int64),
            selector_unknown=any(c < 0 for c in cols),
            tolerated=tolerated,
            allowed_sites=sites,
            best_effort=pod.best_effort,
            origin=self.site_ids.get(pod.origin_site, -1) if pod.origin_site else -1,
            image=self.images.image_id(pod.image, pod.image_layers) if pod.image else -1,
        )

    def resource_fit(self, req: PodRequest) -> np.ndarray:
        """Boolean mask of nodes that are up and have room for ``req`` (the one definition).

        CPU, memory, FPGA and total GPU milli: request <= capacity - allocated. GPUs: at least
        ``num_gpu`` devices of an allowed model each with ``gpu_milli`` free. The AND of
        :meth:`fit_checks`, which says which part fails.
        """
        checks = self.fit_checks(req)
        ok = checks[0][1]
        for _, mask in checks[1:]:
            ok = ok & mask
        return ok

    def fits_without(self, req: PodRequest, node: int, rows: np.ndarray) -> bool:
        """Whether ``req`` fits ``node`` once the bound ``rows`` (all on that node) leave:
        its resources, best-effort pool, devices and a pod slot (what a preemption must
        free; its plugin and the engine's check of a decision's victims both ask this)."""
        if self.max_pods is not None and self.pod_count[node] - rows.size >= self.max_pods[node]:
            return False  # no pod slot: fit_checks leaves slots out when given room
        room = self.bound.room_on(rows)
        return all(bool(m[0]) for _, m in self.fit_checks(req, np.array([node]), extra=room))

    def fit_checks(self, reqs: PodRequest | RequestBatch,
                   nodes: np.ndarray | slice = _ALL_NODES,
                   extra: Room | None = None) -> list[tuple[str, np.ndarray]]:
        """The parts of "fits" of one request ([M] masks) or of K requests ([K, M] or [M]
        masks, to broadcast) on
        the M ``nodes``: ``up``, ``cpu``, ``memory`` (from the best-effort pool for
        best-effort pods), ``fpga``, ``gpu model`` and ``gpu`` (devices with room), the
        last three only when some request asks for them. Requests fit where every part
        passes; scheduling's NodeResourcesFit reports the first failing part of each node,
        and the twin's queue asks it whether waiting pods fit where room was freed. One
        set of comparisons serves both shapes: node arrays broadcast against scalars or
        against [K, 1] request columns. ``extra``: room the nodes would have on top of
        their free resources (what evicting some pods gives back, ``BoundPods.room``),
        one row per node selected by ``nodes``."""
        if isinstance(reqs, PodRequest):
            v = reqs.vector
            cpu, mem, fpga = v[CPU], v[MEM], v[FPGA]
            num_gpu, milli, be, models = (reqs.num_gpu, reqs.gpu_milli, reqs.best_effort,
                                          reqs.models_ok)
            any_be, any_fpga, any_gpu = be, bool(fpga), bool(num_gpu)
        else:
            cpu, mem, fpga, num_gpu, milli, be, models = (
                reqs.cpu, reqs.memory, reqs.fpga, reqs.num_gpu, reqs.gpu_milli,
                reqs.best_effort, reqs.models_ok)
            any_be, any_fpga, any_gpu = bool(be.any()), bool(fpga.any()), bool(num_gpu.any())
        # Node arrays are [M]; a batch's request columns are [K, 1], so each comparison
        # broadcasts to [K, M] (parts that do not depend on the request stay [M]).
        fr = self.free_res[nodes]
        gpu_max_free, gpu_full = self.gpu_max_free[nodes], self.gpu_full[nodes]
        if extra is not None:
            fr = fr + extra[0]
            dev_free = self.gpu_free[nodes] + extra[2]
            gpu_max_free = dev_free.max(axis=1)
            gpu_full = (dev_free == MILLI_PER_DEVICE).sum(axis=1)
        cpu_ok = fr[:, CPU] >= cpu
        mem_ok = fr[:, MEM] >= mem
        if any_be:
            slack = self.be_allocatable[nodes] - self.be_allocated[nodes]
            if extra is not None:
                slack = slack + extra[1]
            cpu_ok = np.where(be, slack[:, 0] >= cpu, cpu_ok)
            mem_ok = np.where(be, slack[:, 1] >= mem, mem_ok)
        out = [("up", self.up[nodes]), ("cpu", cpu_ok), ("memory", mem_ok)]
        if self.max_pods is not None and extra is None:  # (evictions free pod slots too)
            out.append(("pods", self.pod_count[nodes] < self.max_pods[nodes]))
        if any_fpga:
            out.append(("fpga", fr[:, FPGA] >= fpga))
        if any_gpu:
            if models is not None:
                out.append(("gpu model", models[..., self.gpu_model[nodes]]))
            # A share needs one device with gpu_milli free; several GPUs are whole devices.
            if isinstance(num_gpu, np.ndarray):
                share = gpu_max_free >= milli
                whole = gpu_full >= num_gpu
                out.append(("gpu", (num_gpu == 0) | np.where(num_gpu == 1, share, whole)))
            elif num_gpu == 1:
                out.append(("gpu", gpu_max_free >= milli))
            else:
                out.append(("gpu", gpu_full >= num_gpu))
        return out

    def pick_devices(self, node: int, req: PodRequest) -> tuple[int, ...]:
        """Default device binder: the tightest-fitting devices (least free milli that fits).

        Ties go to the lowest index. This is Open-GPU-Share's "best" selection;
        topology-aware binders live in scheduling and pass devices explicitly.
        """
        if not req.num_gpu:
            return ()
        free = self.gpu_free[node]
        cand = np.flatnonzero(free >= req.gpu_milli)
        if cand.size < req.num_gpu:
            raise InfeasibleDecisionError(
                f"node {self.names[node]}: {cand.size} devices with {req.gpu_milli} milli free, "
                f"need {req.num_gpu}"
            )
        order = cand[np.argsort(free[cand], kind="stable")]
        return tuple(int(d) for d in np.sort(order[: req.num_gpu]))

    # --------------------------------------------------------------- mutations
    def allocate(self, node: int, req: PodRequest, devices: tuple[int, ...],
                 until: float = np.inf) -> None:
        """Take ``req`` on ``node`` and ``devices``; refuse anything that would over-allocate.
        ``until``: when the pod is expected to leave (gang reservations plan on it)."""
        if not 0 <= node < self.num_nodes:
            raise InfeasibleDecisionError(f"node index {node} out of range")
        if not self.up[node]:
            raise InfeasibleDecisionError(f"node {self.names[node]} is down")
        if self.max_pods is not None and self.pod_count[node] >= self.max_pods[node]:
            raise InfeasibleDecisionError(
                f"node {self.names[node]}: admits {int(self.max_pods[node])} pods, "
                f"{int(self.pod_count[node])} are bound")
        v = self.charged(req)
        if np.any(self.allocated[node] + v > self.capacity[node]):
            raise InfeasibleDecisionError(
                f"node {self.names[node]}: request {v.tolist()} exceeds free "
                f"{(self.capacity[node] - self.allocated[node]).tolist()}"
            )
        if req.best_effort and np.any(
            self.be_allocated[node] + req.vector[[CPU, MEM]] > self.be_allocatable[node]
        ):
            raise InfeasibleDecisionError(
                f"node {self.names[node]}: best-effort request exceeds the slack "
                f"{(self.be_allocatable[node] - self.be_allocated[node]).tolist()}"
            )
        if len(devices) != req.num_gpu or len(set(devices)) != len(devices):
            raise InfeasibleDecisionError(
                f"pod {req.pod.id}: needs {req.num_gpu} distinct devices, got {devices}"
            )
        if req.num_gpu:
            if req.models_ok is not None and not req.models_ok[self.gpu_model[node]]:
                raise InfeasibleDecisionError(f"node {self.names[node]}: GPU model not allowed")
            d = np.asarray(devices, dtype=np.int64)
            if np.any(d < 0) or np.any(d >= self.gpu_count[node]):
                raise InfeasibleDecisionError(f"node {self.names[node]}: no device in {devices}")
            if np.any(self.gpu_free[node, d] < req.gpu_milli):
                raise InfeasibleDecisionError(
                    f"node {self.names[node]}: devices {devices} lack {req.gpu_milli} milli"
                )
            self.gpu_free[node, d] -= req.gpu_milli
            self._refresh_gpu_summary(node)
        self.allocated[node] += v
        self.free_res[node] -= v
        if req.best_effort:
            self.be_allocated[node] += req.vector[[CPU, MEM]]
        else:
            self.nonzero_alloc[node] += req.nonzero
        self.pod_count[node] += 1
        self.version[node] = next(_VERSIONS)
        if not self.bound_frozen:
            self.bound.add(node, req, v, devices, self.now, until)
        if req.num_gpu:
            self.gpu_pod_tags[node, gpu_tag(req)] += 1
        if req.pod.app:
            counts = self.app_pods.get(req.pod.app)
            if counts is None:
                counts = self.app_pods[req.pod.app] = np.zeros(self.num_nodes, dtype=np.int32)
            counts[node] += 1

    def release(self, node: int, req: PodRequest, devices: tuple[int, ...]) -> None:
        """Give back exactly what :meth:`allocate` took."""
        v = self.charged(req)
        if not self.bound_frozen:
            self.bound.remove(req, node)
        self.allocated[node] -= v
        self.free_res[node] += v
        if req.best_effort:
            self.be_allocated[node] -= req.vector[[CPU, MEM]]
        else:
            self.nonzero_alloc[node] -= req.nonzero
        self.version[node] = next(_VERSIONS)
        if req.num_gpu:
            self.gpu_pod_tags[node, gpu_tag(req)] -= 1
        if req.pod.app:
            self.app_pods[req.pod.app][node] -= 1
        if devices:
            self.gpu_free[node, np.asarray(devices, dtype=np.int64)] += req.gpu_milli
            self._refresh_gpu_summary(node)
        self.pod_count[node] -= 1
        if np.any(self.allocated[node] < 0) or np.any(
            self.gpu_free[node] > np.where(self.gpu_exists[node], MILLI_PER_DEVICE, 0)
        ):
            raise InfeasibleDecisionError(f"node {self.names[node]}: released more than taken")

    @staticmethod
    def charged(req: PodRequest) -> np.ndarray:
        """What a pod takes from ``allocated``: all of it, or for a best-effort pod
        only its devices (its cpu and memory come from the best-effort pool)."""
        if not req.best_effort:
            return req.vector
        v = req.vector.copy()
        v[[CPU, MEM]] = 0
        return v

    def _refresh_gpu_summary(self, node: int) -> None:
        row = self.gpu_free[node]
        self.gpu_max_free[node] = row.max()
        self.gpu_full[node] = np.count_nonzero(row == MILLI_PER_DEVICE)

    def fork(self, share_bound: bool = False) -> ClusterState:
        """An independent copy of the mutable arrays (static metadata is shared).

        ``share_bound``: the fork reads this state's bound-pod table and never changes it
        (``bound_frozen``: allocate and release leave it as it is). A rollout that keeps
        its own account of the pods it places (``scheduling.sandbox``) saves copying the
        table, the largest part of a loaded state, and must not read it for them."""
        other = object.__new__(ClusterState)
        other.__dict__.update(self.__dict__)
        other.app_pods = {k: v.copy() for k, v in self.app_pods.items()}
        other.bound = self.bound if share_bound else self.bound.copy()
        other.bound_frozen = share_bound or self.bound_frozen
        other.images = self.images.copy()
        other.reservations = self.reservations.copy()
        other.disrupted = dict(self.disrupted)
        for name in ("allocated", "usage_allocated", "free_res", "nonzero_alloc", "be_allocated",
                     "be_allocatable", "gpu_free",
                     "gpu_max_free", "gpu_full", "version",
                     "gpu_pod_tags", "usage", "up", "unschedulable", "power",
                     "pod_count", "labels", "taints"):
            setattr(other, name, getattr(self, name).copy())
        return other
