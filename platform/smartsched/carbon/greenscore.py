"""GreenScore: how green it is to run work at a site or on a node now, in [0, 1].

Owns the formula and its three terms (issue 20's ``a*PUE + b*RenewableRatio +
c*ResourceEfficiency``), each scaled so that 1 is best:

  GreenScore = (a * pue_share + b * renewable + c * efficiency) / (a + b + c)

  pue_share   1 / PUE: the share of the facility's power that reaches IT equipment
              (1.0 for a PUE of 1; the medium preset's MEC sites, 1.6: 0.625).
  renewable   the grid's renewable share of generation now
              (``CarbonSeries.renewable_at``: the generation mix where the series has
              one, else the low-carbon share estimated from intensity).
  efficiency  work per watt at the current load, relative to the same hardware at full
              load: u * P(1) / P(u), with P(u) = idle + (max - idle) * u and u the
              node's use weighted by the watts each part adds (host, accelerators).
              0 for a node doing nothing, 1 at full load; a node drawing 40 % of its
              peak at idle reaches 0.625 at u = 0.4. A site's efficiency is its
              powered-on nodes' work over their watts (sum of u * max over sum of P(u)).

Location-based accounting: the grid's average mix where the site is, not
contracts. Pure arithmetic over arrays (the twin and the service supply use
and watts); must import model only.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class GreenWeights(BaseModel):
    """a, b, c of the formula (any scale: the score divides by their sum)."""

    model_config = ConfigDict(extra="forbid")
    pue: float = Field(1.0, ge=0, le=1000)
    renewable: float = Field(1.0, ge=0, le=1000)
    efficiency: float = Field(1.0, ge=0, le=1000)

    @model_validator(mode="after")
    def _some_weight(self) -> GreenWeights:
        if self.pue + self.renewable + self.efficiency <= 0:
            raise ValueError("at least one of pue, renewable, efficiency must be > 0")
        return self


_EQUAL = GreenWeights()  # the default a = b = c (built once: it is read per twin event)


def pue_share(pue: float | np.ndarray) -> np.ndarray:
    """1 / PUE: the share of facility power that reaches IT equipment."""
    return 1.0 / np.asarray(pue, dtype=np.float64)


def efficiency(util: np.ndarray, idle_w: np.ndarray, max_w: np.ndarray) -> np.ndarray:
    """[N] work per watt at use ``util`` (0..1) relative to full load: u * max / P(u)."""
    u = np.clip(np.asarray(util, dtype=np.float64), 0.0, 1.0)
    idle = np.asarray(idle_w, dtype=np.float64)
    peak = np.asarray(max_w, dtype=np.float64)
    watts = idle + (peak - idle) * u
    out = np.zeros(np.broadcast(u, idle, peak).shape)
    np.divide(u * peak, watts, out=out, where=watts > 0)
    return np.clip(out, 0.0, 1.0)


def site_efficiency(util: np.ndarray, idle_w: np.ndarray, max_w: np.ndarray,
                    on: np.ndarray, site: np.ndarray, num_sites: int) -> np.ndarray:
    """[S] each site's work over its watts (powered-on nodes), relative to full load; 0 for
    a site with nothing on."""
    u = np.clip(np.asarray(util, dtype=np.float64), 0.0, 1.0) * on
    idle = np.asarray(idle_w, dtype=np.float64) * on
    peak = np.asarray(max_w, dtype=np.float64) * on
    work = np.bincount(site, weights=u * peak, minlength=num_sites)
    watts = np.bincount(site, weights=idle + (peak - idle) * u, minlength=num_sites)
    out = np.zeros(num_sites)
    np.divide(work, watts, out=out, where=watts > 0)
    return np.clip(out, 0.0, 1.0)


def green_score(pue: np.ndarray | float, renewable: np.ndarray | float,
                eff: np.ndarray | float, weights: GreenWeights | None = None
                ) -> np.ndarray | float:
    """The weighted mean of the three terms (each in [0, 1], 1 best)."""
    w = weights or _EQUAL
    total = w.pue + w.renewable + w.efficiency
    return (w.pue * np.asarray(pue) + w.renewable * np.asarray(renewable)
            + w.efficiency * np.asarray(eff)) / total
