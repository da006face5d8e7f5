"""Pods and clusters round-trip through Parquet."""

from __future__ import annotations

from pathlib import Path

import pytest

from smartsched.model.errors import ValidationError
from smartsched.model.presets import load_cluster
from smartsched.twin.state import ClusterState
from smartsched.workloads.mixed import generate_mixed
from smartsched.workloads.parquet_io import read_cluster, read_pods, write_cluster, write_pods


def test_pods_round_trip(tmp_path: Path) -> None:
    spec = load_cluster("small")
    pods = generate_mixed(spec, hours=6, seed=0)
    write_pods(pods, tmp_path / "p.parquet")
    assert read_pods(tmp_path / "p.parquet") == pods


def test_cluster_round_trip(tmp_path: Path) -> None:
    spec = load_cluster("medium")
    write_cluster(spec, tmp_path / "c.parquet")
    back = read_cluster(tmp_path / "c.parquet")
    assert back.nodes == spec.nodes
    assert [z.name for z in back.zones] == [z.name for z in spec.zones]
    a, b = ClusterState(spec), ClusterState(back)
    assert (a.capacity == b.capacity).all() and (a.taints == b.taints).all()
    assert (back.sites[1].carbon.values == spec.sites[1].carbon.values).all()


def test_bad_pod_row_names_row(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": ["a", "b"], "cpu_milli": [100, -1], "memory_mib": [1, 1]}),
                   tmp_path / "bad.parquet")
    with pytest.raises(ValidationError) as e:
        read_pods(tmp_path / "bad.parquet")
    assert e.value.field == "cpu_milli" and e.value.row == 1


def test_a_renamed_pod_column_is_named_not_dropped(tmp_path: Path) -> None:
    """A column under another name (``arrival_s``) was ignored: every pod arrived at 0,
    and the run went ahead."""
    import pyarrow.parquet as pq

    write_pods(generate_mixed(load_cluster("small"), hours=1, seed=0), tmp_path / "p.parquet")
    table = pq.read_table(tmp_path / "p.parquet")
    pq.write_table(table.rename_columns([("arrival_s" if n == "arrival" else n)
                                         for n in table.column_names]), tmp_path / "r.parquet")
    with pytest.raises(ValidationError, match="unknown column") as e:
        read_pods(tmp_path / "r.parquet")
    assert e.value.field == "arrival_s"
    table.to_pandas().set_index("id", drop=False).to_parquet(tmp_path / "pd.parquet")
    assert len(read_pods(tmp_path / "pd.parquet")) == table.num_rows  # pandas' own index


@pytest.mark.parametrize("damage", ["truncated", "not parquet", "other table", "no sites",
                                    "bad json", "wrong types"])
def test_a_cluster_file_that_is_not_one_is_named_not_a_traceback(tmp_path: Path,
                                                                 damage: str) -> None:
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    good = tmp_path / "good.parquet"
    write_cluster(load_cluster("small"), good)
    bad = tmp_path / "bad.parquet"
    table = pq.read_table(good)
    meta = json.loads(table.schema.metadata[b"smartsched.cluster"])
    if damage == "truncated":
        bad.write_bytes(good.read_bytes()[:200])
    elif damage == "not parquet":
        bad.write_bytes(b"PAR1 this is not a parquet file")
    elif damage == "other table":
        pq.write_table(pa.table({"x": [1, 2]}), bad)
    else:
        if damage == "no sites":
            del meta["sites"]
        elif damage == "wrong types":
            meta["zones"] = [{"name": 3, "site": None, "extra": 1}]
        raw = b"{not json" if damage == "bad json" else json.dumps(meta).encode()
        pq.write_table(table.replace_schema_metadata({"smartsched.cluster": raw}), bad)
    with pytest.raises(ValidationError) as e:
        read_cluster(bad)
    assert e.value.field.split(".")[0] in ("file", "metadata") and str(bad) in str(e.value)


@pytest.mark.parametrize(("edit", "field"), [
    (lambda m: m.update(sites="eu"), "metadata.sites"),
    (lambda m: m["sites"][0].update(carbon="grid.csv"), "metadata.sites[0].carbon"),
    (lambda m: m["sites"][0]["carbon"].update(values="1,2"), "metadata.sites[0].carbon.values"),
    (lambda m: m["sites"][0]["carbon"].update(values=[1, "x"]),
     "metadata.sites[0].carbon.values"),
    (lambda m: m["sites"][0]["carbon"].update(step_s="3600"), "metadata.sites[0].carbon.step_s"),
    (lambda m: m["sites"][0].update(pue="1.2"), "metadata.sites[0].pue"),
    (lambda m: m["sites"][0].update(coords_km=[1]), "metadata.sites[0].coords_km"),
    (lambda m: m["sites"][0].update(color="red"), "metadata.sites[0]"),
    (lambda m: m["zones"][0].update(site=None), "metadata.zones[0].site"),
    (lambda m: m.update(zones={"a": 1}), "metadata.zones"),
    (lambda m: m.update(name=[1]), "metadata.name"),
])
def test_edited_cluster_metadata_names_the_field(tmp_path: Path, edit, field: str) -> None:
    """Each part of the metadata is named when it is not what the writer writes (it
    was one "malformed cluster file (TypeError: string indices ...)" line)."""
    import json

    import pyarrow.parquet as pq

    good = tmp_path / "good.parquet"
    write_cluster(load_cluster("small"), good)
    table = pq.read_table(good)
    meta = json.loads(table.schema.metadata[b"smartsched.cluster"])
    edit(meta)
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.replace_schema_metadata({"smartsched.cluster": json.dumps(meta)}), bad)
    with pytest.raises(ValidationError) as e:
        read_cluster(bad)
    assert e.value.field == field and str(bad) in str(e.value)
