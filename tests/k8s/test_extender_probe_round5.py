"""Round 5 of the hostile probe of the scheduler extender, over real HTTP (uvicorn on
loopback): what round 4 found and left open.

- a NodeList item whose name the API server would refuse (``"Node A"``, ``"n_1"``, 254
  characters) was a candidate like any other: the pod passed the filter onto a node that
  cannot exist, and kube-scheduler bound it to that name;
- a large body was parsed on the event loop: every other request, ``/healthz`` included,
  waited for the parse.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from smartsched.k8s import extender as extender_module
from smartsched.k8s.extender import Extender, make_app
from tests.k8s.test_extender import _serving
from tests.k8s.test_extender_probe_round3 import POD
from tests.k8s.test_extender_probe_round4 import _node, _post


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with _serving(make_app(Extender("k8s-default"))) as url:
        yield url


@pytest.mark.parametrize("name", ["Node-A", "node a", "n_1", "-n1", "n1.", "x" * 254,
                                  "n\u00e9"])
def test_a_node_kubernetes_could_not_hold_is_no_candidate(server: str, name: str) -> None:
    body = json.dumps({"Pod": POD, "Nodes": {"kind": "NodeList",
                                             "items": [_node("good-1"), _node(name)]}})
    r = _post(server, "filter", body.encode())
    assert r.status_code == 200, r.text[:200]
    out = r.json()
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["good-1"]
    why = out["FailedAndUnresolvableNodes"][name]
    assert why.startswith("node not understood: metadata.name")
    assert name not in why  # the reason never quotes the name
    r = _post(server, "prioritize", body.encode())
    assert r.status_code == 200 and [h["Host"] for h in r.json()] == ["good-1"]


def test_a_dotted_name_is_a_node_name(server: str) -> None:
    body = json.dumps({"Pod": POD, "Nodes": {"items": [_node("ip-10-0-0-1.ec2.internal")]}})
    r = _post(server, "filter", body.encode())
    assert r.status_code == 200 and not r.json()["FailedAndUnresolvableNodes"]


@pytest.mark.parametrize("inline", [False, True])
def test_a_large_body_is_parsed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch,
                                                   inline: bool) -> None:
    """The parse is made slow (3 s) for the test; /healthz must answer meanwhile. The
    ``inline`` case shows the test can fail: parsed on the loop, /healthz waits."""
    parse = extender_module.parse_args_json

    def slow(raw: bytes) -> object:
        time.sleep(3.0)
        return parse(raw)

    monkeypatch.setattr(extender_module, "parse_args_json", slow)
    monkeypatch.setattr(extender_module, "INLINE_PARSE_BYTES", 1 << 40 if inline else 16)
    body = json.dumps({"Pod": POD, "Nodes": {"items": [_node("n1")]}}).encode()
    with _serving(make_app(Extender("k8s-default"))) as url:
        posted: list[int] = []
        t = threading.Thread(target=lambda: posted.append(
            _post(url, "filter", body).status_code))
        t.start()
        time.sleep(0.4)  # the body is in and being parsed
        t0 = time.monotonic()
        assert requests.get(f"{url}/healthz", timeout=10).ok
        waited = time.monotonic() - t0
        t.join(10)
    assert posted == [200]
    if inline:
        assert waited > 1.5
    else:
        assert waited < 1.5, waited


def test_a_gpu_product_selector_is_a_label_match_too(server: str) -> None:
    """HTTP probe 5: ``nvidia.com/gpu.product`` in a nodeSelector became a GPU-model
    constraint and the label match was dropped: a CPU pod selecting it passed nodes
    without the label, and a pod selecting an A100 40GB passed an 80GB node."""
    import copy

    labelled = _node("a100-40", metadata__labels={
        "kubernetes.io/hostname": "a100-40", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"})
    other = _node("a100-80", metadata__labels={
        "kubernetes.io/hostname": "a100-80", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    plain = _node("plain-1")
    pod = copy.deepcopy(POD)
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
    body = json.dumps({"Pod": pod, "Nodes": {"items": [labelled, other, plain]}})
    r = _post(server, "filter", body.encode())
    assert r.status_code == 200, r.text[:200]
    assert [n["metadata"]["name"] for n in r.json()["Nodes"]["items"]] == ["a100-40"]


def test_extender_errors_never_quote_the_input(server: str) -> None:
    import copy

    pod = copy.deepcopy(POD)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "SECRETQTY"
    r = _post(server, "filter", json.dumps({"Pod": pod, "Nodes": {"items": [_node("n1")]}}
                                           ).encode())
    assert r.status_code == 400 and "SECRETQTY" not in r.text
    assert "requests.cpu" in r.json()["Error"]
    bad = _node("n2", spec__taints=[{"key": "k", "effect": "SECRETEFFECT"}])
    r = _post(server, "filter", json.dumps({"Pod": POD, "Nodes": {"items": [
        _node("n1"), bad]}}).encode())
    assert r.status_code == 200 and "SECRETEFFECT" not in r.text


def test_prioritize_scores_each_host_once_and_errors_name_the_pods_fields(server: str
                                                                         ) -> None:
    import copy

    from smartsched.k8s.extender import Extender, make_app

    ext = Extender("k8s-default")
    ext.set_cache([_node("n0"), _node("n1")])
    with _serving(make_app(ext)) as url:
        r = _post(url, "prioritize", json.dumps({"Pod": POD, "NodeNames": ["n0", "n0", "n1"]}
                                                ).encode())
        assert r.status_code == 200 and [h["Host"] for h in r.json()] == ["n0", "n1"]
    pod = copy.deepcopy(POD)
    pod["spec"]["containers"][0]["resources"]["requests"]["memory"] = "1E18"
    r = _post(server, "filter", json.dumps({"Pod": pod, "Nodes": {"items": [_node("n1")]}}
                                           ).encode())
    assert r.status_code == 400
    assert "requests.memory" in r.json()["Error"] and "memory_mib" not in r.json()["Error"]
