"""A site's carbon outlook in simulation time: the forecast a scheduler may plan on.

Owns turning a site's grid series (``model.carbon.CarbonSeries``, read at ``t +
offset_s`` and repeating after its end, as the twin's metrics read it) into the
intensity expected for the coming hours at simulation time ``t``: the forecast
table's row for the last completed hour (``carbon.forecast``: readings up to then
only). A series shorter than the forecaster's warm-up (a synthetic day) is
forecast by seasonal naive over its own repetitions; the forecaster's first weeks
fall back to seasonal naive too; an hour with no forecast at all reads 0 (no
preference: the pod runs when it can).
"""

from __future__ import annotations

import hashlib

import numpy as np

from smartsched.carbon.forecast import (
    DAY,
    WEEK,
    ahead,
    hourly,
    lag_regression,
    seasonal_naive,
)
from smartsched.model.carbon import CarbonSeries

HORIZON_H = 48
_CACHE: dict[tuple[str, int, float, str], SiteOutlook] = {}


class SiteOutlook:
    """Expected intensity of one site's grid for the hours ahead."""

    def __init__(self, series: CarbonSeries, horizon: int = HORIZON_H) -> None:
        self.series = series
        y = hourly(series) if series.span_s >= 3600.0 else np.full(24, series.values[0])
        self.n = y.size
        if y.size >= WEEK + 30 * DAY:
            self.rows = lag_regression(y, horizon).rows
            naive = seasonal_naive(y, horizon).rows
            self.rows = np.where(np.isfinite(self.rows), self.rows, naive)
            self._shift = 0
        else:  # short (synthetic) series: it repeats, so its past is itself
            reps = -(-(WEEK + horizon) // y.size) + 1
            self.rows = seasonal_naive(np.tile(y, reps), horizon).rows
            self._shift = (reps - 1) * y.size

    def expected(self, t_s: float, hours: int) -> np.ndarray:
        """Expected intensity of the ``hours`` hours from the one containing ``t_s``,
        forecast at the end of the hour before it."""
        k = int((t_s + self.series.offset_s) // 3600.0) % self.n
        return ahead(self.rows[self._shift + (k - 1) % self.n], hours)


_BY_ARRAY: dict[int, tuple[np.ndarray, float, SiteOutlook]] = {}


def outlook(series: CarbonSeries) -> SiteOutlook:
    """The outlook of ``series``, built once per distinct series in a process (forecasting
    a year of a real grid takes seconds); a scheduler asks per decision, so the same
    array and offset are answered without hashing the series again."""
    hit = _BY_ARRAY.get(id(series.values))
    if hit is not None and hit[0] is series.values and hit[1] == series.offset_s:
        return hit[2]
    view = _outlook(series)
    _BY_ARRAY[id(series.values)] = (series.values, series.offset_s, view)
    return view


def _outlook(series: CarbonSeries) -> SiteOutlook:
    digest = hashlib.blake2b(series.values.tobytes(), digest_size=16).hexdigest()
    key = (series.name, series.values.size, series.step_s, digest)
    cached = _CACHE.get(key)
    if cached is None:
        cached = _CACHE[key] = SiteOutlook(CarbonSeries(series.values, series.step_s,
                                                        series.name))
    view = SiteOutlook.__new__(SiteOutlook)  # the same forecasts, this series' offset
    view.__dict__.update(cached.__dict__)
    view.series = series
    return view


# id(series.renewable) -> (that array, its offset, the share as a series of its own)
_RENEWABLE: dict[int, tuple[np.ndarray, float, CarbonSeries]] = {}


def expected_renewable(series: CarbonSeries, t_s: float, hours: int) -> np.ndarray:
    """[hours] expected renewable share of ``series``' grid for the hours from the one
    containing ``t_s``, forecast from its past only, as the intensity is: the forecast of
    the grid's own share where the series has one, else the low-carbon share estimated
    from the forecast intensity (``CarbonSeries.renewable_at``'s rule)."""
    if series.renewable is None:
        ci = outlook(series).expected(t_s, hours)
        return np.clip(1.0 - ci / series.fossil_g_per_kwh, 0.0, 1.0)
    hit = _RENEWABLE.get(id(series.renewable))
    if hit is None or hit[0] is not series.renewable or hit[1] != series.offset_s:
        if len(_RENEWABLE) > 64:
            _RENEWABLE.clear()
        share = CarbonSeries(series.renewable, series.step_s, f"{series.name}:renewable",
                             series.offset_s)
        hit = _RENEWABLE[id(series.renewable)] = (series.renewable, series.offset_s, share)
    return np.clip(outlook(hit[2]).expected(t_s, hours), 0.0, 1.0)
