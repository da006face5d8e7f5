"""The custom scheduler over many passes against a misbehaving API server: nodes that
change, shrink or go between passes, binds answered with errors or never answered, a
Lease stolen, skewed or gone, watches that hang or send garbage. After every pass: no
crash, no node bound over its allocatable, no pod bound twice, no bind without the
lease, a reason for every pod left pending, and no state kept for pods that are gone."""

from __future__ import annotations

import datetime as dt
import random
import time
from decimal import Decimal
from typing import Any

import pytest

from smartsched.k8s import scheduler as sched_mod
from smartsched.k8s.daemon import run_scheduler_daemon
from smartsched.k8s.scheduler import LeaseLock, SchedulerLoop
from tests.k8s.fake_apiserver import FakeAPIServer
from tests.k8s.test_daemon import Clock as DaemonClock
from tests.k8s.test_daemon import _stop_after
from tests.k8s.test_scheduler import _client

V100 = {"nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB"}


def node(name: str, cpu: str = "8", mem: str = "32Gi", gpus: int = 0,
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    alloc = {"cpu": cpu, "memory": mem, "pods": "110"}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {**(V100 if gpus else {}), **(labels or {})}},
            "spec": {}, "status": {"allocatable": alloc}}


def pod(name: str, cpu: str = "1", ns: str = "default", on: str | None = None,
        scheduler: str = "smartsched", gpus: int = 0, mem: str = "1Gi") -> dict[str, Any]:
    req = {"cpu": cpu, "memory": mem}
    if gpus:
        req["nvidia.com/gpu"] = str(gpus)
    p: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {"schedulerName": scheduler,
                 "containers": [{"name": "c", "resources": {"requests": req}}]},
        "status": {"phase": "Pending"}}
    if on:
        p["spec"]["nodeName"] = on
    return p


class Clock(DaemonClock):
    """``test_daemon``'s fake clock, also moving a little at every read (so the daemon's
    watch deadline passes without a real watch)."""

    def __call__(self) -> float:
        self.now += 10.0
        return self.now


def _q(v: Any) -> Decimal:
    from kubernetes.utils.quantity import parse_quantity

    return parse_quantity(v)


def _overbooked(api: FakeAPIServer) -> dict[str, str]:
    """Nodes whose running pods request more than their allocatable: node -> what."""
    out = {}
    with api.lock:
        for name, n in api.nodes.items():
            alloc = n["status"]["allocatable"]
            used: dict[str, Decimal] = {}
            for p in api.pods.values():
                if p["spec"].get("nodeName") != name or (p.get("status") or {}).get(
                        "phase") in ("Succeeded", "Failed"):
                    continue
                for c in p["spec"].get("containers") or []:
                    for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
                        used[k] = used.get(k, Decimal(0)) + _q(v)
            over = [k for k, v in used.items() if k in alloc and v > _q(alloc[k])]
            if over:
                out[name] = ",".join(over)
    return out


# ------------------------------------------------------------------ many passes, at random
def _mutate(api: FakeAPIServer, rng: random.Random, step: int) -> None:
    """One random change between passes: nodes come, go, are cordoned, tainted,
    relabelled, shrink or lose GPUs; pods arrive (some odd), finish, are deleted; binds
    fail in the ways an API server fails."""
    kind = rng.choice(["add-node", "remove-node", "cordon", "taint", "relabel", "shrink",
                       "no-gpus", "pods", "pods", "finish", "delete", "fault", "fault"])
    with api.lock:
        names = sorted(api.nodes)
    if kind == "add-node" or not names:
        gpus = rng.choice([0, 0, 2, 4])
        n = node(f"n{step}", cpu=str(rng.choice([2, 4, 8])), gpus=gpus)
        with api.lock:
            api.nodes[n["metadata"]["name"]] = n
    elif kind == "remove-node" and len(names) > 1:
        with api.lock:
            del api.nodes[rng.choice(names)]
    elif kind == "cordon":
        with api.lock:
            api.nodes[rng.choice(names)]["spec"]["unschedulable"] = rng.random() < 0.7
    elif kind == "taint":
        with api.lock:
            api.nodes[rng.choice(names)]["spec"]["taints"] = [
                {"key": "dedicated", "value": "x", "effect": rng.choice(
                    ["NoSchedule", "NoExecute", "PreferNoSchedule"])}]
    elif kind == "relabel":
        with api.lock:
            api.nodes[rng.choice(names)]["metadata"]["labels"]["pool"] = rng.choice("ab")
    elif kind == "shrink":  # allocatable falls below what its pods use
        with api.lock:
            api.nodes[rng.choice(names)]["status"]["allocatable"]["cpu"] = rng.choice(
                ["1", "2", "500m"])
    elif kind == "no-gpus":
        with api.lock:
            api.nodes[rng.choice(names)]["status"]["allocatable"].pop("nvidia.com/gpu", None)
    elif kind == "pods":
        for i in range(rng.randint(1, 4)):
            p = pod(f"p{step}-{i}", cpu=rng.choice(["250m", "1", "2", "3"]),
                    ns=rng.choice(["default", "ml", "ünï"[:1] + "x"]),
                    gpus=rng.choice([0, 0, 0, 1]))
            odd = rng.random()
            if odd < 0.1:
                p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = rng.choice(
                    ["1e400000", "-1", "lots"])
            elif odd < 0.15:
                p["spec"]["containers"] = None
            elif odd < 0.2:
                p["spec"]["nodeSelector"] = {"pool": "a"}
            elif odd < 0.25:  # another scheduler's pod, already bound (counts as used)
                p["spec"]["schedulerName"] = "default-scheduler"
                if names:
                    p["spec"]["nodeName"] = rng.choice(names)
            elif odd < 0.3:  # terminating
                p["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
            elif odd < 0.4:  # a member of a pod group (namespaced: the same name elsewhere)
                p["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "g"}
                p["metadata"]["annotations"] = {"scheduling.x-k8s.io/min-member": "2"}
            api.add_pod(p)
    elif kind == "finish":
        with api.lock:
            running = [k for k, p in api.pods.items() if p["spec"].get("nodeName")]
        if running:
            with api.lock:
                api.pods[rng.choice(running)]["status"]["phase"] = rng.choice(
                    ["Succeeded", "Failed"])
    elif kind == "delete":
        with api.lock:
            keys = list(api.pods)
        if keys:
            api.delete_pod(*rng.choice(keys))
    elif kind == "fault":
        code, after = rng.choice([(409, False), (404, False), (422, False), (500, False),
                                  (500, True), (503, True), (429, False)])
        api.inject("POST", r".*/binding", code, after=after, times=rng.randint(1, 2),
                   headers={"Retry-After": "1"} if code == 429 else None)
        if rng.random() < 0.3:  # the status subresource refused or lost too
            api.inject("PATCH", r".*/status", rng.choice([403, 500]), after=rng.random() < 0.5)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_many_passes_under_churn_and_faults_keep_the_invariants(seed: int) -> None:
    rng = random.Random(seed)
    nodes = [node("a", cpu="4"), node("b", cpu="8", gpus=2), node("c", cpu="2")]
    with FakeAPIServer(nodes, [pod(f"start-{i}", cpu="1") for i in range(6)]) as api:
        core, _ = _client(api.url)
        loop = SchedulerLoop(core)
        for step in range(30):
            before = set(_overbooked(api))
            with api.lock:
                seen = {f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                        for p in api.pods.values() if loop._mine(p)}
            n_bindings = len(api.bindings)
            res = loop.run_once()  # never raises
            new = api.bindings[n_bindings:]
            # No node that got a pod this pass is over its allocatable (unless it was
            # already, and then it got nothing).
            over = _overbooked(api)
            assert not {n for _, n in new} & (set(over) | before), (step, over, new)
            keys = [k for k, _ in api.bindings]
            assert len(keys) == len(set(keys)), "a pod bound twice"
            assert not res.conflicts or any(f["code"] == 409 for f in api.faults)
            # Every pod of ours still pending was told why.
            with api.lock:
                pending = {f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                           for p in api.pods.values() if loop._mine(p)}
            assert pending - set(res.bound) <= set(res.failed) | set(res.conflicts), step
            assert all(res.failed.values())
            # Nothing remembered for pods that were gone (or bound) before the pass.
            assert (set(loop._evented) | set(loop._nominated) | set(loop._said)
                    | set(loop._conditioned)) <= seen
            _mutate(api, rng, step)
        assert api.bindings  # it did schedule through all that


# ------------------------------------------------------------------ nodes that shrink
def test_a_node_shrunk_below_its_pods_or_without_its_gpus_takes_no_more() -> None:
    """Bound pods that no longer fit their node (allocatable shrank, GPUs went away) were
    left out of the snapshot, so the node looked free and got more pods."""
    nodes = [node("n1", cpu="8"), node("g1", cpu="8", gpus=2)]
    pods = [pod("a", "6", on="n1", scheduler="x"), pod("b", "3", on="n1", scheduler="x"),
            pod("g", "7", on="g1", scheduler="x", gpus=2)]
    with FakeAPIServer(nodes, [*pods, pod("p", "1"), pod("q", "1")]) as api:
        with api.lock:  # g1's GPUs are gone (a driver failure, a relabelled node)
            del api.nodes["g1"]["status"]["allocatable"]["nvidia.com/gpu"]
        core, _ = _client(api.url)
        res = SchedulerLoop(core).run_once()
        assert res.bound == {"default/p": "g1"}  # g1 has 1 cpu left, n1 none
        assert "Insufficient cpu" in res.failed["default/q"]
        assert _overbooked(api) == {"n1": "cpu"}  # as it was: nothing added


# ------------------------------------------------------------------ binds that fail
@pytest.mark.parametrize("how", ["500-after-write", "timeout"])
def test_a_bind_whose_answer_is_lost_keeps_its_room(how: str, monkeypatch) -> None:
    """A 500 or a timeout after the API server bound the pod: the room was given to the
    next pod of the same pass, and the node ended over its allocatable."""
    # Only the timeout case shortens the client's timeout: with it short, a loaded CI
    # machine answered the 500 too late and the 500 case saw a timeout instead.
    if how == "timeout":
        monkeypatch.setattr(sched_mod, "API_TIMEOUT_S", 1.0)
    with FakeAPIServer([node("n1", cpu="4")], [pod("a", "3"), pod("b", "3")]) as api:
        if how == "timeout":
            api.inject("POST", r".*/binding", None, after=True, delay=3.0)
        else:
            api.inject("POST", r".*/binding", 500, after=True)
        core, _ = _client(api.url)
        loop = SchedulerLoop(core)
        res = loop.run_once()
        assert len(api.bindings) == 1 and _overbooked(api) == {}
        (first,) = [k for k in res.failed if "bind to n1 failed" in res.failed[k]]
        assert ("HTTP 500" if how != "timeout" else "no answer") in res.failed[first]
        time.sleep(2.2 if how == "timeout" else 0)  # past the late answer
        again = loop.run_once()  # the truth, re-listed: the other pod still does not fit
        assert again.bound == {} and len(api.bindings) == 1 and _overbooked(api) == {}


def test_bind_refusals_name_the_cause_and_a_429_stops_the_pass() -> None:
    with FakeAPIServer([node("n1", cpu="8")], [pod(f"p{i}") for i in range(4)]) as api:
        api.inject("POST", r".*/p0/binding", 422, reason="Invalid")
        api.inject("POST", r".*/p1/binding", 404, reason="NotFound")
        api.inject("POST", r".*/p2/binding", 429, reason="TooManyRequests",
                   headers={"Retry-After": "7"})
        core, _ = _client(api.url)
        res = SchedulerLoop(core).run_once()
        assert res.failed["default/p0"].startswith("bind to n1 failed: HTTP 422 ")
        assert res.failed["default/p1"].startswith("bind to n1 failed: HTTP 404 ")
        assert res.failed["default/p2"].endswith("(retry after 7 s)") and res.retry_after == 7
        assert res.failed["default/p3"] == ("not tried: the API server asked to retry after "
                                            "7 s")
        assert api.bindings == []
        assert [e["message"] for e in api.events] == [res.failed["default/p0"]]


def test_the_daemon_waits_as_a_429_asks_then_binds() -> None:
    with FakeAPIServer([node("n1", cpu="8")], [pod("p0"), pod("p1")]) as api:
        api.inject("POST", r".*/binding", 429, headers={"Retry-After": "7"})
        core, coord = _client(api.url)
        clock, lines = Clock(), []
        stats = run_scheduler_daemon(SchedulerLoop(core), LeaseLock(coord, "s", "ks", "me"),
                                     interval=1.0, echo=lines.append, sleep=clock.sleep,
                                     clock=clock, stop=_stop_after(2))
        assert clock.sleeps == [7.0] and stats.passes == 2 and len(api.bindings) == 2


def test_the_daemon_survives_an_api_server_that_fails_and_backs_off() -> None:
    """A 500 on the lease read or the pod list, a timeout on the node list: each ended
    the daemon."""
    with FakeAPIServer([node("n1", cpu="8")], [pod("p0")]) as api:
        sched_timeout = sched_mod.API_TIMEOUT_S
        sched_mod.API_TIMEOUT_S = 0.5
        try:
            api.inject("GET", r"/api/v1/pods", 500)
            api.inject("GET", r".*/leases/s", 500)
            # (the client retries a GET that times out 3 times)
            api.inject("GET", r"/api/v1/nodes", None, delay=1.5, times=4)
            core, coord = _client(api.url)
            clock, warnings = Clock(), []
            stats = run_scheduler_daemon(
                SchedulerLoop(core), LeaseLock(coord, "s", "ks", "me"), interval=1.0,
                warn=warnings.append, sleep=clock.sleep, clock=clock, stop=_stop_after(4))
        finally:
            sched_mod.API_TIMEOUT_S = sched_timeout
        assert stats.pass_errors == 3 and stats.passes == 1 and len(api.bindings) == 1
        # The lease read first, then the pass's lists; the backoff doubles.
        assert warnings[0] == ("scheduling pass failed (HTTP 500 Internal Server Error); "
                               "retrying in 1 s")
        assert warnings[1].startswith("scheduling pass failed (ReadTimeoutError: ")
        assert warnings[1].endswith("retrying in 2 s")
        assert warnings[2] == ("scheduling pass failed (HTTP 500 Internal Server Error); "
                               "retrying in 4 s")
        assert clock.sleeps == [1.0, 2.0, 4.0]


def test_once_still_reports_a_failure() -> None:
    from kubernetes.client.rest import ApiException

    with FakeAPIServer([node("n1")], [pod("p0")]) as api:
        api.inject("GET", r"/api/v1/pods", 500)
        core, coord = _client(api.url)
        with pytest.raises(ApiException):
            run_scheduler_daemon(SchedulerLoop(core), LeaseLock(coord, "s", "ks", "me"),
                                 interval=1.0, once=True)


# ------------------------------------------------------------------ odd lists
def test_objects_the_client_cannot_read_or_no_usable_node_are_reasons_not_crashes() -> None:
    """A pod with ``containers: null`` made the client's list raise (every pass, until it
    was gone); a node list with no usable node raised out of the pass."""
    bad = pod("bad")
    bad["spec"]["containers"] = None
    other = pod("other-bad", scheduler="x", on="n1")
    other["spec"]["containers"] = None
    with FakeAPIServer([node("n1")], [bad, other, pod("ok")]) as api:
        core, _ = _client(api.url)
        loop = SchedulerLoop(core)
        res = loop.run_once()
        assert res.bound == {"default/ok": "n1"} and "default/bad" in res.failed
        with api.lock:
            api.nodes["n1"]["status"]["allocatable"]["cpu"] = "-1"
        api.add_pod(pod("late"))
        res = loop.run_once()
        assert res.failed["default/late"].startswith("no usable node in the snapshot: n1: ")
        assert any(e["involvedObject"]["name"] == "late" and "no usable node" in e["message"]
                   for e in api.events)


# ------------------------------------------------------------------ many passes: state
def test_an_unchanged_reason_is_one_event_and_gone_pods_are_forgotten() -> None:
    """Every pass recorded a new FailedScheduling Event for every pod it could not place
    (one per pod per pass, for as long as it waits)."""
    with FakeAPIServer([node("n1", cpu="2")], [pod("big", "4"), pod("big2", "4")]) as api:
        core, _ = _client(api.url)
        loop = SchedulerLoop(core)
        loop._nominated["default/gone"] = ("n1", {"default/v"})  # a preemptor since deleted
        for _ in range(20):
            assert set(loop.run_once().failed) == {"default/big", "default/big2"}
        assert len(api.events) == 2 and loop._nominated == {}
        with api.lock:  # the reason changes: said again
            api.nodes["n1"]["spec"]["unschedulable"] = True
        loop.run_once()
        assert len(api.events) == 4 and "unschedulable" in api.events[-1]["message"]
        api.delete_pod("default", "big")
        api.delete_pod("default", "big2")
        loop.run_once()
        assert loop._evented == {} and loop._said == {}


# ------------------------------------------------------------------ the lease
class WallClock:
    def __init__(self) -> None:
        self.t = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.t

    def tick(self, s: float) -> None:
        self.t += dt.timedelta(seconds=s)


def _set_lease(api: FakeAPIServer, holder: str, renew: dt.datetime, spec: bool = True) -> None:
    with api.lock:
        api.leases[("ks", "s")] = {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "s", "namespace": "ks", "resourceVersion": api._bump()},
            **({"spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                         "renewTime": renew.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}
               if spec else {})}


def test_a_holders_skewed_clock_neither_keeps_nor_gives_up_the_lease() -> None:
    """The lease's renewTime (the holder's clock) was compared with this replica's clock:
    a holder whose clock runs an hour behind lost a lease it was renewing, and one whose
    clock ran a day ahead kept it for a day after it died."""
    clock = WallClock()
    with FakeAPIServer([node("n1")], []) as api:
        _, coord = _client(api.url)
        me = LeaseLock(coord, "s", "ks", "me", clock=clock)
        for _ in range(5):  # alive, renewing every 5 s, an hour behind
            _set_lease(api, "other", clock.t - dt.timedelta(hours=1) + dt.timedelta(
                seconds=5 * _))
            assert not me.try_acquire()
            clock.tick(5)
        # A day ahead, and then dead: taken once unchanged for its 15 s on this clock.
        _set_lease(api, "dead", clock.t + dt.timedelta(days=1))
        assert not me.try_acquire()
        clock.tick(10)
        assert not me.try_acquire()
        clock.tick(6)
        assert me.try_acquire()
        assert api.leases[("ks", "s")]["spec"]["holderIdentity"] == "me"


def test_a_lease_without_a_spec_or_deleted_is_taken() -> None:
    with FakeAPIServer([node("n1")], []) as api:
        _, coord = _client(api.url)
        _set_lease(api, "", dt.datetime.now(dt.UTC), spec=False)
        me = LeaseLock(coord, "s", "ks", "me")
        assert me.try_acquire()  # raised AttributeError on the missing spec
        coord.delete_namespaced_lease("s", "ks")
        assert me.try_acquire() and ("ks", "s") in api.leases


def test_a_pass_binds_only_while_its_lease_lasts() -> None:
    """A pass slowed by the API server (here a bind answered after 1.2 s) went on binding
    after its 1 s lease ran out, while another replica could hold it."""
    with FakeAPIServer([node("n1")], [pod("p0"), pod("p1")]) as api:
        api.inject("POST", r".*/binding", None, delay=1.2)
        core, coord = _client(api.url)
        lines: list[str] = []
        loop = SchedulerLoop(core)
        run_scheduler_daemon(loop, LeaseLock(coord, "s", "ks", "me", lease_s=1),
                             interval=1.0, once=True, echo=lines.append)
        assert len(api.bindings) == 1
        assert lines == ["bound 1, unschedulable 1, conflicts 0"]
        (key,) = [k for k in ("default/p0", "default/p1") if k not in dict(api.bindings)]
        res = loop.run_once()  # (leader_until is past: no more binds until renewed)
        assert res.failed[key] == "not tried: this replica's lease ran out during the pass"


# ------------------------------------------------------------------ watches
def test_a_watch_that_hangs_or_sends_garbage_returns() -> None:
    """A half-open watch (headers, then nothing) blocked the loop until the connection
    closed (forever, on a real network); a garbage line raised."""
    with FakeAPIServer([node("n1")], [pod("p0")]) as api:
        core, _ = _client(api.url)
        loop = SchedulerLoop(core)
        loop.run_once()
        old, sched_mod.API_TIMEOUT_S = sched_mod.API_TIMEOUT_S, 0.5
        try:
            api.hang_next_watch = 8.0
            t0 = time.monotonic()
            assert loop.watch_pods(loop.last_rv, timeout_s=1) == (loop.last_rv, False)
            assert time.monotonic() - t0 < 5
        finally:
            sched_mod.API_TIMEOUT_S = old
        api.watch_lines = [b"garbage{"]
        api.add_pod(pod("p1"))
        rv, work = loop.watch_pods(loop.last_rv, timeout_s=5)
        assert work and rv != loop.last_rv
