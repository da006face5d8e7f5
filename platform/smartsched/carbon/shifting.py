"""Temporal shifting: deferrable jobs run in the hours forecast to be cleanest, by
their deadline.

Owns three ways to run a job that may wait (arrival, hours of work, deadline, power),
on an hourly grid, and the carbon each emits (location-based: the energy of each hour
times the grid's average intensity in that hour):

- ``agnostic``: from arrival, without a pause (what a carbon-blind scheduler does);
- ``oracle``: the perfect-knowledge bound for the same job -- the cheapest hours
  before the deadline (interruptible) or the cheapest window (not) -- reading the
  future, so it is a bound, never a policy;
- ``forecast``: decided hour by hour at the start of each hour from the forecast
  table row of the hour before (readings of hours ``< t`` only): an interruptible job
  runs this hour if it is among the cheapest forecast hours it still needs before its
  deadline; one that cannot pause starts when the window starting now is the
  cheapest forecast window. Either runs unconditionally once the hours left equal the
  work left, so no deadline is ever missed, whatever the forecast says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smartsched.carbon.forecast import ForecastTable, ahead
from smartsched.model.errors import ValidationError


@dataclass(frozen=True, slots=True)
class Job:
    """A deferrable job on the hourly grid: it may run in hours ``arrival ..
    deadline - 1`` and needs ``work`` of them."""

    arrival: int
    work: int
    deadline: int
    power_kw: float = 1.0
    interruptible: bool = True

    def __post_init__(self) -> None:
        for name in ("arrival", "work", "deadline"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
                raise ValidationError(f"job.{name}", f"must be an integer >= 0, got {v!r}")
        if self.work < 1:
            raise ValidationError("job.work", "must be at least one hour")
        if self.deadline - self.arrival < self.work:
            raise ValidationError("job.deadline", "leaves less time than the work needs")
        if not (isinstance(self.power_kw, int | float) and 0 < self.power_kw < np.inf):
            raise ValidationError("job.power_kw", "must be a positive number")


def agnostic(job: Job) -> np.ndarray:
    return np.arange(job.arrival, job.arrival + job.work)


def oracle(job: Job, y: np.ndarray) -> np.ndarray:
    """The cleanest hours (or window) before the deadline, knowing the true intensity."""
    _check_span(job, y.size)
    span = y[job.arrival:job.deadline]
    if job.interruptible:
        return np.sort(job.arrival + np.argsort(span, kind="stable")[:job.work])
    start = int(np.argmin(_window_sums(span, job.work)))
    return np.arange(job.arrival + start, job.arrival + start + job.work)


def forecast(job: Job, table: ForecastTable) -> np.ndarray:
    """The hours the forecast-driven policy runs ``job`` in (see the module docstring)."""
    _check_span(job, table.rows.shape[0])
    run: list[int] = []
    left = job.work
    t = job.arrival
    while left:
        hours_left = job.deadline - t
        if hours_left <= left:  # no slack left: run every remaining hour
            run.extend(range(t, t + left))
            break
        f = _expected(table, t, hours_left)
        if job.interruptible:
            # Run now when this hour is among the `left` cheapest (ties: the earlier).
            go = int((f[1:] < f[0]).sum()) < left
        else:
            sums = _window_sums(f, left)
            go = int(np.argmin(sums)) == 0
        if go:
            if job.interruptible:
                run.append(t)
                left -= 1
            else:
                run.extend(range(t, t + left))
                break
        t += 1
    return np.asarray(run, dtype=np.int64)


def emitted_kg(job: Job, hours: np.ndarray, y: np.ndarray) -> float:
    """kg CO2 of running ``job`` in ``hours`` (kW x g/kWh over one-hour slots)."""
    return float(y[hours].sum() * job.power_kw / 1000.0)


def _expected(table: ForecastTable, t: int, n: int) -> np.ndarray:
    """The forecast for hours ``t .. t + n - 1`` made at the end of hour ``t - 1``
    (``forecast.ahead``: no forecast counts as no preference, the job runs as it
    arrives)."""
    if t < 1:
        return np.zeros(n)
    return ahead(table.rows[t - 1], n)


def _window_sums(x: np.ndarray, w: int) -> np.ndarray:
    c = np.concatenate([[0.0], np.cumsum(x)])
    return c[w:] - c[:-w]


def _check_span(job: Job, n: int) -> None:
    if job.deadline > n:
        raise ValidationError("job.deadline", f"hour {job.deadline} is past the series' end "
                              f"({n} hours)")
