"""Where the audit log lives on disk: segment files, the open segment, the heads file.

Owns the layout the writer, the verifier and ``prove`` share::

    <log_dir>/seg-<first seq, 16 digits>.parquet   closed segments (zstd)
    <log_dir>/seg-<first seq>.arrows               the open segment: an Arrow IPC stream,
                                                   one record batch per sealed block
    <log_dir>/unsigned/                            records a restart found after the last
                                                   signed head (kept, never signed)
    <heads file>                                   one signed head per block (JSON lines),
                                                   outside the log directory

The open segment is an IPC stream because a Parquet file is readable only once its
footer is written: a crash would lose the whole segment. A stream cut short by a
crash still yields every batch written before it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from smartsched.audit.chain import LOG_ID_BYTES, Head
from smartsched.model.errors import ValidationError

SCHEMA = pa.schema([
    ("seq", pa.int64()), ("ts", pa.float64()), ("kind", pa.string()),
    ("principal", pa.string()), ("tenant", pa.string()), ("payload", pa.string()),
    ("hash", pa.binary(32)),
])
COLUMNS = tuple(SCHEMA.names)
OPEN_SUFFIX, CLOSED_SUFFIX = ".arrows", ".parquet"
LOG_ID_FILE = "log_id"  # the log's random id (hex), made when the log is created
LOG_ID_FILE_MAX = 256  # bytes read of it at most (32 hex digits and a newline)


def parse_log_id(text: str) -> bytes | None:
    """A log id from its hex form, or None when it is not one."""
    try:
        got = bytes.fromhex(text.strip())
    except ValueError:
        return None
    return got if len(got) == LOG_ID_BYTES else None


def segment_name(first_seq: int, suffix: str) -> str:
    return f"seg-{first_seq:016d}{suffix}"


def first_seq_of(path: Path) -> int | None:
    stem = path.name.split(".", 1)[0]
    if stem.startswith("seg-") and stem[4:].isdigit() and path.suffix in (OPEN_SUFFIX,
                                                                          CLOSED_SUFFIX):
        return int(stem[4:])
    return None


def segment_files(log_dir: Path) -> list[Path]:
    """Segments in order of their first record (an open one after a closed one of the
    same name is a roll a crash interrupted: the closed one wins)."""
    found: dict[int, Path] = {}
    for p in log_dir.iterdir() if log_dir.is_dir() else ():
        seq = first_seq_of(p)
        if seq is None:
            continue
        if seq not in found or p.suffix == CLOSED_SUFFIX:
            found[seq] = p
    return [found[k] for k in sorted(found)]


def read_segment(path: Path, first: int | None = None, last: int | None = None) -> pa.Table:
    """A segment's records (only seq ``first``..``last`` when given: a closed segment then
    reads just the row groups holding them); an open segment cut short yields the batches
    before the cut. A closed segment that does not read (damaged, or not one) is a
    ValidationError naming it."""
    if not path.is_file():  # a FIFO named like a segment held verify for ever
        raise ValidationError("audit.log", "not a regular file", source=str(path))
    if path.suffix == CLOSED_SUFFIX:
        try:
            if first is None or last is None:
                return pq.read_table(path, schema=SCHEMA)
            return pq.read_table(path, schema=SCHEMA,
                                 filters=[("seq", ">=", first), ("seq", "<=", last)])
        except (pa.ArrowException, OSError, ValueError) as e:
            raise ValidationError("audit.log", f"not a readable audit segment "
                                  f"({type(e).__name__})", source=str(path)) from None
    batches = []
    try:
        with pa.OSFile(str(path), "rb") as f:
            reader = pa.ipc.open_stream(f)
            while True:
                try:
                    batches.append(reader.read_next_batch())
                except StopIteration:
                    break
    except (pa.ArrowInvalid, OSError):
        pass  # a torn last batch (or an empty file): what came before it stands
    try:
        return pa.Table.from_batches(batches, schema=SCHEMA)
    except (pa.ArrowException, ValueError) as e:  # batches of another schema
        raise ValidationError("audit.log", f"not an audit segment ({type(e).__name__})",
                              source=str(path)) from None


def write_closed(table: pa.Table, path: Path, fsync: bool = True) -> None:
    """Write ``table`` as the Parquet segment ``path`` atomically (tmp, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    # Dictionaries only where values repeat: on hashes and payloads they cost time for nothing.
    # Row groups of 16,384: a proof reads the group(s) of one block, not the whole segment.
    pq.write_table(table, tmp, compression="zstd", use_dictionary=["kind", "principal", "tenant"],
                   row_group_size=16_384)
    if fsync:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.replace(tmp, path)
    if fsync:
        sync_dir(path.parent)


def sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class SignedHead:
    head: Head
    key_id: str
    signature: bytes

    def to_json(self) -> str:
        h = self.head
        return json.dumps({"block": h.block, "first_seq": h.first_seq, "last_seq": h.last_seq,
                           "ts": h.ts, "root": h.root.hex(), "chain": h.chain.hex(),
                           "prev_head": h.prev_head.hex(), "log_id": h.log_id.hex(),
                           "key_id": self.key_id,
                           "sig": self.signature.hex()}, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> SignedHead:
        """Raises ValueError (with what is wrong) for a line that is not a head."""
        try:
            d = json.loads(line)
            if not isinstance(d, dict):
                raise TypeError(f"a JSON {type(d).__name__}, not an object")
            # Each field has the one JSON type the writer gives it: "1", 1.5 or false read
            # as the block number 1 would make two texts of one signed head.
            for k in ("block", "first_seq", "last_seq"):
                if type(d[k]) is not int:
                    raise TypeError(f"{k} must be a JSON integer, got {d[k]!r}")
            if type(d["ts"]) not in (int, float):
                raise TypeError(f"ts must be a JSON number, got {d['ts']!r}")
            for k in ("root", "chain", "prev_head", "log_id", "sig", "key_id"):
                if not isinstance(d[k], str):
                    raise TypeError(f"{k} must be a JSON string, got {d[k]!r}")
            head = Head(d["block"], d["first_seq"], d["last_seq"],
                        float(d["ts"]), bytes.fromhex(d["root"]), bytes.fromhex(d["chain"]),
                        bytes.fromhex(d["prev_head"]), bytes.fromhex(d["log_id"]))
            sig = bytes.fromhex(d["sig"])
            key = d["key_id"]
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as e:
            # (int(1e400): inf; RecursionError: JSON nested thousands deep)
            raise ValueError(f"not a head ({type(e).__name__}: {e})") from None
        # A head is signed as packed int64s: a number past them (1e30) failed the packing
        # with a traceback instead of being named as not a head.
        bad = [k for k in ("block", "first_seq", "last_seq")
               if not 0 <= getattr(head, k) < 2**63]
        if bad:
            raise ValueError(f"not a head ({bad[0]} {getattr(head, bad[0])} is outside "
                             f"0..2**63-1)")
        if any(len(b) != 32 for b in (head.root, head.chain, head.prev_head)) or len(sig) != 64 \
                or len(head.log_id) != LOG_ID_BYTES:
            raise ValueError("not a head (a hash or the signature has the wrong length)")
        return cls(head, key, sig)


# A signed head as JSON is a few hundred characters; a line this long is not one.
MAX_HEAD_LINE = 64 * 1024


def read_heads(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of every non-empty line of the heads file. Refused, naming the
    file: one that is not a regular file (a FIFO held verify for ever) and a line longer
    than any head (one line of 300 MB was read whole)."""
    if not path.exists():
        return
    if not path.is_file():
        raise ValidationError("audit.heads", "not a regular file", source=str(path))
    with open(path, encoding="utf-8", errors="replace") as f:
        for no, line in enumerate(iter(lambda: f.readline(MAX_HEAD_LINE + 1), ""), 1):
            if len(line) > MAX_HEAD_LINE:
                raise ValidationError("audit.heads", f"line {no} is longer than any signed "
                                      f"head ({MAX_HEAD_LINE:,} characters)", source=str(path))
            if line.strip():
                yield no, line


def last_head(path: Path) -> SignedHead | None:
    """The heads file's last head (the writer trusts its own file; ``verify`` checks all)."""
    last = None
    for _, line in read_heads(path):
        last = line
    if last is None:
        return None
    try:
        return SignedHead.from_json(last)
    except ValueError as e:
        raise ValidationError("audit.heads", f"{path}: last line {e}") from None
