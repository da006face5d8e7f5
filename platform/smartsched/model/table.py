"""Strict reading of tabular traces (CSV or Parquet) into typed numpy columns.

Owns the checks every trace loader shares: required columns present, numeric
columns numeric, integral where they must be, nothing negative. Each failure
names the column and the first bad data row (0-based, header excluded).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from smartsched.model.errors import ValidationError

if TYPE_CHECKING:
    import pandas as pd

# An integral column is cast to int64 after its checks; beyond 2**53 a float no longer
# holds every integer, and past 2**63 the cast wraps to a negative number.
MAX_INTEGRAL = float(2**53)


def read_frame(path: Path) -> pd.DataFrame:
    """Read a CSV or Parquet file with every column as text (CSV) so checks see raw values.

    A CSV's header names are stripped and its trailing rows of bare commas dropped; a
    file named .csv that is no text (Parquet, gzip, binary) is refused saying so."""
    import pandas as pd

    if path.is_dir():
        raise ValidationError("path", f"{path} is a directory, not a trace file")
    if path.exists() and not path.is_file():  # a FIFO, a device (/dev/zero, say)
        raise ValidationError("path", f"{path} is not a regular file")
    if not path.is_file():
        raise ValidationError("path", f"no such file: {path}{_data_dir_hint(path)}")
    csv = path.suffix != ".parquet"
    try:
        if not csv:
            # One named twice (after stripping) is refused here, where arrow would refuse
            # it unclearly.
            check_column_names(parquet_names(path), str(path))
            df = pd.read_parquet(path)
            df.columns = [str(c).strip() for c in df.columns]
        else:
            _check_text(path)
            df = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
            # " name , cpu_milli " is the header a hand-edited or aligned file has;
            # skipinitialspace strips only the spaces after each comma.
            df.columns = [str(c).strip() for c in df.columns]
    except (ValueError, OSError) as e:  # pandas' parser errors derive from ValueError
        if isinstance(e, ValidationError):
            raise
        if isinstance(e, UnicodeDecodeError):
            raise ValidationError("file", "not UTF-8 text (Latin-1? UTF-16?): save it as UTF-8",
                                  source=str(path)) from None
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValidationError("file", f"cannot parse: {first}", source=str(path)) from None
    check_shape(df, str(path), csv=csv)
    return _without_trailing_blank_rows(df) if csv else df


# Leading bytes of files a user may hand over named .csv, and what to tell them: the
# CSV reader's own words are a codec's "can't decode byte 0x8b" or a field count.
_NOT_CSV = (
    (b"PAR1", "a Parquet file, not CSV text: name it .parquet"),
    (b"\x1f\x8b", "gzip-compressed: decompress it first"),
    (b"PK\x03\x04", "a ZIP archive (a spreadsheet workbook?), not CSV text: export it as CSV"),
    (b"\xff\xfe", "UTF-16 text: save it as UTF-8"),
    (b"\xfe\xff", "UTF-16 text: save it as UTF-8"),
)


def _check_text(path: Path) -> None:
    """Refuse, saying what it is, a file named .csv that is no CSV text."""
    with path.open("rb") as f:
        head = f.read(4096)
    for magic, what in _NOT_CSV:
        if head.startswith(magic):
            raise ValidationError("file", what, source=str(path))
    if b"\x00" in head:
        raise ValidationError("file", "binary data (a NUL byte), not CSV text", source=str(path))


def _without_trailing_blank_rows(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` less the rows of empty cells at its end: a spreadsheet exports blank rows
    as bare commas, which pandas (unlike blank lines) reads as rows. One between rows of
    data stays, and is refused as the row it is."""
    if df.empty or len(df.columns) == 0 or any(str(v).strip() for v in df.iloc[-1]):
        return df  # the usual file: its last row holds data, nothing to scan
    blank = np.ones(len(df), dtype=bool)
    for col in df.columns:
        blank &= df[col].astype(str).str.strip().eq("").to_numpy(dtype=bool)
    filled = np.flatnonzero(~blank)
    return df.iloc[: int(filled[-1]) + 1 if len(filled) else 0]


def check_shape(df: pd.DataFrame, source: str, *, csv: bool) -> None:
    """Refuse what pandas reads without a word but a loader would misread: rows with more
    fields than the header (pandas makes the first fields an index, shifting every
    column by one: a trailing comma does it) and a column named twice (pandas renames
    the second ``x.1``, and the loader would use one of the two)."""
    import pandas as pd

    if csv and not isinstance(df.index, pd.RangeIndex):  # (Parquet may store an index)
        extra = df.index.nlevels
        raise ValidationError("file", f"rows have {extra} field(s) more than the header's "
                              f"{len(df.columns)} columns (a trailing comma?)", source=source)
    check_column_names([str(c) for c in df.columns], source, renamed=csv)


def parquet_names(path: str | Path) -> list[str]:
    """A Parquet file's column names, stripped as a CSV header's are: a tool that kept a
    CSV's spaced header wrote " cpu_milli " into the schema, which then read as a missing
    cpu_milli."""
    import pyarrow.parquet as pq

    return [str(c).strip() for c in pq.read_schema(path).names]


def check_column_names(names: Sequence[str], source: str, *, renamed: bool = False) -> None:
    """A column named twice (``renamed``: pandas' ``x.1`` for the second ``x`` counts)."""
    for i, name in enumerate(names):
        base, dot, n = name.rpartition(".")
        if name in names[:i]:
            raise ValidationError(name, "column appears twice in the header", source=source)
        if renamed and dot and n.isdigit() and base in names[:i]:
            raise ValidationError(base, "column appears twice in the header", source=source)


def _data_dir_hint(path: Path) -> str:
    """Where a missing public trace was looked for, so a user outside the development
    layout learns which setting moves it."""
    from smartsched.paths import DATA_DIR_ENV, data_dir

    root = data_dir()
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return ""
    return f" (public traces are read from ${DATA_DIR_ENV}, now {str(root)!r})"


def require_columns(df: pd.DataFrame, columns: Sequence[str], source: str) -> None:
    for col in columns:
        if col not in df.columns:
            have = ", ".join(map(str, df.columns))
            raise ValidationError(col, f"missing column (have: {have})", source=source)


def numeric_column(
    df: pd.DataFrame,
    col: str,
    source: str,
    *,
    integral: bool = False,
    allow_empty: bool = False,
    low: float = 0.0,
) -> np.ndarray:
    """Column ``col`` as float64 (NaN for empty cells when ``allow_empty``), validated."""
    import pandas as pd

    raw = df[col]
    if raw.dtype.kind in "mMb":  # Parquet: times and booleans would coerce to numbers
        raise ValidationError(col, f"expected numbers, the column holds {raw.dtype}",
                              source=source)
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values)
    if allow_empty:
        empty = (raw.isna() | raw.astype(str).str.strip().eq("")).to_numpy(dtype=bool)
        bad &= ~empty
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValidationError(
            col, f"not a number: {_shown(raw.iloc[row])}", row=row, source=source
        )
    finite = np.isfinite(values)
    below = finite & (values < low)
    if below.any():
        row = int(np.flatnonzero(below)[0])
        raise ValidationError(
            col, f"must be >= {low:g}, got {values[row]:g}", row=row, source=source
        )
    if integral:
        huge = finite & (np.abs(values) > MAX_INTEGRAL)
        if huge.any():
            row = int(np.flatnonzero(huge)[0])
            raise ValidationError(
                col, f"is absurdly large ({values[row]:g})", row=row, source=source
            )
        frac = finite & (np.mod(values, 1.0) != 0)
        if frac.any():
            row = int(np.flatnonzero(frac)[0])
            raise ValidationError(
                col, f"must be an integer, got {values[row]:g}", row=row, source=source
            )
    return values


def _shown(cell: object) -> str:
    """A bad cell as a user would write it ('' for an empty CSV cell, inf, [1])."""
    if isinstance(cell, str):  # cut as specs are: a 5,000-digit cell was a 5 KB line
        return repr(cell) if len(cell) <= 80 else repr(cell[:77] + "...")
    if isinstance(cell, np.ndarray):
        return repr(cell.tolist())[:80]
    return str(cell)[:80]


def text_column(df: pd.DataFrame, col: str, source: str | None = None) -> np.ndarray:
    """Column ``col`` as an object array of stripped strings ('' for missing); a cell that
    is no text (a Parquet list or struct, bytes that are not UTF-8) names its row."""
    raw = df[col]
    text = raw.astype(object).where(raw.notna(), "")  # a Parquet column of floats may be NaN
    cells = list(text)
    for row, cell in enumerate(cells):
        if isinstance(cell, bytes):
            try:
                cells[row] = cell.decode("utf-8")
            except UnicodeDecodeError:
                raise ValidationError(col, f"not UTF-8 text: {cell[:40]!r}", row=row,
                                      source=source) from None
        elif isinstance(cell, bool | np.bool_) or not isinstance(
                cell, str | int | float | np.integer | np.floating):  # True: a flag column
            raise ValidationError(col, f"expected text, got {_shown(cell)}", row=row,
                                  source=source)
    return np.array([str(c).strip() for c in cells], dtype=object)
