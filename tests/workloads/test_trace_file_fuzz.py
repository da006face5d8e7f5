"""User-supplied trace files, odd but valid or malformed.

Odd-but-valid files (whitespace around header names or GPU models, a spreadsheet's
trailing rows of bare commas, a pod file with float or decimal numbers) must read as
the same pods as their clean form. Malformed ones (a Parquet or gzip file named
.csv, a directory, a null arrival, a pod asking more GPUs than any node has) must be
one error naming the column, and the row where there is one; through the CLI, exit
2 and one line, no traceback.
"""

from __future__ import annotations

import decimal
import gzip
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smartsched.model.cluster_io import load_openb_nodes
from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod
from smartsched.workloads.openb import load_openb_pods
from smartsched.workloads.parquet_io import read_pods, write_pods

HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
          "creation_time,deletion_time,scheduled_time")
ROWS = ("p1,1000,1024,1,500,,LS,Running,0,100,0",
        "p2,2000,2048,2,1000,V100M16|V100M32,BE,Succeeded,10,,10",
        "p3,4000,4096,0,0,,Burstable,Running,20,300,20")
CLEAN = HEADER + "\n" + "\n".join(ROWS) + "\n"


def _key(pods: list[Pod]) -> list[tuple]:
    return [(p.id, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_models,
             p.pod_class, p.arrival, p.duration, p.priority) for p in pods]


def _csv(tmp_path: Path, text: str | bytes, name: str = "pods.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _clean(tmp_path: Path) -> list[tuple]:
    return _key(load_openb_pods(_csv(tmp_path, CLEAN, "clean.csv")))


@pytest.mark.parametrize("text", [
    "\ufeff" + CLEAN.replace("\n", "\r\n"),  # a BOM and CRLF (already read)
    # spaces around every header name and field: " name , cpu_milli , ..."
    "\n".join(line.replace(",", " , ") for line in CLEAN.splitlines()) + "\n",
    # a trailing space after the last header name, tabs before the commas
    "\n".join(line + " " for line in CLEAN.splitlines()) + "\n",
    "\n".join(line.replace(",", "\t,") for line in CLEAN.splitlines()) + "\n",
    # a spreadsheet's export: trailing rows of bare commas
    CLEAN + "," * 10 + "\n" + "," * 10 + "\r\n\n",
    # spaces around a GPU model in a gpu_spec list
    CLEAN.replace("V100M16|V100M32", "V100M16 | V100M32"),
], ids=["bom-crlf", "spaced", "trailing-space", "tabs", "comma-rows", "spaced-models"])
def test_odd_but_valid_csv_reads_as_its_clean_form(tmp_path: Path, text: str) -> None:
    assert _key(load_openb_pods(_csv(tmp_path, text))) == _clean(tmp_path)


def test_a_node_list_with_spaced_header_names_reads(tmp_path: Path) -> None:
    clean = "sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,2,P100\n"
    spaced = "sn, cpu_milli, memory_mib, gpu, model \nn1, 64000, 262144, 2, P100\n"
    want = load_openb_nodes(_csv(tmp_path, clean, "a.csv"), zone="z")
    assert load_openb_nodes(_csv(tmp_path, spaced, "b.csv"), zone="z") == want


def test_a_comma_row_amid_the_pods_is_still_refused(tmp_path: Path) -> None:
    """Only trailing rows of bare commas are blank lines; one between pods is a pod
    with no name."""
    text = HEADER + "\n" + ROWS[0] + "\n" + "," * 10 + "\n" + ROWS[1] + "\n"
    with pytest.raises(ValidationError) as e:
        load_openb_pods(_csv(tmp_path, text))
    assert (e.value.field, e.value.row) == ("name", 1)


def test_header_names_that_collide_once_stripped_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as e:
        load_openb_pods(_csv(tmp_path, HEADER + ", name\n" + ROWS[0] + ",x\n"))
    assert e.value.field == "name" and "twice" in e.value.message


@pytest.mark.parametrize(("data", "says"), [
    (gzip.compress(CLEAN.encode()), "gzip"),
    (b"PAR1" + bytes(range(256)) * 4 + b"PAR1", "Parquet"),
    (bytes(range(256)) * 8, "binary"),
    (("\ufeff" + CLEAN).encode("utf-16"), "UTF-16"),
    ((CLEAN + "p\xe9,1,1,0,0,,LS,Running,0,1,0\n").encode("latin-1"), "not UTF-8"),
])
def test_a_csv_that_is_no_text_says_what_it_is(tmp_path: Path, data: bytes, says: str) -> None:
    """Was the codec's "can't decode byte 0x8b in position 1" or a tokenizer's count of
    fields on some line."""
    with pytest.raises(ValidationError) as e:
        load_openb_pods(_csv(tmp_path, data))
    assert e.value.field == "file" and says in e.value.message


def test_a_real_parquet_file_named_csv_is_named_as_one(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    pq.write_table(pa.table({"name": ["p1"], "cpu_milli": [1000], "memory_mib": [1],
                             "num_gpu": [0], "gpu_milli": [0]}), path)
    with pytest.raises(ValidationError) as e:
        load_openb_pods(path)
    assert e.value.field == "file" and "Parquet" in e.value.message


def test_parquet_column_names_with_spaces_read_as_a_csv_headers_do(tmp_path: Path) -> None:
    # A tool that kept a CSV's spaced header wrote " cpu_milli" into the Parquet schema:
    # both the openb loader and the project's own pod files read it as cpu_milli.
    cols = {"name": ["p1", "p2"], "cpu_milli": [1000, 2000], "memory_mib": [1, 2],
            "num_gpu": [0, 1], "gpu_milli": [0, 500]}
    clean, spaced = tmp_path / "clean.parquet", tmp_path / "spaced.parquet"
    pq.write_table(pa.table(cols), clean)
    pq.write_table(pa.table({f" {k} ": v for k, v in cols.items()}), spaced)
    assert _key(load_openb_pods(spaced)) == _key(load_openb_pods(clean))
    own = write_pods(_pods(), tmp_path / "own.parquet") or tmp_path / "own.parquet"
    table = pq.read_table(own)
    pq.write_table(table.rename_columns([f"{c} " for c in table.column_names]), own)
    assert _key(read_pods(own)) == _key(_pods())
    twice = tmp_path / "twice.parquet"
    pq.write_table(pa.table({**cols, " cpu_milli": [1, 1]}), twice)
    for load in (load_openb_pods, read_pods):
        with pytest.raises(ValidationError, match="twice") as e:
            load(twice)
        assert e.value.field == "cpu_milli"


def test_a_directory_is_not_called_missing(tmp_path: Path) -> None:
    (tmp_path / "pods.csv").mkdir()
    with pytest.raises(ValidationError) as e:
        load_openb_pods(tmp_path / "pods.csv")
    assert "a directory" in e.value.message and "no such file" not in e.value.message


def test_a_bool_name_column_is_no_text(tmp_path: Path) -> None:
    """Was read as pods named 'True' and 'False'."""
    path = tmp_path / "pods.parquet"
    pq.write_table(pa.table({"name": [True, False], "cpu_milli": [1000, 1000],
                             "memory_mib": [1, 1], "num_gpu": [0, 0],
                             "gpu_milli": [0, 0]}), path)
    with pytest.raises(ValidationError) as e:
        load_openb_pods(path)
    assert (e.value.field, e.value.row) == ("name", 0)


def _pods() -> list[Pod]:
    return [Pod("a", 1000, 100, arrival=0.0, duration=100.0),
            Pod("b", 2000, 200, num_gpu=1, gpu_milli=500, arrival=5.0, priority=1),
            Pod("c", 3000, 300, num_gpu=2, gpu_milli=1000, arrival=10.0, duration=50.0)]


def _rewrite(tmp_path: Path, **cols: pa.Array) -> Path:
    """The pods of :func:`_pods` as written, with some columns replaced."""
    path = tmp_path / "pods.parquet"
    write_pods(_pods(), path)
    table = pq.read_table(path)
    for name, values in cols.items():
        table = table.set_column(table.schema.get_field_index(name), name, values)
    pq.write_table(table, path)
    return path


def test_a_pod_file_with_float64_or_decimal_numbers_reads(tmp_path: Path) -> None:
    """pandas writes an integer column holding a null as float64; they were refused as
    "must be an integer, got 1000.0"."""
    want = _key(_pods())
    floats = {k: pa.array([float(getattr(p, k)) for p in _pods()])
              for k in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "priority",
                        "gang_size", "num_fpga")}
    assert _key(read_pods(_rewrite(tmp_path, **floats))) == want
    dec = pa.array([decimal.Decimal(p.cpu_milli) for p in _pods()], pa.decimal128(12, 0))
    arr = pa.array([decimal.Decimal(str(p.arrival)) for p in _pods()], pa.decimal128(12, 3))
    assert _key(read_pods(_rewrite(tmp_path, cpu_milli=dec, arrival=arr))) == want


def test_a_fractional_float_is_still_not_an_integer(tmp_path: Path) -> None:
    path = _rewrite(tmp_path, cpu_milli=pa.array([1000.0, 2000.5, 3000.0]))
    with pytest.raises(ValidationError) as e:
        read_pods(path)
    assert (e.value.field, e.value.row) == ("cpu_milli", 1)


def test_a_null_arrival_is_named_not_read_as_zero(tmp_path: Path) -> None:
    """Pod b arrived at 0 instead of 5 without a word."""
    path = _rewrite(tmp_path, arrival=pa.array([0.0, None, 10.0]))
    with pytest.raises(ValidationError) as e:
        read_pods(path)
    assert (e.value.field, e.value.row) == ("arrival", 1)


def test_an_id_of_spaces_is_named(tmp_path: Path) -> None:
    """Was read as a pod named "  " (the openb loader strips names and refuses it)."""
    path = _rewrite(tmp_path, id=pa.array(["a", "  ", "c"]))
    with pytest.raises(ValidationError) as e:
        read_pods(path)
    assert (e.value.field, e.value.row) == ("id", 1)


@pytest.mark.parametrize(("make", "says"), [
    (lambda d: _csv(d, gzip.compress(CLEAN.encode())), "gzip"),
    (lambda d: _csv(d, HEADER + "\n" + ROWS[0].replace("1000,1024", "1000,nan") + "\n"),
     "memory_mib (row 0)"),
])
def test_the_cli_says_one_line(tmp_path: Path, make, says: str) -> None:
    path = make(tmp_path)
    r = subprocess.run([sys.executable, "-m", "smartsched.cli", "simulate", "--cluster",
                        "small", "--workload", str(path), "--hours", "0.05", "--no-plots",
                        "--no-progress"], capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
