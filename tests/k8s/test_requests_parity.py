"""A pod's requests as kube-scheduler counts them (sidecars, the init phase, pod-level
resources, RuntimeClass overhead), resources the twin does not track refused by the
scheduler that binds, and pods held by scheduling gates left alone."""

from __future__ import annotations

from typing import Any

import pytest

from smartsched.k8s.scheduler import SchedulerLoop
from smartsched.k8s.snapshot import pod_model
from tests.k8s.fake_apiserver import FakeAPIServer
from tests.k8s.test_scheduler import _client
from tests.k8s.test_scheduler_sequences import _overbooked, node, pod


def c(cpu: str, gpu: str | None = None, limit_gpu: str | None = None,
      sidecar: bool = False) -> dict[str, Any]:
    req = {"cpu": cpu}
    if gpu:
        req["nvidia.com/gpu"] = gpu
    res: dict[str, Any] = {"requests": req}
    if limit_gpu:
        res["limits"] = {"nvidia.com/gpu": limit_gpu}
    out: dict[str, Any] = {"name": "x", "resources": res}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def shaped(containers: list[dict], init: list[dict] | None = None, **spec: Any
           ) -> dict[str, Any]:
    p = pod("p")
    p["spec"]["containers"] = containers
    if init:
        p["spec"]["initContainers"] = init
    p["spec"].update(spec)
    return p


@pytest.mark.parametrize("obj, cpu_milli", [
    # an ordinary init container runs alone: the larger of it and the app containers
    (shaped([c("1")], [c("3")]), 3000),
    (shaped([c("2"), c("1")], [c("1")]), 3000),
    # a sidecar runs on beside the app containers, and beside later init containers
    (shaped([c("2")], [c("2", sidecar=True)]), 4000),
    (shaped([c("1")], [c("1", sidecar=True), c("3")]), 4000),
    (shaped([c("1")], [c("3"), c("1", sidecar=True)]), 3000),
    # RuntimeClass overhead on top; pod-level requests replace the containers' cpu
    (shaped([c("1")], overhead={"cpu": "250m"}), 1250),
    (shaped([c("1"), c("1")], resources={"requests": {"cpu": "3"}}), 3000),
    (shaped([c("1")], resources={"requests": {"cpu": "500m"}}, overhead={"cpu": "100m"}), 600),
])
def test_requests_are_counted_as_kube_scheduler_counts_them(obj: dict, cpu_milli: int) -> None:
    assert pod_model(obj).cpu_milli == cpu_milli


def test_a_gpu_given_as_a_limit_counts_in_every_container() -> None:
    """The limit-only GPU of a second container was dropped once the first requested one."""
    assert pod_model(shaped([c("1", gpu="1"), c("1", limit_gpu="2")])).num_gpu == 3


def test_a_sidecar_is_counted_so_the_node_is_not_overbooked() -> None:
    """A 2-core app with a 2-core sidecar counted as 2 cores: a third pod was bound onto
    the 4-core node beside it (the kubelet refuses it: OutOfcpu)."""
    first = shaped([c("2")], [c("2", sidecar=True)])
    with FakeAPIServer([node("n1", cpu="4")], [first, pod("late", "1")]) as api:
        core, _ = _client(api.url)
        res = SchedulerLoop(core).run_once()
        assert res.bound == {"default/p": "n1"}
        assert "Insufficient cpu" in res.failed["default/late"]
        assert _overbooked(api) == {}


def test_a_resource_the_twin_does_not_track_is_refused_by_name() -> None:
    huge = pod("huge")
    huge["spec"]["containers"][0]["resources"]["requests"]["hugepages-2Mi"] = "1Gi"
    disk = pod("disk")
    disk["spec"]["containers"][0]["resources"]["requests"]["ephemeral-storage"] = "10Gi"
    with FakeAPIServer([node("n1")], [huge, disk]) as api:
        core, _ = _client(api.url)
        res = SchedulerLoop(core).run_once()
        assert res.bound == {"default/disk": "n1"}
        why = res.failed["default/huge"]
        assert why.startswith("not understood: spec.containers.resources: this scheduler "
                              "does not track hugepages-2Mi per node"), why
    assert pod_model(huge).cpu_milli == 1000  # the extender leaves it to kube-scheduler


def test_a_gated_pod_waits_for_its_gates_without_a_reason_or_a_bind() -> None:
    """A pod held by ``spec.schedulingGates`` (Kueue holds pods so until admitted) was
    bound at once, past the quota that gated it."""
    gated = pod("gated")
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    with FakeAPIServer([node("n1")], [gated]) as api:
        core, _ = _client(api.url)
        loop = SchedulerLoop(core)
        res = loop.run_once()
        assert res.bound == {} and res.failed == {} and api.events == []
        assert api.status_patches == []
        with api.lock:
            api.pods[("default", "gated")]["spec"]["schedulingGates"] = []
        assert loop.run_once().bound == {"default/gated": "n1"}


@pytest.mark.parametrize("field, value, named", [
    ("affinity", {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}},
         "topologyKey": "kubernetes.io/hostname"}]}}, "spec.affinity.podAntiAffinity"),
    ("affinity", {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}},
         "topologyKey": "topology.kubernetes.io/zone"}]}}, "spec.affinity.podAffinity"),
    ("topologySpreadConstraints", [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                    "whenUnsatisfiable": "DoNotSchedule",
                                    "labelSelector": {"matchLabels": {"app": "web"}}}],
     "spec.topologySpreadConstraints"),
    ("volumes", [{"name": "data", "persistentVolumeClaim": {"claimName": "data-0"}}],
     "spec.volumes.data"),
])
def test_placement_rules_the_twin_does_not_check_are_refused_by_name(
        field: str, value: Any, named: str) -> None:
    """Such a pod was bound as if it had none: two replicas on one node against their
    anti-affinity, a pod on a node its zonal volume cannot attach to."""
    rule = pod("rule")
    rule["spec"][field] = value
    with FakeAPIServer([node("n1")], [rule, pod("plain")]) as api:
        core, _ = _client(api.url)
        res = SchedulerLoop(core).run_once()
        assert res.bound == {"default/plain": "n1"}
        assert res.failed["default/rule"].startswith(f"not understood: {named}"), res.failed


def test_soft_rules_and_plain_volumes_are_no_reason_to_refuse() -> None:
    soft = pod("soft")
    soft["spec"]["topologySpreadConstraints"] = [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
         "whenUnsatisfiable": "ScheduleAnyway"}]
    soft["spec"]["affinity"] = {"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "podAffinityTerm": {
            "labelSelector": {}, "topologyKey": "kubernetes.io/hostname"}}]}}
    soft["spec"]["volumes"] = [{"name": "tmp", "emptyDir": {}}]
    soft["spec"]["containers"][0]["ports"] = [{"containerPort": 80}]
    with FakeAPIServer([node("n1")], [soft]) as api:
        core, _ = _client(api.url)
        assert SchedulerLoop(core).run_once().bound == {"default/soft": "n1"}


def test_a_host_port_is_refused_by_name() -> None:
    hp = pod("hp")
    hp["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    with FakeAPIServer([node("n1")], [hp]) as api:
        core, _ = _client(api.url)
        why = SchedulerLoop(core).run_once().failed["default/hp"]
        assert why.startswith("not understood: spec.containers.ports.hostPort"), why


def test_a_node_takes_no_more_pods_than_it_admits() -> None:
    """The node's allocatable ``pods`` (110 by default) was not read: small pods were
    bound past it, and the kubelet refuses them (OutOfpods)."""
    full = node("n1", cpu="64")
    full["status"]["allocatable"]["pods"] = "3"
    none = node("n2", cpu="64")
    none["status"]["allocatable"]["pods"] = "0"
    pods = [pod("run", "100m", on="n1", scheduler="x"), *(pod(f"p{i}", "100m") for i in range(4))]
    with FakeAPIServer([full, none], pods) as api:
        core, _ = _client(api.url)
        res = SchedulerLoop(core).run_once()
        assert sorted(res.bound) == ["default/p0", "default/p1"]
        assert set(res.bound.values()) == {"n1"}
        assert "Too many pods" in res.failed["default/p2"]


def test_a_pod_limit_survives_a_cluster_file_and_is_read_from_yaml(tmp_path) -> None:
    from smartsched.model.cluster_io import read_cluster, write_cluster
    from smartsched.model.presets import cluster_from_dict

    spec = cluster_from_dict({"name": "c", "sites": [{"name": "s"}],
                              "zones": [{"name": "z", "site": "s"}],
                              "nodes": [{"name": "n", "zone": "z", "cpu_milli": 4000,
                                         "memory_mib": 4096, "max_pods": 2}]})
    assert spec.nodes[0].max_pods == 2
    write_cluster(spec, tmp_path / "c.parquet")
    assert read_cluster(tmp_path / "c.parquet").nodes[0].max_pods == 2
