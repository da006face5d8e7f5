"""Node lists from files (``smartsched k8s extender --nodes``): every accepted shape, and bad
input named ``nodes``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from smartsched.k8s.nodelist import parse_node_list, read_node_list
from smartsched.model.errors import ValidationError


def _node(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}}


@pytest.mark.parametrize("shape", ["nodelist-json", "nodelist-yaml", "bare-list", "one-node"])
def test_every_shape_gives_the_node_objects(shape: str, tmp_path: Path) -> None:
    nodes = [_node("a"), _node("b")]
    f = tmp_path / "nodes"
    if shape == "nodelist-json":  # as `kubectl get nodes -o json` writes it
        f.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
    elif shape == "nodelist-yaml":
        f.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "NodeList", "items": nodes}))
    elif shape == "bare-list":
        f.write_text(yaml.safe_dump(nodes))
    else:
        nodes = nodes[:1]
        f.write_text(yaml.safe_dump(nodes[0]))
    assert read_node_list(f) == nodes


def test_recorded_nodes_fill_the_extender_cache(data_dir: Path, tmp_path: Path) -> None:
    from smartsched.k8s.extender import Extender

    root = data_dir / "k8s-api-examples" / "hkust-fgd-test-cluster" / "node"
    items = [yaml.safe_load(p.read_text()) for p in sorted(root.glob("*.yaml"))]
    f = tmp_path / "nodes.json"
    f.write_text(json.dumps({"kind": "NodeList", "items": items}))
    snap = Extender("k8s-default").set_cache(read_node_list(f))
    assert [n.name for n in snap.spec.nodes] == [n["metadata"]["name"] for n in items]


@pytest.mark.parametrize(("text", "message", "row"), [
    ("{items: [", "not valid JSON/YAML", None),
    ("", "empty", None),
    ("items: null\n", "must be a list", "items"),
    ("- {kind: Node}\n- just-a-name\n", "got str", 1),
    ("42\n", "got int", 0),
])
def test_bad_input_names_nodes(text: str, message: str, row: int | None,
                               tmp_path: Path) -> None:
    f = tmp_path / "nodes.yaml"
    f.write_text(text)
    with pytest.raises(ValidationError, match=message) as e:
        read_node_list(f)
    if row == "items":  # the NodeList's items, not a row of them (probe round 5)
        assert e.value.field == "nodes.items" and e.value.row is None
        return
    assert e.value.field == "nodes" and e.value.row == row


def test_an_unreadable_file_names_nodes(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="cannot read") as e:
        read_node_list(tmp_path)  # a directory
    assert e.value.field == "nodes"
    assert parse_node_list([_node("a")]) == [_node("a")]


def test_the_extender_command_reports_a_bad_node_file_in_one_line(tmp_path: Path) -> None:
    from smartsched.cli import main

    f = tmp_path / "nodes.json"
    f.write_text('{"items": [')
    r = CliRunner().invoke(main, ["k8s", "extender", "--nodes", str(f)])
    assert r.exit_code == 2
    assert r.output.startswith("error: nodes: not valid JSON/YAML")
