"""The openb trace loader on the shared files, and on corrupted copies."""

from __future__ import annotations

from pathlib import Path

import pytest

from smartsched.model.errors import ValidationError
from smartsched.model.presets import load_cluster
from smartsched.workloads.openb import load_openb_nodes, load_openb_pods

OPENB = "alibaba-openb-gpu-2023"


@pytest.mark.parametrize(
    ("variant", "rows"),
    [("default", 8152), ("cpu050", 7439), ("gpushare40", 8152), ("gpuspec33", 8152),
     ("multigpu20", 8324), ("multigpu50", 9061)],
)
def test_row_counts(data_dir: Path, variant: str, rows: int) -> None:
    pods = load_openb_pods(data_dir / OPENB / f"openb_pod_list_{variant}.csv")
    assert len(pods) == rows


def test_default_trace_contents(data_dir: Path) -> None:
    pods = load_openb_pods(data_dir / OPENB / "openb_pod_list_default.csv")
    by_gpus = {}
    for p in pods:
        by_gpus[p.num_gpu] = by_gpus.get(p.num_gpu, 0) + 1
    assert by_gpus == {0: 1088, 1: 6989, 2: 16, 4: 15, 8: 44}  # per the data README
    assert sum(1 for p in pods if p.is_gpu_share) == 3078
    assert pods[1].arrival == 427061 and pods[1].gpu_milli == 460
    assert all(p.duration is not None and p.duration >= 0 for p in pods)


def test_five_column_variant_has_no_times(data_dir: Path) -> None:
    pods = load_openb_pods(data_dir / OPENB / "openb_pod_list_multigpu30.csv")
    assert len(pods) == 8508
    assert all(p.arrival == 0 and p.duration is None and not p.gpu_models for p in pods)


def test_node_lists(data_dir: Path) -> None:
    gpu = load_cluster("openb-gpu")
    assert len(gpu.nodes) == 1213 and gpu.total_gpus == 6212
    everything = load_cluster("openb-all")
    assert len(everything.nodes) == 1523 and everything.total_gpus == 6212


def _corrupt(src: Path, dst: Path, fn) -> Path:
    lines = src.read_text().splitlines()
    dst.write_text("\n".join(fn(lines)) + "\n")
    return dst


def test_missing_column_is_named(data_dir: Path, tmp_path: Path) -> None:
    src = data_dir / OPENB / "openb_pod_list_default.csv"

    def drop_creation(lines: list[str]) -> list[str]:
        out = []
        for line in lines:
            cells = line.split(",")
            del cells[8]  # creation_time
            out.append(",".join(cells))
        return out

    bad = _corrupt(src, tmp_path / "no_creation.csv", drop_creation)
    with pytest.raises(ValidationError) as e:
        load_openb_pods(bad)
    assert e.value.field == "creation_time"

    bad = _corrupt(src, tmp_path / "no_cpu.csv",
                   lambda ls: [",".join(c for j, c in enumerate(x.split(",")) if j != 1)
                               for x in ls])
    with pytest.raises(ValidationError) as e:
        load_openb_pods(bad)
    assert e.value.field == "cpu_milli"


def test_non_numeric_value_names_column_and_row(data_dir: Path, tmp_path: Path) -> None:
    src = data_dir / OPENB / "openb_pod_list_default.csv"

    def poison(lines: list[str]) -> list[str]:
        cells = lines[101].split(",")
        cells[2] = "lots"  # memory_mib of data row 100
        lines[101] = ",".join(cells)
        return lines

    bad = _corrupt(src, tmp_path / "poison.csv", poison)
    with pytest.raises(ValidationError) as e:
        load_openb_pods(bad)
    assert e.value.field == "memory_mib" and e.value.row == 100
    assert "lots" in str(e.value)


def test_negative_and_unknown_model_rows(data_dir: Path, tmp_path: Path) -> None:
    src = data_dir / OPENB / "openb_pod_list_default.csv"

    def negative(lines: list[str]) -> list[str]:
        cells = lines[5].split(",")
        cells[1] = "-4000"
        lines[5] = ",".join(cells)
        return lines

    with pytest.raises(ValidationError) as e:
        load_openb_pods(_corrupt(src, tmp_path / "neg.csv", negative))
    assert e.value.field == "cpu_milli" and e.value.row == 4

    def unknown_model(lines: list[str]) -> list[str]:
        cells = lines[3].split(",")
        cells[5] = "Z900"
        lines[3] = ",".join(cells)
        return lines

    with pytest.raises(ValidationError) as e:
        load_openb_pods(_corrupt(src, tmp_path / "model.csv", unknown_model))
    assert e.value.field == "gpu_spec" and e.value.row == 2


def test_node_list_bad_model(tmp_path: Path) -> None:
    f = tmp_path / "nodes.csv"
    f.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,Q7\n")
    with pytest.raises(ValidationError) as e:
        load_openb_nodes(f, zone="z")
    assert e.value.row == 0 and "gpu_model" in e.value.field


def test_node_list_with_a_name_twice_names_the_file_and_both_rows(tmp_path: Path) -> None:
    f = tmp_path / "nodes.csv"
    f.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,0,\nn1,64000,262144,0,\n"
                 "n0,64000,262144,0,\n")
    with pytest.raises(ValidationError, match=r"duplicate node name .n0. \(also row 0\)") as e:
        load_openb_nodes(f, zone="z")
    assert e.value.field == "sn" and e.value.row == 2 and e.value.source == str(f)


def test_a_trace_with_no_pods_or_a_name_twice_is_refused(data_dir: Path, tmp_path: Path) -> None:
    from smartsched.model.presets import load_cluster
    from smartsched.workloads.resolve import load_workload

    lines = (data_dir / OPENB / "openb_pod_list_default.csv").read_text().splitlines()
    spec = load_cluster("openb-gpu")
    header_only = tmp_path / "header.csv"
    header_only.write_text(lines[0] + "\n")
    with pytest.raises(ValidationError) as e:
        load_workload(str(header_only), spec, 24.0, 0)
    assert e.value.field == "workload" and "no pods" in e.value.message
    twice = tmp_path / "twice.csv"
    twice.write_text("\n".join([*lines[:3], lines[2]]) + "\n")
    with pytest.raises(ValidationError) as e:
        load_workload(str(twice), spec, 24.0, 0)
    assert e.value.field == "name" and e.value.row == 2


def test_absurd_numbers_and_unknown_qos_are_named_not_wrapped(
    data_dir: Path, tmp_path: Path
) -> None:
    """A cell of 1e30 would wrap to a negative int64 in the cast; an unknown QoS class
    would silently become batch. Both are refused naming the column and the row."""
    src = data_dir / OPENB / "openb_pod_list_default.csv"

    def cell(col: int, value: str):
        def edit(lines: list[str]) -> list[str]:
            cells = lines[4].split(",")
            cells[col] = value
            lines[4] = ",".join(cells)
            return lines
        return edit

    with pytest.raises(ValidationError) as e:
        load_openb_pods(_corrupt(src, tmp_path / "huge.csv", cell(1, "1e30")))
    assert e.value.field == "cpu_milli" and e.value.row == 3 and "absurdly large" in str(e.value)
    with pytest.raises(ValidationError) as e:
        load_openb_pods(_corrupt(src, tmp_path / "qos.csv", cell(6, "Platinum")))
    assert e.value.field == "qos" and e.value.row == 3 and "Platinum" in str(e.value)


def test_an_openb_pod_list_in_parquet_reads_as_its_csv(data_dir: Path, tmp_path: Path) -> None:
    """The CLI takes a .parquet pod file: one in the trace's own columns goes through the
    openb loader (same pods as the CSV), with the same checks."""
    import numpy as np
    import pandas as pd

    from smartsched.workloads.resolve import load_workload

    src = data_dir / OPENB / "openb_pod_list_default.csv"
    df = pd.read_csv(src, nrows=50)
    spec = load_cluster("openb-gpu")
    good = tmp_path / "pods.parquet"
    df.to_parquet(good)
    from_parquet = load_workload(str(good), spec, 24.0, 0)
    head = tmp_path / "head.csv"
    df.to_csv(head, index=False)
    from_csv = load_workload(str(head), spec, 24.0, 0)
    assert [(p.id, p.cpu_milli, p.num_gpu, p.pod_class) for p in from_parquet] == [
        (p.id, p.cpu_milli, p.num_gpu, p.pod_class) for p in from_csv
    ]
    bad = df.copy()
    bad["creation_time"] = pd.Timestamp("2020-01-01")
    bad.to_parquet(tmp_path / "times.parquet")
    with pytest.raises(ValidationError) as e:
        load_workload(str(tmp_path / "times.parquet"), spec, 24.0, 0)
    assert e.value.field == "creation_time" and "datetime" in e.value.message
    bad = df.astype({"cpu_milli": np.float64})
    bad.loc[7, "cpu_milli"] = np.inf
    bad.to_parquet(tmp_path / "inf.parquet")
    with pytest.raises(ValidationError) as e:
        load_workload(str(tmp_path / "inf.parquet"), spec, 24.0, 0)
    assert e.value.field == "cpu_milli" and e.value.row == 7 and "inf" in e.value.message


def test_a_missing_shared_file_says_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SMARTSCHED_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ValidationError) as e:
        load_cluster("openb-gpu")
    assert "SMARTSCHED_DATA_DIR" in str(e.value) and "nowhere" in str(e.value)


def test_a_column_of_ones_own_leaves_either_form_as_it_is(data_dir: Path,
                                                          tmp_path: Path) -> None:
    """The timed form is told by its columns: a 5-column list with a note column was asked
    for gpu_spec (probe round 6); the unread pod_phase and scheduled_time may be absent."""
    import pandas as pd

    five = pd.read_csv(data_dir / OPENB / "openb_pod_list_multigpu30.csv").head(50)
    five["note"] = "mine"
    f = tmp_path / "five.csv"
    five.to_csv(f, index=False)
    pods = load_openb_pods(f)
    assert len(pods) == 50 and all(p.arrival == 0 and p.duration is None for p in pods)
    timed = pd.read_csv(data_dir / OPENB / "openb_pod_list_default.csv").head(50)
    want = load_openb_pods(data_dir / OPENB / "openb_pod_list_default.csv")[:50]
    t = tmp_path / "timed.csv"
    timed.drop(columns=["pod_phase", "scheduled_time"]).assign(note="x").to_csv(t, index=False)
    assert load_openb_pods(t) == want
    half = tmp_path / "half.csv"
    five.assign(creation_time=0).to_csv(half, index=False)  # timed, without the rest
    with pytest.raises(ValidationError, match="missing column") as e:
        load_openb_pods(half)
    assert e.value.field in ("gpu_spec", "qos", "deletion_time")
