"""Pod groups as the Coscheduling plugin counts them (per namespace, running members
included, min-member not all pending pods) and pods left pending marked as
kube-scheduler marks them (PodScheduled=False, nominatedNodeName), without a call per
pass for an unchanged pod."""

from __future__ import annotations

from typing import Any

import pytest

from smartsched.k8s.scheduler import SchedulerLoop
from smartsched.k8s.snapshot import MIN_MEMBER_ANNOTATION, POD_GROUP_LABEL
from tests.k8s.fake_apiserver import FakeAPIServer
from tests.k8s.test_scheduler import _client, _cpu_pod
from tests.k8s.test_scheduler_sequences import _overbooked, node, pod


def member(name: str, group: str, size: Any, cpu: str = "2", ns: str = "default"
           ) -> dict[str, Any]:
    p = pod(name, cpu, ns=ns)
    p["metadata"]["labels"] = {POD_GROUP_LABEL: group}
    p["metadata"]["annotations"] = {MIN_MEMBER_ANNOTATION: str(size)}
    return p


def _condition(api: FakeAPIServer, key: str) -> dict[str, Any] | None:
    ns, _, name = key.partition("/")
    with api.lock:
        conds = api.pods[(ns, name)]["status"].get("conditions") or []
    return next((c for c in conds if c["type"] == "PodScheduled"), None)


# ------------------------------------------------------------------ pod groups
def test_a_group_whose_bind_failed_half_way_starts_its_other_members() -> None:
    """A member's bind refused after the others bound: the next passes said "pod group
    has 1 of its 3 members pending" for ever (the running members were not counted)."""
    with FakeAPIServer([node("n1", cpu="8")], [member(f"w{i}", "job", 3) for i in range(3)]
                       ) as api:
        api.inject("POST", r".*/w1/binding", 422, reason="Invalid")
        core, _ = _client(api.url)
        loop = SchedulerLoop(core)
        first = loop.run_once()
        assert set(first.bound) == {"default/w0", "default/w2"}
        assert first.failed["default/w1"].startswith("bind to n1 failed: HTTP 422")
        second = loop.run_once()
        assert second.bound == {"default/w1": "n1"} and _overbooked(api) == {}


def test_a_group_with_too_few_members_counts_the_running_ones_in_its_reason() -> None:
    pods = [member("w0", "job", 4), member("w1", "job", 4)]
    pods[0]["spec"]["nodeName"] = "n1"
    with FakeAPIServer([node("n1", cpu="8")], pods) as api:
        core, _ = _client(api.url)
        res = SchedulerLoop(core).run_once()
        assert res.failed["default/w1"] == "pod group has 1 of its 4 members pending and 1 running"
        assert api.bindings == []


def test_groups_of_one_name_in_two_namespaces_are_two_groups() -> None:
    """A PodGroup is a namespaced object: ``job`` in ``a`` and ``job`` in ``b`` were one
    group, so b's lone member bound without its partner (on a's members' count)."""
    pods = [member("a0", "job", 2, ns="a"), member("a1", "job", 2, ns="a"),
            member("b0", "job", 2, ns="b")]
    with FakeAPIServer([node("n1", cpu="8")], pods) as api:
        core, _ = _client(api.url)
        res = SchedulerLoop(core).run_once()
        assert set(res.bound) == {"a/a0", "a/a1"}
        assert res.failed["b/b0"] == "pod group has 1 of its 2 members pending"


def test_a_group_starts_at_its_min_member_and_the_rest_wait_on_their_own_reason() -> None:
    """Three members pending, min-member 2, room for two: nothing bound (every pending
    member had to fit), though the group could run."""
    with FakeAPIServer([node("n1", cpu="8")], [member(f"w{i}", "job", 2, cpu="4")
                                               for i in range(3)]) as api:
        core, _ = _client(api.url)
        res = SchedulerLoop(core).run_once()
        assert set(res.bound) == {"default/w0", "default/w1"}
        assert res.failed["default/w2"].startswith("0/1 nodes are available: 1 Insufficient cpu")
        assert _overbooked(api) == {}


@pytest.mark.parametrize("size", ["lots", "0", "-2", "1e3", "99999999", ""])
def test_a_bad_min_member_is_named(size: str) -> None:
    with FakeAPIServer([node("n1")], [member("w0", "job", size), pod("ok")]) as api:
        core, _ = _client(api.url)
        res = SchedulerLoop(core).run_once()
        if size == "":  # none given: a group of one, as before
            assert set(res.bound) == {"default/ok", "default/w0"}
            return
        assert res.bound == {"default/ok": "n1"}
        why = res.failed["default/w0"]
        assert why.startswith(f"not understood: metadata.annotations.{MIN_MEMBER_ANNOTATION}: "
                              "must be a whole number of pods in [1, 10000]"), why


# ------------------------------------------------------------------ PodScheduled=False
def test_a_pod_left_pending_is_marked_unschedulable_once_per_reason() -> None:
    """The Cluster Autoscaler scales up only for pods marked PodScheduled=False/
    Unschedulable; none was marked. An unchanged reason is not patched again (by this
    replica, or by a new one reading the pod), and the watch does not wake on the
    scheduler's own patch."""
    with FakeAPIServer([node("n1", cpu="2")], [pod("big", "4"), pod("ok", "1")]) as api:
        core, _ = _client(api.url)
        loop = SchedulerLoop(core)
        first = loop.run_once()
        assert first.bound == {"default/ok": "n1"}
        assert [k for k, _ in api.status_patches] == ["default/big"]
        cond = _condition(api, "default/big")
        assert cond is not None and (cond["status"], cond["reason"]) == ("False", "Unschedulable")
        assert cond["message"] == first.failed["default/big"]
        assert _condition(api, "default/ok") is None
        _, work = loop.watch_pods(loop.last_rv, timeout_s=1)
        assert not work  # its own patch (and bind) are no work
        loop.run_once()
        SchedulerLoop(core).run_once()
        assert len(api.status_patches) == 1
        with api.lock:
            api.nodes["n1"]["spec"]["unschedulable"] = True
        again = loop.run_once()
        assert len(api.status_patches) == 2
        now = _condition(api, "default/big")
        assert now is not None and now["message"] == again.failed["default/big"] != cond["message"]
        assert now["lastTransitionTime"] == cond["lastTransitionTime"]  # still False: kept


def test_a_refused_bind_is_a_scheduler_error_and_a_preemptor_is_nominated() -> None:
    victim = _cpu_pod("low", "4", 0, "n1", "default-scheduler")
    with FakeAPIServer([node("n1", cpu="4"), node("n2", cpu="2")],
                       [victim, _cpu_pod("web", "4", 1000), _cpu_pod("small", "1", 0)]) as api:
        api.inject("POST", r".*/small/binding", 422, reason="Invalid")
        core, _ = _client(api.url)
        res = SchedulerLoop(core, preemption=True).run_once()
        assert list(res.preempting) == ["prod/web"] and api.evictions == ["prod/low"]
        cond = _condition(api, "prod/small")
        assert cond is not None and cond["reason"] == "SchedulerError"
        assert cond["message"].startswith("bind to n2 failed: HTTP 422")
        with api.lock:
            assert api.pods[("prod", "web")]["status"]["nominatedNodeName"] == "n1"
        assert _condition(api, "prod/web")["message"].startswith("preempting: evicted 1 ")


def test_a_status_patch_refused_is_logged_not_fatal() -> None:
    with FakeAPIServer([node("n1", cpu="2")], [pod("big", "4")]) as api:
        api.inject("PATCH", r".*/status", 403, reason="Forbidden", times=5)
        core, _ = _client(api.url)
        res = SchedulerLoop(core).run_once()
        assert "Insufficient cpu" in res.failed["default/big"] and api.status_patches == []


def test_a_forbidden_status_patch_is_not_retried_for_every_pod_every_pass() -> None:
    # A Role without pods/status: patch made one refused call per pending pod per pass.
    with FakeAPIServer([node("n1", cpu="2")], [pod(f"big{i}", "4") for i in range(3)]) as api:
        api.inject("PATCH", r".*/status", 403, reason="Forbidden", times=100)
        core, _ = _client(api.url)
        loop = SchedulerLoop(core)

        def patches() -> int:
            return sum(1 for m, p in api.requests if m == "PATCH" and p.endswith("/status"))

        for _ in range(3):
            res = loop.run_once()
            assert all("Insufficient cpu" in res.failed[f"default/big{i}"] for i in range(3))
        assert patches() == 1
        loop._status_forbidden_until = 0.0  # the wait is over: one try, refused again
        loop.run_once()
        assert patches() == 2


def test_a_new_leader_waits_for_the_victims_an_earlier_one_evicted() -> None:
    """A replica taking over while a preemptor's victims terminate had no memory of the
    nomination: it evicted another node's pod for the same preemptor (two victims for
    one pod). It now reads ``status.nominatedNodeName``, as upstream does."""
    pods = [_cpu_pod("low-a", "4", 0, "n1", "default-scheduler"),
            _cpu_pod("low-b", "4", 0, "n2", "default-scheduler"), _cpu_pod("web", "4", 1000)]
    with FakeAPIServer([node("n1", cpu="4"), node("n2", cpu="4")], pods) as api:
        core, _ = _client(api.url)
        first = SchedulerLoop(core, preemption=True).run_once()
        (nominated, victims), = first.preempting.values()
        # (seed 1: this replica's tie-break between the two nodes picks the other one)
        successor = SchedulerLoop(core, preemption=True, seed=1)
        res = successor.run_once()
        assert api.evictions == victims and not res.preempting
        assert res.failed["prod/web"] == (f"waiting for 1 preempted pod(s) on {nominated} "
                                          "to terminate")
        api.finish_terminating()
        assert successor.run_once().bound == {"prod/web": nominated}
