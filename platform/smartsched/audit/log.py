"""The audit log writer: append decisions, seal them into signed blocks, roll segments.

Owns the append path (issue 19). ``append`` only buffers (a sequence number, the
fields, the payload as canonical JSON); the cost is paid once per block, at
``seal``: chain hashes, the Merkle root, one Ed25519 signature, one Arrow batch and
one head line, fsync'd in that order by an I/O thread. A block is sealed when it
holds ``block_records`` records (at most 4,096) or its first record is
``block_seconds`` old (a background thread; ``close`` seals the rest). Every
``segment_blocks`` blocks the open segment is closed and a child process rewrites it
as a Parquet file (``audit.convert``).

A restart picks up from the last signed head: records written after it (a crash
between a block's batch and its head) are moved to ``unsigned/`` and never signed;
the log goes on from the last signed record, and the first new record says how many
were set aside. A log that no longer reaches its last signed head (cut short or
edited) is refused: run ``smartsched audit verify``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from smartsched.audit.chain import LOG_ID_BYTES, ZERO, Head, chain_hashes, merkle_root
from smartsched.audit.keys import key_id
from smartsched.audit.store import (
    CLOSED_SUFFIX,
    LOG_ID_FILE,
    LOG_ID_FILE_MAX,
    OPEN_SUFFIX,
    SCHEMA,
    SignedHead,
    last_head,
    parse_log_id,
    read_segment,
    segment_files,
    segment_name,
    write_closed,
)
from smartsched.model.errors import ValidationError
from smartsched.paths import lock_exclusive, read_regular_file

MAX_BLOCK_RECORDS = 4096


class AuditWriteError(OSError):
    """The log could not write (a full disk, say): it takes no more records until restarted."""


_JSON_OPTIONS = orjson.OPT_NON_STR_KEYS


def canonical_json(payload: Mapping[str, Any] | str) -> bytes:
    """A payload as the log stores it (UTF-8): compact JSON in the mapping's own key order
    (the hash covers the stored bytes, so no canonical order is needed), a string as is.
    orjson, not the standard library: at 100,000 records/s the standard encoder alone
    would take most of the time (8 us a decision record on this machine, orjson 0.5)."""
    if isinstance(payload, str):
        return payload.encode()
    return orjson.dumps(payload, option=_JSON_OPTIONS, default=str)


def _exclusive(path: Path, wait_s: float) -> int:
    """One writer per log."""
    fd = lock_exclusive(path, wait_s)
    if fd is None:
        raise ValidationError("audit.dir", f"{path.parent} is being written by another "
                              "process: one writer per log")
    return fd


class AuditLog:
    """An append-only, hash-chained, signed decision log (thread-safe)."""

    def __init__(self, log_dir: str | Path, heads_path: str | Path, key: Ed25519PrivateKey, *,
                 block_records: int = MAX_BLOCK_RECORDS, block_seconds: float = 1.0,
                 segment_blocks: int = 256, fsync: bool = True, autoseal: bool = True,
                 lock_wait_s: float = 10.0) -> None:
        if not 1 <= block_records <= MAX_BLOCK_RECORDS:
            raise ValidationError("audit.block_records", f"must be 1..{MAX_BLOCK_RECORDS}")
        if not 0 < block_seconds <= 3600:
            raise ValidationError("audit.block_seconds", "must be in (0, 3600]")
        if segment_blocks < 1:
            raise ValidationError("audit.segment_blocks", "must be at least 1")
        self.dir = Path(log_dir).resolve()
        self.heads_path = Path(heads_path).resolve()
        if self.heads_path.is_relative_to(self.dir):
            raise ValidationError("audit.heads", "must be outside the log directory: heads "
                                  "kept apart are what shows a log cut short")
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.heads_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lockfd = _exclusive(self.dir / ".writer.lock", lock_wait_s)
        self.key, self.key_id = key, key_id(key.public_key())
        self.block_records, self.block_seconds = block_records, block_seconds
        self.segment_blocks, self.fsync = segment_blocks, fsync
        self._lock = threading.Lock()
        self._io = ThreadPoolExecutor(1, thread_name_prefix="audit-io")
        self._io_tasks: list[Future[None]] = []
        self._broken: BaseException | None = None
        self._closed = False
        self._reset_buffer()
        # Nothing on disk changes until the log is known to reach its signed heads: a
        # refused start deleted the open segment's records past the cut (signed ones too)
        # and wrote a fresh log id over a log that had none.
        self.log_id, fresh = self._log_id()
        set_aside = self._recover()
        if fresh:
            (self.dir / LOG_ID_FILE).write_text(self.log_id.hex() + "\n")
        self._heads = open(self.heads_path, "a", encoding="utf-8")  # noqa: SIM115 (held open)
        self._open_segment()
        self._stop = threading.Event()
        self._sealer: threading.Thread | None = None
        if set_aside:
            self.append("audit.recovery", "smartsched", {
                "unsigned_records_set_aside": set_aside,
                "where": str(self.dir / "unsigned"),
                "reason": "written after the last signed head (a crash before sealing)"})
        if autoseal:
            self._sealer = threading.Thread(target=self._autoseal, name="audit-sealer",
                                            daemon=True)
            self._sealer.start()

    # ------------------------------------------------------------ state
    def _reset_buffer(self) -> None:
        # Column lists, not a tuple a record: a tuple is a GC-tracked allocation, and the
        # collections they set off cost a sixth of the append rate (measured).
        self._ts: list[float] = []
        self._kind: list[str] = []
        self._principal: list[str] = []
        self._tenant: list[str] = []
        self._payload: list[bytes] = []
        self._opened = 0.0

    def _log_id(self) -> tuple[bytes, bool]:
        """This log's id and whether it is still to be written: made at creation (random),
        read back afterwards; a log whose id file is gone takes the id its signed heads
        carry (a fresh one would make every head read as another log's)."""
        path = self.dir / LOG_ID_FILE
        if path.exists():
            try:
                got = parse_log_id(read_regular_file(path, LOG_ID_FILE_MAX).decode("utf-8"))
            except OSError as e:  # a FIFO would wait for a writer forever
                raise ValidationError("audit.log", f"{path}: {e.strerror or 'unreadable'}"
                                      ) from None
            except ValueError:  # not UTF-8 text
                got = None
            if got is None:
                raise ValidationError("audit.log", f"{path}: not a log id")
            return got, False
        signed = last_head(self.heads_path)
        if signed is not None:
            return signed.head.log_id, True
        return os.urandom(LOG_ID_BYTES), True

    def _recover(self) -> int:
        """Pick up after the last signed head; return how many records were set aside."""
        signed = last_head(self.heads_path)
        if signed is not None and signed.head.log_id != self.log_id:
            raise ValidationError("audit.heads", f"{self.heads_path} holds the heads of "
                                  "another log (its log id differs)")
        self.next_seq = signed.head.last_seq + 1 if signed else 0
        self.chain = signed.head.chain if signed else ZERO
        self.block = signed.head.block + 1 if signed else 0
        self.head_digest = signed.head.digest() if signed else ZERO
        # Plan first: what each open segment (a crash left it) becomes, and where the log
        # then ends; only a log that reaches its signed heads is changed.
        plan: list[tuple[Path, Any, Any]] = []  # (open segment, kept, set aside)
        finals: list[tuple[Path, Any]] = []  # (segment, its records once recovered)
        for path in segment_files(self.dir):
            if path.suffix != OPEN_SUFFIX:
                finals.append((path, None))
                continue
            if path.with_suffix(CLOSED_SUFFIX).exists():  # the roll finished before the
                plan.append((path, None, None))  # crash removed this: only removed
                continue
            table = read_segment(path)
            keep = table.filter(pc.less(table["seq"], self.next_seq))
            plan.append((path, keep, table.slice(keep.num_rows)))
            finals.append((path, keep))
        last = None
        for path, table in reversed(finals):
            table = read_segment(path) if table is None else table
            if table.num_rows:
                last = table.slice(table.num_rows - 1)
                break
        have_seq = last["seq"][0].as_py() if last is not None else -1
        have_hash = last["hash"][0].as_py() if last is not None else ZERO
        if have_seq != self.next_seq - 1 or have_hash != self.chain:
            raise ValidationError(
                "audit.log", f"{self.dir} ends at record {have_seq} but its signed heads "
                f"reach record {self.next_seq - 1} (or its last hash differs): the log was cut "
                "short or edited; run `smartsched audit verify` before writing to it "
                "(nothing was changed)")
        set_aside = 0
        for path, keep, rest in plan:
            if rest is not None and rest.num_rows:
                (self.dir / "unsigned").mkdir(exist_ok=True, mode=0o700)
                # Named by the restart's time too: a later crash reuses these numbers.
                aside = segment_name(rest["seq"][0].as_py(), f".{time.time_ns()}{CLOSED_SUFFIX}")
                write_closed(rest, self.dir / "unsigned" / aside, self.fsync)
                set_aside += rest.num_rows
            if keep is not None and keep.num_rows:
                write_closed(keep, path.with_suffix(CLOSED_SUFFIX), self.fsync)
            path.unlink()
        return set_aside

    def _open_segment(self) -> None:
        self._segment = self.dir / segment_name(self.next_seq, OPEN_SUFFIX)
        self._segment_file = open(self._segment, "wb")  # noqa: SIM115 (closed on roll)
        self._writer = pa.ipc.new_stream(self._segment_file, SCHEMA)
        self._segment_blocks_done = 0

    # ------------------------------------------------------------ appending
    def append(self, kind: str, principal: str, payload: Mapping[str, Any] | str,
               tenant: str = "", ts: float | None = None) -> int:
        """Buffer one record; return its sequence number."""
        data = canonical_json(payload)
        when = time.time() if ts is None else float(ts)
        self._check()
        with self._lock:
            n = len(self._ts)
            if not n:
                self._opened = time.monotonic()
            self._ts.append(when)
            self._kind.append(str(kind))
            self._principal.append(str(principal))
            self._tenant.append(str(tenant))
            self._payload.append(data)
            seq = self.next_seq + n
            if n + 1 >= self.block_records:
                self._seal()
            return seq

    def seal(self) -> Head | None:
        """Seal the buffered records into a signed block now (None when there are none)."""
        with self._lock:
            return self._seal()

    def _seal(self) -> Head | None:
        self._check()
        n = len(self._ts)
        if n == 0:
            return None
        first = self.next_seq
        ts, kind, principal, tenant, payload = (self._ts, self._kind, self._principal,
                                                self._tenant, self._payload)
        hashes = chain_hashes(self.chain, first, ts, kind, principal, tenant, payload)
        head = Head(self.block, first, first + n - 1, time.time(), merkle_root(hashes),
                    hashes[-1], self.head_digest, self.log_id)
        signed = SignedHead(head, self.key_id, self.key.sign(head.to_bytes()))
        batch = pa.RecordBatch.from_arrays([
            pa.array(range(first, first + n), pa.int64()), pa.array(ts, pa.float64()),
            pa.array(kind, pa.string()), pa.array(principal, pa.string()),
            pa.array(tenant, pa.string()), pa.array(payload, pa.string()),
            pa.array(hashes, pa.binary(32))], schema=SCHEMA)
        self._writer.write_batch(batch)
        self._segment_file.flush()
        # Durability off this thread: fsync the batch, then write and fsync its head, in
        # that order (a head on disk before its records would read as a log cut short).
        self._submit(self._make_durable, self._segment_file, signed.to_json() + "\n")
        self.next_seq, self.chain = first + n, hashes[-1]
        self.block, self.head_digest = self.block + 1, head.digest()
        self._reset_buffer()
        self._segment_blocks_done += 1
        if self._segment_blocks_done >= self.segment_blocks:
            self._roll()
            self._open_segment()
        return head

    def _submit(self, fn: Any, *args: Any) -> None:
        """Queue file work on the I/O thread (one thread: tasks run in order)."""
        self._io_tasks = [f for f in self._io_tasks if not f.done()]
        self._io_tasks.append(self._io.submit(self._guarded, fn, *args))

    def _guarded(self, fn: Any, *args: Any) -> None:
        """Run one I/O task unless an earlier one failed. The first failure (a full disk,
        say) breaks the log for good: no later head may follow a missing one, and every
        later call raises it (a restart sets the unsigned blocks aside)."""
        if self._broken is not None:
            return
        try:
            fn(*args)
        except BaseException as e:
            self._broken = e
            raise

    @property
    def stopped(self) -> BaseException | None:
        """The failure that stopped the log (None while it works)."""
        return self._broken

    def _check(self) -> None:
        if self._broken is not None:
            raise AuditWriteError(f"the audit log {self.dir} stopped after a failed write: "
                                  f"{type(self._broken).__name__}: {self._broken}; restart "
                                  "it once the cause is fixed") from self._broken

    def _make_durable(self, segment_file: Any, head_line: str) -> None:
        if self.fsync:
            os.fsync(segment_file.fileno())
        self._heads.write(head_line)
        self._heads.flush()
        if self.fsync:
            os.fsync(self._heads.fileno())

    def _roll(self) -> None:
        """Close the open segment; the I/O thread rewrites it as a Parquet file (an empty
        one is just removed). Until then, and if that fails, the Arrow stream stays: every
        record in it is signed and readable, and a restart retries."""
        self._submit(self._close_segment, self._writer, self._segment_file, self._segment)

    def _close_segment(self, writer: Any, segment_file: Any, segment: Path) -> None:
        writer.close()
        segment_file.close()
        cmd = [sys.executable, "-m", "smartsched.audit.convert", str(segment)]
        done = subprocess.run(cmd + ([] if self.fsync else ["--no-fsync"]),
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise OSError(f"closing audit segment {segment.name} failed: "
                          f"{done.stderr.strip()[-500:]}")

    def _autoseal(self) -> None:
        while not self._stop.wait(min(0.25, self.block_seconds / 4)):
            with self._lock:
                if self._ts and time.monotonic() - self._opened >= self.block_seconds:
                    try:
                        self._seal()
                    except Exception as e:  # broken: callers see it at their next call
                        if self._broken is None:
                            self._broken = e
                        return

    @property
    def pending(self) -> int:
        """Records buffered, not yet sealed."""
        return len(self._ts)

    def close(self) -> None:
        """Seal what is buffered and close the open segment as Parquet."""
        self._stop.set()
        if self._sealer is not None:
            self._sealer.join()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._broken is None:
                self._seal()
                self._roll()
        self._io.shutdown(wait=True)
        self._heads.close()
        os.close(self._lockfd)  # releases the writer lock
        self._check()  # a failed write is an error the caller sees (its stream stays)

    def flush(self) -> None:
        """Seal what is buffered and wait until every sealed block is on disk."""
        with self._lock:
            self._seal()
            tasks = list(self._io_tasks)
        for f in tasks:
            f.exception()  # wait
        self._check()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
