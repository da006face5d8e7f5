"""Where a command may write a report or a figure, and how a report is written.

Owns the rules that keep an output option from destroying what is already stored:

- a report (``--json``) may replace an existing file only when that file is itself one
  JSON document -- an earlier report -- never a trace, a config, a key, an audit log's
  heads (JSON lines) or a Parquet segment;
- no output goes into a folder that holds a trained model (a policy, a forecaster, a
  telemetry projection), a policy store or an audit log, and no report replaces an audit
  log's signed heads: their files are JSON too, and a report written over one left a
  model that no longer loads, a store without its current version, a log whose truncation
  no longer shows (a link is judged by the file it points to);
- an output may not be the same file as one of the command's inputs (``simulate
  --workload pods.csv --json pods.csv`` replaced the trace with the report);
- a figure (``--plot``) needs a file name whose suffix names an image format matplotlib
  writes, checked before the work (a ``.txt`` failed after the whole run, and a name
  without a suffix was written to another path, ``name.png``).

Reports are written as strict JSON: NaN and infinity (an undefined median, a
percentile over no pods) become ``null``, numpy numbers plain numbers.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# The files that say a folder holds a trained model (what the training commands write).
MODEL_FILES = ("smartsched_policy.json", "module_spec.json", "forecaster.pt",
               "forecaster.json", "projection.json", "projection.npz")
# Image formats matplotlib writes, by suffix.
IMAGE_SUFFIXES = (".png", ".svg", ".svgz", ".pdf", ".jpg", ".jpeg", ".eps", ".ps", ".tif",
                  ".tiff", ".webp")
# An existing file this large is not an earlier report to replace.
MAX_REPLACEABLE_REPORT_BYTES = 256 << 20
# What says a folder holds a policy store (its pointer or its log, beside its versions or
# candidates: ``rl.versions``) or an audit log (its id file: ``audit.store``), and what a
# line of an audit log's signed heads carries (``audit.store.SignedHead``). Spelled here,
# as this module sits below both (tests/test_outputs_names.py holds them equal).
STORE_FILES = ("store.json", "log.jsonl")
STORE_FOLDERS = ("versions", "candidates")
AUDIT_LOG_FILE = "log_id"
HEAD_FIELDS = frozenset({"block", "first_seq", "last_seq", "root", "chain", "log_id", "sig"})


def model_folder_problem(path: str | Path, own: Iterable[str] = ()) -> str | None:
    """Why ``path``'s folder is no place for an output (it holds a trained model, a policy
    store or an audit log; for a link, the folder of the file it points to), or None.
    ``own``: model files the output itself writes (a retraining with ``--overwrite``
    replaces its own kind of model, never another kind)."""
    shown = str(path)[:200]
    mine = set(own)
    for parent in dict.fromkeys((Path(path).parent, Path(path).resolve().parent)):
        held = [f for f in MODEL_FILES if f not in mine and (parent / f).is_file()]
        if held:
            return (f"{str(parent)[:200]!r} holds a trained model ({held[0]}): write the "
                    "output elsewhere")
        if any((parent / f).is_file() for f in STORE_FILES) and any(
                (parent / d).is_dir() for d in STORE_FOLDERS):
            return (f"{str(parent)[:200]!r} is a policy store: write the output elsewhere"
                    + (f" ({shown!r} is a link into it)" if parent != Path(path).parent
                       else ""))
        if (parent / AUDIT_LOG_FILE).is_file():
            return (f"{str(parent)[:200]!r} holds an audit log ({AUDIT_LOG_FILE}): write "
                    "the output elsewhere")
    return None


def _signed_heads(p: Path) -> bool:
    """Whether ``p``'s first line reads as an audit log's signed head (its fields)."""
    try:
        with open(p, encoding="utf-8") as f:
            first = json.loads(f.readline(1 << 16))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(first, dict) and first.keys() >= HEAD_FIELDS


def report_path_problem(path: str | Path) -> str | None:
    """Why a JSON report may not be written at ``path``, or None: an existing file there
    must be one JSON document (an earlier report)."""
    if (why := model_folder_problem(path)) is not None:
        return why
    p = Path(path)
    if not p.exists():
        return None
    shown = str(path)[:200]
    if not p.is_file():
        return f"{shown!r} exists and is not a regular file"
    try:
        if p.stat().st_size > MAX_REPLACEABLE_REPORT_BYTES:
            raise ValueError
        with open(p, encoding="utf-8") as f:
            json.load(f)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return (f"{shown!r} exists and is not a JSON report (it would be replaced): give "
                "another path")
    if _signed_heads(p):
        return (f"{shown!r} holds an audit log's signed heads (it would be replaced): give "
                "another path")
    return None


def image_path_problem(path: str | Path) -> str | None:
    """Why a figure may not be written at ``path``, or None."""
    if (why := model_folder_problem(path)) is not None:
        return why
    suffix = Path(path).suffix.lower()
    if suffix not in IMAGE_SUFFIXES:
        named = f"{suffix!r} is not" if suffix else "no suffix names"
        return (f"{named} an image format (use one of "
                f"{', '.join(s[1:] for s in IMAGE_SUFFIXES)})")
    return None


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one existing file (links and spellings alike)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def input_paths(values: Iterable[Any]) -> list[str]:
    """The values among a command's parameters that name existing files (strings, or
    strings inside lists and tuples), and the files named inside specs: each
    comma-separated part, what follows a ``prefix:`` (``mixed:prof.yaml``,
    ``rl:models/p``) and what precedes a ``?`` (``lookahead:fgd?k=2``): ``--workload
    mixed:prof.json --json prof.json`` replaced the profile it had just read."""
    out: list[str] = []
    for v in values:
        items = v if isinstance(v, list | tuple) else (v,)
        for x in items:
            if not isinstance(x, str | Path) or not str(x):
                continue
            for cand in _spec_parts(str(x)):
                if _is_file(cand):
                    out.append(cand)
    return out


def _spec_parts(text: str) -> list[str]:
    """``text`` and the paths a spec may carry inside it (at most a few hundred)."""
    found = [text]
    for part in text.split(",")[:64]:
        for piece in (part, part.split("?", 1)[0]):
            found.append(piece)
            while ":" in piece:
                piece = piece.split(":", 1)[1]
                found.extend((piece, piece.split("?", 1)[0]))
    return list(dict.fromkeys(p.strip() for p in found if p.strip()))


def _is_file(x: str | Path) -> bool:
    try:
        return Path(x).is_file()
    except (OSError, ValueError):
        return False


def plain(doc: Any) -> Any:
    """``doc`` with what strict JSON cannot hold replaced: NaN and infinities by None,
    numpy scalars and arrays by Python numbers and lists, tuples by lists."""
    import numpy as np

    if isinstance(doc, dict):
        return {k if isinstance(k, str) else str(k): plain(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [plain(v) for v in doc]
    if isinstance(doc, np.ndarray):
        return [plain(v) for v in doc.tolist()]
    if isinstance(doc, np.generic):
        doc = doc.item()
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    return doc


def json_text(doc: Any) -> str:
    """``doc`` as strict JSON text (``plain``), indented, with a final newline."""
    return json.dumps(plain(doc), indent=2, allow_nan=False) + "\n"
