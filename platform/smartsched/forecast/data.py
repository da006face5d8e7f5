"""Load-series data: long-format tables, the Google 2011 loader, and splits by series.

Owns getting utilization series into one shape -- a long table of
``series_id, timestamp (s), value`` per target, the format a Prometheus
export gives -- and splitting them into train / validation / test by series
id (whole series go to one split; time is never shuffled, so no test
machine's values are seen in training).

``Series`` holds one machine's regularly sampled values for every target;
gaps are refused rather than interpolated silently. Values are utilization
in percent of a machine (the Google file; the node predictor feeds the same):
a negative value, or one above ``MAX_UTIL_PCT``, is refused naming the row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from smartsched.model.errors import ValidationError
from smartsched.model.table import check_shape

GOOGLE_FILE = "google2011-vm-utilization/gcd_vm_cpu_mem_5min.csv"
GOOGLE_COLUMNS = ("vm_file", "job_id", "day", "step", "cpu_util_pct", "mem_util_pct")
LONG_COLUMNS = ("series_id", "timestamp")
# The largest utilization (%) a value may hold. Real data stays far below it: the Google
# file peaks at 131 % memory, and even percent of one core on a host of a few hundred
# cores stays under 100,000. Far larger values are a unit or export error, and the
# float32 the models compute in turns them into inf and every metric into nan.
MAX_UTIL_PCT = 1e5


@dataclass(frozen=True)
class Series:
    """One machine: ``values[t, k]`` for target ``targets[k]`` at ``start_s + t * step_s``."""

    id: str
    start_s: float
    step_s: float
    targets: tuple[str, ...]
    values: np.ndarray  # [T, K] float32

    def __len__(self) -> int:
        return int(self.values.shape[0])


def _read_table(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise ValidationError("data", f"{path} is a folder, not a CSV or Parquet file"
                              if path.is_dir() else f"not a regular file: {path}"
                              if path.exists() else f"no such file: {path}")
    if path.suffix == ".parquet":
        try:
            return pd.read_parquet(path)
        except (OSError, ValueError, pa.ArrowException) as e:
            raise ValidationError("data", f"{path}: not a readable Parquet file: {e}") from None
    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ValidationError("data", f"{path}: empty file (no header row)") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ValidationError("data", f"{path}: not a readable CSV: {e}") from None
    # A column named twice came back as a second target ``x.1``; rows longer than the
    # header shifted every column by one.
    check_shape(df, str(path), csv=True)
    return df


def _require(df: pd.DataFrame, cols: Sequence[str], source: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        have = ", ".join(map(str, df.columns))
        raise ValidationError(missing[0], f"missing column (have: {have})", source=source)


def _numeric(df: pd.DataFrame, col: str, source: str) -> np.ndarray:
    if df[col].dtype.kind == "b":  # True/False cells would be read as 1 and 0
        raise ValidationError(col, "expected numbers, the column holds true/false",
                              source=source)
    vals = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(vals))
    if bad.size:
        cell = df[col].iloc[bad[0]]
        shown = repr(cell)[:80] if isinstance(cell, str) else str(cell)[:80]
        raise ValidationError(col, f"not a finite number: {shown}",
                              row=int(bad[0]), source=source)
    return vals


def _seconds(df: pd.DataFrame, col: str, source: str) -> np.ndarray:
    """Column ``col`` as epoch seconds. A typed timestamp (a datetime column, as
    pandas writes one to Parquet, in whatever unit and time zone) is converted by its
    own unit: read as a plain number it would be micro- or nanoseconds and look like
    a series sampled once every few years."""
    kind = df[col].dtype.kind
    if kind == "M":
        t = pd.to_datetime(df[col], utc=True)
        return _finite((t - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1),
                       df[col], col, source)
    if kind == "m":
        return _finite(df[col] / pd.Timedelta(seconds=1), df[col], col, source)
    return _numeric(df, col, source)


def _finite(secs: pd.Series, raw: pd.Series, col: str, source: str) -> np.ndarray:
    vals = secs.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = np.flatnonzero(~np.isfinite(vals))
    if bad.size:
        raise ValidationError(col, f"not a time: {raw.iloc[bad[0]]!r}", row=int(bad[0]),
                              source=source)
    return vals


def _utilization(df: pd.DataFrame, col: str, source: str) -> np.ndarray:
    """Column ``col`` as numbers within [0, ``MAX_UTIL_PCT``]: utilization is never
    negative, and an absurd value would turn the float32 models' figures into nan."""
    vals = _numeric(df, col, source)
    bad = np.flatnonzero((vals < 0) | (vals > MAX_UTIL_PCT))
    if bad.size:
        raise ValidationError(col, f"utilization must be within [0, {MAX_UTIL_PCT:g}] %, "
                              f"got {vals[bad[0]]:g}", row=int(bad[0]), source=source)
    return vals


def _whole(df: pd.DataFrame, col: str, source: str, lo: int, hi: int) -> np.ndarray:
    """Column ``col`` as whole numbers within [lo, hi]."""
    vals = _numeric(df, col, source)
    bad = np.flatnonzero((vals != np.round(vals)) | (vals < lo) | (vals > hi))
    if bad.size:
        raise ValidationError(col, f"must be a whole number within [{lo}, {hi}], got "
                              f"{vals[bad[0]]:g}", row=int(bad[0]), source=source)
    return vals.astype(np.int64)


def series_from_long(df: pd.DataFrame, targets: Sequence[str], source: str = "table",
                     step_s: float | None = None) -> list[Series]:
    """Series from a long table ``series_id, timestamp, <targets...>``.

    Each series must be regularly sampled (one step, inferred as the most common
    gap unless given) without gaps or duplicate timestamps, and its values must be
    utilization within [0, ``MAX_UTIL_PCT``] %.
    """
    _require(df, [*LONG_COLUMNS, *targets], source)
    if df.empty:
        raise ValidationError("data", "no rows (a header only?)", source=source)
    ts = _seconds(df, "timestamp", source)
    vals = np.stack([_utilization(df, t, source) for t in targets], axis=1)
    ids = df["series_id"]
    missing = np.flatnonzero((ids.isna() | ids.astype(object).map(str).str.strip().eq(""))
                             .to_numpy(dtype=bool))
    if missing.size:  # (an empty cell reached the sort as a float among strings)
        raise ValidationError("series_id", "empty", row=int(missing[0]), source=source)
    sid = ids.astype(object).map(str).to_numpy()
    order = np.lexsort((ts, sid))
    sid, ts, vals = sid[order], ts[order], vals[order]
    cuts = np.flatnonzero(sid[1:] != sid[:-1]) + 1
    out = []
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(sid)], strict=True):
        t = ts[a:b]
        if b - a < 2:
            raise ValidationError("timestamp", f"series {sid[a]!r} has a single point",
                                  source=source)
        gaps = np.diff(t)
        step = step_s or float(pd.Series(gaps).mode().iloc[0])
        if step <= 0 or not np.allclose(gaps, step):
            bad = int(np.flatnonzero(~np.isclose(gaps, step))[0]) if step > 0 else 0
            raise ValidationError("timestamp", f"series {sid[a]!r} is not regular at "
                                  f"{t[bad]:.0f} s (step {step:.0f} s, gap {gaps[bad]:.0f} s)",
                                  source=source)
        out.append(Series(str(sid[a]), float(t[0]), step, tuple(targets),
                          vals[a:b].astype(np.float32)))
    return out


def load_long(path: str | Path, targets: Sequence[str] | None = None) -> list[Series]:
    """A long-format CSV or Parquet; targets default to every column but id and time."""
    path = Path(path)
    df = _read_table(path)
    _require(df, LONG_COLUMNS, str(path))
    tg = list(targets) if targets else [c for c in df.columns if c not in LONG_COLUMNS]
    if not tg:
        raise ValidationError("value", "no value column besides series_id and timestamp",
                              source=str(path))
    return series_from_long(df, tg, str(path))


def load_google2011(path: str | Path, chain_days: bool = True) -> list[Series]:
    """The shared Google 2011 VM file: CPU and memory %, 5-minute steps.

    With ``chain_days`` a job's consecutive days form one series (the file's
    README measured the day boundaries as contiguous); a job whose days have a
    hole is split at it. Without it every (job, day) is its own 288-step series.
    """
    path = Path(path)
    df = _read_table(path)
    _require(df, GOOGLE_COLUMNS, str(path))
    # A day of 1.5 or a step of 2.7 was truncated to 1 and 2 without a word, and a step of
    # 1e20 wrapped around int64: each is refused naming the row.
    day = _whole(df, "day", str(path), 1, 100_000)
    step = _whole(df, "step", str(path), 0, 86_400 // 300 - 1)
    job = df["job_id"].astype(str).to_numpy()
    long = pd.DataFrame({
        "timestamp": (day - 1) * 86_400 + step * 300,
        "cpu": _utilization(df, "cpu_util_pct", str(path)),
        "mem": _utilization(df, "mem_util_pct", str(path)),
    })
    if chain_days:
        # A new series starts where a job's day does not follow the previous one.
        frame = pd.DataFrame({"job": job, "day": day}).drop_duplicates().sort_values(
            ["job", "day"])
        frame["run"] = (frame.groupby("job")["day"].diff() != 1).cumsum()
        run_of = dict(zip(zip(frame["job"], frame["day"], strict=True), frame["run"],
                          strict=True))
        long["series_id"] = [f"job{j}-r{run_of[(j, d)]}" for j, d in zip(job, day,
                                                                        strict=True)]
    else:
        long["series_id"] = [f"job{j}-d{d}" for j, d in zip(job, day, strict=True)]
    return series_from_long(long, ["cpu", "mem"], str(path), step_s=300.0)


def job_key(series_id: str) -> str:
    """The job a series belongs to (``job<id>-r<run>`` / ``job<id>-d<day>`` -> ``job<id>``;
    any other id is its own job)."""
    return series_id.split("-r")[0].split("-d")[0]


@dataclass(frozen=True)
class Split:
    train: list[Series]
    val: list[Series]
    test: list[Series]


def split_by_series(series: Sequence[Series], val_frac: float = 0.15, test_frac: float = 0.15,
                    seed: int = 0, group: str = "job") -> Split:
    """Whole series to one split, by a seeded hash of their group (``job`` keeps all
    series of one Google job together, so no job is seen in both train and test)."""
    if not (0 <= val_frac < 1 and 0 <= test_frac < 1 and val_frac + test_frac < 1):
        raise ValidationError("split", "val_frac + test_frac must be < 1, each >= 0")

    def key(s: Series) -> str:
        return job_key(s.id) if group == "job" else s.id

    def u(s: Series) -> float:
        h = hashlib.sha256(f"{seed}:{key(s)}".encode()).digest()
        return int.from_bytes(h[:8], "big") / 2**64

    out: dict[str, list[Series]] = {"train": [], "val": [], "test": []}
    for s in series:
        x = u(s)
        part = "test" if x < test_frac else "val" if x < test_frac + val_frac else "train"
        out[part].append(s)
    return Split(out["train"], out["val"], out["test"])
