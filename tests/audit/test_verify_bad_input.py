"""The audit commands given bad input: a folder that is not a log, an empty or wrong heads
file, a damaged segment or log id, a record file that is not JSON text, a public key that
is neither form: each named, never a traceback, never an OK for nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from smartsched.audit.keys import load_public_key
from smartsched.audit.log import AuditLog
from smartsched.audit.verify import prove, verify_log
from smartsched.cli import main
from smartsched.model.errors import ValidationError

OTHER_ID = "00112233445566778899aabbccddeeff"


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def pub(tmp_path: Path, key: Ed25519PrivateKey) -> str:
    path = tmp_path / "k.pub"
    path.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return str(path)


def _log(root: Path, key: Ed25519PrivateKey, n: int) -> tuple[Path, Path]:
    log = AuditLog(root / "log", root / "heads.jsonl", key, autoseal=False, fsync=False,
                   block_records=8)
    for i in range(n):
        log.append("placement", "client", {"pod": f"p{i}"}, ts=1.7e9 + i)
    log.close()
    return root / "log", root / "heads.jsonl"


def _cli(*args: str):
    res = CliRunner().invoke(main, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


def test_a_folder_that_is_not_a_log_is_refused(tmp_path: Path, key, pub: str) -> None:
    empty, junk = tmp_path / "empty", tmp_path / "junk"
    empty.mkdir()
    junk.mkdir()
    (junk / "blocks.bin").write_text("junk\n")
    heads = tmp_path / "zero.json"
    heads.write_bytes(b"")
    for folder in (empty, junk):
        with pytest.raises(ValidationError, match="not an audit log") as e:
            verify_log(folder, heads, key.public_key())
        assert e.value.field == "log"
        for pin in ([], ["--log-id", OTHER_ID]):
            res = _cli("audit", "verify", "--log", str(folder), "--heads", str(heads),
                       "--public-key", pub, *pin)
            assert res.exit_code == 2 and "not an audit log" in res.output, res.output
        res = _cli("audit", "prove", "--log", str(folder), "--heads", str(heads), "--seq", "0",
                   "--out", str(tmp_path / "p.bin"))
        assert res.exit_code == 2 and "not an audit log" in res.output, res.output


def test_a_new_empty_log_verifies_as_its_own_log_only(tmp_path: Path, key, pub: str) -> None:
    log_dir, heads = _log(tmp_path, key, 0)
    own = (log_dir / "log_id").read_text().strip()
    rep = verify_log(log_dir, heads, key.public_key())
    assert rep.ok and rep.records == 0 and rep.log_id == own, rep
    rep = verify_log(log_dir, heads, key.public_key(), log_id=OTHER_ID)
    assert not rep.ok and "not the pinned" in rep.problem.reason, rep
    res = _cli("audit", "verify", "--log", str(log_dir), "--heads", str(heads),
               "--public-key", pub, "--log-id", OTHER_ID)
    assert res.exit_code == 1 and "FAILED" in res.output, res.output


def test_an_empty_heads_file_for_a_log_with_records_is_named(tmp_path: Path, key) -> None:
    log_dir, _ = _log(tmp_path, key, 20)
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    rep = verify_log(log_dir, empty, key.public_key())
    assert not rep.ok and str(empty) in rep.problem.reason, rep.problem
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(b"\xff\xfe{\n")
    rep = verify_log(log_dir, junk, key.public_key())
    assert not rep.ok and "junk.jsonl line 1" in str(rep.problem), rep.problem
    with pytest.raises(ValidationError, match=r"junk\.jsonl line 1"):
        prove(log_dir, junk, 0)


def test_a_damaged_segment_or_log_id_is_named(tmp_path: Path, key, pub: str) -> None:
    log_dir, heads = _log(tmp_path, key, 20)
    (segment,) = log_dir.glob("seg-*.parquet")
    good = segment.read_bytes()
    segment.write_bytes(b"not parquet")
    rep = verify_log(log_dir, heads, key.public_key())
    assert not rep.ok and segment.name in str(rep.problem), rep.problem
    with pytest.raises(ValidationError, match="not a readable audit segment"):
        prove(log_dir, heads, 3)
    segment.write_bytes(good)
    (log_dir / "log_id").write_bytes(b"\xff\xfe")
    res = _cli("audit", "verify", "--log", str(log_dir), "--heads", str(heads),
               "--public-key", pub)
    assert res.exit_code == 2 and "log_id: unreadable" in res.output, res.output
    with pytest.raises(ValidationError, match="not a log id"):
        AuditLog(log_dir, heads, key, autoseal=False)


def test_check_proof_names_a_record_file_that_is_not_a_json_object(tmp_path: Path,
                                                                   pub: str) -> None:
    proof = tmp_path / "p.bin"
    proof.write_bytes(b"junk")
    for name, body in (("binary.json", b"\xff\xfe"), ("list.json", b"[]"),
                       ("broken.json", b"{")):
        record = tmp_path / name
        record.write_bytes(body)
        res = _cli("audit", "check-proof", "--proof", str(proof), "--record", str(record),
                   "--public-key", pub)
        assert res.exit_code == 2 and res.output.startswith("error: ") \
            and name in res.output, res.output


def test_a_public_key_that_is_neither_form_says_both_are_accepted() -> None:
    with pytest.raises(ValidationError, match="64 hex digits") as e:
        load_public_key("00")
    assert e.value.field == "public_key"


def test_a_fifo_or_device_given_as_a_file_is_refused_not_waited_on(tmp_path: Path,
                                                                   pub: str) -> None:
    """A FIFO waited for a writer forever; /dev/zero was read until memory ran out."""
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for spec in (fifo, "/dev/zero"):
        with pytest.raises(ValidationError, match="not a regular file") as e:
            load_public_key(spec)
        assert e.value.field == "public_key"
    record = tmp_path / "r.json"
    record.write_text("{}")
    for args in (("--proof", str(fifo), "--record", str(record)),
                 ("--proof", str(record), "--record", str(fifo)),
                 ("--proof", str(record), "--record", "/dev/zero")):
        res = _cli("audit", "check-proof", *args, "--public-key", pub)
        assert res.exit_code == 2 and "not a regular file" in res.output, res.output
