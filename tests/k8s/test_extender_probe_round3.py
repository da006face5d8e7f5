"""Round 3 of the hostile probe of the scheduler extender, over real HTTP (uvicorn on
loopback), with small hand-written Node and Pod objects.

Found against ``smartsched k8s extender --nodes <the hkust-fgd test cluster>``:

- a filter call with whole Nodes, one of them holding an array nested ~300 levels deep in
  any field, was a 500 "Internal Server Error" (the answer echoes the Nodes, and FastAPI's
  encoder recursed out of stack); prioritize, which echoes nothing, answered;
- ``NaN`` / ``Infinity`` literals (not JSON; Go never writes them) were read as floats: in
  a node's annotations the filter echoed them back as ``null``, in a pod's annotations they
  were ignored;
- a NodeList with no items was a 400 "no usable node in the snapshot: " (a message cut
  short) where ``NodeNames: []`` is answered with nothing passing;
- ``POST /filter/`` was a 307 to a Location built from the Host header; ``HEAD /healthz``
  a 405.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from smartsched.k8s.extender import MAX_JSON_DEPTH, Extender, make_app
from tests.k8s.test_extender import _serving

NODE = {"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}},
        "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}}}
POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
       "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    ext = Extender("k8s-default")
    ext.set_cache([NODE])
    with _serving(make_app(ext)) as url:
        yield url


def _nodes(*extra: dict) -> dict:
    return {"kind": "NodeList", "items": [copy.deepcopy(NODE), *extra]}


def _post(url: str, verb: str, data: str) -> requests.Response:
    return requests.post(f"{url}/{verb}", data=data.encode(),
                         headers={"Content-Type": "application/json"}, timeout=10)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 300, 900])
def test_nodes_nested_too_deeply_are_a_400_not_a_500(server: str, depth: int) -> None:
    """Before: filter 500 from ~300 levels (the echo), prioritize 200."""
    node = copy.deepcopy(NODE)
    node["metadata"]["name"] = "n2"
    deep: Any = 1
    for _ in range(depth):
        deep = [deep]
    node["status"]["conditions"] = deep
    for verb in ("filter", "prioritize"):
        r = _post(server, verb, json.dumps({"Pod": POD, "Nodes": _nodes(node)}))
        assert r.status_code == 400, (verb, r.status_code, r.text[:200])
        assert "nested" in r.json()["Error"]
    # What Kubernetes objects nest (a dozen levels) is answered as ever.
    ok = copy.deepcopy(NODE)
    ok["metadata"]["name"] = "n2"
    ok["metadata"]["managedFields"] = [{"fieldsV1": {"f:a": {"f:b": {"f:c": {"f:d": {}}}}}}]
    r = _post(server, "filter", json.dumps({"Pod": POD, "Nodes": _nodes(ok)}))
    assert r.status_code == 200 and r.json()["Nodes"]["items"][1] == ok


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_literals_are_a_400(server: str, literal: str) -> None:
    """Before: a node annotation NaN came back as null; a pod annotation NaN was ignored."""
    node = json.dumps(_nodes()).replace('"labels"', f'"annotations": {{"x": {literal}}}, '
                                                   '"labels"', 1)
    pod = json.dumps(POD).replace('"namespace"', f'"annotations": {{"x": {literal}}}, '
                                                 '"namespace"', 1)
    for body in (f'{{"Pod": {json.dumps(POD)}, "Nodes": {node}}}',
                 f'{{"Pod": {pod}, "NodeNames": ["n1"]}}'):
        for verb in ("filter", "prioritize"):
            r = _post(server, verb, body)
            assert r.status_code == 400, (verb, r.text[:200])
            assert r.json()["Error"] == f"not valid JSON: {literal} is not a JSON number"
    # A large number is JSON: read as ever (here, as a quantity too large: a clear 400).
    pod = copy.deepcopy(POD)
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = 1e300
    r = _post(server, "filter", json.dumps({"Pod": pod, "NodeNames": ["n1"]}))
    assert r.status_code == 400 and "cpu" in r.json()["Error"]


def test_an_empty_node_list_is_answered_like_empty_node_names(server: str) -> None:
    """Before: 400 "ExtenderArgs.Nodes: no usable node in the snapshot: "."""
    r = _post(server, "filter", json.dumps({"Pod": POD, "Nodes": {"kind": "NodeList",
                                                                  "items": []}}))
    assert r.status_code == 200
    assert r.json() == {"Nodes": {"kind": "NodeList", "items": []}, "FailedNodes": {},
                        "FailedAndUnresolvableNodes": {}, "Error": ""}
    r = _post(server, "prioritize", json.dumps({"Pod": POD, "Nodes": {"items": []}}))
    assert r.status_code == 200 and r.json() == []
    # The pod is still checked first.
    r = _post(server, "filter", json.dumps({"Pod": {"spec": {}}, "Nodes": {"items": []}}))
    assert r.status_code == 400 and r.json()["Error"].startswith("ExtenderArgs.Pod")


def test_no_redirect_to_the_callers_host_and_head_on_healthz(server: str) -> None:
    """Before: ``POST /filter/`` 307 to ``http://evil.example:1/filter``; HEAD 405."""
    r = requests.post(f"{server}/filter/", data=b"{}", headers={"Host": "evil.example:1"},
                      allow_redirects=False, timeout=10)
    assert r.status_code == 404 and "location" not in r.headers
    r = requests.head(f"{server}/healthz", timeout=10)
    assert r.status_code == 200 and r.content == b""
    # The extender serves no API document or pages (probe round 5: kube-scheduler speaks
    # the extender protocol, and the pages load scripts from a public CDN).
    for path in ("openapi.json", "docs", "redoc"):
        assert requests.get(f"{server}/{path}", timeout=10).status_code == 404


def _walk_too_deep(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict | list):
            if depth > limit:
                return True
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return False


def test_the_depth_read_from_the_text_is_the_parsed_values() -> None:
    """``_too_deep`` reads the depth from the text (a walk of the parsed value cost as much
    as the parse): brackets and quotes inside strings, escaped or not, must not count."""
    import random

    from smartsched.k8s.extender import _too_deep

    rnd = random.Random(7)
    leaves = [1, None, 2.5, 'a[{\\"]}\\\\', 'x"[[[', "\\u005b[", "{{{{{{", "é[\u2028", ""]

    def gen(d: int) -> Any:
        r = rnd.random()
        if d > 10 or r < 0.3:
            return rnd.choice(leaves)
        if r < 0.65:
            return [gen(d + 1) for _ in range(rnd.randint(0, 3))]
        return {rnd.choice(["k", "[", '\\"{', "}"]) + str(i): gen(d + 1)
                for i in range(rnd.randint(0, 3))}

    for _ in range(2000):
        v, limit = gen(0), rnd.randint(1, 8)
        raw = json.dumps(v, ensure_ascii=rnd.random() < 0.5,
                         indent=rnd.choice([None, 1])).encode()
        assert _too_deep(raw, limit) == _walk_too_deep(v, limit), (raw[:200], limit)
