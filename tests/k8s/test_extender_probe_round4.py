"""Round 4 of the hostile probe of the scheduler extender, over real HTTP (uvicorn on
loopback):

- a NodeList whose every node was malformed was a 400 echoing the input ("no usable node
  in the snapshot: a: ... not a quantity: 'x'"), where one such node beside a good one is
  answered 200 with it among the FailedAndUnresolvableNodes;
- node label values were turned into text: ``{"k": null}`` read as "None", and a pod
  selecting ``k: "None"`` passed the node; a taint ``{"key": 1}`` became "1:NoSchedule";
- a JSON key given twice was read with its last value (``"name": "a", "name": "b"``);
- a body declared as text/plain or as gzip-encoded was parsed as JSON anyway;
- a body 10 bytes short of its Content-Length held the request for good (no answer after
  300 s).
"""

from __future__ import annotations

import copy
import json
import socket
import time
from collections.abc import Iterator

import pytest
import requests

from smartsched.k8s import extender as extender_module
from smartsched.k8s.extender import Extender, make_app
from tests.k8s.test_extender import _serving
from tests.k8s.test_extender_probe_round3 import NODE, POD


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with _serving(make_app(Extender("k8s-default"))) as url:
        yield url


def _post(url: str, verb: str, data: bytes, **headers: str) -> requests.Response:
    return requests.post(f"{url}/{verb}", data=data,
                         headers={"Content-Type": "application/json", **headers}, timeout=10)


def _node(name: str, **edit: object) -> dict:
    n = copy.deepcopy(NODE)
    n["metadata"]["name"] = name
    for path, value in edit.items():
        *head, last = path.split("__")
        cur = n
        for k in head:
            cur = cur.setdefault(k, {})
        cur[last] = value
    return n


def test_every_node_unreadable_is_a_200_with_each_unresolvable(server: str) -> None:
    bad = [_node("a", status__allocatable={"cpu": "x", "memory": "1Gi"}),
           _node("b", status__allocatable={"cpu": "y", "memory": "1Gi"})]
    body = json.dumps({"Pod": POD, "Nodes": {"kind": "NodeList", "items": bad}}).encode()
    r = _post(server, "filter", body)
    assert r.status_code == 200, r.text[:200]
    out = r.json()
    assert out["Nodes"]["items"] == [] and set(out["FailedAndUnresolvableNodes"]) == {"a", "b"}
    r = _post(server, "prioritize", body)
    assert r.status_code == 200 and r.json() == []


@pytest.mark.parametrize("edit", [
    {"metadata__labels": {"k": None, "kubernetes.io/hostname": "x"}},
    {"metadata__labels": {"k": [1]}},
    {"metadata__labels": {"k": 1.5}},
    {"metadata__labels": {"": "v"}},
    {"spec__taints": [{"key": 1, "effect": "NoSchedule"}]},
    {"spec__taints": [{"key": "k", "value": 5, "effect": "NoSchedule"}]},
])
def test_a_node_whose_labels_or_taints_are_not_text_is_unresolvable(server: str,
                                                                     edit: dict) -> None:
    nodes = {"kind": "NodeList", "items": [_node("odd", **edit), _node("good")]}
    r = _post(server, "filter", json.dumps({"Pod": POD, "Nodes": nodes}).encode())
    assert r.status_code == 200, r.text[:200]
    out = r.json()
    assert "odd" in out["FailedAndUnresolvableNodes"]
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["good"]


def test_a_key_given_twice_is_a_400(server: str) -> None:
    body = (b'{"Pod": %s, "Nodes": {"kind": "NodeList", "items": [{"metadata": {"name": "a", '
            b'"name": "b"}, "status": {"allocatable": {"cpu": "8", "memory": "1Gi"}}}]}}'
            % json.dumps(POD).encode())
    r = _post(server, "filter", body)
    assert r.status_code == 400 and "is given twice" in r.json()["Error"]
    assert "'name'" not in r.json()["Error"]  # the key is the client's input (round 5)


def test_a_body_not_declared_as_plain_json_is_a_415(server: str) -> None:
    body = json.dumps({"Pod": POD, "NodeNames": []}).encode()
    assert _post(server, "filter", body, **{"Content-Type": "text/plain"}).status_code == 415
    assert _post(server, "filter", body, **{"Content-Encoding": "gzip"}).status_code == 415
    ok = _post(server, "filter", body, **{"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 400  # read: NodeNames without a node cache


def test_a_body_that_stops_arriving_is_a_408(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extender_module, "BODY_IDLE_TIMEOUT_S", 0.5)
    with _serving(make_app(Extender("k8s-default"))) as url:
        host, port = url.removeprefix("http://").split(":")
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall(b"POST /filter HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"Pod\": ")
        t0 = time.monotonic()
        got = s.recv(4096)
        s.close()
    assert got.startswith(b"HTTP/1.1 408"), got[:80]
    assert time.monotonic() - t0 < 8


def test_a_hand_written_yaml_lists_unquoted_numbers_and_booleans_read_as_their_text() -> None:
    from smartsched.k8s.snapshot import node_spec

    spec, _ = node_spec(_node("y", metadata__labels={"gpu-count": 8, "accel": True}))
    assert spec.labels["gpu-count"] == "8" and spec.labels["accel"] == "true"
    with pytest.raises(ValueError, match=r"metadata\.labels"):
        node_spec(_node("z", metadata__labels={"k": None}))
    with pytest.raises(ValueError, match=r"spec\.taints"):
        node_spec(_node("t", spec__taints=[{"key": "k", "value": 0, "effect": "NoSchedule"}]))
