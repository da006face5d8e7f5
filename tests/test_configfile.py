"""The one YAML loader: read, parse, validate, and name the failing field."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from smartsched.model.configfile import (
    field_path,
    read_resource,
    read_yaml,
    read_yaml_text,
    validate,
)
from smartsched.model.errors import ValidationError


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int


class Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[Item] = []
    tags: dict[str, int] = {}


def test_read_yaml_names_the_field(tmp_path: Path) -> None:
    good = tmp_path / "c.yaml"
    good.write_text("a: [1, 2]\n")
    assert read_yaml(good, "config") == {"a": [1, 2]}
    with pytest.raises(ValidationError) as e:
        read_yaml(tmp_path / "missing.yaml", "config")
    assert e.value.field == "config" and "cannot read" in e.value.message
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [unclosed")
    with pytest.raises(ValidationError) as e:
        read_yaml(bad, "config")
    assert e.value.field == "config" and e.value.source == str(bad)
    assert "not valid YAML" in str(e.value)


def test_read_yaml_text_and_packaged_resources() -> None:
    assert read_yaml_text("x: 1", "f") == {"x": 1}
    with pytest.raises(ValidationError) as e:
        read_yaml_text("x: [", "scenarios", source="here")
    assert (e.value.field, e.value.source) == ("scenarios", "here")
    doc = read_resource("smartsched.objectives", "profiles/scenarios.yaml", "scenarios")
    assert "balanced" in doc


@pytest.mark.parametrize(
    ("loc", "path"),
    [(("items", 0, "size"), "items[0].size"), (("a", "b"), "a.b"), ((0, "x"), "[0].x"),
     (("tags", "k", "[key]"), "tags.k")],
)
def test_field_path(loc: tuple, path: str) -> None:
    assert field_path(loc, drop=("[key]",)) == path


def test_validate_names_list_items_as_written() -> None:
    with pytest.raises(ValidationError) as e:
        validate(Doc, {"items": [{"size": 1}, {"size": "big"}]}, prefix="cfg", source="f.yaml")
    assert e.value.field == "cfg.items[1].size" and e.value.source == "f.yaml"
    with pytest.raises(ValidationError) as e:
        validate(Doc, {"colour": 1})
    assert e.value.field == "colour"
    assert validate(Doc, None).items == []


def test_a_binary_file_is_named_not_a_decode_traceback(tmp_path) -> None:
    bad = tmp_path / "nodes.json"
    bad.write_bytes(b"\xff\xfe\x00garbage\n")
    with pytest.raises(ValidationError, match="not UTF-8") as e:
        read_yaml(bad, "nodes")
    assert e.value.field == "nodes"
