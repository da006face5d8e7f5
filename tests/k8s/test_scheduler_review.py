"""Review of the pod-group, PodScheduled / nominatedNodeName, request-counting and
pod-limit work against kube-scheduler and the Coscheduling plugin: a status patch that
fails is sent again, a pod recreated under the same name is marked, a nomination that no
longer holds is cleared (upstream's clearNominatedNode), members that disagree on their
min-member are refused, pod-level hugepages and DRA resource claims are refused by name,
and a bound pod the model refuses still takes its place on its node."""

from __future__ import annotations

from typing import Any

import pytest

from smartsched.k8s.scheduler import SchedulerLoop
from smartsched.k8s.snapshot import CLASS_LABEL, pod_model
from tests.k8s.fake_apiserver import FakeAPIServer
from tests.k8s.test_scheduler import _client
from tests.k8s.test_scheduler_groups_status import _condition, member
from tests.k8s.test_scheduler_sequences import _overbooked, node, pod


# ------------------------------------------------------------------ PodScheduled=False
def test_a_status_patch_that_failed_is_sent_again_at_the_next_pass() -> None:
    """A refused or lost status patch was remembered as sent: the pod was never marked
    Unschedulable while its reason stayed the same (the Cluster Autoscaler never saw it)."""
    with FakeAPIServer([node("n1", cpu="2")], [pod("big", "4")]) as api:
        api.inject("PATCH", r".*/big/status", 500, reason="InternalError")
        core, _ = _client(api.url)
        loop = SchedulerLoop(core)
        loop.run_once()
        assert api.status_patches == []
        loop.run_once()
        cond = _condition(api, "default/big")
        assert cond is not None and cond["reason"] == "Unschedulable"
        loop.run_once()
        assert len(api.status_patches) == 1  # marked: no call per pass


def test_a_pod_recreated_under_its_name_is_marked_again() -> None:
    """A StatefulSet's pod deleted and created again under its name between passes: this
    replica had sent that reason for the name, and the new pod was never marked."""
    with FakeAPIServer([node("n1", cpu="2")], [pod("big", "4")]) as api:
        core, _ = _client(api.url)
        loop = SchedulerLoop(core)
        loop.run_once()
        assert len(api.status_patches) == 1
        api.delete_pod("default", "big")
        again = pod("big", "4")
        again["metadata"]["uid"] = "uid-big-2"
        api.add_pod(again)
        loop.run_once()
        assert len(api.status_patches) == 2
        assert _condition(api, "default/big") is not None


def test_a_nomination_that_no_longer_holds_is_cleared() -> None:
    """kube-scheduler clears ``status.nominatedNodeName`` when a pod fails with no new
    nomination (clearNominatedNode; preemption finding no candidate nominates ""). It was
    left as it was: a new leader then read it as a preemption still under way."""
    stale = pod("web", "4")
    stale["status"]["nominatedNodeName"] = "n1"
    with FakeAPIServer([node("n1", cpu="2")], [stale]) as api:
        core, _ = _client(api.url)
        res = SchedulerLoop(core, preemption=True).run_once()
        assert "Insufficient cpu" in res.failed["default/web"]
        with api.lock:
            status = api.pods[("default", "web")]["status"]
        assert not status.get("nominatedNodeName")
        assert _condition(api, "default/web")["reason"] == "Unschedulable"


# ------------------------------------------------------------------ pod groups
def test_members_that_disagree_on_min_member_are_refused_by_name() -> None:
    """The group's number came from whichever member sorted first: the oldest saying 1 bound
    alone though its partner said the group needs 2 (upstream has one PodGroup object;
    the twin refuses a gang whose members disagree)."""
    pods = [member("w0", "job", 1, cpu="4"), member("w1", "job", 2, cpu="4")]
    with FakeAPIServer([node("n1", cpu="4")], pods) as api:
        core, _ = _client(api.url)
        res = SchedulerLoop(core).run_once()
        assert res.bound == {} and api.bindings == []
        for k in ("default/w0", "default/w1"):
            assert res.failed[k].startswith("pod group default/job: its members disagree on "
                                            "scheduling.x-k8s.io/min-member (1, 2)"), res.failed


# ------------------------------------------------------------------ what the twin cannot check
def _bare(spec: dict[str, Any]) -> dict[str, Any]:
    p = pod("p")
    p["spec"].update(spec)
    return p


def test_pod_level_hugepages_are_refused_as_untracked() -> None:
    """Pod-level requests may set hugepages as well as cpu and memory (upstream's
    IsSupportedPodLevelResource); only cpu and memory were read, so a pod asking for
    hugepages at pod level only was bound where the node may have none."""
    p = _bare({"resources": {"requests": {"cpu": "1", "memory": "1Gi",
                                          "hugepages-2Mi": "64Mi"}}})
    with pytest.raises(ValueError, match="does not track hugepages-2Mi"):
        pod_model(p, enforce_affinity=True)


def test_dynamic_resource_claims_are_refused_by_name() -> None:
    """``spec.resourceClaims`` are allocated by kube-scheduler's DynamicResources plugin;
    bound here, the claim is never allocated and the kubelet cannot start the pod."""
    p = _bare({"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]})
    with pytest.raises(ValueError, match=r"spec\.resourceClaims"):
        pod_model(p, enforce_affinity=True)
    with FakeAPIServer([node("n1")], [p]) as api:
        core, _ = _client(api.url)
        res = SchedulerLoop(core).run_once()
        assert res.bound == {} and res.failed["default/p"].startswith(
            "not understood: spec.resourceClaims")


# ------------------------------------------------------------------ bound pods
def test_a_bound_pod_the_model_refuses_still_takes_its_room() -> None:
    """A running pod the twin's model refuses (here an unknown class label) was left out
    of the snapshot: its node looked empty, and pods were bound past its cpu and its
    allocatable pods (the kubelet refuses them: OutOfcpu, OutOfpods)."""
    n1 = node("n1", cpu="4")
    n1["status"]["allocatable"]["pods"] = "2"
    odd = pod("odd", "3", on="n1", scheduler="default-scheduler")
    odd["metadata"]["labels"] = {CLASS_LABEL: "no-such-class"}
    odd["status"]["phase"] = "Running"
    pods = [odd, pod("a", "2"), pod("b", "100m"), pod("c", "100m")]
    with FakeAPIServer([n1], pods) as api:
        core, _ = _client(api.url)
        res = SchedulerLoop(core).run_once()
        assert res.bound == {"default/b": "n1"}, res.bound
        assert "Insufficient cpu" in res.failed["default/a"]
        assert "Too many pods" in res.failed["default/c"]
        assert _overbooked(api) == {}


def test_its_own_tolerations_patch_does_not_wake_the_watch() -> None:
    """A failover profile patches a pod's tolerations before binding it; when the bind is
    refused the pod is still pending at the patch's resourceVersion, and the watch woke
    on it for a pass with nothing new."""
    with FakeAPIServer([node("n1")], [pod("a")]) as api:
        api.inject("POST", r".*/a/binding", 422, reason="Invalid")
        core, _ = _client(api.url)
        loop = SchedulerLoop(core, "smartsched", "finance")
        res = loop.run_once()
        assert api.patches == ["default/a"] and "HTTP 422" in res.failed["default/a"]
        _, work = loop.watch_pods(loop.last_rv, timeout_s=1)
        assert not work
