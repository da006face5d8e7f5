"""A site's durable journal: reservations survive a replica restart.

Owns the on-disk record of one site's reservations: an append-only JSON-lines
file (``<site>.jsonl``) with one event per change -- ``reserve`` (pods, nodes,
devices, expiry, request id), ``confirm``, ``release`` -- written and fsynced
before the answer leaves the site, so an acknowledged reservation is never
lost and a released one never comes back. A request's events are one group
(``group()``): written together and fsynced once, before its answer leaves --
a 500-pod batch costs one fsync, not 500 (group commit; the guarantee is the
same, since no answer leaves before its group is on disk). On start the site
replays it; when
the file grows past ``compact_after`` events, and past twice the live state it
was last rewritten with, it is rewritten as the live reservations only (write to
a temp file, fsync, atomic rename): a live state larger than ``compact_after``
does not make every event rewrite the whole file.

The journal is private to one service instance: its directory is created 0700
and its files 0600 (reservations name tenants and pods), and an exclusive lock
on ``<site>.lock`` makes a second instance pointed at the same directory fail
at start instead of sharing (and corrupting) the first one's reservations.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

from smartsched.model.errors import SmartSchedError
from smartsched.model.pod import Pod, UsageProfile
from smartsched.paths import lock_exclusive

_POD_FIELDS = tuple(f.name for f in fields(Pod))
_USAGE_FIELDS = tuple(f.name for f in fields(UsageProfile))

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


class JournalInUse(SmartSchedError):
    """Another live process holds this site's journal."""


def _open_private(path: Path, mode: str) -> Any:
    """``path`` opened with ``mode``, created 0600 if new (never wider than the umask)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, PRIVATE_FILE), mode, encoding="utf-8")


def _lock(path: Path, wait_s: float) -> int:
    """An exclusive lock on ``path``, waiting up to ``wait_s``; JournalInUse when held."""
    fd = lock_exclusive(path, wait_s)
    if fd is None:
        raise JournalInUse(
            f"the journal {path.with_suffix('.jsonl')} is in use by another service "
            "instance; give each instance its own journal_dir (--state-dir)")
    return fd


def _plain(x: Any) -> Any:
    """A value ``json`` does not write (a numpy scalar in an answer) as one it does."""
    item = getattr(x, "item", None)
    return item() if callable(item) else str(x)


def _line(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"), default=_plain) + "\n"


def pod_to_dict(pod: Pod) -> dict[str, Any]:
    """Every field of ``pod`` as JSON-ready values. Field by field rather than
    ``dataclasses.asdict``, whose deep copy cost more than the placement itself in a
    large batch (the fields are scalars and tuples of scalars: nothing to copy)."""
    d = {k: getattr(pod, k) for k in _POD_FIELDS}
    d["pod_class"] = str(pod.pod_class)
    d["usage"] = {k: getattr(pod.usage, k) for k in _USAGE_FIELDS}
    d["usage"]["kind"] = str(pod.usage.kind)
    return d


def pod_from_dict(d: dict[str, Any]) -> Pod:
    d = dict(d)
    d["usage"] = UsageProfile(**d["usage"])
    for k in ("gpu_models", "tolerations", "allowed_regions"):
        d[k] = tuple(d[k])
    for k in ("node_selector", "image_layers"):
        d[k] = tuple(tuple(x) for x in d.get(k, ()))
    return Pod(**d)


class Journal:
    def __init__(self, path: Path, fsync: bool = True, compact_after: int = 10_000,
                 lock_wait_s: float = 10.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        self._lock_fd = _lock(self.path.with_suffix(".lock"), lock_wait_s)
        self.fsync = fsync
        self.compact_after = compact_after
        self.events = sum(1 for _ in self._lines()) if self.path.exists() else 0
        self.live = 0  # events the last rewrite wrote (the live state then)
        self._f = _open_private(self.path, "a")
        self.fsyncs = 0  # how many times the file was fsynced (benchmarks, tests)
        self._pending: list[str] | None = None  # lines of the open group
        self._depth = 0

    def _lines(self) -> Iterator[str]:
        with self.path.open(encoding="utf-8") as f:
            yield from f

    def replay(self) -> Iterator[dict[str, Any]]:
        """Events in order; a torn last line (a crash mid-write) is ignored."""
        if not self.path.exists():
            return
        for line in self._lines():
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue

    def append(self, event: dict[str, Any]) -> None:
        """Record ``event``: on disk (fsynced) when this returns, or, inside ``group()``,
        when the outermost group ends."""
        line = _line(event)
        self.events += 1
        if self._pending is not None:
            self._pending.append(line)
            return
        self._write(line)

    @contextmanager
    def group(self) -> Iterator[None]:
        """Events appended inside are written and fsynced once, when the outermost group
        ends -- also when it ends by an exception, since what was applied before it must
        be recorded. The caller answers after the group: its answer never leaves before
        its events are durable."""
        self._depth += 1
        if self._depth == 1:
            self._pending = []
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                lines, self._pending = self._pending, None
                if lines:
                    self._write("".join(lines))

    def _write(self, text: str) -> None:
        self._f.write(text)
        self._f.flush()
        if self.fsync:
            os.fsync(self._f.fileno())
            self.fsyncs += 1

    def needs_compaction(self) -> bool:
        """Past ``compact_after`` events and twice the last rewrite's: compaction costs the
        live state's size, so it runs once per as many events, whatever that size."""
        return self.events > max(self.compact_after, 2 * self.live)

    def rewrite(self, events: list[dict[str, Any]]) -> None:
        """Replace the journal by ``events`` (the live state), atomically. The lines of an
        open group are dropped: the live state already holds what they record."""
        tmp = self.path.with_suffix(".tmp")
        with _open_private(tmp, "w") as f:
            for e in events:
                f.write(_line(e))
            f.flush()
            os.fsync(f.fileno())
        self._f.close()
        os.replace(tmp, self.path)
        self._f = _open_private(self.path, "a")
        self.events = self.live = len(events)
        if self._pending is not None:
            self._pending = []

    def close(self) -> None:
        self._f.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = -1
