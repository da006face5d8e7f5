"""Pods by class: what each running pod gets, and the node's per-class sums.

Pod use: a pod wants ``request * usage_factor`` of CPU and memory (the twin's
usage sample, ``twin.sampling.running_use``). Best-effort pods get only what
the others leave of the node, each in the node's ratio got / wanted (CPU and
memory apart); their devices are not counted:

    cpu  = demand_cpu * (be_got_cpu / be_demand_cpu)[node]   if best-effort
    gpu  = request_gpu * factor                              if not best-effort, else 0

CFS throttling: a pod using more than its CPU request runs into its limit (the
twin's use is what it got; CFS withheld a further 25 % of the excess), and a
best-effort pod loses what the node's slack lacks:

    throttled          = 0.25 * max(demand - request, 0) + (demand - got)
    throttled periods  = 10/s * sum over pods of clip(5 * throttled / max(demand, 1), 0, 1)

Per class (``catalogue.CLASS_NAMES`` order): pod count, CPU seconds, throttled
CPU seconds, memory working set, GPU devices used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from smartsched.model.resources import CPU, GPU, MEM
from smartsched.twin.sampling import RunningUse
from smartsched.twin.telemetry.catalogue import CLASS_NAMES
from smartsched.twin.telemetry.families.base import MIB, Columns

THROTTLE_SHARE: Final = 0.25
CFS_PERIODS_PER_S: Final = 10.0
NUM_CLASSES: Final = len(CLASS_NAMES)


@dataclass(frozen=True, slots=True, eq=False)
class PodUse:
    """Every running pod's requests and use now ([P] arrays, twin units: milli, MiB).

    Attributes:
        index: pod index in the twin's pod table (the key of seeded hashes).
        node: node each pod runs on (int64).
        cls: class id (``model.pod.POD_CLASS_IDS``, int64).
        factor: share of its request the pod wants (``usage_factor``).
        request_cpu, request_mem, request_gpu: requests (gpu: milli over all devices).
        demand_cpu: CPU the pod wants (request * factor).
        cpu, mem: what it gets (best-effort pods scaled down by the node's slack).
        gpu: device milli it uses (0 for best-effort pods).
    """

    index: np.ndarray
    node: np.ndarray
    cls: np.ndarray
    factor: np.ndarray
    request_cpu: np.ndarray
    request_mem: np.ndarray
    request_gpu: np.ndarray
    demand_cpu: np.ndarray
    cpu: np.ndarray
    mem: np.ndarray
    gpu: np.ndarray


def pod_use(use: RunningUse, requests: np.ndarray, cls: np.ndarray) -> PodUse:
    """Per-pod use from a usage sample; ``requests`` [P, R] and ``cls`` [P] of ``use.pods``."""
    f, be = use.factor, use.best_effort
    dem_cpu, dem_mem = requests[:, CPU] * f, requests[:, MEM] * f
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(use.be_demand > 0, use.be_got / use.be_demand, 1.0)
    node = use.nodes.astype(np.int64)
    return PodUse(
        index=use.pods, node=node, cls=np.asarray(cls).astype(np.int64), factor=f,
        request_cpu=requests[:, CPU].astype(np.float64),
        request_mem=requests[:, MEM].astype(np.float64),
        request_gpu=requests[:, GPU].astype(np.float64),
        demand_cpu=dem_cpu,
        cpu=np.where(be, dem_cpu * scale[node, 0], dem_cpu),
        mem=np.where(be, dem_mem * scale[node, 1], dem_mem),
        gpu=np.where(be, 0.0, requests[:, GPU] * f),
    )


def by_class(node: np.ndarray, cls: np.ndarray, num_nodes: int,
             weights: np.ndarray | None = None) -> np.ndarray:
    """[N, classes] sum of ``weights`` (or a count) over the pods of each node and class."""
    key = node * NUM_CLASSES + cls
    return np.bincount(key, weights, minlength=num_nodes * NUM_CLASSES).reshape(
        num_nodes, NUM_CLASSES)


def throttled_milli(demand_cpu: np.ndarray, request_cpu: np.ndarray,
                    got_cpu: np.ndarray) -> np.ndarray:
    """[P] CPU milli CFS withholds: ``0.25 * max(demand - request, 0) + (demand - got)``."""
    return THROTTLE_SHARE * np.maximum(demand_cpu - request_cpu, 0.0) + (demand_cpu - got_cpu)


def pod_family(pods: PodUse, num_nodes: int) -> Columns:
    """The per-class pod columns and the node's CFS throttled periods."""
    nd, n = pods.node, num_nodes
    thr = throttled_milli(pods.demand_cpu, pods.request_cpu, pods.cpu)
    throttled_frac = np.clip(5.0 * thr / np.maximum(pods.demand_cpu, 1.0), 0.0, 1.0)
    return {
        "smartsched_node_pods": by_class(nd, pods.cls, n).astype(np.float64),
        "smartsched_node_pod_cpu_seconds_total": by_class(nd, pods.cls, n, pods.cpu / 1000.0),
        "smartsched_node_pod_cpu_throttled_seconds_total": by_class(nd, pods.cls, n,
                                                                    thr / 1000.0),
        "smartsched_node_pod_memory_working_set_bytes": by_class(nd, pods.cls, n,
                                                                 pods.mem * MIB),
        "smartsched_node_pod_gpu_used_devices": by_class(nd, pods.cls, n, pods.gpu / 1000.0),
        "smartsched_node_cpu_cfs_throttled_periods_total": CFS_PERIODS_PER_S * np.bincount(
            nd, throttled_frac, minlength=n),
    }
