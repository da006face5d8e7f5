"""Grid carbon-intensity series (gCO2/kWh) attached to regions and edge sites.

Owns a regular time series and its lookup at simulation times, plus loaders
for the public traces under SMARTSCHED_DATA_DIR. Irregular sources are
resampled onto a fixed grid (mean per bin, gaps held) so lookups are one
vectorized index.

A series may also carry the grid's renewable share of generation (wind, solar,
hydro over all generation), where its source has the generation mix (the
California file). Where it does not (the German and British files hold
intensity only), ``renewable_at`` estimates the low-carbon share from the
intensity: ``1 - CI / fossil_g_per_kwh``, the share of generation that cannot
be fossil if the fossil part emits ``fossil_g_per_kwh`` (nuclear counts as
low-carbon there, so it is an upper estimate of the renewable share). The
default fossil intensity is IPCC AR5's life-cycle median for gas combined
cycle (490 g/kWh); a coal-heavy grid should set its own (coal: 820).
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from smartsched.model.errors import ValidationError
from smartsched.model.table import check_column_names

if TYPE_CHECKING:
    import pandas as pd

HOUR = 3600.0
# IPCC AR5 (WG3 annex III) life-cycle medians, gCO2eq/kWh: gas combined cycle, coal.
GAS_G_PER_KWH = 490.0
COAL_G_PER_KWH = 820.0
# The largest intensity a series may hold, g/kWh. The dirtiest generation (lignite) emits
# about 1,100-1,200 g/kWh at the plant and a grid average is below its dirtiest source, so
# a value several times that is a unit or export error (mg/kWh, a misplaced column),
# not a grid: refused rather than scored.
MAX_G_PER_KWH = 5000.0


@dataclass(frozen=True, slots=True, eq=False)
class CarbonSeries:
    """Carbon intensity sampled every ``step_s`` seconds, repeating after its end.
    Simulation time ``t`` reads the series at ``t + offset_s`` (a run may start at any
    point of a year-long series: ``with_offset``)."""

    values: np.ndarray  # gCO2/kWh, float64
    step_s: float = HOUR
    name: str = "synthetic"
    offset_s: float = 0.0
    # Renewable share of generation in [0, 1] at each step (None: estimated, see module).
    renewable: np.ndarray | None = None
    fossil_g_per_kwh: float = GAS_G_PER_KWH

    def __post_init__(self) -> None:
        v = np.asarray(self.values, dtype=np.float64)
        if v.ndim != 1 or v.size == 0:
            raise ValidationError("carbon.values", "must be a non-empty 1-D series")
        if not np.all(np.isfinite(v)) or np.any(v < 0) or np.any(v > MAX_G_PER_KWH):
            raise ValidationError("carbon.values",
                                  f"must be finite, >= 0 and <= {MAX_G_PER_KWH:g} g/kWh")
        if not (self.step_s > 0 and math.isfinite(self.step_s)):
            raise ValidationError("carbon.step_s", "must be a positive number")
        if not (isinstance(self.offset_s, int | float) and 0 <= self.offset_s < math.inf):
            raise ValidationError("carbon.offset_s", "must be a number >= 0")
        f = self.fossil_g_per_kwh
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0 < f <= MAX_G_PER_KWH:
            raise ValidationError("carbon.fossil_g_per_kwh",
                                  f"must be a number in (0, {MAX_G_PER_KWH:g}] g/kWh, got {f!r}")
        object.__setattr__(self, "values", v)
        if self.renewable is not None:
            r = np.asarray(self.renewable, dtype=np.float64)
            if r.shape != v.shape:
                raise ValidationError("carbon.renewable",
                                      f"must have one share per value ({v.size}), got {r.size}")
            if not np.all(np.isfinite(r)) or np.any(r < 0) or np.any(r > 1):
                raise ValidationError("carbon.renewable", "shares must be within [0, 1]")
            object.__setattr__(self, "renewable", r)

    def with_offset(self, offset_s: float) -> CarbonSeries:
        """The same series read from ``offset_s`` seconds into it."""
        return dataclasses.replace(self, offset_s=float(offset_s))

    def renewable_at(self, t: float | np.ndarray) -> np.ndarray | float:
        """Renewable share of generation at simulation time(s) ``t``: the series' own where
        it has one, else the low-carbon share estimated from intensity (module docstring)."""
        if self.renewable is not None:
            return self._read(self.renewable, t)
        ci = self.at(t)
        if isinstance(ci, float):
            return min(max(1.0 - ci / self.fossil_g_per_kwh, 0.0), 1.0)
        return np.clip(1.0 - ci / self.fossil_g_per_kwh, 0.0, 1.0)

    @property
    def span_s(self) -> float:
        return self.values.size * self.step_s

    def at(self, t: float | np.ndarray) -> np.ndarray | float:
        """Intensity at simulation time(s) ``t`` (seconds), wrapping around the series."""
        return self._read(self.values, t)

    def held_until(self, t: float) -> float:
        """A time up to which the value read at ``t`` holds: a millisecond short of the
        series' next step, so a reader that caches it never crosses a step (float rounding
        at the boundary costs only a re-read)."""
        return ((t + self.offset_s) // self.step_s + 1) * self.step_s - self.offset_s - 1e-3

    def _read(self, values: np.ndarray, t: float | np.ndarray) -> np.ndarray | float:
        """``values`` (one per step) at simulation time(s) ``t``, wrapping around."""
        if isinstance(t, (float, int)) and math.isfinite(t):  # per event: no array trip
            return float(values[int((t + self.offset_s) // self.step_s) % values.size])
        idx = ((np.asarray(t, dtype=np.float64) + self.offset_s) // self.step_s).astype(
            np.int64) % values.size
        out = values[idx]
        return float(out) if np.ndim(out) == 0 else out

    @staticmethod
    def constant(value: float) -> CarbonSeries:
        return CarbonSeries(np.array([value], dtype=np.float64), HOUR, f"constant:{value:g}")

    @staticmethod
    def diurnal(mean: float, amplitude: float, low_hour: float = 13.0) -> CarbonSeries:
        """A solar-shaped day: lowest at ``low_hour``, hourly steps."""
        hours = np.arange(24, dtype=np.float64)
        v = mean + amplitude * np.cos(2 * np.pi * (hours - low_hour - 12.0) / 24.0)
        return CarbonSeries(np.clip(v, 0.0, None), HOUR, f"diurnal:{mean:g}")


# Named public series: file under the data dir, time column, value column.
PUBLIC_SERIES: dict[str, tuple[str, str, str]] = {
    "ger-2020": ("carbon-intensity-letswaitawhile-2020/ger_ci.csv", "Time", "Carbon Intensity"),
    "gb-2020": ("carbon-intensity-letswaitawhile-2020/gb_ci.csv", "Time", "Carbon Intensity"),
    "ca-2022": ("carbon-intensity-sustaindc-eia-2022/CA_NG_avgCI.csv", "timestamp", "avg_CI"),
}
# Public series with a generation mix: (renewable columns, every generation column).
PUBLIC_MIX: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "ca-2022": (("WND", "SUN", "WAT"), ("WND", "SUN", "WAT", "OIL", "NG", "COL", "NUC", "OTH")),
}
# The fossil intensity each public grid's estimate uses where it has no mix: the IPCC
# medians weighted by the country's 2020 fossil generation (Germany: coal and lignite
# about 60 %, gas 40 %; Great Britain: gas about 95 %), not fitted to the files.
PUBLIC_FOSSIL: dict[str, float] = {
    "ger-2020": 0.6 * COAL_G_PER_KWH + 0.4 * GAS_G_PER_KWH,
    "gb-2020": 0.05 * COAL_G_PER_KWH + 0.95 * GAS_G_PER_KWH,
}


MAX_GAP_S = 3 * HOUR  # the longest span between two readings a loaded series may hold over


def _read_csv(path: Path) -> pd.DataFrame:
    """``path`` as a table; a missing, empty, unparsable or non-UTF-8 file is refused
    naming it, as :func:`smartsched.model.table.read_frame` does for traces."""
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ValidationError("file", "empty (no header row)", source=str(path)) from None
    except UnicodeDecodeError as e:
        raise ValidationError("file", f"not UTF-8 text: {e.reason} at byte {e.start}",
                              source=str(path)) from None
    except (ValueError, OSError) as e:  # pandas' parser errors derive from ValueError
        raise ValidationError("file", f"cannot read: {e}", source=str(path)) from None
    # A column named twice was read as its first (the second renamed ``x.1``), as a
    # trace's would be refused.
    check_column_names([str(c) for c in df.columns], str(path), renamed=True)
    return df


def load_carbon_csv(
    path: str | Path, time_column: str, value_column: str, step_s: float = 900.0,
    max_gap_s: float = MAX_GAP_S,
) -> CarbonSeries:
    """Load an irregular (time, intensity) CSV and resample to a fixed grid.

    Refused, naming the row: a bad timestamp, timestamps not increasing, a value that is
    not a number (other than empty), negative or above ``MAX_G_PER_KWH``, and a gap --
    more than ``max_gap_s`` between two readings, empty values not counting as readings.
    Shorter gaps (the California file's three empty hours, a 30-min hole in a 15-min
    series) hold the previous reading, as empty bins of the grid do. A file with fewer
    than two readings is refused too: one reading is not a series (it would repeat as a
    constant, hiding a truncated export).
    """
    import pandas as pd

    path = Path(path)
    df = _read_csv(path)
    for col in (time_column, value_column):
        if col not in df.columns:
            raise ValidationError(col, "missing column", source=str(path))
    if df.empty:
        raise ValidationError(value_column, "no rows", source=str(path))
    # True/false values were read as 1 and 0 g/kWh.
    if df[value_column].dtype.kind == "b":
        raise ValidationError(value_column, "true/false, not numbers", source=str(path))
    ts = _timestamps(df, time_column, path)
    raw = df[value_column]
    vals = pd.to_numeric(raw, errors="coerce")
    secs_all = (ts - ts.iloc[0]).dt.total_seconds().to_numpy()
    steps = np.diff(secs_all)
    back = np.flatnonzero(steps <= 0)
    if back.size:
        # Going back an hour at most is what a local clock does in autumn.
        dst = -HOUR <= steps[back[0]] <= 0 and not _has_offsets(df[time_column])
        raise ValidationError(time_column, "timestamps must increase" + (
            " (local time across a daylight-saving change? give UTC, or times with their "
            "offset, e.g. +01:00)" if dst else ""), row=int(back[0]) + 1, source=str(path))
    not_number = (vals.isna() & raw.notna() & (raw.astype(str).str.strip() != "")).to_numpy()
    if not_number.any():
        raise ValidationError(value_column, f"{raw.iloc[int(np.flatnonzero(not_number)[0])]!r} "
                              "is not a number", row=int(np.flatnonzero(not_number)[0]),
                              source=str(path))
    v = vals.fillna(0).to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(v) | (v < 0) | (v > MAX_G_PER_KWH))
    if bad.size:
        raise ValidationError(value_column, f"must be finite, >= 0 and <= {MAX_G_PER_KWH:g}"
                              f" g/kWh, got {vals.iloc[bad[0]]:g}", row=int(bad[0]),
                              source=str(path))
    keep = vals.notna().to_numpy()
    if not keep.any():
        raise ValidationError(value_column, "no numeric values", source=str(path))
    if keep.sum() < 2:
        raise ValidationError(value_column, "a single reading is not a series (need at "
                              "least 2)", source=str(path))
    rows = np.flatnonzero(keep)
    gaps = np.flatnonzero(np.diff(secs_all[rows]) > max_gap_s)
    if gaps.size:
        at = int(rows[gaps[0] + 1])
        raise ValidationError(value_column, f"a gap of {np.diff(secs_all[rows])[gaps[0]] / HOUR:g}"
                              f" h before this row (at most {max_gap_s / HOUR:g} h)", row=at,
                              source=str(path))
    grid = _resample(secs_all[keep], vals[keep].to_numpy(dtype=np.float64), step_s,
                     own_step=_own_step(secs_all))
    return CarbonSeries(grid, step_s, path.stem)


def _has_offsets(col: pd.Series) -> bool:
    """Whether a time column's text carries UTC offsets or a Z (its first value's)."""
    first = str(col.iloc[0]).strip() if len(col) else ""
    # After a time of day, so a date written 27-10-2024 is not read as one.
    return bool(re.search(r"\d:\d\d(:\d\d(\.\d+)?)?\s*([+-]\d\d:?\d\d|[Zz])$", first))


# Epoch numbers a time column may hold, told apart by magnitude: seconds from 1973 to
# 2286, milliseconds from 1973 to 2286. Anything else in a numeric column is ambiguous.
_EPOCH_S = (1e8, 1e10)
_EPOCH_MS = (1e11, 1e13)


def _timestamps(df: pd.DataFrame, column: str, path: Path) -> pd.Series:
    """``column`` as UTC timestamps: dates and times as text, or numbers since 1970 in
    seconds or milliseconds (as a Prometheus range query or a Unix tool writes them; which
    is told by their size, the same for the whole column). Refused,
    naming the row: text that is not a time, an empty time, numbers of neither size
    (pandas alone reads numbers as nanoseconds: a whole day in one bin)."""
    import pandas as pd

    col = df[column]
    if col.dtype.kind == "b":
        raise ValidationError(column, "true/false, not timestamps", source=str(path))
    if col.dtype.kind in "iuf":
        x = col.to_numpy(dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(x))
        if bad.size:
            raise ValidationError(column, "not a timestamp", row=int(bad[0]), source=str(path))
        in_s = (x >= _EPOCH_S[0]) & (x <= _EPOCH_S[1])
        unit, fits = ("s", in_s) if in_s[0] else (
            "ms", (x >= _EPOCH_MS[0]) & (x <= _EPOCH_MS[1]))  # the first row decides
        if fits.all():
            return pd.Series(pd.to_datetime(x, unit=unit, utc=True), index=col.index)
        odd = int(np.flatnonzero(~fits)[0])
        raise ValidationError(column, "numbers must all be seconds or all milliseconds since "
                              f"1970 (dates from 1973 on), got {x[odd]:g}", row=odd,
                              source=str(path))
    with warnings.catch_warnings():  # "could not infer format": the refusal below says it
        warnings.simplefilter("ignore", UserWarning)
        ts = pd.to_datetime(col, utc=True, errors="coerce")
    if ts.isna().any():
        raise ValidationError(column, "not a timestamp",
                              row=int(np.flatnonzero(ts.isna().to_numpy())[0]), source=str(path))
    return ts


def _own_step(secs_all: np.ndarray) -> float | None:
    """A file's own time between readings: the median over every row (rows with empty
    values are readings missed, not a longer step); None for a single row."""
    return float(np.median(np.diff(secs_all))) if secs_all.size > 1 else None


def _resample(secs: np.ndarray, v: np.ndarray, step_s: float, n: int | None = None,
              own_step: float | None = None) -> np.ndarray:
    """Time-weighted mean of the readings ``v`` (at ``secs`` from the first timestamp) per
    ``step_s`` bin: each reading holds until the next (a gap holds the reading before it),
    the last one for the series' own step (the median time between readings), so a
    series spans its readings times its step whatever the grid -- an hourly year is 8,760
    hours, and the same values at any resolution give the same grid. (Each bin's readings
    were averaged by count and the last reading held for one bin: an hourly day spanned
    23.25 h and drifted when it repeated, and readings every 10 minutes weighed 1/8 or 1/4
    of their hour by where they fell.) ``own_step``: the file's step (``_own_step`` of all
    its rows; default: from ``secs``). ``n`` bins (default: up to the last reading's end);
    past the readings the last value holds."""
    secs = np.asarray(secs, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if own_step is None:
        own_step = _own_step(secs) or step_s
    end = float(secs[-1]) + own_step
    if n is None:
        n = max(1, math.ceil(end / step_s - 1e-9))
    end = max(end, n * step_s)  # the last reading holds to the grid's end
    held = np.append(np.diff(secs), end - secs[-1])  # how long each reading is in force
    before = np.concatenate([[0.0], np.cumsum(v * held)])  # integral up to each reading

    def integral(x: np.ndarray) -> np.ndarray:
        i = np.clip(np.searchsorted(secs, x, side="right") - 1, 0, secs.size - 1)
        return before[i] + v[i] * (x - secs[i])

    edges = np.arange(n + 1, dtype=np.float64) * step_s
    at = integral(edges)
    return np.diff(at) / step_s


def load_generation_share(path: str | Path, time_column: str, share_of: Sequence[str],
                          total_of: Sequence[str], step_s: float, n: int) -> np.ndarray:
    """[n] share of generation from ``share_of`` columns over ``total_of`` columns, on the
    same grid as :func:`load_carbon_csv` (bins of ``step_s`` from the first timestamp).
    Refused, naming the column or row: a missing column, a value that is not a number
    or is negative, an hour with no generation at all; a file that is empty or not
    UTF-8, naming it."""
    import pandas as pd

    path = Path(path)
    df = _read_csv(path)
    for col in (time_column, *total_of):
        if col not in df.columns:
            raise ValidationError(col, "missing column", source=str(path))
    ts = _timestamps(df, time_column, path)
    raw = {col: df[col] for col in total_of}
    # A row with every generation column empty is a missing reading (held, as empty
    # intensities are); anything else must be numbers >= 0.
    missing = np.logical_and.reduce([r.isna().to_numpy() for r in raw.values()])
    gen = {}
    for col, r in raw.items():
        x = pd.to_numeric(r, errors="coerce").to_numpy(dtype=np.float64)
        bad = np.flatnonzero((~np.isfinite(x) | (x < 0)) & ~missing)
        if bad.size:
            raise ValidationError(col, "generation must be a number >= 0, got "
                                  f"{r.iloc[bad[0]]!r}", row=int(bad[0]), source=str(path))
        gen[col] = x[~missing]
    total = sum(gen[c] for c in total_of)
    empty = np.flatnonzero(total <= 0)
    if empty.size:
        raise ValidationError(total_of[0], "no generation in this row",
                              row=int(np.flatnonzero(~missing)[empty[0]]), source=str(path))
    share = sum(gen[c] for c in share_of) / total
    secs_all = (ts - ts.iloc[0]).dt.total_seconds().to_numpy()
    return np.clip(_resample(secs_all[~missing], share, step_s, n,
                             own_step=_own_step(secs_all)), 0.0, 1.0)


def load_public_series(name: str, data_dir: Path) -> CarbonSeries:
    """Load one of :data:`PUBLIC_SERIES` from ``data_dir``, with its renewable share where
    the file has the generation mix (:data:`PUBLIC_MIX`)."""
    if name not in PUBLIC_SERIES:
        raise ValidationError(
            "carbon", f"unknown series {name!r} (known: {', '.join(PUBLIC_SERIES)})"
        )
    rel, tcol, vcol = PUBLIC_SERIES[name]
    series = load_carbon_csv(data_dir / rel, tcol, vcol)
    renewable = None
    if name in PUBLIC_MIX:
        share_of, total_of = PUBLIC_MIX[name]
        renewable = load_generation_share(data_dir / rel, tcol, share_of, total_of,
                                          series.step_s, series.values.size)
    return CarbonSeries(series.values, series.step_s, name, renewable=renewable,
                        fossil_g_per_kwh=PUBLIC_FOSSIL.get(name, GAS_G_PER_KWH))


# Column names a grid series file's time column is found by, and words its intensity
# column's name holds (``Carbon Intensity``, ``avg_CI``, ``gCO2_per_kWh``, ``co2eq``...).
_TIME_NAMES = ("time", "timestamp", "datetime", "date", "date_time", "period", "utc",
               "datetime_utc", "time_utc", "start", "period_start")
_VALUE_WORDS = ("carbon", "intensity", "ci", "co2", "gco2", "co2eq", "gco2eq", "emissions")


def load_series(spec: str, data_dir: Path) -> CarbonSeries:
    """A grid series by its public name (:data:`PUBLIC_SERIES`, under ``data_dir``) or from
    a CSV file of one's own: ``FILE`` (its time column and its intensity column found by
    their names) or ``FILE:TIME_COLUMN:VALUE_COLUMN``. A file's series is named after the
    file and has no generation mix (its renewable share is estimated from intensity with
    the default fossil intensity; a site may set ``fossil_g_per_kwh``). Refused naming
    ``carbon``: a name that is neither; the file's own problems as :func:`load_carbon_csv`
    names them."""
    if spec in PUBLIC_SERIES:
        return load_public_series(spec, data_dir)
    path, tcol, vcol = series_file(spec)
    if tcol is None or vcol is None:
        tcol, vcol = _series_columns(path)
    series = load_carbon_csv(path, tcol, vcol)
    return dataclasses.replace(series, name=path.stem)


def series_file(spec: str) -> tuple[Path, str | None, str | None]:
    """(file, time column, value column) of a series given as a file (columns None: to
    be found)."""
    if Path(spec).is_file():  # a regular file (not a FIFO, not a device)
        return Path(spec), None, None
    if spec.count(":") >= 2:
        head, tcol, vcol = spec.rsplit(":", 2)
        if Path(head).is_file() and tcol and vcol:
            return Path(head), tcol, vcol
    raise ValidationError("carbon", f"unknown series {spec[:200]!r}: neither a public series "
                          f"({', '.join(PUBLIC_SERIES)}) nor a CSV file (FILE or "
                          "FILE:TIME_COLUMN:VALUE_COLUMN)")


def _series_columns(path: Path) -> tuple[str, str]:
    """(time column, intensity column) of a series file, found by their names; refused
    naming the columns when none or several could be meant."""
    import re

    import pandas as pd

    try:
        head = pd.read_csv(path, nrows=200)
    except (ValueError, OSError, UnicodeDecodeError):
        head = _read_csv(path)  # names the problem
    columns = [str(c) for c in head.columns]
    check_column_names(columns, str(path), renamed=True)

    def words(c: str) -> set[str]:
        return {w for w in re.split(r"[^a-z0-9]+", c.lower()) if w}

    times = [c for c in columns if c.strip().lower() in _TIME_NAMES
             or words(c) & {"time", "timestamp", "datetime", "date"}]
    if len(times) != 1:
        which = (f"several are named so: {', '.join(times)}" if times else
                 f"none of {', '.join(columns)} is named so")
        raise ValidationError("carbon", f"cannot tell which column is the time ({which[:300]}):"
                              " give FILE:TIME_COLUMN:VALUE_COLUMN", source=str(path))
    numeric = [c for c in columns if c != times[0]
               and pd.to_numeric(head[c], errors="coerce").notna().any()]
    named = [c for c in numeric if words(c) & set(_VALUE_WORDS)]
    # A named column empty in the rows read here (an export that starts with missing
    # readings) is still the one: its values are checked where the whole file is read.
    empty = [c for c in columns if c != times[0] and words(c) & set(_VALUE_WORDS)
             and head[c].isna().all()]
    values = named or empty or numeric
    if len(values) != 1:
        raise ValidationError("carbon", f"cannot tell which column is the carbon intensity "
                              f"(candidates: {', '.join(values)[:300] or 'none'}): give "
                              "FILE:TIME_COLUMN:VALUE_COLUMN", source=str(path))
    return times[0], values[0]
