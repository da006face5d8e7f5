"""The one YAML loader: read, parse, validate, and name the failing field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
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
    assert validate(Doc, None).items == []  # an empty file: every default


@pytest.mark.parametrize("doc", [[], "", 0, False])
def test_a_falsy_document_that_is_no_mapping_is_refused_not_the_defaults(doc: object) -> None:
    """``[]`` or ``''`` as a whole config (``train --config``) trained on every default
    without a word: only an empty file (None) means the defaults."""
    with pytest.raises(ValidationError, match="dictionary") as e:
        validate(Doc, doc, prefix="config")
    assert e.value.field == "config"


def test_a_binary_file_is_named_not_a_decode_traceback(tmp_path) -> None:
    bad = tmp_path / "nodes.json"
    bad.write_bytes(b"\xff\xfe\x00garbage\n")
    with pytest.raises(ValidationError, match="not UTF-8") as e:
        read_yaml(bad, "nodes")
    assert e.value.field == "nodes"


LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True))


@pytest.mark.parametrize(("text", "says"), [
    # a few lines of aliases of aliases stand for 9^9 values: pydantic's error for them
    # exhausted memory (the process aborted)
    (LAUGHS + "filters: *i\n", "more than 1,000,000 values"),
    ("a: " + "[" * 3000 + "]" * 3000 + "\n", "deeper than 100"),  # was a RecursionError
    ("a: " + "[" * 150 + "]" * 150 + "\n", "deeper than 100"),
    ("a: &x [*x]\n", "deeper than 100"),  # a document that contains itself
    # safe_load kept the second silently: a profile's second ``score:`` dropped the first
    ("score: [a]\nfilters: [b]\nscore: [c]\n", "duplicate key 'score'"),
])
def test_a_document_too_big_deep_or_ambiguous_is_one_error(text: str, says: str) -> None:
    with pytest.raises(ValidationError) as e:
        read_yaml_text(text, "profile", source="p.yaml")
    assert e.value.field == "profile" and says in e.value.message
    assert "\n" not in str(e.value)


def test_yaml_errors_fit_on_one_line_with_the_place() -> None:
    with pytest.raises(ValidationError) as e:
        read_yaml_text("a: [unclosed", "config")
    assert "\n" not in str(e.value) and "(line 1, column 13)" in e.value.message


def test_merge_keys_may_still_be_overridden() -> None:
    doc = read_yaml_text("base: &b {x: 1, y: 2}\nmine: {<<: *b, y: 3}\n", "config")
    assert doc["mine"] == {"x": 1, "y": 3}


def test_a_fifo_or_device_is_refused_not_waited_on(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ValidationError) as e:  # reading it waited for a writer forever
        read_yaml(fifo, "config")
    assert "not a regular file" in e.value.message
    with pytest.raises(ValidationError) as e:  # /dev/zero ended in a MemoryError
        read_yaml("/dev/zero", "config")
    assert "not a regular file" in e.value.message
    with pytest.raises(ValidationError) as e:
        read_yaml(tmp_path, "config")
    assert "is a directory" in e.value.message


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_a_number_that_is_not_finite_is_named_so_not_blamed_on_a_bound(value: str) -> None:
    """``interval_s: .nan`` was refused as "should be less than or equal to 604800"."""
    from smartsched.rl.learning import load_learn_config

    doc = yaml.safe_load(f"store: models/store\ninterval_s: {value}\n")
    with pytest.raises(ValidationError) as e:
        load_learn_config(doc)
    assert e.value.field == "learn.interval_s"
    assert e.value.message.startswith("must be a finite number, got "), e.value.message


def test_true_or_false_where_a_number_goes_is_named() -> None:
    """pydantic reads true as 1 for a number: ``failure_toleration_s: true`` was a 1-second
    toleration, ``interval_s: true`` one second, a list item's ``size: true`` a size of 1."""
    from smartsched.rl.learning import load_learn_config
    from smartsched.scheduling.registry import profile_from_dict, read_profile_doc

    with pytest.raises(ValidationError) as e:
        validate(Doc, {"items": [{"size": 1}, {"size": True}]}, prefix="cfg")
    assert e.value.field == "cfg.items[1].size" and "true/false" in e.value.message
    with pytest.raises(ValidationError) as e:
        validate(Doc, {"tags": {"a": 1, "b": False}})
    assert e.value.field == "tags.b"
    with pytest.raises(ValidationError) as e:
        load_learn_config({"store": "s", "interval_s": True})
    assert e.value.field == "learn.interval_s"
    doc, _ = read_profile_doc("k8s-default")
    with pytest.raises(ValidationError) as e:
        profile_from_dict({**doc, "name": "mine", "failure_toleration_s": True})
    assert e.value.field == "mine.failure_toleration_s"
    assert validate(Doc, {"items": [{"size": 2}]}).items[0].size == 2  # numbers still pass


def test_a_json_document_reads_as_the_yaml_path_reads_it_only_faster() -> None:
    """`kubectl get nodes -o json` of 1,000 nodes (10.9 MB) took 34 s through YAML's
    constructor (probe round 8); JSON is read by Python's JSON reader now, with the YAML
    path's rules: a key twice, NaN and too deep are refused or read as YAML reads them."""
    import json

    from smartsched.model.configfile import read_yaml_text
    from smartsched.model.errors import ValidationError

    doc = {"items": [{"metadata": {"name": f"n{i}", "labels": {"zone": "a"}},
                      "cap": [1, 2.5, 1e300, True, None, "x"]} for i in range(3)]}
    text = json.dumps(doc)
    assert read_yaml_text(text, "nodes") == doc
    with pytest.raises(ValidationError, match=r"duplicate key 'a' \(line 1"):
        read_yaml_text('{"a": 1, "a": 2}', "nodes")
    assert read_yaml_text('{"v": NaN}', "nodes") == {"v": "NaN"}  # text, as YAML reads it
    with pytest.raises(ValidationError, match="nest"):
        read_yaml_text("[" * 5000 + "]" * 5000, "nodes")
    assert read_yaml_text("{a: 1}", "nodes") == {"a": 1}  # flow YAML, not JSON
