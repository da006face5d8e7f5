"""`smartsched k8s scheduler` fed odd but legal, and malformed, Pods and Nodes as an API
server (or a list file) may hold them: a few hundred objects mutated from valid ones.

What must hold after every pass: no crash; the good pods of the same pass are bound; every
pod of this scheduler left pending has a reason (never a traceback); nothing is bound onto
a node without the room for it (counted in bytes and millicores, as kube-scheduler and the
kubelet count) or onto a node that could not be read; two equal runs bind alike.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from smartsched.k8s.scheduler import PassResult, SchedulerLoop
from smartsched.k8s.snapshot import (
    CLASS_LABEL,
    DURATION_ANNOTATION,
    MIN_MEMBER_ANNOTATION,
    POD_GROUP_LABEL,
    _q,
    build_snapshot,
    pod_model,
)
from smartsched.model.errors import SmartSchedError
from tests.k8s.fake_apiserver import FakeAPIServer
from tests.k8s.test_scheduler import _client
from tests.k8s.test_scheduler_sequences import node, pod

QUANTITIES: list[Any] = ["100m", "1", "1.5", "1Ki", "1e3", "1E3", "0.1", "+1", "-1",
                         "1e400000", "", "abc", 1, 2.5, 0.1, None, True, [], {}, " 1", "1_0",
                         "NaN", "inf", "1K", "1e3m", "\u0661", "0", "1e-9", "1.5Mi", "1Ei",
                         "5n", ".5", "1."]
JUNK: list[Any] = [None, "", "abc", "-1", "0", "1.5", "1e400", "nan", "inf", 5, [], {},
                   "\u0661", " 3 ", "9" * 40, "\u00fcn\u00efc\u00f8de", "x" * 5000]


def _set(path: tuple[str, ...], value: Any) -> Callable[[dict], None]:
    def mutate(obj: dict) -> None:
        o = obj
        for k in path[:-1]:
            o = o.setdefault(k, {})
        o[path[-1]] = value
    return mutate


def _pod_mutations() -> list[tuple[str, Callable[[dict], None]]]:
    """(label, mutation) pairs applied to a small valid pending pod of this scheduler."""
    req = ("spec", "containers", 0, "resources", "requests")
    out: list[tuple[str, Callable[[dict], None]]] = []

    def at_request(res: str, q: Any) -> Callable[[dict], None]:
        return lambda p: p["spec"]["containers"][0]["resources"]["requests"].__setitem__(res, q)

    for q in QUANTITIES:
        for res in ("cpu", "memory", "nvidia.com/gpu", "ephemeral-storage"):
            out.append((f"{'.'.join(map(str, req))}.{res}={q!r}", at_request(res, q)))
        out.append((f"limits gpu={q!r}", lambda p, q=q: p["spec"]["containers"][0][
            "resources"].__setitem__("limits", {"nvidia.com/gpu": q})))
        out.append((f"overhead cpu={q!r}", _set(("spec", "overhead"), {"cpu": q})))
    for part in ("metadata", "spec", "status"):
        for v in (None, [], "x", 5, {}):
            out.append((f"{part}={v!r}", _set((part,), v)))
    for part in ("labels", "annotations"):
        for v in (None, [], "x", {"a": None}, {"a": 5}, {"a": [1]}, {"5": {}}):
            out.append((f"metadata.{part}={v!r}", _set(("metadata", part), v)))
    for v in (None, "", 5, [], "a" * 300, "\u00fcn\u00efc\u00f8de", "a/b", "a\nb", "a\x00b"):
        out.append((f"metadata.name={v!r:.20}", _set(("metadata", "name"), v)))
        out.append((f"metadata.namespace={v!r:.20}", _set(("metadata", "namespace"), v)))
    for v in (None, 2**40, -5, -(2**31), 2**31 - 1, 2**31, "5", 1.5, True, []):
        out.append((f"spec.priority={v!r}", _set(("spec", "priority"), v)))
    for v in ("Succeeded", "Failed", "Unknown", "Running", None, 5):
        out.append((f"status.phase={v!r}", _set(("status", "phase"), v)))
    for ann in (DURATION_ANNOTATION, MIN_MEMBER_ANNOTATION, "alibabacloud.com/gpu-milli",
                "alibabacloud.com/gpu-count", "alibabacloud.com/gpu-index"):
        for v in JUNK:
            def m(p: dict, ann: str = ann, v: Any = v) -> None:
                p["metadata"]["annotations"] = {ann: v}
                p["metadata"]["labels"] = {POD_GROUP_LABEL: "g"}
            out.append((f"annotation {ann}={v!r:.20}", m))
    for v in ("batch", "online", "nope", 5, None, ""):
        out.append((f"label {CLASS_LABEL}={v!r}", _set(("metadata", "labels"), {CLASS_LABEL: v})))
    for tol in ([{"key": "k"}], [{"key": "k", "operator": "Bogus"}], [{"operator": "Exists"}],
                [{}], ["x"], [None], "x", [{"key": "k", "operator": "Exists", "effect": "Bad"}],
                [{"key": 5, "value": 6}], [{"key": "k", "operator": "Exists", "value": "v"}],
                [{"operator": "Exists", "effect": "NoSchedule"}]):
        out.append((f"spec.tolerations={tol!r}", _set(("spec", "tolerations"), tol)))
    for v in (None, [], ["n1"], {"a": 1}, 5, "ghost", ""):
        out.append((f"spec.nodeName={v!r}", _set(("spec", "nodeName"), v)))
    out += [
        ("no containers", _set(("spec", "containers"), [])),
        ("containers null", _set(("spec", "containers"), None)),
        ("no resources (BestEffort)", lambda p: p["spec"]["containers"][0].pop("resources")),
        ("1,000 containers", _set(("spec", "containers"), [
            {"name": f"c{i}", "resources": {"requests": {"cpu": "1m"}}} for i in range(1000)])),
        ("deletionTimestamp", _set(("metadata", "deletionTimestamp"), "2026-01-01T00:00:00Z")),
        ("schedulingGates", _set(("spec", "schedulingGates"), [{"name": "x"}])),
    ]
    return out


def _node_mutations() -> list[tuple[str, Callable[[dict], None]]]:
    """(label, mutation) pairs applied to a valid 8-core node."""
    out: list[tuple[str, Callable[[dict], None]]] = []
    for part in ("metadata", "spec", "status"):
        for v in (None, [], "x"):
            out.append((f"{part}={v!r}", _set((part,), v)))
    for v in (None, [], "x", {}, {"cpu": "8"}, {"memory": "8Gi"}):
        out.append((f"status.allocatable={v!r}", _set(("status", "allocatable"), v)))
    for q in QUANTITIES:
        for res in ("cpu", "memory", "pods", "nvidia.com/gpu"):
            out.append((f"status.allocatable.{res}={q!r}",
                        _set(("status", "allocatable", res), q)))
    for v in ("true", "false", "", 1, 0, [], None, True, False):
        out.append((f"spec.unschedulable={v!r}", _set(("spec", "unschedulable"), v)))
    for v in ([{}], [{"key": "k"}], [{"effect": "NoSchedule"}], [{"key": "k", "effect": "Bad"}],
              "x", [None], [{"key": "k", "effect": "NoExecute", "value": 5}],
              [{"key": "k", "effect": "PreferNoSchedule"}],
              [{"key": "a b", "effect": "NoSchedule"}]):
        out.append((f"spec.taints={v!r}", _set(("spec", "taints"), v)))
    for v in (None, [], "x", [{"type": "Ready", "status": "False"}], [None]):
        out.append((f"status.conditions={v!r}", _set(("status", "conditions"), v)))
    for v in ("\u00fcn\u00efc\u00f8de", "a" * 300, "", None, 5):
        out.append((f"metadata.name={v!r:.20}", _set(("metadata", "name"), v)))
    for v in (None, [], "x", {"a": None}, {"a": 5}, {"nvidia.com/gpu.product": None}):
        out.append((f"metadata.labels={v!r}", _set(("metadata", "labels"), v)))
    return out


POD_CASES = _pod_mutations()
NODE_CASES = _node_mutations()


def _serve(api: FakeAPIServer, pods: list[dict], nodes: list[dict]) -> None:
    """Put objects into the fake API server as they are (its constructor would stringify
    quantities and need names): keyed by their name where they have one."""
    with api.lock:
        for i, n in enumerate(nodes):
            api.nodes[f"\0node{i}"] = n
        for i, p in enumerate(pods):
            meta = p.get("metadata") if isinstance(p, dict) else None
            ns = meta.get("namespace") if isinstance(meta, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            key = ((ns if isinstance(ns, str) and ns else "default", name)
                   if isinstance(name, str) else ("\0", str(i)))
            api.pods[key] = p


def _room_kept(api: FakeAPIServer, res: PassResult) -> None:
    """Nothing this pass bound is over its node's allocatable, as the kubelet counts it
    (bytes, millicores, devices, pod slots); it binds only onto nodes it could read."""
    with api.lock:
        nodes = {n["metadata"]["name"]: n for n in api.nodes.values()
                 if isinstance(n, dict) and isinstance(n.get("metadata"), dict)}
        for node_name in set(res.bound.values()):
            alloc = nodes[node_name]["status"]["allocatable"]
            used: dict[str, Decimal] = {}
            count = 0
            for p in api.pods.values():
                status = p.get("status")
                if not isinstance(p.get("spec"), dict) or p["spec"].get(
                        "nodeName") != node_name or (isinstance(status, dict) and status.get(
                        "phase") in ("Succeeded", "Failed")):
                    continue
                count += 1
                for c in p["spec"].get("containers") or []:
                    for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
                        # unreadable (another's pod): not counted here
                        with contextlib.suppress(ValueError):
                            used[k] = used.get(k, Decimal(0)) + _q(v, k)
            for k, v in used.items():
                if k in alloc:
                    assert v <= _q(alloc[k], k), (node_name, k, v, alloc[k])
            if "pods" in alloc:
                assert count <= _q(alloc["pods"], "pods")


def _good(name: str) -> dict:
    p = pod(name, cpu="500m", mem="256Mi")
    p["spec"]["priority"] = 1000  # first in the queue: the bad pods cannot take its room
    return p


def _check(res: PassResult, api: FakeAPIServer, good: list[str], mine: list[str]) -> None:
    for k in good:
        assert k in res.bound, (k, res.failed.get(k))
    for k in mine:
        assert k in res.bound or res.failed.get(k), k
    for why in res.failed.values():
        assert why and "Traceback" not in why
    for ev in api.events:
        assert ev["message"] and "Traceback" not in ev["message"]
    _room_kept(api, res)


@pytest.mark.parametrize("chunk", range(4))
def test_mutated_pods_never_stop_a_pass_nor_overbook(chunk: int, caplog) -> None:
    """Every pod mutation, a quarter per pass, beside good pods; each once pending (this
    scheduler's) and once already bound to the node by another scheduler."""
    caplog.set_level(logging.CRITICAL)
    cases = POD_CASES[chunk::4]
    pods: list[dict] = []
    mine: list[str] = []
    for i, (_, mutate) in enumerate(cases):
        p = pod(f"bad-{i}", cpu="250m", mem="64Mi")
        mutate(p)
        pods.append(p)
        other = pod(f"other-{i}", cpu="10m", mem="1Mi", ns="others",
                    scheduler="default-scheduler", on="n1")
        other["status"]["phase"] = "Running"
        mutate(other)
        pods.append(other)
        meta, spec, status = p.get("metadata"), p.get("spec"), p.get("status")
        phase = status.get("phase", "Pending") if isinstance(status, dict) else "Pending"
        if (isinstance(meta, dict) and isinstance(spec, dict) and isinstance(
                meta.get("name"), str) and meta["name"] and not spec.get("nodeName")
                and spec.get("schedulerName") == "smartsched"
                and isinstance(meta.get("namespace"), str | None)
                and not meta.get("deletionTimestamp") and not spec.get("schedulingGates")
                and phase == "Pending"):
            mine.append(f"{meta.get('namespace') or 'default'}/{meta['name']}")
    good = [_good(f"good-{i}") for i in range(3)]
    with FakeAPIServer([node("n1", cpu="64", mem="256Gi"), node("n2", cpu="2", mem="4Gi")],
                       []) as api:
        _serve(api, [*good, *pods], [])
        res = SchedulerLoop(_client(api.url)[0]).run_once()
        _check(res, api, [f"default/good-{i}" for i in range(3)], mine)


@pytest.mark.parametrize("chunk", range(2))
def test_mutated_nodes_are_unusable_never_empty(chunk: int, caplog) -> None:
    """The mutated nodes of a chunk listed together (each under its own name) beside one
    good node for the good pods: a pod too big for the good node lands only on a mutated
    node that can be read on its own and has the room (``_room_kept``)."""
    caplog.set_level(logging.CRITICAL)
    cases = NODE_CASES[chunk::2]
    nodes = []
    for i, (_, mutate) in enumerate(cases):
        n = node(f"m{i}", cpu="8", mem="32Gi")
        mutate(n)
        nodes.append(n)
    big = [pod(f"big-{i}", cpu="6", mem="1Gi") for i in range(len(cases))]
    good = [_good(f"good-{i}") for i in range(3)]
    with FakeAPIServer([node("n1", cpu="2", mem="4Gi")], []) as api:
        _serve(api, [*good, *big], nodes)
        res = SchedulerLoop(_client(api.url)[0]).run_once()
        _check(res, api, [f"default/good-{i}" for i in range(3)],
               [f"default/big-{i}" for i in range(len(cases))])
        readable = {"n1"}
        for n in nodes:
            with contextlib.suppress(SmartSchedError):  # no usable node: unreadable
                readable |= {x.name for x in build_snapshot([copy.deepcopy(n)]).spec.nodes}
        assert set(res.bound.values()) <= readable


def test_equal_runs_give_equal_results(caplog) -> None:
    caplog.set_level(logging.CRITICAL)

    def once() -> tuple[dict, dict]:
        pods = [_good(f"good-{i}") for i in range(3)]
        for i, (_, mutate) in enumerate(POD_CASES[::7]):
            p = pod(f"bad-{i}", cpu="1", mem="1Gi")
            mutate(p)
            pods.append(p)
        with FakeAPIServer([node("n1", cpu="8"), node("n2", cpu="4")], []) as api:
            _serve(api, pods, [])
            res = SchedulerLoop(_client(api.url)[0]).run_once()
            return res.bound, res.failed

    assert once() == once()


# ------------------------------------------------------------------ the defects found
def test_a_malformed_pod_among_the_others_does_not_stop_the_pass() -> None:
    """A pod whose metadata or status was not an object, or bound to a nodeName that is a
    list or an object, raised out of the pass (AttributeError / TypeError: unhashable):
    no pod was scheduled while it existed. One whose namespace was not a string was bound
    or evented with it, and the client's models raised."""
    odd = []
    for i, mutate in enumerate([_set(("metadata",), "x"), _set(("status",), "x"),
                                _set(("spec", "nodeName"), ["n1"]),
                                _set(("spec", "nodeName"), {"a": 1})]):
        p = pod(f"other-{i}", scheduler="default-scheduler", on="n1")
        mutate(p)
        odd.append(p)
    ns = pod("ns-5")
    ns["metadata"]["namespace"] = 5
    with FakeAPIServer([node("n1")], [pod("ok")]) as api:
        _serve(api, [*odd, ns], [])
        res = SchedulerLoop(_client(api.url)[0]).run_once()
        assert res.bound == {"default/ok": "n1"}


@pytest.mark.parametrize(("res", "each", "alloc", "fits"), [
    ("memory", "1.5Mi", "10Mi", 6), ("cpu", "1.5m", "10m", 6), ("memory", "100M", "1000M", 10)])
def test_requests_are_counted_up_not_down(res: str, each: str, alloc: str, fits: int) -> None:
    """Requests were rounded down to whole MiB and millicores: eight pods of 1.5Mi were
    bound onto a node of 10Mi (the kubelet refuses the seventh, OutOfmemory)."""
    n = node("n1", cpu="8", mem="1Gi")
    n["status"]["allocatable"][res] = alloc
    pods = []
    for i in range(12):
        p = pod(f"p{i}", cpu="1m", mem="1Mi")
        p["spec"]["containers"][0]["resources"]["requests"] = {res: each}
        pods.append(p)
    with FakeAPIServer([n], pods) as api:
        res_ = SchedulerLoop(_client(api.url)[0]).run_once()
        assert 0 < len(res_.bound) <= fits
        _room_kept(api, res_)


def test_a_float_quantity_is_read_as_written() -> None:
    p = pod("f")
    p["spec"]["containers"][0]["resources"]["requests"] = {"cpu": 0.1, "memory": 1.0}
    assert pod_model(p).cpu_milli == 100  # not 101 from 0.1000000000000000055...


@pytest.mark.parametrize(("where", "value", "says"), [
    ("request", "1.5", "nvidia.com/gpu: must be a whole number"),
    ("request", "500m", "nvidia.com/gpu: must be a whole number"),
    ("milli", "2.5", "gpu-milli: must be a whole number"),
    ("milli", "0", "gpu-milli: must be in [1, 1000]"),
    ("count", "1.5", "gpu-count: must be a whole number"),
    ("count", "0", "gpu-count: must be at least 1"),
])
def test_device_counts_must_be_whole(where: str, value: str, says: str) -> None:
    """A request of 1.5 GPUs was read as 1 and bound onto a node one device short (the API
    server refuses a non-integer extended resource); half a GPU was refused as "num_gpu".
    """
    p = pod("g", gpus=1)
    if where == "request":
        p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = value
    else:
        p["metadata"]["annotations"] = {"alibabacloud.com/gpu-milli": "500",
                                        "alibabacloud.com/gpu-count": "1"}
        p["metadata"]["annotations"][f"alibabacloud.com/gpu-{where}"] = value
    with pytest.raises(ValueError, match=re.escape(says)):
        pod_model(p)


@pytest.mark.parametrize("value", [" 8", "8_0", "\u0661\u0666", "1K", "1e3m", "NaN", "0x10",
                                   "1e", "Infinity", "1.5.5", "--1"])
def test_quantities_the_api_server_refuses_are_refused(value: str) -> None:
    """Python's Decimal read " 8" and "8_0" and Arabic-Indic digits, the client's parser
    "1K" and "1e3m": a node with such an allocatable was used as if it had that room."""
    with pytest.raises(ValueError, match=r"allocatable\.cpu: not a quantity"):
        _q(value, "status.allocatable.cpu")


@pytest.mark.parametrize(("value", "expect"), [
    ("1e3", 1000), ("1E3", 1000), ("1E", 10**18), ("+1", 1), (".5", Decimal("0.5")),
    ("1.", 1), ("1Ki", 1024), ("100m", Decimal("0.1")), ("5n", Decimal("5e-9")),
    ("1e-3", Decimal("0.001")), ("2Gi", 2 * 1024**3), (3, 3)])
def test_every_quantity_form_kubernetes_writes_is_read(value: Any, expect: Any) -> None:
    assert _q(value, "q") == Decimal(expect)


def _taint_case(taint: dict, toleration: dict) -> PassResult:
    n = node("tainted")
    n["spec"]["taints"] = [taint]
    p = pod("p")
    p["spec"]["tolerations"] = [toleration]
    with FakeAPIServer([n], [p]) as api:
        return SchedulerLoop(_client(api.url)[0]).run_once()


@pytest.mark.parametrize(("taint", "toleration", "binds"), [
    # Exists with an effect tolerated every effect: bound onto a NoExecute taint that
    # evicts it at once
    ({"key": "dedicated", "value": "x", "effect": "NoExecute"},
     {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}, False),
    ({"key": "dedicated", "value": "x", "effect": "NoExecute"},
     {"operator": "Exists", "effect": "NoSchedule"}, False),
    ({"key": "dedicated", "value": "x", "effect": "NoSchedule"},
     {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}, True),
    ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
     {"operator": "Exists", "effect": "NoSchedule"}, True),
    ({"key": "dedicated", "value": "x", "effect": "NoExecute"},
     {"key": "dedicated", "operator": "Exists"}, True),
    ({"key": "dedicated", "value": "x", "effect": "NoExecute"}, {"operator": "Exists"}, True),
    # Equal with an empty value tolerated no value-less taint (upstream: "" == "")
    ({"key": "dedicated", "effect": "NoSchedule"},
     {"key": "dedicated", "operator": "Equal", "effect": "NoSchedule"}, True),
    ({"key": "dedicated", "effect": "NoSchedule"}, {"key": "dedicated"}, True),
    ({"key": "dedicated", "value": "x", "effect": "NoSchedule"}, {"key": "dedicated"}, False),
    ({"key": "dedicated", "value": "x", "effect": "NoSchedule"},
     {"key": "dedicated", "value": "x"}, True),
    ({"key": "dedicated", "value": "x", "effect": "NoSchedule"},
     {"key": "dedicated", "value": "x", "effect": "NoExecute"}, False),
])
def test_tolerations_match_taints_as_upstream_does(taint: dict, toleration: dict,
                                                   binds: bool) -> None:
    res = _taint_case(taint, toleration)
    assert ("default/p" in res.bound) is binds, res.failed


@pytest.mark.parametrize(("toleration", "says"), [
    ({"key": "k", "operator": "Bogus"}, "spec.tolerations.operator"),
    ({"key": "k", "operator": "Exists", "effect": "Bad"}, "spec.tolerations.effect"),
    ({"value": "v"}, "spec.tolerations.key"),
    ({"key": "k", "operator": "Exists", "value": "v"}, "spec.tolerations.value"),
])
def test_a_toleration_the_api_server_refuses_is_named(toleration: dict, says: str) -> None:
    """An unknown operator was read as Equal, an unknown effect as none: the pod was bound."""
    res = _taint_case({"key": "k", "value": "v", "effect": "NoSchedule"}, toleration)
    assert says in res.failed["default/p"]


@pytest.mark.parametrize(("mutate", "says"), [
    (_set(("spec", "taints"), [{"key": "gpu"}]), "spec.taints"),
    (_set(("spec", "taints"), [{"effect": "NoSchedule"}]), "spec.taints"),
    (_set(("spec", "taints"), [{"key": "gpu", "effect": "NoSchedul"}]), "spec.taints"),
    (_set(("spec", "unschedulable"), ""), "spec.unschedulable"),
    (_set(("spec", "unschedulable"), 0), "spec.unschedulable"),
    (_set(("spec", "unschedulable"), "false"), "spec.unschedulable"),
])
def test_a_node_whose_taints_or_cordon_cannot_be_read_is_not_used(mutate, says: str) -> None:
    """A taint without its key or effect was dropped and a cordon of "" or 0 read as none:
    pods were bound onto a node its owner meant to keep them off."""
    bad = node("bad", cpu="64")
    mutate(bad)
    snap = build_snapshot([bad, node("n1", cpu="2")])
    assert [n.name for n in snap.spec.nodes] == ["n1"]
    assert snap.skipped[0][:2] == ("Node", "bad") and says in snap.skipped[0][2]
    with FakeAPIServer([bad, node("n1", cpu="2")], [pod("big", "8"), pod("ok", "1")]) as api:
        res = SchedulerLoop(_client(api.url)[0]).run_once()
        assert res.bound == {"default/ok": "n1"} and "default/big" in res.failed


def test_two_nodes_under_one_name_do_not_stop_the_others() -> None:
    """Duplicate node names failed the whole snapshot: no pod was placed anywhere."""
    dup_a, dup_b = node("dup", cpu="64"), node("dup", cpu="1")
    snap = build_snapshot([dup_a, node("n1"), dup_b])
    assert [n.name for n in snap.spec.nodes] == ["n1"]
    assert ("Node", "dup", "metadata.name: more than one node has this name") in snap.skipped
    with FakeAPIServer([node("n1")], [pod("ok")]) as api:
        _serve(api, [], [dup_a, dup_b])
        res = SchedulerLoop(_client(api.url)[0]).run_once()
        assert res.bound == {"default/ok": "n1"}


def test_a_best_effort_pod_is_scheduled_and_one_without_containers_is_named() -> None:
    """A pod requesting nothing (legal: the BestEffort class) was refused as "cpu_milli: a
    pod must request some cpu, memory or gpu"; one with no container at all (which the
    API server refuses) was bound as if it requested nothing."""
    be = pod("be")
    del be["spec"]["containers"][0]["resources"]
    empty = pod("empty")
    empty["spec"]["containers"] = []
    with FakeAPIServer([node("n1")], [be, empty]) as api:
        res = SchedulerLoop(_client(api.url)[0]).run_once()
        assert res.bound == {"default/be": "n1"}
        assert "spec.containers: a pod needs at least one container" in res.failed[
            "default/empty"]


@pytest.mark.parametrize("cpu", ["1.5Mi", "5000", "1_0"])
def test_a_bound_pod_past_the_models_bounds_or_unreadable_fills_its_node(cpu: str) -> None:
    """Another scheduler's pod bound with requests past the model's bounds (5,000 cores) or
    unreadable took only a pod slot on its node, which then read as nearly empty: pods
    were bound beside it."""
    other = pod("other", scheduler="default-scheduler", on="n1")
    other["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    with FakeAPIServer([node("n1", cpu="8"), node("n2", cpu="2")], []) as api:
        _serve(api, [other, pod("p", "1")], [])
        res = SchedulerLoop(_client(api.url)[0]).run_once()
        assert res.bound == {"default/p": "n2"}
