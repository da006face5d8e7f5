"""Snapshots from real-form Kubernetes objects (the shared fixtures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from smartsched.k8s.snapshot import build_snapshot, gpu_model, pod_model
from smartsched.scheduling.base import make_scheduler


def _fgd(data_dir: Path) -> tuple[list[dict], list[dict]]:
    root = data_dir / "k8s-api-examples" / "hkust-fgd-test-cluster"
    nodes = [yaml.safe_load(p.read_text()) for p in sorted((root / "node").glob("*.yaml"))]
    pods = [yaml.safe_load(p.read_text()) for p in sorted((root / "pod").glob("*.yaml"))]
    return nodes, pods


def test_gpu_sharing_fixtures(data_dir: Path) -> None:
    nodes, pods = _fgd(data_dir)
    snap = build_snapshot(nodes, pods)
    assert snap.skipped == []
    n0 = snap.spec.nodes[0]
    assert (n0.name, n0.cpu_milli, n0.memory_mib, n0.num_gpu, n0.gpu_model) == (
        "pai-node-00", 64_000, 256_000, 2, "V100M16")
    byid = {p.id: p for p in snap.pending}
    assert (byid["pai-gpu/gpu-pod-00"].gpu_milli, byid["pai-gpu/gpu-pod-00"].num_gpu) == (500, 1)
    assert byid["pai-gpu/gpu-pod-01"].num_gpu == 0
    assert byid["pai-gpu/gpu-pod-01"].memory_mib == 17_408
    assert (byid["pai-gpu/gpu-pod-02"].num_gpu, byid["pai-gpu/gpu-pod-02"].cpu_milli) == (2, 12_000)
    # The same profiles decide for it.
    sched = make_scheduler("fgd")
    sched.prepare(snap.pending)
    for p in snap.pending:
        d = sched.decide(snap.state, snap.state.compile(p))
        assert d.node is not None


def test_bound_pods_are_allocated_and_gone_or_bad_ones_skipped(data_dir: Path) -> None:
    nodes, pods = _fgd(data_dir)
    bound = json.loads(json.dumps(pods[2]))
    bound["spec"]["nodeName"] = "pai-node-01"
    done = json.loads(json.dumps(pods[0]))
    done["metadata"]["name"] = "finished"
    done["spec"]["nodeName"] = "pai-node-00"
    done["status"] = {"phase": "Succeeded"}
    bad = {"metadata": {"name": "bad", "namespace": "x"},
           "spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}}
    broken_node = {"metadata": {"name": "n-broken"}, "status": {"allocatable": {"cpu": "4"}}}
    snap = build_snapshot([*nodes, broken_node], [bound, done, bad])
    i = snap.state.index["pai-node-01"]
    assert snap.state.allocated[i, 0] == 12_000 and (snap.state.gpu_free[i, :2] == 0).all()
    assert snap.bound == {"pai-gpu/gpu-pod-02": "pai-node-01"}
    reasons = {(k, n): r for k, n, r in snap.skipped}
    assert "needs cpu and memory" in reasons[("Node", "n-broken")]
    assert "cpu" in reasons[("Pod", "x/bad")]


def test_gke_nodelist(data_dir: Path) -> None:
    doc = json.loads((data_dir / "k8s-api-examples" / "gke-2017-nodelist" / "nodes.json")
                     .read_text())
    snap = build_snapshot(doc["items"])
    assert len(snap.spec.nodes) == 17 and not snap.skipped
    assert sum(n.unschedulable for n in snap.spec.nodes) == 2
    n = snap.spec.nodes[0]
    assert n.cpu_milli == 2000 and n.memory_mib == 13_317_664 // 1024
    assert {s.name for s in snap.spec.sites} >= {"us-central1"}


REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def test_quantities_affinity_tolerations_and_gangs() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {
               "scheduling.x-k8s.io/pod-group": "g1", "app": "web"},
               "annotations": {"scheduling.x-k8s.io/min-member": "4"}},
           "spec": {"priority": 7,
                    "containers": [{"resources": {"requests": {"cpu": "500m", "memory": "2Gi"},
                                                  "limits": {"nvidia.com/gpu": 2}}},
                                   {"resources": {"requests": {"cpu": "1e0"}}}],
                    "initContainers": [{"resources": {"requests": {"memory": "4Gi"}}}],
                    "nodeSelector": {"disk": "ssd"},
                    "affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "topology.kubernetes.io/region",
                                               "operator": "In", "values": ["eu-west1"]}]}]}}},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"},
                                    {"key": "dedicated", "operator": "Equal", "value": "ai",
                                     "effect": "NoSchedule"}]}}
    p = pod_model(pod)
    assert (p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli) == (1500, 4096, 2, 1000)
    assert p.node_selector == (("disk", "ssd"),) and p.allowed_regions == ("eu-west1",)
    assert p.tolerations == ("nvidia.com/gpu", "dedicated=ai:NoSchedule")
    assert (p.gang_id, p.gang_size, p.priority, p.app) == (f"{p.tenant}/g1", 4, 7, "web")
    assert gpu_model("NVIDIA-A100-SXM4-40GB") == "A100"
    assert gpu_model("Tesla-V100-SXM2-32GB") == "V100M32" and gpu_model("MI300") is None


def test_gpu_products_match_whole_names_and_unknown_ones_stay_a_selector() -> None:
    """An L40S is not an L4 (substring matching said so); a product the catalogue lacks
    keeps its label as a node selector, so the pod cannot land on just any GPU node."""
    assert gpu_model("NVIDIA-L40S") is None and gpu_model("NVIDIA-A40") is None
    assert gpu_model("NVIDIA-L4") == "L4" and gpu_model("NVIDIA-A10G") == "A10"
    assert gpu_model("NVIDIA-H100-80GB-HBM3") == "H100"

    def pod(product: str) -> dict:
        return {"metadata": {"name": "p"}, "spec": {
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}],
            "nodeSelector": {"nvidia.com/gpu.product": product}}}

    known = pod_model(pod("NVIDIA-A100-SXM4-40GB"))
    # The device constraint and the label match both (probe round 5: the label was
    # dropped, and a 40GB pod passed an 80GB node).
    assert known.gpu_models == ("A100",) and known.node_selector == (
        ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-40GB"),)
    unknown = pod_model(pod("NVIDIA-L40S"))
    assert unknown.gpu_models == () and unknown.node_selector == (
        ("nvidia.com/gpu.product", "NVIDIA-L40S"),)


def test_one_bad_bound_pod_or_an_empty_region_label_does_not_stop_a_snapshot(
        data_dir: Path) -> None:
    """A bound pod's device annotation that is not device numbers (or overflows int64) is
    skipped with a reason, not raised out of the scheduler's pass; an empty region or
    zone label (Kubernetes allows it) means none given."""
    import copy

    nodes, pods = _fgd(data_dir)
    nodes = copy.deepcopy(nodes)
    nodes[0]["metadata"]["labels"]["topology.kubernetes.io/region"] = ""
    nodes[0]["metadata"]["labels"]["topology.kubernetes.io/zone"] = ""
    bad = []
    for i, index in enumerate(("x", "9" * 5000, "1" + "0" * 30)):
        p = copy.deepcopy(pods[0])
        p["metadata"]["name"] = f"bad-{i}"
        p["metadata"].setdefault("annotations", {})["alibabacloud.com/gpu-index"] = index
        p["spec"]["nodeName"] = nodes[0]["metadata"]["name"]
        bad.append(p)
    snap = build_snapshot(nodes, [*pods, *bad])
    skipped = {name: why for kind, name, why in snap.skipped if kind == "Pod"}
    assert {f"{bad[0]['metadata'].get('namespace') or 'default'}/bad-{i}"
            for i in range(3)} <= set(skipped)
    assert snap.spec.nodes[0].zone == "default-region/default-zone"


def test_pod_priority_is_an_int32_as_the_api_server_has_it() -> None:
    import pytest

    def pod(priority: object) -> dict:
        return {"metadata": {"name": "p"}, "spec": {"priority": priority, "containers": [
            {"resources": {"requests": {"cpu": "100m"}}}]}}

    assert pod_model(pod(7)).priority == 7 and pod_model(pod(None)).priority == 0
    for bad in (1.9, True, "5", 2**31):
        with pytest.raises(ValueError, match=r"spec\.priority"):
            pod_model(pod(bad))


def test_required_affinity_the_model_cannot_express_is_refused_where_we_bind() -> None:
    """The extender leaves required affinity to kube-scheduler (which checks it before
    asking); `smartsched k8s scheduler` binds, so a form it cannot enforce is refused
    (FailedScheduling with the reason), never ignored."""
    import pytest

    def pod(*exprs: dict, terms: int = 1) -> dict:
        term = {"matchExpressions": list(exprs)}
        return {"metadata": {"name": "p"}, "spec": {
            "containers": [{"resources": {"requests": {"cpu": "100m"}}}],
            "affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [term] * terms}}}}}

    one = pod({"key": "disk", "operator": "In", "values": ["ssd"]})
    assert pod_model(one, enforce_affinity=True).node_selector == (("disk", "ssd"),)
    for bad in (pod({"key": "disk", "operator": "NotIn", "values": ["hdd"]}),
                pod({"key": "disk", "operator": "In", "values": ["ssd", "nvme"]}),
                pod({"key": "gpu", "operator": "Exists"}),
                pod({"key": "disk", "operator": "In", "values": ["ssd"]}, terms=2)):
        assert pod_model(bad).id == "default/p"  # the extender's reading: kube-scheduler checks
        with pytest.raises(ValueError, match="nodeAffinity"):
            pod_model(bad, enforce_affinity=True)


@pytest.mark.parametrize(("selector", "why"), [
    ({f"k{i}": "v" for i in range(65)}, "at most 64"),
    ({"disk": "x" * 64}, "label values"),
    ({"bad key!": "ssd"}, "label keys"),
    ({"Example.COM/disk": "ssd"}, "label keys"),
])
def test_a_node_selector_the_api_server_would_refuse_is_refused(selector: dict,
                                                                  why: str) -> None:
    """The extender kept every pod it saw for its workload view, selector as sent: a
    selector of 790,000 keys of 63-character values (a 59 MB body) held ~220 MiB a
    request, 2,000 requests kept (probe round 8). The API server's rules apply now."""
    from smartsched.k8s.snapshot import pod_model

    obj = {"metadata": {"name": "p", "namespace": "default"},
           "spec": {"nodeSelector": selector, "containers": [
               {"name": "c", "resources": {"requests": {"cpu": "100m"}}}]}}
    with pytest.raises(ValueError, match=f"spec.nodeSelector: .*{why}"):
        pod_model(obj)
    obj["spec"]["nodeSelector"] = {"example.com/disk": "ssd", "zone": ""}
    assert dict(pod_model(obj).node_selector) == {"example.com/disk": "ssd", "zone": ""}
