"""The extender protocol over real HTTP (uvicorn on loopback), in recorded-form payloads."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from smartsched.k8s.extender import Extender, make_app
from tests.builders import free_port


@pytest.fixture(scope="module")
def fixtures(data_dir: Path) -> dict:
    root = data_dir / "k8s-api-examples" / "hkust-fgd-test-cluster"
    nodes = [yaml.safe_load(p.read_text()) for p in sorted((root / "node").glob("*.yaml"))]
    pods = {p.stem: yaml.safe_load(p.read_text()) for p in (root / "pod").glob("*.yaml")}
    small = copy.deepcopy(nodes[0])
    small["metadata"]["name"] = "small-node"
    small["status"]["allocatable"].update({"cpu": "8", "alibabacloud.com/gpu-count": "1"})
    return {"nodes": [*nodes, small], "pods": pods}


@contextlib.contextmanager
def _serving(app: Any) -> Iterator[str]:
    """``app`` on a loopback port in a thread, ready; its URL."""
    import uvicorn

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if requests.get(f"{url}/healthz", timeout=1).ok:
                break
        except requests.ConnectionError:
            time.sleep(0.05)
    try:
        yield url
    finally:
        srv.should_exit = True
        t.join(timeout=5)


@pytest.fixture(scope="module")
def server(fixtures: dict):
    ext = Extender("k8s-default")
    ext.set_cache(fixtures["nodes"])
    with _serving(make_app(ext)) as url:
        yield url


def test_filter_with_whole_nodes(server: str, fixtures: dict) -> None:
    args = {"Pod": fixtures["pods"]["gpu-pod-02"],  # 2 GPUs, 12 CPU
            "Nodes": {"apiVersion": "v1", "kind": "NodeList", "items": fixtures["nodes"]},
            "NodeNames": None}
    r = requests.post(f"{server}/filter", json=args, timeout=10)
    assert r.status_code == 200
    res = r.json()
    assert set(res) == {"Nodes", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert [n["metadata"]["name"] for n in res["Nodes"]["items"]] == ["pai-node-00",
                                                                       "pai-node-01"]
    assert res["Nodes"]["kind"] == "NodeList"
    assert res["FailedNodes"] == {"small-node": "Insufficient cpu"}  # 8 cores, pod asks 12


def test_filter_and_prioritize_with_node_names(server: str, fixtures: dict) -> None:
    args = {"Pod": fixtures["pods"]["gpu-pod-00"], "NodeNames": [
        "pai-node-00", "small-node", "ghost"]}
    res = requests.post(f"{server}/filter", json=args, timeout=10).json()
    assert res["NodeNames"] == ["pai-node-00", "small-node"]
    assert res["FailedAndUnresolvableNodes"] == {"ghost": "node unknown to the extender's cache"}
    pr = requests.post(f"{server}/prioritize", json=args, timeout=10).json()
    assert [h["Host"] for h in pr] == ["pai-node-00", "small-node"]
    assert all(0 <= h["Score"] <= 10 for h in pr) and max(h["Score"] for h in pr) == 10


@pytest.mark.parametrize("payload", ["{not json", "[]", '{"Pod": 3}',
                                     '{"Pod": {"metadata": {"name": "p"}}}',
                                     '{"Pod": {"metadata": {"name": "p"}}, "NodeNames": [1]}'])
def test_malformed_payloads_get_400(server: str, payload: str) -> None:
    r = requests.post(f"{server}/filter", data=payload, timeout=10,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["Error"]
    assert requests.get(f"{server}/healthz", timeout=10).ok  # still serving


def test_nodes_no_eviction_can_open_are_reported_unresolvable(server: str,
                                                               fixtures: dict) -> None:
    # A selector no node matches: the NodeAffinity plugin's verdict is
    # UnschedulableAndUnresolvable, so kube-scheduler's preemption skips those nodes;
    # lack of room stays a plain failure. Each node is blamed on its first failing check,
    # as kube does: small-node lacks cpu before its labels are looked at.
    pod = copy.deepcopy(fixtures["pods"]["gpu-pod-02"])
    pod["spec"]["nodeSelector"] = {"disktype": "nvme-nowhere"}
    res = requests.post(f"{server}/filter", timeout=10, json={
        "Pod": pod, "NodeNames": ["pai-node-00", "small-node"]}).json()
    assert res["NodeNames"] == []
    assert res["FailedNodes"] == {"small-node": "Insufficient cpu"}
    assert res["FailedAndUnresolvableNodes"] == {
        "pai-node-00": "node(s) didn't match Pod's node affinity/selector"}


# ------------------------------------------------------------------ probes: never a 5xx
_PROBE_VALUES = [None, 3, -1, 1.5, "x", "", [], {}, [[]], [{}], {"a": 1}, True, "1e400000",
                 "-5", float("nan")]


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:2]):
            yield from _paths(v, (*prefix, i))


@pytest.mark.parametrize("profile", ["k8s-default", "fgd"])
def test_every_field_replaced_by_junk_is_a_clear_400_or_an_answer(fixtures: dict,
                                                                   profile: str) -> None:
    """Each field of a valid ExtenderArgs (whole nodes, and node names) replaced by values of
    the wrong type, absurd or negative quantities: the extender answers or raises
    BadRequest (HTTP 400), never another exception (HTTP 500)."""
    from smartsched.k8s.extender import BadRequest

    ext = Extender(profile)
    ext.set_cache(fixtures["nodes"])
    pod = fixtures["pods"]["gpu-pod-02"]
    bases = [{"Pod": pod, "Nodes": {"kind": "NodeList", "items": fixtures["nodes"][:2]}},
             {"Pod": pod, "NodeNames": [n["metadata"]["name"] for n in fixtures["nodes"]]}]
    cases = 0
    for base in bases:
        for path in [p for p in _paths(base) if p]:
            for junk in _PROBE_VALUES:
                args = copy.deepcopy(base)
                target = args
                for key in path[:-1]:
                    target = target[key]
                target[path[-1]] = junk
                for verb in (ext.filter, ext.prioritize):
                    cases += 1
                    try:
                        verb(args)
                    except BadRequest as e:
                        assert str(e)
    assert cases > 1000


def test_quantities_that_are_absurd_or_negative_are_refused_fast(server: str,
                                                                 fixtures: dict) -> None:
    for q in ("1e400000", "-4", "99999999999999999999Ei"):
        pod = copy.deepcopy(fixtures["pods"]["gpu-pod-02"])
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = q
        r = requests.post(f"{server}/filter", json={"Pod": pod, "NodeNames": ["pai-node-00"]},
                          timeout=10)
        assert r.status_code == 400 and "cpu" in r.json()["Error"]
        assert q not in r.json()["Error"] or len(q) < 32  # never echoes long input


def test_bodies_over_the_limit_get_413_declared_or_chunked() -> None:
    with _serving(make_app(Extender("k8s-default"), max_body_bytes=2048)) as url:
        big = b'{"Pod": {"metadata": {"name": "' + b"x" * 4096 + b'"}}}'
        r = requests.post(f"{url}/filter", data=big, timeout=10)
        assert r.status_code == 413 and "x" * 16 not in r.text

        def chunks():
            for _ in range(8):
                yield b" " * 1024

        assert requests.post(f"{url}/filter", data=chunks(), timeout=10).status_code == 413
        assert requests.get(f"{url}/healthz", timeout=10).ok


def test_json_nested_too_deeply_is_a_400(server: str) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    r = requests.post(f"{server}/filter", data=deep, timeout=30)
    assert r.status_code == 400 and "nested too deeply" in r.json()["Error"]


def test_a_number_too_long_to_read_is_a_400(server: str) -> None:
    """Python refuses integers of more than 4,300 digits (a ValueError, not a JSON one)."""
    body = '{"Pod": {}, "NodeNames": [], "X": ' + "1" * 5000 + "}"
    for path in ("/filter", "/prioritize"):
        r = requests.post(f"{server}{path}", data=body, timeout=10)
        assert r.status_code == 400 and "number too long" in r.json()["Error"]


@pytest.mark.parametrize("where", ["names", "items", "annotation"])
def test_a_lone_surrogate_anywhere_is_a_400_not_a_500(server: str, fixtures: dict,
                                                       where: str) -> None:
    """Answers echo node names (and filter's items): a lone surrogate cannot be written
    back as UTF-8, so it is refused on the way in, whichever endpoint and field."""
    import json as _json

    pod = fixtures["pods"]["gpu-pod-00"]
    if where == "names":
        args: dict = {"Pod": pod, "NodeNames": ["\ud800"]}
    else:
        node = copy.deepcopy(fixtures["nodes"][0])
        if where == "items":
            node["metadata"]["name"] = "\ud800"
        else:
            node["metadata"].setdefault("annotations", {})["x"] = "\ud800"
        args = {"Pod": pod, "Nodes": {"items": [node]}}
    body = _json.dumps(args)  # ensure_ascii: the surrogate travels as an escape
    for path in ("/filter", "/prioritize"):
        r = requests.post(f"{server}{path}", data=body, timeout=10)
        assert r.status_code == 400 and "surrogate" in r.json()["Error"], r.text[:200]
    # A valid pair (an emoji) is not a lone surrogate: answered.
    ok = {"Pod": pod, "NodeNames": ["\U0001F600"]}
    assert requests.post(f"{server}/filter", data=_json.dumps(ok), timeout=10).status_code == 200


@pytest.mark.parametrize(("change", "needle"), [
    (lambda pod: pod.__setitem__("spec", None), "spec"),
    (lambda pod: pod["spec"].__setitem__("nodeSelector", ["a"]), "spec.nodeSelector"),
    (lambda pod: pod["spec"].__setitem__("tolerations", "x"), "spec.tolerations"),
    (lambda pod: pod["spec"].__setitem__("affinity", {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "k", "operator": "Bogus", "values": ["v"]}]}]}}}),
     "operator"),
    (lambda pod: pod["spec"].__setitem__("affinity", {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["x"]}]}]}}}),
     "integer"),
])
def test_a_pod_the_api_server_would_refuse_is_a_clear_400(server: str, fixtures: dict,
                                                          change: Any, needle: str) -> None:
    """Not read as a pod asking nothing (a null spec) or answered with Python's own words:
    a 400 whose message names the field."""
    pod = copy.deepcopy(fixtures["pods"]["gpu-pod-00"])
    change(pod)
    for path in ("/filter", "/prioritize"):
        r = requests.post(f"{server}{path}", json={"Pod": pod,
                                                   "NodeNames": ["openb-node-0227"]},
                          timeout=10)
        assert r.status_code == 400 and needle in r.json()["Error"], r.text[:300]
        assert "(AttributeError)" not in r.text and "sequence element" not in r.text


def test_a_workload_aware_profile_answers_prioritize(fixtures: dict) -> None:
    # FGD plans on the workload it expects; the extender gives it the pods it has seen.
    ext = Extender("fgd")
    ext.set_cache(fixtures["nodes"])
    args = {"Pod": fixtures["pods"]["gpu-pod-01"],
            "NodeNames": [n["metadata"]["name"] for n in fixtures["nodes"]]}
    scores = ext.prioritize(args)
    assert len(scores) == len(fixtures["nodes"]) and max(s["Score"] for s in scores) == 10


def test_the_compliance_policy_binds_the_extender(fixtures: dict, tmp_path: Path) -> None:
    """A node dedicated to the finance namespace (tenant) is unresolvable for everyone
    else's pod, named as such, and the only node for finance's pods."""
    policy = tmp_path / "compliance.yaml"
    policy.write_text(yaml.safe_dump({"compliance": {
        "tenants": ["finance"], "dedicated": {"finance": {"nodes": ["pai-node-00"]}}}}))
    ext = Extender("k8s-default", compliance=str(policy))
    nodes = {"apiVersion": "v1", "kind": "NodeList", "items": fixtures["nodes"]}
    pod = copy.deepcopy(fixtures["pods"]["gpu-pod-00"])
    with _serving(make_app(ext)) as url:
        res = requests.post(f"{url}/filter", timeout=10,
                            json={"Pod": pod, "Nodes": nodes, "NodeNames": None}).json()
        assert "pai-node-00" not in [n["metadata"]["name"] for n in res["Nodes"]["items"]]
        assert "dedicated to another tenant" in res["FailedAndUnresolvableNodes"]["pai-node-00"]
        pod["metadata"]["namespace"] = "finance"
        res = requests.post(f"{url}/filter", timeout=10,
                            json={"Pod": pod, "Nodes": nodes, "NodeNames": None}).json()
        assert [n["metadata"]["name"] for n in res["Nodes"]["items"]] == ["pai-node-00"]


def test_the_extender_refuses_a_policy_it_cannot_enforce(tmp_path: Path) -> None:
    from smartsched.model.errors import ValidationError

    policy = tmp_path / "compliance.yaml"
    policy.write_text(yaml.safe_dump({"isolation": [{"between": ["class:online",
                                                                 "class:batch"]}]}))
    with pytest.raises(ValidationError) as e:
        Extender("k8s-default", compliance=str(policy))
    assert e.value.field == "compliance.isolation"
