"""Checking an audit log: the whole of it (``verify_log``), or one record (inclusion proofs).

Owns what ``smartsched audit verify`` and ``smartsched audit prove`` do. Verification
needs only the public key. It checks, and names the first thing that fails:

- every head: parses, is signed by the given key, follows its predecessor (block
  number, first record, ``prev_head``) and covers 1..4,096 records;
- every record, in order: its sequence number is the next one (a record deleted,
  inserted or moved breaks this), and its hash follows from its fields and the
  previous record's hash (an edit breaks this);
- every block: the Merkle root and chain hash of its records equal its signed head's
  (records rewritten with their hashes recomputed break this);
- coverage: the log reaches the last signed head (a log cut short shows) and no
  closed segment holds records that no head signs. Records at the end of the open
  segment that are not signed yet (at most a block being written) are counted as
  ``unsigned_tail``, not trusted.

A proof that one record is in the log is that record's predecessor hash, its Merkle
path within its block (at most 12 hashes) and the block's signed head: about 660
bytes whatever the log's size, checked with the public key alone.
"""

from __future__ import annotations

import numbers
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from smartsched.audit.chain import (
    HEAD_BYTES,
    LOG_ID_BYTES,
    SIGNATURE_BYTES,
    ZERO,
    Head,
    chain_hashes,
    merkle_path,
    merkle_root,
    record_hash,
    root_from_path,
)
from smartsched.audit.keys import key_id, signature_ok
from smartsched.audit.log import MAX_BLOCK_RECORDS
from smartsched.audit.store import (
    CLOSED_SUFFIX,
    COLUMNS,
    LOG_ID_FILE,
    LOG_ID_FILE_MAX,
    SignedHead,
    first_seq_of,
    parse_log_id,
    read_heads,
    read_segment,
    segment_files,
)
from smartsched.model.errors import ValidationError
from smartsched.paths import read_regular_file

PROOF_MAGIC = b"SSPROOF1"
_PROOF = struct.Struct("<qI")


@dataclass(frozen=True)
class Problem:
    seq: int | None  # the first record concerned (a block's first when only the block is known)
    where: str
    reason: str

    def __str__(self) -> str:
        at = f"record {self.seq}" if self.seq is not None else "log"
        return f"{at} ({self.where}): {self.reason}"


@dataclass(frozen=True)
class VerifyReport:
    ok: bool
    records: int  # records checked and found good
    blocks: int  # signed blocks checked and found good
    unsigned_tail: int
    problem: Problem | None
    seconds: float
    log_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "log_id": self.log_id, "records": self.records,
                "blocks": self.blocks,
                "unsigned_tail": self.unsigned_tail, "seconds": self.seconds,
                "problem": str(self.problem) if self.problem else None,
                "first_bad_record": self.problem.seq if self.problem else None}


def _check_heads(heads_path: Path, public: Ed25519PublicKey, log_id: bytes | None
                 ) -> tuple[list[tuple[Head, bytes]], Problem | None]:
    """The heads that check out, in order, up to the first that does not (and why). Every
    head must name ``log_id`` (None: the first head's)."""
    kid = key_id(public)
    good: list[tuple[Head, bytes]] = []
    prev, first = ZERO, 0
    for no, line in read_heads(heads_path):
        where = f"{heads_path.name} line {no}"
        try:
            sh = SignedHead.from_json(line)
        except ValueError as e:
            return good, Problem(first, where, str(e))
        h = sh.head
        if sh.key_id != kid:
            why = f"signed by key {sh.key_id}, not by the given key {kid}"
        elif not signature_ok(public, sh.signature, h.to_bytes()):
            why = "its signature does not verify (the head was altered or forged)"
        elif h.block != len(good) or h.first_seq != first:
            why = (f"expected block {len(good)} from record {first}, found block {h.block} "
                   f"from record {h.first_seq} (a head removed, added or moved)")
        elif not 1 <= h.count <= MAX_BLOCK_RECORDS:
            why = f"covers {h.count} records (1..{MAX_BLOCK_RECORDS} allowed)"
        elif h.prev_head != prev:
            why = "does not follow the previous head (prev_head differs)"
        elif log_id is not None and h.log_id != log_id:
            why = (f"belongs to log {h.log_id.hex()}, not {log_id.hex()} (another log's "
                   "head, signed with the same key)")
        else:
            good.append((h, sh.signature))
            prev, first = h.digest(), h.last_seq + 1
            log_id = h.log_id if log_id is None else log_id
            continue
        return good, Problem(first, where, why)
    return good, None


def verify_log(log_dir: str | Path, heads_path: str | Path,
               public: Ed25519PublicKey, live: bool = False,
               log_id: str | None = None) -> VerifyReport:
    """Check the whole log against its signed heads; the first problem is named. Records
    no head signs yet fail a closed log; ``live`` (a log being written) lets the open
    segment end with at most one block of them (the one being sealed), reported as
    ``unsigned_tail`` and never counted as good."""
    t0 = time.perf_counter()
    log_dir, heads_path = Path(log_dir), Path(heads_path)
    own = _own_log_id(log_dir)
    want = _pinned_log_id(log_id) or own
    if want is not None and own is not None and want != own:  # checked before any head
        return VerifyReport(False, 0, 0, 0, Problem(None, LOG_ID_FILE, f"this is log "
                            f"{own.hex()}, not the pinned {want.hex()}"),
                            time.perf_counter() - t0, own.hex())
    heads, head_problem = _check_heads(heads_path, public, want)
    expected, prev, hi, unsigned = 0, ZERO, 0, 0
    pending: list[bytes] = []
    problem: Problem | None = None
    signed_to = heads[-1][0].last_seq if heads else -1
    for path in segment_files(log_dir):
        try:
            t = read_segment(path)
        except ValidationError as e:
            problem = Problem(expected, path.name, e.message)
            break
        # A field set to null (or a column dropped, read back as nulls) or text that is not
        # UTF-8 was a traceback here, not a tampered record named.
        null = next(((c, int(pc.index(pc.is_null(t[c]), True).as_py())) for c in COLUMNS
                     if t[c].null_count), None)
        if null is not None:
            problem = Problem(expected + null[1], f"{path.name} row {null[1]}",
                              f"its {null[0]} is empty (null): the record was edited")
            break
        try:
            cols = {c: t[c].to_pylist() for c in COLUMNS}
        except UnicodeDecodeError:
            problem = Problem(expected, path.name, "a text field is not UTF-8: the segment "
                              "was edited")
            break
        seqs, n = cols["seq"], t.num_rows
        m = n
        if seqs != list(range(expected, expected + n)):
            m = next(i for i in range(n) if seqs[i] != expected + i)
            problem = Problem(expected + m, f"{path.name} row {m}",
                              f"expected record {expected + m}, found record {seqs[m]} "
                              "(a record deleted, inserted or moved)")
        computed = chain_hashes(prev, expected, cols["ts"][:m], cols["kind"][:m],
                                cols["principal"][:m], cols["tenant"][:m], cols["payload"][:m])
        bad = next((i for i in range(m) if computed[i] != cols["hash"][i]), None)
        if bad is not None:
            m = bad
            problem = Problem(expected + bad, f"{path.name} row {bad}",
                              "its fields or its hash were changed (the hash does not follow "
                              "from them and the previous record)")
        pending.extend(computed[:m])
        while hi < len(heads) and len(pending) >= heads[hi][0].count:
            h = heads[hi][0]
            block, pending = pending[:h.count], pending[h.count:]
            if merkle_root(block) != h.root or block[-1] != h.chain:
                problem = Problem(h.first_seq, f"block {h.block}, records {h.first_seq}.."
                                  f"{h.last_seq}", "the records do not match the block's signed "
                                  "Merkle root (rewritten, hashes recomputed)")
                expected = h.first_seq
                break
            hi += 1
        else:
            if m:
                expected, prev = expected + m, computed[m - 1]
            beyond = expected - 1 - signed_to
            if problem is None and beyond > 0:
                if path.suffix == CLOSED_SUFFIX:
                    problem = Problem(signed_to + 1, path.name, "no signed head covers this "
                                      "record or the ones after it (heads cut short, or records "
                                      "added)" + _no_heads(heads_path, heads))
                else:
                    unsigned = beyond
        if problem is not None:
            break
    if problem is None and expected - 1 < signed_to:
        problem = Problem(expected, "end of log", f"the log ends at record {expected - 1} but "
                          f"signed heads cover records up to {signed_to} (records cut off)")
    if head_problem is not None and (problem is None or head_problem.seq <= problem.seq):
        problem = head_problem
    if problem is None and unsigned and (not live or unsigned > MAX_BLOCK_RECORDS):
        problem = Problem(signed_to + 1, "open segment", f"{unsigned} records after the last "
                          "signed head" + (" (more than one block: heads removed, or records "
                                           "added)" if live else "; a closed log has none "
                                           "(use --live for a log being written)")
                          + _no_heads(heads_path, heads))
    expected -= unsigned  # never counted as good
    good_records = min(expected, problem.seq) if problem and problem.seq is not None \
        else expected
    found = heads[0][0].log_id.hex() if heads else (want.hex() if want else None)
    return VerifyReport(problem is None, good_records, hi, unsigned, problem,
                        time.perf_counter() - t0, found)


def _pinned_log_id(given: str | None) -> bytes | None:
    """The log id the caller pinned (None: none pinned)."""
    if given is None:
        return None
    got = parse_log_id(given)
    if got is None:
        raise ValidationError("log_id", f"{LOG_ID_BYTES * 2} hex digits")
    return got


def _own_log_id(log_dir: Path) -> bytes | None:
    """The log directory's own id, to hold the heads to (a swapped heads file shows); None
    for a log without one (its first head's is used). A directory with neither an id nor
    a segment is not a log: verified, it would pass as an empty one."""
    path = log_dir / LOG_ID_FILE
    if not path.exists():
        if not segment_files(log_dir):
            raise ValidationError("log", f"not an audit log: {log_dir} has no {LOG_ID_FILE} "
                                  "file and no segments (seg-*.parquet, seg-*.arrows)")
        return None
    try:
        got = parse_log_id(read_regular_file(path, LOG_ID_FILE_MAX).decode("utf-8"))
    except OSError as e:  # a FIFO waited for a writer forever, /dev/zero never ended
        raise ValidationError("log", f"{path}: {e.strerror or 'unreadable'}") from None
    except ValueError as e:  # not UTF-8 text
        raise ValidationError("log", f"{path}: unreadable ({type(e).__name__})") from None
    if got is None:
        raise ValidationError("log", f"{path}: not a log id ({LOG_ID_BYTES * 2} hex digits)")
    return got


def _no_heads(heads_path: Path, heads: list[tuple[Head, bytes]]) -> str:
    """Said of records no head signs when the heads file holds none at all: most likely the
    wrong (or an emptied) heads file, which is worth naming."""
    if heads or any(True for _ in read_heads(heads_path)):
        return ""
    return f"; {heads_path} holds no signed heads (the wrong heads file, or emptied)"


# ------------------------------------------------------------------ inclusion proofs
def _records_between(log_dir: Path, first: int, last: int) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    files = segment_files(log_dir)
    starts = [first_seq_of(p) or 0 for p in files]  # (any digits, as verify reads them)
    for i, path in enumerate(files):
        end = starts[i + 1] - 1 if i + 1 < len(files) else None
        if starts[i] > last or (end is not None and end < first):
            continue
        t = read_segment(path, first, last)
        try:
            cols = {c: t[c].to_pylist() for c in COLUMNS}
        except UnicodeDecodeError:
            cols = None
        if cols is None or any(t[c].null_count for c in COLUMNS):
            raise ValidationError("log", f"{path.name}: a record's field is null or not "
                                  "UTF-8 (edited): verify the log")
        for c in COLUMNS:
            out[c].extend(cols[c])
    keep = [i for i, s in enumerate(out["seq"]) if first <= s <= last]
    return {c: [v[i] for i in keep] for c, v in out.items()}


def prove(log_dir: str | Path, heads_path: str | Path, seq: int) -> tuple[dict[str, Any], bytes]:
    """Record ``seq`` (its fields) and the proof that it is in the signed log."""
    _own_log_id(Path(log_dir))  # a directory that is not a log is refused by name
    prev_chain, found = ZERO, None
    for no, line in read_heads(Path(heads_path)):
        try:
            sh = SignedHead.from_json(line)
        except ValueError as e:
            raise ValidationError("heads", f"{heads_path} line {no}: {e}") from None
        if sh.head.first_seq <= seq <= sh.head.last_seq:
            found = sh
            break
        prev_chain = sh.head.chain
    if found is None:
        raise ValidationError("seq", f"no signed block holds record {seq}")
    h = found.head
    if not 1 <= h.count <= MAX_BLOCK_RECORDS:  # unverified here: bound it before reading
        raise ValidationError("heads", f"{heads_path} line {no}: covers {h.count} records "
                              f"(1..{MAX_BLOCK_RECORDS} allowed): verify the log")
    rec = _records_between(Path(log_dir), h.first_seq, h.last_seq)
    if rec["seq"] != list(range(h.first_seq, h.last_seq + 1)):
        raise ValidationError("log", f"block {h.block} is incomplete in the log: verify it")
    idx = seq - h.first_seq
    prev = prev_chain if idx == 0 else rec["hash"][idx - 1]
    path = merkle_path(rec["hash"], idx)
    proof = (PROOF_MAGIC + _PROOF.pack(seq, len(path)) + prev + b"".join(path) + h.to_bytes()
             + found.signature + bytes.fromhex(found.key_id))
    record = {c: rec[c][idx] for c in COLUMNS if c != "hash"}
    return record, proof


def check_proof(proof: bytes, record: Mapping[str, Any], public: Ed25519PublicKey,
                log_id: str | None = None) -> tuple[bool, str]:
    """Whether ``proof`` shows ``record`` (seq, ts, kind, principal, tenant, payload) in a
    block signed by ``public`` (of the log ``log_id``, when given); and why not."""
    fixed = len(PROOF_MAGIC) + _PROOF.size + 32
    if len(proof) < fixed or not proof.startswith(PROOF_MAGIC):
        return False, "not a proof"
    seq, npath = _PROOF.unpack_from(proof, len(PROOF_MAGIC))
    if len(proof) != fixed + 32 * npath + HEAD_BYTES + SIGNATURE_BYTES + 8:
        return False, "not a proof (wrong length)"
    prev = proof[fixed - 32:fixed]
    path = [proof[fixed + 32 * i:fixed + 32 * (i + 1)] for i in range(npath)]
    off = fixed + 32 * npath
    try:
        head = Head.from_bytes(proof[off:off + HEAD_BYTES])
    except ValueError:
        return False, "not a proof (its head is not an audit head)"
    if log_id is not None and head.log_id.hex() != log_id.lower():
        return False, f"the proof is from log {head.log_id.hex()}, not {log_id}"
    sig = proof[off + HEAD_BYTES:off + HEAD_BYTES + SIGNATURE_BYTES]
    extra = sorted(set(record) - {c for c in COLUMNS if c != "hash"})
    if extra:  # shown beside the proven fields, they would read as signed
        return False, f"the record has a field no proof covers: {str(extra[0])[:40]!r}"
    if isinstance(record.get("ts"), bool) or not isinstance(record.get("ts"), int | float):
        return False, "the record's ts must be a number"
    try:
        # The record's number as written: int() read 3.9 or "3" as record 3 (a record that
        # is not the log's was reported in it), and 1e400 (inf) was an OverflowError.
        rseq = record["seq"]
        if isinstance(rseq, bool) or not isinstance(rseq, numbers.Integral):
            raise ValueError(f"seq must be a whole number, got {rseq!r}"[:120])
        if rseq != seq:
            return False, f"the proof is for record {seq}, not {rseq}"
        leaf = record_hash(prev, seq, float(record["ts"]), str(record["kind"]),
                           str(record["principal"]), str(record["tenant"]),
                           str(record["payload"]))
    except (KeyError, TypeError, ValueError) as e:
        return False, f"the record lacks a field or has a bad one ({type(e).__name__}: {e})"
    if root_from_path(leaf, seq - head.first_seq, head.count, path) != head.root:
        return False, "the record does not hash to the block's Merkle root"
    if not signature_ok(public, sig, head.to_bytes()):
        return False, "the block's head is not signed by this key"
    return True, f"record {seq} is in block {head.block} (records {head.first_seq}.." \
                 f"{head.last_seq}) of log {head.log_id.hex()}, signed by {key_id(public)}"
