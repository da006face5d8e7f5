"""Policy versions: every promoted policy kept, one current, a log of every verdict.

Owns the store continuous learning promotes into and operators roll back with
(issue 18). A store is a folder:

    versions/v0001/ ...      exported policies (``smartsched_policy.json`` + weights), as promoted
    candidates/<name>/ ...   policies staged for the learning loop's gate (``stage``)
    store.json               {"current": "v0002", "history": ["v0001", "v0002"]}
    log.jsonl                one line per event: add, stage, promote, refuse, rollback

Nothing is deleted: a rollback moves ``current`` back along ``history``. A
policy is loaded (``RLScheduler``, which reads no pickle) before it is added,
so a store only holds policies that load. ``store.json`` is replaced
atomically (write, fsync, rename): a crash leaves the old or the new pointer,
never half of one, and the serving side reads ``current`` at reload time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smartsched.model.errors import ValidationError
from smartsched.paths import read_regular_file

POINTER = "store.json"
LOG = "log.jsonl"
# A pointer is a few hundred bytes; the log a few hundred a promotion or rollback.
MAX_POINTER_BYTES = 16 << 20
MAX_LOG_BYTES = 256 << 20
CANDIDATES = "candidates"
VERSIONS = "versions"


class PolicyStore:
    """The versions of one policy, in ``root``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.versions_dir = self.root / VERSIONS

    # ------------------------------------------------------------ reading
    def is_store(self) -> bool:
        """Whether ``root`` holds a store: any of its files or folders. An empty or unrelated
        folder is not one (listing it would look like a store with nothing in it)."""
        return any((self.root / name).exists() for name in (POINTER, LOG, VERSIONS, CANDIDATES))

    def require(self) -> None:
        """Refuse a folder that is not a store (for commands that read one, not make one)."""
        if not self.is_store():
            raise ValidationError("store", f"{self.root}: not a policy store (no {POINTER}, "
                                  f"{LOG}, {VERSIONS}/ or {CANDIDATES}/ in it)")

    def _writable(self) -> None:
        """A store is made only in a new or empty folder: writing one into a folder of other
        files (a mistyped path, a policy folder) would mix the two."""
        if self.root.is_dir() and not self.is_store() and any(self.root.iterdir()):
            raise ValidationError("store", f"{self.root}: holds other files, not a policy "
                                  "store; give a new or empty folder, or an existing store")

    def check(self) -> None:
        """Before work that ends in writing here (the gate's episodes): a folder that is
        not a store, or a store whose pointer or log cannot be read, is refused now, not
        after the work. A current version whose folder is gone is named too."""
        self._writable()
        self.log()
        current = self._pointer().get("current")
        if current is not None and not (self.versions_dir / current).is_dir():
            raise ValidationError("store", f"{self.root}: its current version {current!r} "
                                  f"has no folder under {VERSIONS}/")

    def _pointer(self) -> dict[str, Any]:
        path = self.root / POINTER
        if not path.exists():
            return {"current": None, "history": []}
        text = _read_text(path, MAX_POINTER_BYTES)
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as e:  # not JSON, or nested too deep
            raise ValidationError("store", f"{path}: unreadable ({type(e).__name__})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("history"), list) \
                or not all(isinstance(v, str) for v in doc["history"]) \
                or not isinstance(doc.get("current"), str | None):
            raise ValidationError("store", f"{path}: not a policy store pointer")
        return doc

    def versions(self) -> list[str]:
        if not self.versions_dir.is_dir():
            return []
        found = [p.name for p in self.versions_dir.iterdir()
                 if p.is_dir() and re.fullmatch(r"v\d+", p.name)]
        return sorted(found, key=lambda v: int(v[1:]))

    def current(self) -> str | None:
        return self._pointer().get("current")

    def path_of(self, version: str | None = None) -> Path:
        """The folder of ``version`` (default: the current one)."""
        v = version or self.current()
        if v is None:
            raise ValidationError("store", f"{self.root}: no current policy version")
        if v not in self.versions():
            raise ValidationError("version", f"unknown version {v!r} in {self.root}")
        return self.versions_dir / v

    def log(self) -> list[dict[str, Any]]:
        """The events, oldest first; a line that is not one is named (file and line)."""
        path = self.root / LOG
        if not path.exists():
            return []
        lines = _read_text(path, MAX_LOG_BYTES).splitlines()
        events = []
        for no, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except (ValueError, RecursionError):
                event = None
            if not isinstance(event, dict) or not isinstance(event.get("event"), str):
                raise ValidationError("store", f"{path} line {no}: not a log event")
            events.append(event)
        return events

    def _loadable(self, version: str) -> Path:
        """The folder of ``version``, checked to load as ``add`` required: made current, a
        version whose files were damaged since would fail only when served."""
        from smartsched.rl.policy import RLScheduler

        path = self.path_of(version)
        RLScheduler(path)  # loads (no pickle) or raises a ValidationError naming it
        return path

    # ------------------------------------------------------------ writing
    def add(self, policy_dir: str | Path, note: dict[str, Any] | None = None) -> str:
        """Copy a loadable exported policy in as the next version (not made current)."""
        from smartsched.rl.policy import RLScheduler

        src = Path(policy_dir)
        self._writable()
        self._outside(src)
        RLScheduler(src)  # loads (no pickle) or raises a ValidationError naming it
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        existing = self.versions()
        version = f"v{(int(existing[-1][1:]) + 1) if existing else 1:04d}"  # numeric order
        tmp = _copy_policy(src, self.versions_dir, f".{version}-")
        try:
            os.replace(tmp, self.versions_dir / version)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._append({"event": "add", "version": version, "source": str(src), **(note or {})})
        return version

    def _outside(self, src: Path) -> None:
        """A policy folder that holds this store is refused before anything is made: its
        copy went on copying itself into itself until a path was too long (12 s), then
        left an empty folder behind."""
        inner, outer = self.root.resolve(), src.resolve()
        if inner == outer or outer in inner.parents:
            raise ValidationError("store", f"{self.root} is inside the policy folder "
                                  f"{src}: give a store outside it")

    def promote(self, version: str, figures: dict[str, Any] | None = None) -> str:
        """Make ``version`` current; the one before it stays in the history. Everything is
        checked before anything is written: a refused promotion changes nothing."""
        self._loadable(version)
        ptr = self._pointer()
        previous = ptr.get("current")
        history = [v for v in ptr["history"] if v != version] + [version]
        self._append({"event": "promote", "version": version, "previous": previous,
                      **({"gate": figures} if figures else {})},
                     then=lambda: self._write_pointer({"current": version,
                                                       "history": history}))
        return version

    def stage(self, policy_dir: str | Path) -> str:
        """Copy a loadable exported policy in as a candidate for the learning loop's next
        round (a policy trained elsewhere, e.g. by a ``smartsched train`` job); the loop
        gates it against the current version and promotes it only if it passes. The copy
        appears whole (written aside, then renamed), so the loop never reads half of one.
        Returns the candidate's name."""
        from smartsched.rl.policy import RLScheduler

        src = Path(policy_dir)
        self._writable()
        self._outside(src)
        RLScheduler(src)  # loads (no pickle) or raises a ValidationError naming it
        root = self.root / CANDIDATES
        root.mkdir(parents=True, exist_ok=True)
        label = re.sub(r"[^A-Za-z0-9_.-]", "_", src.resolve().name)[:40] or "policy"
        name = f"{time.strftime('%Y%m%dT%H%M%S')}-{time.time_ns() % 10**9:09d}-{label}"
        tmp = _copy_policy(src, root, f".{label}-")
        try:
            os.replace(tmp, root / name)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._append({"event": "stage", "candidate": name, "source": str(src)})
        return name

    def staged(self) -> list[Path]:
        """The staged candidates, oldest first (folders being written are skipped)."""
        root = self.root / CANDIDATES
        if not root.is_dir():
            return []
        return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def refuse(self, source: str, figures: dict[str, Any]) -> None:
        """Record a candidate the gate refused (kept out of the store)."""
        self._append({"event": "refuse", "source": source, "gate": figures})

    def rollback(self) -> str:
        """Make the version before the current one current again. The target is checked
        (it exists and loads) before anything is written: a refused rollback changes
        nothing."""
        self.require()
        ptr = self._pointer()
        history = list(ptr["history"])
        if len(history) < 2:
            raise ValidationError("store", f"{self.root}: no earlier version to roll back to")
        dropped = history.pop()
        self._loadable(history[-1])
        self._append({"event": "rollback", "version": history[-1], "from": dropped},
                     then=lambda: self._write_pointer({"current": history[-1],
                                                       "history": history}))
        return history[-1]

    def _write_pointer(self, doc: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".store-", dir=self.root)
        # mkstemp makes it 0600: a service running as another user could list the versions
        # but not read which is current. The pointer is as readable as the store's folder
        # (made under the umask; reading the umask itself would set it, process-wide).
        os.fchmod(fd, self.root.stat().st_mode & 0o444 | 0o200)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / POINTER)

    def record(self, event: dict[str, Any]) -> None:
        """Add an event of the caller's own (e.g. a learning round that failed) to the log."""
        self._append(event)

    def _append(self, event: dict[str, Any], then: Callable[[], None] | None = None) -> None:
        """Log ``event`` (written and fsynced). ``then`` -- the pointer's change the event
        records -- runs once the log is open for appending and before the line is written:
        a log that cannot be written (read-only, not a file) stops the change before it
        happens, and a change that fails is not logged as done."""
        self._writable()
        path = self.root / LOG
        if path.exists() and not path.is_file():  # a FIFO's open for appending waited
            why = "a directory" if path.is_dir() else "not a regular file"
            raise ValidationError("store", f"{path}: cannot be written ({why}); nothing "
                                  "changed")
        if path.is_file():
            self.log()  # a log with a line that is not an event is not appended to
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            f = open(self.root / LOG, "a", encoding="utf-8")  # noqa: SIM115 (the with below)
        except OSError as e:
            raise ValidationError("store", f"{self.root / LOG}: cannot be written "
                                  f"({e.strerror or type(e).__name__}); nothing changed") from None
        with f:
            if then is not None:
                then()
            f.write(json.dumps({"time": time.time(), **event}, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _read_text(path: Path, limit: int) -> str:
    """A store file's text; refused naming it when it is not a regular file (a FIFO was
    waited on for ever), too large, or not UTF-8."""
    try:
        return read_regular_file(path, limit).decode("utf-8")
    except OSError as e:
        raise ValidationError("store", f"{path}: {e.strerror or type(e).__name__}") from None
    except ValueError as e:  # not UTF-8 text
        raise ValidationError("store", f"{path}: unreadable ({type(e).__name__})") from None


def _copy_policy(src: Path, into: Path, prefix: str) -> Path:
    """A whole copy of the policy in ``src`` (an export, or a training output folder's
    ``policy/``), in a new hidden folder of ``into``, checked to load before it is
    returned. Its subfolders are copied too (the forecaster and telemetry projection an
    export carries: without them the stored version did not load); a link that leads out
    of the folder, or anything but files and folders (a FIFO, a device), is refused rather
    than followed (its target's bytes would land in the store)."""
    from smartsched.rl.policy import RLScheduler, resolve_policy_dir

    folder = resolve_policy_dir(src)
    root = folder.resolve()
    for top, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            path = Path(top) / name
            real = path.resolve()
            if not real.is_relative_to(root):
                raise ValidationError("scheduler", f"{path}: links outside the policy "
                                      "folder; nothing was added")
            if not (real.is_file() or real.is_dir()):
                raise ValidationError("scheduler", f"{path}: not a file or a folder; nothing "
                                      "was added")
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=into))
    try:
        try:
            shutil.copytree(folder, tmp, dirs_exist_ok=True)  # a link inside: its file's bytes
        except OSError as e:  # shutil.Error too: an unreadable file, a full disk
            raise ValidationError("scheduler", f"{folder}: cannot be copied into the store "
                                  f"({type(e).__name__}); nothing was added") from None
        RLScheduler(tmp)  # the copy loads as the source did, or nothing is added
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp
