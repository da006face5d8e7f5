"""Where SmartSched finds shared data and writes its outputs.

Owns the resolution of ``SMARTSCHED_DATA_DIR`` (default ``../shared/data``
relative to the working directory, as laid out for development) so every
loader and test agrees on one location; and the single-writer lock the journal
and the audit log take on what they write.
"""

from __future__ import annotations

import contextvars
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DATA_DIR_ENV = "SMARTSCHED_DATA_DIR"


def data_dir() -> Path:
    """The public-trace root: ``$SMARTSCHED_DATA_DIR`` or ``../shared/data``."""
    return Path(os.environ.get(DATA_DIR_ENV, "../shared/data")).expanduser()


# The folder a relative scheduler reference is read from while a file that names it is
# being built (a split profile's routes): None for the working directory.
_RELATIVE_TO: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "smartsched_relative_to", default=None)


def user_path(path: str | Path) -> Path:
    """``path`` as the file being read means it: a relative path is taken from that
    file's folder while one is set (``relative_to``), else from the working directory."""
    p = Path(path).expanduser()
    base = _RELATIVE_TO.get()
    return p if base is None or p.is_absolute() else base / p


@contextmanager
def relative_to(folder: Path | None) -> Iterator[None]:
    """Relative references (``user_path``) are read from ``folder`` within this block
    (None: from the working directory)."""
    token = _RELATIVE_TO.set(folder)
    try:
        yield
    finally:
        _RELATIVE_TO.reset(token)


def read_regular_file(path: str | Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; an OSError (its
    strerror says why) for anything else: a FIFO would wait for a writer forever and
    /dev/zero never ends, where a user meant to name a file."""
    path = Path(path)
    if path.exists() and not path.is_file():
        why = "is a directory" if path.is_dir() else "not a regular file"
        raise OSError(errno.EINVAL, why, str(path))
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit:,} bytes", str(path))
    return data


def lock_exclusive(path: Path, wait_s: float) -> int | None:
    """An exclusive lock on ``path`` (created 0600): its descriptor (closing it releases
    the lock), or None when another holder keeps it for ``wait_s`` (a restarting
    process's predecessor may take a moment to exit)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.1)
