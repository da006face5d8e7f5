"""Trace files whose shape pandas or pyarrow read without a word but a loader would
misread: a trailing comma on every row, a column named twice, a cell that is a list or
undecodable bytes, a list column given as text. Each is one error naming the column."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smartsched.model.cluster_io import load_openb_nodes
from smartsched.model.errors import ValidationError
from smartsched.workloads.openb import load_openb_pods
from smartsched.workloads.parquet_io import read_pods

HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
          "creation_time,deletion_time,scheduled_time")
ROW = "p1,1000,1024,1,500,,LS,Running,0,100,0"


def test_rows_longer_than_the_header_are_refused_not_shifted(tmp_path: Path) -> None:
    """pandas made the extra leading fields an index, so every column moved one along."""
    pods = tmp_path / "pods.csv"
    pods.write_text(f"{HEADER}\n{ROW},\n")
    with pytest.raises(ValidationError) as e:
        load_openb_pods(pods)
    assert e.value.field == "file" and "more than the header" in e.value.message
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,2,P100,\n")
    with pytest.raises(ValidationError) as e:
        load_openb_nodes(nodes, zone="z")
    assert e.value.field == "file" and "trailing comma" in e.value.message


def test_a_column_named_twice_is_refused(tmp_path: Path) -> None:
    """pandas renamed the second ``cpu_milli.1`` and the loader used the first."""
    csv = tmp_path / "pods.csv"
    csv.write_text(f"{HEADER},cpu_milli\n{ROW},5\n")
    with pytest.raises(ValidationError) as e:
        load_openb_pods(csv)
    assert e.value.field == "cpu_milli" and "twice" in e.value.message
    names = ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "cpu_milli"]
    table = pa.Table.from_arrays([pa.array(["p1"])] + [pa.array([1])] * 5, names=names)
    pq.write_table(table, tmp_path / "pods.parquet")
    with pytest.raises(ValidationError) as e:
        load_openb_pods(tmp_path / "pods.parquet")
    assert e.value.field == "cpu_milli" and "twice" in e.value.message
    own = pa.Table.from_arrays([pa.array(["a"]), pa.array([1000]), pa.array([100]),
                                pa.array([5])], names=["id", "cpu_milli", "memory_mib", "id"])
    pq.write_table(own, tmp_path / "own.parquet")
    with pytest.raises(ValidationError) as e:
        read_pods(tmp_path / "own.parquet")
    assert e.value.field == "id" and "\n" not in str(e.value)


def _openb_table(**over: list) -> pa.Table:
    cols = {"name": ["p1", "p2"], "cpu_milli": [1000, 2000], "memory_mib": [1024, 1024],
            "num_gpu": [0, 0], "gpu_milli": [0, 0]}
    return pa.table({**cols, **over})


@pytest.mark.parametrize(("cells", "says"), [
    ([["p1"], ["p2"]], "expected text"),  # a list cell became the name "['p1']"
    (pa.array([b"p1", b"\xff"], pa.binary()), "not UTF-8"),  # was a UnicodeDecodeError
])
def test_a_name_cell_that_is_no_text_is_named(tmp_path: Path, cells: object, says: str) -> None:
    path = tmp_path / "pods.parquet"
    pq.write_table(_openb_table(name=cells), path)
    with pytest.raises(ValidationError) as e:
        load_openb_pods(path)
    assert e.value.field == "name" and says in e.value.message


@pytest.mark.parametrize(("column", "cells", "field"), [
    ("allowed_regions", ["eu", "us"], "allowed_regions"),  # was ('e', 'u'): two regions
    ("node_selector", [["pool"], []], "node_selector"),  # no '=': crashed the twin
    ("tolerations", [[1], []], "tolerations"),
    ("tenant", [["a"], ["b"]], "tenant"),
])
def test_a_pod_file_column_of_the_wrong_shape_is_named(
    tmp_path: Path, column: str, cells: list, field: str
) -> None:
    path = tmp_path / "pods.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "cpu_milli": [1000, 1000],
                             "memory_mib": [100, 100], column: cells}), path)
    with pytest.raises(ValidationError) as e:
        read_pods(path)
    assert (e.value.field, e.value.row) == (field, 0)


def test_an_empty_id_cell_is_named(tmp_path: Path) -> None:
    path = tmp_path / "pods.parquet"
    pq.write_table(pa.table({"id": [None, "b"], "cpu_milli": [1000, 1000],
                             "memory_mib": [100, 100]}), path)
    with pytest.raises(ValidationError) as e:
        read_pods(path)
    assert (e.value.field, e.value.row) == ("id", 0)
