"""Node objects from a file: the ``--nodes`` of ``smartsched k8s extender``.

Owns reading a NodeList as ``kubectl get nodes -o json`` (or ``-o yaml``)
writes it -- a document with ``items`` -- or a bare list of Node objects, or
one Node, into a list of Node objects (plain dicts) for the extender's node
cache. Bad input is a ``ValidationError`` naming ``nodes``; whether each Node
is understood is the snapshot's business (it skips and names those it is not).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from smartsched.model.errors import ValidationError

FIELD = "nodes"


def parse_node_list(doc: Any) -> list[dict[str, Any]]:
    """The Node objects of a parsed NodeList document, list of Nodes, or single Node."""
    if doc is None:
        raise ValidationError(FIELD, "empty: expected a NodeList, a list of Nodes or a Node")
    if isinstance(doc, dict) and "items" in doc:
        items = doc["items"]
        if not isinstance(items, list):  # ("row 0: got NoneType" named no row there is)
            raise ValidationError(f"{FIELD}.items", "must be a list of Node objects, got "
                                  f"{type(items).__name__}")
        if not items:
            raise ValidationError(f"{FIELD}.items", "the NodeList has no items")
        nodes = items
    else:
        nodes = doc if isinstance(doc, list) else [doc]
        if not nodes:
            raise ValidationError(FIELD, "an empty list: no Node objects")
    for i, node in enumerate(nodes):
        if not isinstance(node, dict):
            raise ValidationError(FIELD, f"expected a Node object, got {type(node).__name__}",
                                  row=i)
    return nodes


def read_node_list(path: str | Path) -> list[dict[str, Any]]:
    """The Node objects in the JSON or YAML file at ``path`` (see ``parse_node_list``)."""
    from smartsched.model.configfile import read_yaml

    # JSON is YAML: one parser for both.
    return parse_node_list(read_yaml(path, FIELD, kind="JSON/YAML", cite_source=False))
