"""Grid carbon-intensity series (gCO2/kWh) attached to regions and edge sites.

Owns a regular time series and its lookup at simulation times, plus loaders
for the public traces under SMARTSCHED_DATA_DIR. Irregular sources are
resampled onto a fixed grid (mean per bin, gaps held) so lookups are one
vectorized index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from smartsched.model.errors import ValidationError

HOUR = 3600.0


@dataclass(frozen=True, slots=True, eq=False)
class CarbonSeries:
    """Carbon intensity sampled every ``step_s`` seconds, repeating after its end.
    Simulation time ``t`` reads the series at ``t + offset_s`` (a run may start at any
    point of a year-long series: ``with_offset``)."""

    values: np.ndarray  # gCO2/kWh, float64
    step_s: float = HOUR
    name: str = "synthetic"
    offset_s: float = 0.0

    def __post_init__(self) -> None:
        v = np.asarray(self.values, dtype=np.float64)
        if v.ndim != 1 or v.size == 0:
            raise ValidationError("carbon.values", "must be a non-empty 1-D series")
        if not np.all(np.isfinite(v)) or np.any(v < 0):
            raise ValidationError("carbon.values", "must be finite and >= 0")
        if not (self.step_s > 0 and math.isfinite(self.step_s)):
            raise ValidationError("carbon.step_s", "must be a positive number")
        if not (isinstance(self.offset_s, int | float) and 0 <= self.offset_s < math.inf):
            raise ValidationError("carbon.offset_s", "must be a number >= 0")
        object.__setattr__(self, "values", v)

    def with_offset(self, offset_s: float) -> CarbonSeries:
        """The same series read from ``offset_s`` seconds into it."""
        return CarbonSeries(self.values, self.step_s, self.name, float(offset_s))

    @property
    def span_s(self) -> float:
        return self.values.size * self.step_s

    def at(self, t: float | np.ndarray) -> np.ndarray | float:
        """Intensity at simulation time(s) ``t`` (seconds), wrapping around the series."""
        if isinstance(t, (float, int)) and math.isfinite(t):  # per event: no array trip
            return float(self.values[int((t + self.offset_s) // self.step_s) % self.values.size])
        idx = ((np.asarray(t, dtype=np.float64) + self.offset_s) // self.step_s).astype(
            np.int64) % self.values.size
        out = self.values[idx]
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


MAX_GAP_S = 3 * HOUR  # the longest span between two readings a loaded series may hold over


def load_carbon_csv(
    path: str | Path, time_column: str, value_column: str, step_s: float = 900.0,
    max_gap_s: float = MAX_GAP_S,
) -> CarbonSeries:
    """Load an irregular (time, intensity) CSV and resample to a fixed grid.

    Refused, naming the row: a bad timestamp, timestamps not increasing, a value that is
    not a number (other than empty) or negative, and a gap -- more than ``max_gap_s``
    between two readings, empty values not counting as readings. Shorter gaps (the
    California file's three empty hours, a 30-min hole in a 15-min series) hold the
    previous reading, as empty bins of the grid do.
    """
    import pandas as pd

    path = Path(path)
    df = pd.read_csv(path)
    for col in (time_column, value_column):
        if col not in df.columns:
            raise ValidationError(col, "missing column", source=str(path))
    if df.empty:
        raise ValidationError(value_column, "no rows", source=str(path))
    ts = pd.to_datetime(df[time_column], utc=True, errors="coerce")
    raw = df[value_column]
    vals = pd.to_numeric(raw, errors="coerce")
    bad_time = ts.isna()
    if bad_time.any():
        row = int(np.flatnonzero(bad_time.to_numpy())[0])
        raise ValidationError(time_column, "not a timestamp", row=row, source=str(path))
    secs_all = (ts - ts.iloc[0]).dt.total_seconds().to_numpy()
    back = np.flatnonzero(np.diff(secs_all) <= 0)
    if back.size:
        raise ValidationError(time_column, "timestamps must increase", row=int(back[0]) + 1,
                              source=str(path))
    not_number = (vals.isna() & raw.notna() & (raw.astype(str).str.strip() != "")).to_numpy()
    if not_number.any():
        raise ValidationError(value_column, f"{raw.iloc[int(np.flatnonzero(not_number)[0])]!r} "
                              "is not a number", row=int(np.flatnonzero(not_number)[0]),
                              source=str(path))
    neg = np.flatnonzero((vals < 0).to_numpy() | ~np.isfinite(vals.fillna(0).to_numpy()))
    if neg.size:
        raise ValidationError(value_column, f"must be finite and >= 0, got {vals.iloc[neg[0]]}",
                              row=int(neg[0]), source=str(path))
    keep = vals.notna().to_numpy()
    if not keep.any():
        raise ValidationError(value_column, "no numeric values", source=str(path))
    rows = np.flatnonzero(keep)
    gaps = np.flatnonzero(np.diff(secs_all[rows]) > max_gap_s)
    if gaps.size:
        at = int(rows[gaps[0] + 1])
        raise ValidationError(value_column, f"a gap of {np.diff(secs_all[rows])[gaps[0]] / HOUR:g}"
                              f" h before this row (at most {max_gap_s / HOUR:g} h)", row=at,
                              source=str(path))
    secs = secs_all[keep]
    v = vals[keep].to_numpy(dtype=np.float64)
    bins = (secs // step_s).astype(np.int64)
    n = int(bins.max()) + 1
    sums = np.bincount(bins, weights=v, minlength=n)
    counts = np.bincount(bins, minlength=n)
    grid = np.full(n, np.nan)
    has = counts > 0
    grid[has] = sums[has] / counts[has]
    # hold last value across gaps (vectorized forward fill)
    idx = np.where(has, np.arange(n), 0)
    np.maximum.accumulate(idx, out=idx)
    grid = grid[idx]
    return CarbonSeries(grid, step_s, path.stem)


def load_public_series(name: str, data_dir: Path) -> CarbonSeries:
    """Load one of :data:`PUBLIC_SERIES` from ``data_dir``."""
    if name not in PUBLIC_SERIES:
        raise ValidationError(
            "carbon", f"unknown series {name!r} (known: {', '.join(PUBLIC_SERIES)})"
        )
    rel, tcol, vcol = PUBLIC_SERIES[name]
    series = load_carbon_csv(data_dir / rel, tcol, vcol)
    return CarbonSeries(series.values, series.step_s, name)
