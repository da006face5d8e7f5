"""Round 6 of the audit log's probe (the command line and damaged logs).

- A writer started on a log whose open segment was damaged deleted the segment -- signed
  records past the damage included -- and only then refused to write ("run verify").
- A log without its ``log_id`` file got a fresh random one from a refused writer start,
  after which verify read every signed head as another log's.
- ``verify`` answered a record with a null field, a dropped column or text that is not
  UTF-8 with a traceback; a FIFO as the heads file or as a segment held it for ever.
- ``check-proof`` said OK for a record file carrying fields the proof does not cover.
- ``prove`` could not read a segment name with fewer digits that ``verify`` accepts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from smartsched.audit.log import AuditLog
from smartsched.audit.store import LOG_ID_FILE, segment_files
from smartsched.audit.verify import check_proof, prove, verify_log
from smartsched.model.errors import ValidationError
from tests.audit.test_log import _write_log


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def _heads(root: Path) -> Path:
    return root / "heads" / "heads.jsonl"


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".writer.lock"}


def test_a_refused_writer_start_changes_nothing_on_a_damaged_open_segment(
        tmp_path: Path, key) -> None:
    log = _write_log(tmp_path, key, 48, close=False, block_records=16)
    log.flush()
    log._io.shutdown(wait=True)
    os.close(log._lockfd)  # the process is gone (a crash): so is its lock
    (seg,) = [p for p in segment_files(tmp_path / "log") if p.suffix == ".arrows"]
    raw = bytearray(seg.read_bytes())
    marks = [i for i in range(len(raw) - 4) if raw[i:i + 4] == b"\xff\xff\xff\xff"]
    raw[marks[2] + 4:marks[2] + 8] = b"\x00\x00\x00\x7f"  # the 2nd block's framing
    seg.write_bytes(bytes(raw))
    before = _snapshot(tmp_path)
    with pytest.raises(ValidationError, match="nothing was changed") as e:
        AuditLog(tmp_path / "log", _heads(tmp_path), key, autoseal=False, fsync=False)
    assert e.value.field == "audit.log"
    assert _snapshot(tmp_path) == before  # the signed records past the damage are kept


def test_a_log_without_its_id_file_keeps_the_id_its_heads_carry(tmp_path: Path,
                                                                 key) -> None:
    _write_log(tmp_path, key, 40, block_records=16)
    own = (tmp_path / "log" / LOG_ID_FILE).read_text()
    (tmp_path / "log" / LOG_ID_FILE).unlink()
    assert verify_log(tmp_path / "log", _heads(tmp_path), key.public_key()).ok
    log = AuditLog(tmp_path / "log", _heads(tmp_path), key, autoseal=False, fsync=False)
    log.append("placement", "client", {"pod": "after"})
    log.close()
    assert (tmp_path / "log" / LOG_ID_FILE).read_text() == own
    assert verify_log(tmp_path / "log", _heads(tmp_path), key.public_key()).ok


@pytest.mark.parametrize("edit", ["null kind", "null ts", "no tenant", "not utf-8"])
def test_verify_names_a_record_whose_fields_are_null_or_not_text(tmp_path: Path, key,
                                                                  edit: str) -> None:
    _write_log(tmp_path, key, 40, block_records=16)
    (seg,) = segment_files(tmp_path / "log")
    t = pq.read_table(seg)
    if edit == "null kind":
        t = t.set_column(t.schema.get_field_index("kind"), "kind",
                         pa.array([None, *t["kind"].to_pylist()[1:]], pa.string()))
    elif edit == "null ts":
        t = t.set_column(t.schema.get_field_index("ts"), "ts",
                         pa.array([None, *t["ts"].to_pylist()[1:]], pa.float64()))
    elif edit == "no tenant":
        t = t.drop_columns(["tenant"])
    else:
        kinds = t["kind"].cast(pa.binary()).to_pylist()
        kinds[3] = b"\xff\xfe"
        t = t.set_column(t.schema.get_field_index("kind"), "kind",
                         pa.array(kinds, pa.binary()).cast(pa.string(), safe=False))
    pq.write_table(t, seg)
    rep = verify_log(tmp_path / "log", _heads(tmp_path), key.public_key())
    assert not rep.ok and rep.problem is not None
    assert "edited" in rep.problem.reason, rep.problem


def test_fifos_are_refused_not_waited_on(tmp_path: Path, key) -> None:
    _write_log(tmp_path, key, 20, block_records=16)
    os.mkfifo(tmp_path / "log" / "seg-0000000000000100.arrows")
    rep = verify_log(tmp_path / "log", _heads(tmp_path), key.public_key())
    assert not rep.ok and "not a regular file" in rep.problem.reason
    os.unlink(tmp_path / "log" / "seg-0000000000000100.arrows")
    _heads(tmp_path).unlink()
    os.mkfifo(_heads(tmp_path))
    with pytest.raises(ValidationError, match="not a regular file"):
        verify_log(tmp_path / "log", _heads(tmp_path), key.public_key())


def test_a_record_with_unproven_fields_or_a_text_ts_is_no_proven_record(tmp_path: Path,
                                                                         key) -> None:
    _write_log(tmp_path, key, 40, block_records=16)
    record, proof = prove(tmp_path / "log", _heads(tmp_path), 5)
    assert check_proof(proof, record, key.public_key())[0]
    ok, why = check_proof(proof, {**record, "payload_note": "approved by CFO"},
                          key.public_key())
    assert not ok and "no proof covers" in why
    assert not check_proof(proof, {**record, "ts": str(record["ts"])}, key.public_key())[0]


def test_prove_reads_the_segment_names_verify_reads(tmp_path: Path, key) -> None:
    _write_log(tmp_path, key, 40, block_records=16)
    (seg,) = segment_files(tmp_path / "log")
    seg.rename(seg.with_name("seg-0.parquet"))
    assert verify_log(tmp_path / "log", _heads(tmp_path), key.public_key()).ok
    record, proof = prove(tmp_path / "log", _heads(tmp_path), 5)
    assert record["seq"] == 5 and check_proof(proof, record, key.public_key())[0]


def test_keygen_refuses_a_pub_name_before_making_its_folder(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from smartsched.cli import main

    r = CliRunner().invoke(main, ["audit", "keygen", "--out", str(tmp_path / "kk" / "a.pub")])
    assert r.exit_code == 2 and "'--out'" in r.output
    assert not (tmp_path / "kk").exists()



@pytest.mark.parametrize(("field", "value"), [
    ("block", "1"), ("block", 1.0), ("block", False), ("first_seq", "0"),
    ("last_seq", 15.0), ("ts", "1700000000"), ("ts", True), ("key_id", 7)])
def test_a_head_field_of_another_json_type_is_not_a_head(tmp_path: Path, key, field: str,
                                                           value: object) -> None:
    """The heads file was read loosely: ``"block": "1"``, ``1.5`` or ``false`` passed as
    the signed integer, so two texts read as one signed head (no forgery: the signature
    covers the packed integer; probe round 6b)."""
    import json

    _write_log(tmp_path, key, 40, block_records=16)
    lines = _heads(tmp_path).read_text().splitlines()
    d = json.loads(lines[1])
    d[field] = value
    lines[1] = json.dumps(d, separators=(",", ":"))
    _heads(tmp_path).write_text("\n".join(lines) + "\n")
    rep = verify_log(tmp_path / "log", _heads(tmp_path), key.public_key())
    assert not rep.ok and rep.problem is not None
    assert field in str(rep.problem), rep.problem
