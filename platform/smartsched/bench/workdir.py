"""A benchmark's own working folder: made by the benchmark, or refused.

Two benchmarks keep files in a folder the user may name (``bench serve
--state-dir``, ``bench audit --work-dir``) and clear their own leftovers from
it on the next run. The name is easily the wrong one: ``smartsched serve``
keeps its tokens and reservation journal under a ``--state-dir`` with the same
layout, and an audit log lives in a ``log/`` folder like the benchmark's. So
a benchmark works only in a folder that is new, empty, or marked as its own by
an earlier run of the same benchmark; anything else is refused before a file
is touched.
"""

from __future__ import annotations

from pathlib import Path

from smartsched.model.errors import ValidationError


def bench_dir(path: str | Path, bench: str, field: str) -> Path:
    """``path`` resolved and made if new, holding the marker of ``bench``; a folder that
    holds other files and no such marker is a ValidationError naming ``field``."""
    root = Path(path).resolve()
    marker = root / f".smartsched-bench-{bench}"
    if root.exists() and not root.is_dir():
        raise ValidationError(field, f"{path} is not a folder")
    if root.is_dir() and not marker.is_file() and any(root.iterdir()):
        raise ValidationError(field, f"{path} holds files this benchmark did not make (a "
                              "service's state or an audit log, perhaps), and the benchmark "
                              "clears what it finds there; give a new or empty folder")
    root.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return root
