"""The audit log: a good log verifies, every kind of tampering is caught and located,
proofs are small and check with the public key alone, a crash loses nothing signed."""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from smartsched.audit.chain import (
    ZERO,
    Head,
    chain_hashes,
    merkle_path,
    merkle_root,
    root_from_path,
)
from smartsched.audit.log import AuditLog
from smartsched.audit.store import (
    CLOSED_SUFFIX,
    SCHEMA,
    SignedHead,
    read_segment,
    segment_files,
    write_closed,
)
from smartsched.audit.verify import check_proof, prove, verify_log
from smartsched.model.errors import ValidationError

KINDS = ("placement", "rejection", "preemption", "migration", "policy.promotion",
         "node.update")


def _payload(rng: random.Random, i: int) -> dict:
    return {"pod": f"pod-{i}", "node": f"node-{rng.randrange(1500):04d}",
            "cpu_milli": rng.randrange(100, 64_000), "gpu": rng.randrange(0, 8),
            "reasons": ["Insufficient nvidia.com/gpu"] if rng.random() < 0.1 else []}


def _write_log(root: Path, key: Ed25519PrivateKey, n: int, seed: int = 0, *,
               close: bool = True, **kw) -> AuditLog:
    rng = random.Random(seed)
    log = AuditLog(root / "log", root / "heads" / "heads.jsonl", key, autoseal=False,
                   fsync=False, **kw)
    for i in range(n):
        log.append(rng.choice(KINDS), rng.choice(["client", "operator", "tenant:bank"]),
                   _payload(rng, i), tenant=rng.choice(["", "bank", "retail"]),
                   ts=1.7e9 + i * 0.001)
    if close:
        log.close()
    return log


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def good_log(tmp_path_factory: pytest.TempPathFactory, key) -> Path:
    """1,000 records in blocks of 32, segments of 4 blocks (8 Parquet files)."""
    root = tmp_path_factory.mktemp("audit")
    _write_log(root, key, 1000, block_records=32, segment_blocks=4)
    return root


def test_merkle_paths_rebuild_the_root_for_every_leaf_and_tree_size() -> None:
    leaves = [bytes([i]) * 32 for i in range(37)]
    for n in (1, 2, 3, 5, 8, 13, 37):
        root = merkle_root(leaves[:n])
        for i in range(n):
            path = merkle_path(leaves[:n], i)
            assert root_from_path(leaves[i], i, n, path) == root
            assert root_from_path(leaves[(i + 1) % n], i, n, path) != root or n == 1
        assert root_from_path(leaves[0], 0, n, [ZERO] * 40) is None  # wrong path length


def test_a_good_log_verifies_and_names_its_extent(good_log: Path, key) -> None:
    rep = verify_log(good_log / "log", good_log / "heads" / "heads.jsonl", key.public_key())
    assert rep.ok, rep.problem
    assert (rep.records, rep.blocks, rep.unsigned_tail) == (1000, 32, 0)
    assert len([p for p in segment_files(good_log / "log")]) == 8
    other = Ed25519PrivateKey.generate().public_key()
    rep = verify_log(good_log / "log", good_log / "heads" / "heads.jsonl", other)
    assert not rep.ok and "not by the given key" in rep.problem.reason


def test_a_proof_shows_one_record_with_the_public_key_alone(good_log: Path, key) -> None:
    pub = key.public_key()
    for seq in (0, 31, 32, 517, 999):
        record, proof = prove(good_log / "log", good_log / "heads" / "heads.jsonl", seq)
        ok, why = check_proof(proof, record, pub)
        assert ok, why
        assert record["seq"] == seq and json.loads(record["payload"])["pod"] == f"pod-{seq}"
        forged = {**record, "payload": record["payload"].replace(f"pod-{seq}", "pod-x")}
        assert not check_proof(proof, forged, pub)[0]
        assert not check_proof(proof, {**record, "principal": "operator!"}, pub)[0]
        assert not check_proof(proof, record, Ed25519PrivateKey.generate().public_key())[0]
        bent = bytearray(proof)
        bent[30] ^= 1
        assert not check_proof(bytes(bent), record, pub)[0]
    with pytest.raises(ValidationError, match="seq"):
        prove(good_log / "log", good_log / "heads" / "heads.jsonl", 1000)


def test_a_full_block_proof_fits_in_one_kilobyte(tmp_path: Path, key) -> None:
    """The proof's size is set by the block (4,096 records at most: 12 path hashes), not by
    the log: at 10^7 records it is the same size as here."""
    log = AuditLog(tmp_path / "log", tmp_path / "heads.jsonl", key, autoseal=False,
                   fsync=False)
    for i in range(4096):
        log.append("placement", "client", "{}", ts=float(i))
    log.close()
    record, proof = prove(tmp_path / "log", tmp_path / "heads.jsonl", 2049)
    assert check_proof(proof, record, key.public_key())[0]
    assert len(proof) <= 1024, len(proof)
    assert (len(proof) - 8 - 12 - 32 - 152 - 64 - 8) // 32 == 12  # path hashes


# ------------------------------------------------------------------ tampering
def _all_rows(log_dir: Path) -> tuple[list[Path], list[int], dict[str, list]]:
    files = segment_files(log_dir)
    tables = [read_segment(p) for p in files]
    rows = pa.concat_tables(tables).to_pydict()
    return files, [t.num_rows for t in tables], rows


def _rewrite(log_dir: Path, files: list[Path], counts: list[int], rows: dict[str, list]) -> None:
    """Write ``rows`` back over the same segment files (the last one takes the difference)."""
    n = len(rows["seq"])
    counts = [*counts[:-1], n - sum(counts[:-1])]
    start = 0
    for path, c in zip(files, counts, strict=True):
        part = {k: v[start:start + max(c, 0)] for k, v in rows.items()}
        start += max(c, 0)
        path.unlink()
        write_closed(pa.table(part, schema=SCHEMA), path.with_suffix(CLOSED_SUFFIX), False)


def _rechain(rows: dict[str, list], start: int) -> None:
    """What a forger without the key does: recompute every hash from ``start`` on."""
    prev = rows["hash"][start - 1] if start else ZERO
    rows["hash"][start:] = chain_hashes(prev, rows["seq"][start], rows["ts"][start:],
                                        rows["kind"][start:], rows["principal"][start:],
                                        rows["tenant"][start:], rows["payload"][start:])


def _tamper(rng: random.Random, root: Path, key_other: Ed25519PrivateKey) -> tuple[str, int]:
    """One random tampering of the log at ``root``; returns (what, first record touched)."""
    log_dir, heads = root / "log", root / "heads" / "heads.jsonl"
    files, counts, rows = _all_rows(log_dir)
    n = len(rows["seq"])
    i = rng.randrange(n)
    op = rng.choice(["edit", "edit+rechain", "delete", "delete+renumber", "swap",
                     "insert+rechain", "truncate", "drop-segment", "head-edit",
                     "head-forge", "head-delete", "heads-truncate", "edit-hash"])
    if op in ("edit", "edit+rechain"):
        field = rng.choice(["payload", "kind", "principal", "tenant", "ts"])
        old = rows[field][i]
        rows[field][i] = old + 1.0 if field == "ts" else (old + "x" if field != "payload"
                                                          else old.replace("pod-", "pod-9"))
        if op == "edit+rechain":
            _rechain(rows, i)
    elif op == "edit-hash":
        rows["hash"][i] = bytes(32)
    elif op in ("delete", "delete+renumber"):
        for v in rows.values():
            del v[i]
        if op == "delete+renumber":
            rows["seq"][i:] = [s - 1 for s in rows["seq"][i:]]
            _rechain(rows, i) if i < len(rows["seq"]) else None
    elif op == "swap":
        j = min(i + rng.randrange(1, 40), n - 1)
        if j == i:
            i, j = i - 1, i
        for v in rows.values():
            v[i], v[j] = v[j], v[i]
    elif op == "insert+rechain":
        for v in rows.values():
            v.insert(i, v[i])
        rows["seq"][i + 1:] = [s + 1 for s in rows["seq"][i + 1:]]
        rows["payload"][i] = '{"pod":"forged"}'
        _rechain(rows, i)
    elif op == "truncate":
        keep = rng.randrange(n)
        rows = {k: v[:keep] for k, v in rows.items()}
        i = keep
    elif op == "drop-segment":
        f = rng.randrange(len(files))
        files[f].unlink()
        return op, sum(counts[:f])
    else:  # the heads
        lines = heads.read_text().splitlines()
        b = rng.randrange(len(lines))
        sh = SignedHead.from_json(lines[b])
        i = sh.head.first_seq
        if op == "head-edit":  # a different root, the old signature
            h = sh.head
            lines[b] = SignedHead(Head(h.block, h.first_seq, h.last_seq, h.ts, bytes(32),
                                       h.chain, h.prev_head, h.log_id), sh.key_id,
                                  sh.signature).to_json()
        elif op == "head-forge":  # re-signed with another key, claiming the right key id
            h = sh.head
            fake = Head(h.block, h.first_seq, h.last_seq, h.ts + 1, h.root, h.chain,
                        h.prev_head, h.log_id)
            lines[b] = SignedHead(fake, sh.key_id, key_other.sign(fake.to_bytes())).to_json()
        elif op == "head-delete":
            del lines[b]
        else:  # heads-truncate: the log then holds records no head signs
            lines = lines[:b]
        heads.write_text("\n".join(lines) + ("\n" if lines else ""))
        return op, i
    _rewrite(log_dir, files, counts, rows)
    return op, i


def test_fuzzed_tampering_is_always_detected_and_located(good_log: Path, key,
                                                         tmp_path: Path) -> None:
    """Edits, deletions, reorders, insertions, truncations and forged heads at random
    places (with and without the forger recomputing the hash chain): 100 % detected, and
    the first bad record named is at or before the first one touched."""
    rng = random.Random(19)
    other = Ed25519PrivateKey.generate()
    seen: dict[str, int] = {}
    for trial in range(150):
        root = tmp_path / f"t{trial}"
        shutil.copytree(good_log, root)
        op, first = _tamper(rng, root, other)
        rep = verify_log(root / "log", root / "heads" / "heads.jsonl", key.public_key())
        assert not rep.ok, f"trial {trial}: {op} at record {first} went unnoticed"
        assert rep.problem.seq is not None and rep.problem.seq <= first, (op, first,
                                                                          str(rep.problem))
        if op in ("edit", "edit-hash"):
            assert rep.problem.seq == first, (op, str(rep.problem))
        seen[op] = seen.get(op, 0) + 1
        shutil.rmtree(root)
    assert len(seen) == 13, seen  # every kind of tampering was tried


# ------------------------------------------------------------------ writing
def test_a_crash_before_a_head_sets_the_unsigned_block_aside(tmp_path: Path, key,
                                                             monkeypatch) -> None:
    log = _write_log(tmp_path, key, 100, close=False, block_records=16)
    log.flush()
    # The next block reaches its segment, the process dies before its head is written.
    monkeypatch.setattr(log, "_make_durable", lambda *a: None)
    for _ in range(5):
        log.append("placement", "client", {"pod": "lost"})
    log.seal()
    log._io.shutdown(wait=True)
    os.close(log._lockfd)  # the process is gone: so is its lock
    monkeypatch.undo()
    again = AuditLog(tmp_path / "log", tmp_path / "heads" / "heads.jsonl", key,
                     autoseal=False, fsync=False)
    seq = again.append("placement", "client", {"pod": "after"})
    again.close()
    assert seq == 101  # 100 signed records, the recovery note, then this one
    rep = verify_log(tmp_path / "log", tmp_path / "heads" / "heads.jsonl", key.public_key())
    assert rep.ok and rep.records == 102, rep.problem
    record, _ = prove(tmp_path / "log", tmp_path / "heads" / "heads.jsonl", 100)
    assert record["kind"] == "audit.recovery"
    assert json.loads(record["payload"])["unsigned_records_set_aside"] == 5
    aside = read_segment(next((tmp_path / "log" / "unsigned").iterdir()))
    assert aside.num_rows == 5 and set(aside["payload"].to_pylist()) == {'{"pod":"lost"}'}


def test_a_log_cut_short_is_refused_for_writing(tmp_path: Path, key) -> None:
    _write_log(tmp_path, key, 200, block_records=16, segment_blocks=2)
    segment_files(tmp_path / "log")[-1].unlink()
    with pytest.raises(ValidationError) as e:
        AuditLog(tmp_path / "log", tmp_path / "heads" / "heads.jsonl", key, autoseal=False)
    assert e.value.field == "audit.log" and "cut short" in str(e.value)


def test_bad_settings_are_named(tmp_path: Path, key) -> None:
    for kw, field in (({"block_records": 5000}, "audit.block_records"),
                      ({"block_records": 0}, "audit.block_records"),
                      ({"block_seconds": 0}, "audit.block_seconds"),
                      ({"segment_blocks": 0}, "audit.segment_blocks")):
        with pytest.raises(ValidationError) as e:
            AuditLog(tmp_path / "log", tmp_path / "heads.jsonl", key, **kw)
        assert e.value.field == field
    with pytest.raises(ValidationError) as e:
        AuditLog(tmp_path / "log", tmp_path / "log" / "heads.jsonl", key)
    assert e.value.field == "audit.heads"


def test_a_quiet_log_seals_its_records_within_the_block_time(tmp_path: Path, key) -> None:
    log = AuditLog(tmp_path / "log", tmp_path / "heads.jsonl", key, block_seconds=0.2,
                   fsync=False)
    try:
        log.append("node.update", "operator", {"node": "n1", "cordoned": True})
        deadline = time.monotonic() + 10
        while log.pending and time.monotonic() < deadline:
            time.sleep(0.05)
        assert log.pending == 0
        log.flush()
        rep = verify_log(tmp_path / "log", tmp_path / "heads.jsonl", key.public_key())
        assert rep.ok and rep.records == 1 and rep.unsigned_tail == 0, rep.problem
    finally:
        log.close()


def test_concurrent_appends_get_distinct_sequence_numbers(tmp_path: Path, key) -> None:
    from concurrent.futures import ThreadPoolExecutor

    log = AuditLog(tmp_path / "log", tmp_path / "heads.jsonl", key, block_records=64,
                   fsync=False)
    with ThreadPoolExecutor(4) as pool:
        seqs = list(pool.map(lambda i: log.append("placement", f"t{i % 4}", {"i": i}),
                             range(2000)))
    log.close()
    assert sorted(seqs) == list(range(2000))
    assert verify_log(tmp_path / "log", tmp_path / "heads.jsonl", key.public_key()).ok


def test_the_cli_makes_keys_verifies_and_proves(tmp_path: Path) -> None:
    """keygen -> a log signed with that key -> verify OK (exit 0); prove + check-proof;
    an edited record -> verify FAILED naming it (exit 1)."""
    from click.testing import CliRunner

    from smartsched.audit.keys import load_private_key
    from smartsched.cli import main

    run = CliRunner()
    res = run.invoke(main, ["audit", "keygen", "--out", str(tmp_path / "k" / "audit.key")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "k" / "audit.key").stat().st_mode & 0o077 == 0
    key = load_private_key(tmp_path / "k" / "audit.key")
    _write_log(tmp_path, key, 300, block_records=50)
    args = ["--log", str(tmp_path / "log"), "--heads", str(tmp_path / "heads" / "heads.jsonl")]
    pub = str(tmp_path / "k" / "audit.pub")
    res = run.invoke(main, ["audit", "verify", *args, "--public-key", pub])
    assert res.exit_code == 0 and "OK: 300 records in 6 signed blocks of log" in res.output, \
        res.output
    res = run.invoke(main, ["audit", "prove", *args, "--seq", "123", "--out",
                            str(tmp_path / "p.bin")])
    assert res.exit_code == 0, res.output
    res = run.invoke(main, ["audit", "check-proof", "--proof", str(tmp_path / "p.bin"),
                            "--record", str(tmp_path / "p.bin.record.json"), "--public-key", pub])
    assert res.exit_code == 0 and res.output.startswith("OK: record 123"), res.output
    files, counts, rows = _all_rows(tmp_path / "log")
    rows["principal"][200] += "-edited"
    _rewrite(tmp_path / "log", files, counts, rows)
    res = run.invoke(main, ["audit", "verify", *args, "--public-key", pub])
    assert res.exit_code == 1 and "FAILED after 200 good records: record 200" in res.output, \
        res.output
    res = run.invoke(main, ["audit", "keygen", "--out", str(tmp_path / "k" / "audit.key")])
    assert res.exit_code != 0 and "not overwriting" in res.output


def test_one_writer_per_log(tmp_path: Path, key) -> None:
    log = AuditLog(tmp_path / "log", tmp_path / "heads.jsonl", key, autoseal=False)
    try:
        with pytest.raises(ValidationError) as e:
            AuditLog(tmp_path / "log", tmp_path / "heads.jsonl", key, lock_wait_s=0.2)
        assert e.value.field == "audit.dir"
    finally:
        log.close()
    AuditLog(tmp_path / "log", tmp_path / "heads.jsonl", key, autoseal=False).close()


def test_records_after_the_last_head_fail_a_closed_log(good_log: Path, key,
                                                      tmp_path: Path) -> None:
    """A forged open segment added after the log was closed: unsigned records. A closed
    log has none (fails); a live one may end with one block of them (reported, not
    counted), never more."""
    import pyarrow.ipc as ipc

    root = tmp_path / "forged"
    shutil.copytree(good_log, root)
    n = 5000
    rows = {"seq": list(range(1000, 1000 + n)), "ts": [0.0] * n, "kind": ["placement"] * n,
            "principal": ["operator"] * n, "tenant": [""] * n, "payload": ["{}"] * n,
            "hash": [bytes(32)] * n}
    prev = _all_rows(root / "log")[2]["hash"][-1]
    rows["hash"] = chain_hashes(prev, 1000, rows["ts"], rows["kind"], rows["principal"],
                                rows["tenant"], rows["payload"])
    for size, live, ok in ((10, False, False), (10, True, True), (n, True, False)):
        path = root / "log" / "seg-0000000000001000.arrows"
        with pa.OSFile(str(path), "wb") as f, ipc.new_stream(f, SCHEMA) as w:
            w.write_table(pa.table({k: v[:size] for k, v in rows.items()}, schema=SCHEMA))
        rep = verify_log(root / "log", root / "heads" / "heads.jsonl", key.public_key(),
                         live=live)
        assert rep.ok is ok and rep.records == 1000, (size, live, rep)
        assert rep.unsigned_tail == size
        path.unlink()


def test_a_failed_write_stops_the_log_loudly_and_a_restart_recovers(tmp_path: Path,
                                                                    key) -> None:
    from smartsched.audit.log import AuditWriteError

    log = AuditLog(tmp_path / "log", tmp_path / "heads.jsonl", key, autoseal=False,
                   fsync=False, block_records=8)
    for i in range(16):
        log.append("placement", "client", {"i": i})
    log.flush()

    def full_disk(*_: object) -> None:
        raise OSError(28, "No space left on device")

    log._make_durable = full_disk  # type: ignore[method-assign]
    for i in range(8):  # this block's head cannot be written
        log.append("placement", "client", {"i": 100 + i})
    with pytest.raises(AuditWriteError, match="No space left"):
        log.flush()
    with pytest.raises(AuditWriteError):  # and nothing is taken after it
        log.append("placement", "client", {"i": 999})
    with pytest.raises(AuditWriteError):
        log.close()
    again = AuditLog(tmp_path / "log", tmp_path / "heads.jsonl", key, autoseal=False,
                     fsync=False)
    again.close()
    rep = verify_log(tmp_path / "log", tmp_path / "heads.jsonl", key.public_key())
    assert rep.ok and rep.records == 17, rep  # 16 signed, the recovery note


def test_another_logs_heads_and_proofs_do_not_pass_for_this_one(tmp_path: Path, key) -> None:
    """Two logs signed with one key: swapping in the other's heads fails (the log's id is
    signed into every head), and a proof checked against a pinned log id must match."""
    for name in ("a", "b"):
        _write_log(tmp_path / name, key, 100, seed=1, block_records=16)
    a, b = tmp_path / "a", tmp_path / "b"
    ida = (a / "log" / "log_id").read_text().strip()
    rep = verify_log(a / "log", b / "heads" / "heads.jsonl", key.public_key())
    assert not rep.ok and "belongs to log" in rep.problem.reason, rep.problem
    rep = verify_log(a / "log", a / "heads" / "heads.jsonl", key.public_key(), log_id=ida)
    assert rep.ok and rep.log_id == ida
    record, proof = prove(b / "log", b / "heads" / "heads.jsonl", 7)
    assert check_proof(proof, record, key.public_key())[0]
    ok, why = check_proof(proof, record, key.public_key(), log_id=ida)
    assert not ok and "from log" in why
    with pytest.raises(ValidationError) as e:  # the writer refuses another log's heads
        AuditLog(a / "log", b / "heads" / "heads.jsonl", key, autoseal=False)
    assert e.value.field == "audit.heads"
