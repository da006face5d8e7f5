"""The extender protocol over real HTTP (uvicorn on loopback), in recorded-form payloads."""

from __future__ import annotations

import copy
import threading
import time
from pathlib import Path

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


@pytest.fixture(scope="module")
def server(fixtures: dict):
    import uvicorn

    ext = Extender("k8s-default")
    ext.set_cache(fixtures["nodes"])
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(make_app(ext), host="127.0.0.1", port=port,
                                        log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if requests.get(f"{url}/healthz", timeout=1).ok:
                break
        except requests.ConnectionError:
            time.sleep(0.05)
    yield url
    srv.should_exit = True
    t.join(timeout=5)


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
