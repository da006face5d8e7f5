"""Profiles: each packaged one places by its own rule; user files; errors that name the field."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smartsched.model.cluster import ClusterSpec, NodeSpec, Site, Zone
from smartsched.model.errors import UnknownReferenceError, ValidationError
from smartsched.model.pod import Pod
from smartsched.model.resources import CPU, MEM
from smartsched.scheduling.base import make_scheduler
from smartsched.scheduling.registry import builtin_profiles, load_profile, profile_from_dict
from smartsched.twin.state import ClusterState
from tests.builders import pod

BASE = {"name": "mine", "filters": ["NodeResourcesFit"],
        "score": [{"name": "NodeResourcesFit", "weight": 1}]}


# ------------------------------------------------------------------ placement by rule
# One cluster, thirteen GPU nodes (32 cores, 64000 MiB, 8 A100s unless said otherwise).
# Six can host the pod; seven cannot, and each of those is built to be what some rule
# would like best if the filters let it through (empty, fullest, tightest GPU, lowest
# index). Every placed pod asks 2 MiB per millicore, as the nodes have, so cpu and
# memory fractions stay equal and BalancedAllocation never decides.
GPU_TAINT = "nvidia.com/gpu=present:NoSchedule"
CPU_CAP, MEM_CAP, GPUS = 32_000, 64_000, 8


@dataclass(frozen=True)
class Setup:
    """A node, the pods already on it (with their devices) and its measured cpu/mem use."""

    spec: NodeSpec
    placed: tuple[tuple[Pod, tuple[int, ...]], ...] = ()
    used: float = 0.0  # fraction of capacity, cpu and memory alike


def _gpu_node(name: str, *, zone: str = "z1", labels: dict[str, str] | None = None,
              taints: tuple[str, ...] = (GPU_TAINT,), model: str = "A100",
              unschedulable: bool = False) -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=CPU_CAP, memory_mib=MEM_CAP, num_gpu=GPUS,
                    gpu_model=model, zone=zone,
                    labels={"pool": "gpu"} if labels is None else labels,
                    taints=taints, unschedulable=unschedulable)


def _whole(dev: int, cpu: int = 1500) -> tuple[Pod, tuple[int, ...]]:
    return pod(f"whole-{dev}", cpu=cpu, mem=2 * cpu, num_gpu=1, gpu_milli=1000), (dev,)


def _share(dev: int, milli: int = 500, cpu: int = 3000) -> tuple[Pod, tuple[int, ...]]:
    return pod(f"share-{dev}", cpu=cpu, mem=2 * cpu, num_gpu=1, gpu_milli=milli), (dev,)


def _cpu(cpu: int) -> tuple[Pod, tuple[int, ...]]:
    return pod(f"cpu-{cpu}", cpu=cpu, mem=2 * cpu), ()


NODES: tuple[Setup, ...] = (
    # Cannot host the pod:
    Setup(_gpu_node("cordoned", unschedulable=True)),  # empty, index 0
    Setup(_gpu_node("tainted", taints=(GPU_TAINT, "dedicated=infra:NoSchedule"))),  # empty
    Setup(_gpu_node("unlabelled", labels={}),  # the tightest GPU of all (500 milli left)
          (*(_whole(d) for d in range(7)), _share(7))),
    Setup(_gpu_node("too-full"), (_share(0), _cpu(28_000))),  # 1000 m cpu left
    Setup(_gpu_node("gpus-full"), tuple(_share(d, 700, 500) for d in range(GPUS))),
    Setup(_gpu_node("t4", model="T4"), (_share(0, cpu=1000),)),  # only GPU-share pods
    Setup(_gpu_node("far", zone="z3")),  # empty, in region r2
    # Can host it:
    Setup(_gpu_node("moderate"), (_cpu(16_000),), used=0.4),  # the lowest feasible index
    Setup(_gpu_node("fullest"), (_cpu(20_000),), used=0.5),
    Setup(_gpu_node("gpu-busy"), (*(_whole(d) for d in range(6)), _share(6)), used=0.3),
    Setup(_gpu_node("cool"), (_cpu(8000),), used=0.02),
    Setup(_gpu_node("hot"), (_cpu(4000),), used=0.8),  # over LoadAware's 65 % cpu
    Setup(_gpu_node("emptiest"), tuple(_whole(d, 500) for d in (1, 3, 5, 7)), used=0.7),
)
CLUSTER = ClusterSpec("placement", (Site("r1"), Site("r2")),
                      (Zone("z1", "r1"), Zone("z3", "r2")), tuple(s.spec for s in NODES))
# FGD's target workload: 60 % half-GPU shares, 40 % whole GPUs.
TYPICAL = [pod(f"s{i}", num_gpu=1, gpu_milli=500) for i in range(3)] + [
    pod(f"w{i}", num_gpu=1, gpu_milli=1000) for i in range(2)]


def _pod(cls: str = "batch", gpus: int = 1) -> Pod:
    """The pod to place: half a GPU (``gpus=1``) or two whole GPUs, A100 only, pool=gpu,
    tolerating the GPU taint, region r1 only."""
    return pod("p", cpu=2000, mem=4000, num_gpu=gpus, gpu_milli=500 if gpus == 1 else 1000,
               gpu_models=("A100",), node_selector=(("pool", "gpu"),),
               tolerations=("nvidia.com/gpu",), allowed_regions=("r1",), pod_class=cls)


# Facts read off the setup (not off ClusterState), and the feasibility oracle.
def _cpu_alloc(s: Setup) -> int:
    return sum(p.cpu_milli for p, _ in s.placed)


def _gpu_free(s: Setup) -> list[int]:
    free = [1000] * s.spec.num_gpu
    for p, devs in s.placed:
        for d in devs:
            free[d] -= p.gpu_milli
    return free


def _feasible(s: Setup, p: Pod) -> bool:
    n = s.spec
    site = {"z1": "r1", "z3": "r2"}[n.zone]
    tolerated = {t.split("=")[0] for t in p.tolerations}
    hard = [t for t in n.taints if t.endswith((":NoSchedule", ":NoExecute"))]
    return (not n.unschedulable
            and n.cpu_milli - _cpu_alloc(s) >= p.cpu_milli
            and n.memory_mib - sum(q.memory_mib for q, _ in s.placed) >= p.memory_mib
            and n.gpu_model in p.gpu_models
            and sum(f >= p.gpu_milli for f in _gpu_free(s)) >= p.num_gpu
            and all(t.split("=")[0] in tolerated for t in hard)
            and all(n.labels.get(k) == v for k, v in p.node_selector)
            and site in p.allowed_regions)


# Each profile's rule as a sort key per node (lower is better; None: the rule itself
# excludes the node), written from the profiles' docs, not from their code.
Rule = Callable[[Setup, Pod, int], Any]


def least_allocated(s: Setup, p: Pod, i: int) -> Any:
    return _cpu_alloc(s)  # LeastAllocated: spread


def most_allocated(s: Setup, p: Pod, i: int) -> Any:
    return -_cpu_alloc(s)  # MostAllocated: bin-pack cpu and memory


def lowest_index(s: Setup, p: Pod, i: int) -> Any:
    return i


def least_leftover(s: Setup, p: Pod, i: int) -> Any:
    # BestFit: least cpu and GPU left after placing, cpu over 128 cores, GPU over 8 GPUs.
    left_cpu = s.spec.cpu_milli - _cpu_alloc(s) - p.cpu_milli
    return left_cpu / 128_000 + (sum(_gpu_free(s)) - p.gpu_total_milli) / 8000


def best_alignment(s: Setup, p: Pod, i: int) -> Any:
    # DotProd: the smallest dot product of the node's free vector with the request.
    left_cpu = s.spec.cpu_milli - _cpu_alloc(s)
    return left_cpu * p.cpu_milli / 128_000**2 + sum(_gpu_free(s)) * p.gpu_total_milli / 8000**2


def tightest_gpu(s: Setup, p: Pod, i: int) -> Any:
    # GpuPacking: a partly used GPU first (the tightest), then a partly used node, then idle.
    fits = [f for f in _gpu_free(s) if f >= p.gpu_milli]
    if not fits:
        return None
    tight = min(fits)
    return (0 if tight < 1000 else 1 if min(_gpu_free(s)) < 1000 else 2, tight)


def same_shape(s: Setup, p: Pod, i: int) -> Any:
    # GpuClustering: nodes holding only GPU pods of this pod's shape, then this shape and
    # others, then no GPU pods, then only other shapes; fuller GPUs first within a group.
    def shape(q: Pod) -> int:
        return 0 if q.gpu_milli < 1000 else q.num_gpu

    shapes = {shape(q) for q, _ in s.placed if q.num_gpu}
    mine = shape(p)
    group = (0 if shapes == {mine} else 1 if mine in shapes else 2 if not shapes else 3)
    return group, sum(_gpu_free(s))


def _fragmentation(free: list[int], cpu_left: int) -> float:
    """The FGD paper's expected fragmentation of one node for TYPICAL (cpu 1000 m each):
    a task that fits strands the devices too small for it, one that does not all free GPU."""
    out = 0.0
    for g, share in ((500, 0.6), (1000, 0.4)):
        fits = any(f >= g for f in free) and cpu_left >= 1000
        out += share * (sum(f for f in free if f < g) if fits else sum(free))
    return out


def least_fragmentation(s: Setup, p: Pod, i: int) -> Any:
    # FGD: the device (and so the node) whose use grows fragmentation least.
    free, cpu_left = _gpu_free(s), s.spec.cpu_milli - _cpu_alloc(s)
    before = _fragmentation(free, cpu_left)
    growth = [_fragmentation([f - p.gpu_milli * (j == d) for j, f in enumerate(free)],
                             cpu_left - p.cpu_milli) - before
              for d in range(len(free)) if free[d] >= p.gpu_milli]
    return min(growth) if growth else None


def least_used(s: Setup, p: Pod, i: int) -> Any:
    # LoadAware: nodes over 65 % measured cpu use are out; then the least used.
    return None if s.used > 0.65 else s.used


def one_switch_then_spread(s: Setup, p: Pod, i: int) -> Any:
    # NumaAware: k GPUs under one PCIe switch (GPUs sit in pairs under a switch) beat
    # GPUs spread over switches; then LeastAllocated.
    free = _gpu_free(s)
    pairs = [sum(f >= p.gpu_milli for f in free[w:w + 2]) for w in range(0, len(free), 2)]
    return (0 if max(pairs) >= p.num_gpu else 1, _cpu_alloc(s))


CASES: list[tuple[str, str, int, Rule | None]] = [
    # profile, pod class, GPUs asked (1: half a GPU, 2: two whole GPUs), its rule
    ("bestfit", "batch", 1, least_leftover),
    ("binpack", "batch", 1, most_allocated),
    ("dotprod", "batch", 1, best_alignment),
    ("fgd", "batch", 1, least_fragmentation),
    ("first-fit", "batch", 1, lowest_index),
    ("gpu-clustering", "batch", 1, same_shape),
    ("gpu-packing", "batch", 1, tightest_gpu),
    ("k8s-default", "batch", 1, least_allocated),
    ("k8s-default", "batch", 2, least_allocated),
    ("k8s-default-v1.20", "batch", 1, least_allocated),
    # make_scheduler attaches no forecaster (the twin does): these plan on state.usage.
    ("load-aware", "batch", 1, least_used),
    ("load-aware-forecast", "batch", 1, least_used),
    ("load-aware-forecast-median", "batch", 1, least_used),
    ("numa-aware", "batch", 1, least_allocated),
    ("numa-aware", "batch", 2, one_switch_then_spread),
    # The split routes by class: online -> load-aware, batch -> binpack, ai -> fgd.
    ("online-batch", "online", 1, least_used),
    ("online-batch", "batch", 1, most_allocated),
    ("online-batch", "ai-infer", 1, least_fragmentation),
    ("random", "batch", 1, None),  # any feasible node, uniformly
    # The composite: online by load (LoadAware scores, no filter), GPU pods by accelerator
    # tier then least leftover (every GPU node here has 8 GPUs: one tier), batch packed.
    ("composite-online", "online", 1, least_used),
    ("composite-accelerators", "ai-infer", 1, least_leftover),
    ("composite-accelerators", "ai-train", 2, least_leftover),
    ("composite-batch", "batch", 1, most_allocated),
    ("composite", "online", 1, least_used),
    ("composite", "ai-train", 2, least_leftover),
    ("composite", "batch", 1, most_allocated),
    # The composite's placement; its queue order and toleration are the run's.
    ("finance", "online", 1, least_used),
    ("finance", "batch", 1, most_allocated),
    # One grid (this cluster's): GridCarbon scores every node alike; CarbonShift defers
    # only pods with a deadline.
    ("green-batch", "batch", 1, most_allocated),
    ("green", "online", 1, least_used),
    ("green", "batch", 1, most_allocated),
]


def _state() -> ClusterState:
    st = ClusterState(CLUSTER)
    for i, s in enumerate(NODES):
        for p, devices in s.placed:
            st.allocate(i, st.compile(p), devices)
    used = np.array([s.used for s in NODES])
    st.usage[:, 0] = used * st.capacity[:, CPU]
    st.usage[:, 1] = used * st.capacity[:, MEM]
    st.usage_allocated[:] = st.allocated  # the sample saw every pod placed so far
    return st


def _place(name: str, p: Pod, seed: int) -> int:
    sched = make_scheduler(name, seed=seed)
    if hasattr(sched, "prepare"):
        sched.prepare(TYPICAL)
    st = _state()
    d = sched.decide(st, st.compile(p))
    assert d.node is not None, d.reasons
    if d.devices is not None:  # the binder's devices fit on the chosen node
        free = _gpu_free(NODES[d.node])
        assert len(set(d.devices)) == p.num_gpu
        assert all(free[x] >= p.gpu_milli for x in d.devices)
    return d.node


def test_every_packaged_profile_has_a_placement_case() -> None:
    assert {c[0] for c in CASES} == set(builtin_profiles())


@pytest.mark.parametrize(("name", "cls", "gpus", "rule"), CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}gpu" for c in CASES])
def test_packaged_profile_places_by_its_rule(name: str, cls: str, gpus: int,
                                             rule: Rule | None) -> None:
    p = _pod(cls, gpus)
    feasible = {i for i, s in enumerate(NODES) if _feasible(s, p)}
    assert len(feasible) >= 4  # a real choice
    if rule is None:  # random: every feasible node, and only those, over seeds
        assert {_place(name, p, seed) for seed in range(40)} == feasible
        return
    keys = {i: k for i, s in enumerate(NODES) if (k := rule(s, p, i)) is not None}
    best = min(keys[i] for i in feasible if i in keys)
    expected = [i for i in feasible if keys.get(i) == best]
    assert len(expected) == 1, "the case must have one right answer (no tie)"
    # Some node the filters must keep out would be the rule's choice, or tie with it.
    assert any(keys[i] <= best for i in keys if i not in feasible)
    for seed in range(3):  # a tie-break could not hide behind one seed
        node = _place(name, p, seed)
        assert node in feasible, NODES[node].spec.name
        assert node == expected[0], (NODES[node].spec.name, NODES[expected[0]].spec.name)


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"filters": ["Nope"]}, "mine.filters[0].name"),
        ({"score": [{"name": "NodeResourcesFit", "args": {"strategy": "Fancy"}}]},
         "mine.score[0].args.strategy"),
        ({"score": [{"name": "NodeResourcesFit", "args": {"colour": 1}}]},
         "mine.score[0].args.colour"),
        ({"score": [{"name": "NodeResourcesFit", "weight": 0}]}, "mine.score[0].weight"),
        ({"filters": ["DotProd"]}, "mine.filters[0]"),
        ({"score": ["NodeUnschedulable"]}, "mine.score[0]"),
        ({"tie_break": "coin"}, "mine.tie_break"),
        ({"filters": []}, "mine.filters"),
        ({"colour": "red"}, "profile.colour"),
        ({"queue_sort": "shortest-first"}, "mine.queue_sort"),
        ({"failure_toleration_s": -1}, "mine.failure_toleration_s"),
        ({"failure_toleration_s": "soon"}, "mine.failure_toleration_s"),
    ],
)
def test_profile_errors_name_the_field(patch: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        profile_from_dict({**BASE, **patch})
    assert e.value.field == field


def test_user_profile_file(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("name: packer\nfilters: [NodeUnschedulable, NodeResourcesFit]\n"
                 "score:\n  - {name: NodeResourcesFit, weight: 2,\n"
                 "     args: {strategy: MostAllocated}}\n")
    prof = load_profile(str(f))
    assert prof.name == "packer" and prof.scorers[0][1] == 2.0
    with pytest.raises(UnknownReferenceError):
        load_profile(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(ValidationError, match="YAML"):
        load_profile(str(bad))


def test_run_settings_reach_the_twin() -> None:
    """A profile's queue order and NotReady toleration are the run's; others keep the
    twin's (Kubernetes order, the cluster's 300 s)."""
    from smartsched.scheduling.run import build_run

    prof = profile_from_dict({**BASE, "queue_sort": "least-slack", "failure_toleration_s": 5})
    assert (prof.queue_sort, prof.failure_toleration_s) == ("least-slack", 5.0)
    fin = build_run("finance", "finance", "finance", hours=1.0)
    assert fin.engine.queue.order == "least-slack" and fin.engine.failure_toleration_s == 10.0
    assert fin.settings["queue_sort"] == "least-slack"
    k8s = build_run("finance", "finance", "k8s-default", hours=1.0)
    assert k8s.engine.queue.order == "priority" and k8s.engine.failure_toleration_s == 300.0
    short = build_run("finance", "finance", "k8s-default", hours=1.0,
                      engine_overrides={"eviction_toleration_s": 30.0})
    assert short.engine.failure_toleration_s == 30.0


def test_a_filter_that_refuses_no_node_keeps_the_retry_hint() -> None:
    """Reservations has no queueing hint; when it refuses no node, a pod refused for room
    still gets a hint (it used to be retried on every event: 50x the decisions)."""
    from smartsched.scheduling.framework import ProfileScheduler
    from smartsched.twin.state import ClusterState
    from tests.builders import cluster, node, pod

    prof = profile_from_dict({"name": "r", "filters": ["NodeResourcesFit", "Reservations"]})
    st = ClusterState(cluster(node("a", cpu=1000)))
    req = st.compile(pod("big", cpu=2000))
    d = ProfileScheduler(prof).decide(st, req)
    assert d.node is None and d.retry is not None
