"""Carbon-aware placement: wait for cleaner hours (CarbonShift) and pick the cleaner
grid (GridCarbon).

Owns the twin and service side of issue 20's shifting. Both plan on each site's
carbon outlook (``carbon.outlook``: a forecast from the grid series' past only,
never its future values) times the site's PUE: the grams a kWh of the pod's work
emits there.

- ``CarbonShift`` (defer extension point): a pod of a deferrable class with a
  deadline, that fits somewhere now, waits while a later start -- at any site with
  a node that passes its filters now -- is forecast to emit less over its run than
  starting now at the best of those sites. It never waits past its latest start
  less ``margin_h`` (room to queue) and less one more run (``restart_reserve``: the
  shifted hours may be busier ones, where an online surge preempts batch, and a
  batch pod restarts from the beginning), so deadlines hold unless the cluster is
  full when it goes. Waiting pods are offered again at the twin's periodic flush.
- ``GridCarbon`` (score): nodes whose site emits least over the pod's expected run
  score highest (0..100 over the feasible nodes; all equal on one grid).
- ``GreenScore`` (score): each node's GreenScore (``carbon.greenscore``: its
  site's PUE share, its grid's renewable share now, and the node's work per watt
  with the pod on it) times 100. The efficiency term packs work onto nodes
  already drawing their idle watts, so nodes can power down; the other two pick
  the site.

Jobs do not pause once started (the twin's pods run to completion, or are evicted
and restart from a checkpoint): start time and place are the levers here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from smartsched.carbon.greenscore import GreenWeights
from smartsched.carbon.outlook import expected_renewable, outlook
from smartsched.model.cluster import Site
from smartsched.model.pod import POD_CLASS_IDS, PodClass
from smartsched.scheduling.framework import CycleContext, lowest_best
from smartsched.twin.decision import can_defer
from smartsched.twin.green import node_scores, node_use


class CarbonShiftArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    classes: list[PodClass] = Field(default_factory=lambda: [PodClass.BATCH,
                                                              PodClass.AI_TRAIN])
    margin_h: float = Field(1.0, ge=0, le=24 * 7)
    # Keep enough slack to run again once after an eviction (preemption, a node failure):
    # the whole run for a pod without checkpoints, one checkpoint interval for one with.
    restart_reserve: bool = True


class GridCarbonArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GreenScoreArgs(BaseModel):
    """``weights``: a, b, c of GreenScore = a*PUE share + b*renewable + c*efficiency.
    ``over``: the renewable share of the grid ``now``, or the share expected over the
    pod's ``run`` (forecast from the series' past, as GridCarbon's intensity is)."""

    model_config = ConfigDict(extra="forbid")
    weights: GreenWeights = Field(default_factory=GreenWeights)
    over: Literal["now", "run"] = "now"


# (what, cluster, hour) -> (the cluster, [S, hours] outlook): it changes once an hour,
# decisions come by the thousand (a deferred pod is offered again at every flush). The
# cluster is kept beside its outlook so that its id is not reused by another while cached.
_HOURLY: dict[tuple[str, int, int], tuple[object, np.ndarray]] = {}


def _hourly(ctx: CycleContext, hours: int, what: str,
            per_site: Callable[[Site, float, int], np.ndarray]) -> np.ndarray:
    """[S, >= hours] ``per_site(site, now, n)`` stacked, cached per cluster and hour."""
    st = ctx.state
    key = (what, id(st.spec), int(st.now // 3600.0))
    hit = _HOURLY.get(key)
    if hit is not None and hit[0] is st.spec and hit[1].shape[1] >= hours:
        return hit[1]
    if len(_HOURLY) > 64:
        _HOURLY.clear()
    n = max(hours, 72)
    got = np.stack([per_site(s, st.now, n) for s in st.spec.sites])
    _HOURLY[key] = (st.spec, got)
    return got


def _site_outlook(ctx: CycleContext, hours: int) -> np.ndarray:
    """[S, >= hours] expected g/kWh (times PUE) of each site from the current hour."""
    return _hourly(ctx, hours, "intensity",
                   lambda s, now, n: outlook(s.carbon).expected(now, n) * s.pue)


def _site_renewable_outlook(ctx: CycleContext, hours: int) -> np.ndarray:
    """[S, >= hours] expected renewable share of each site's grid from the current hour."""
    return _hourly(ctx, hours, "renewable",
                   lambda s, now, n: expected_renewable(s.carbon, now, n))


def _work_hours(ctx: CycleContext) -> int:
    d = ctx.request.pod.duration
    return max(1, math.ceil((d or 3600.0) / 3600.0))


class CarbonShift:
    """Defer a deferrable pod while a later start is forecast to be cleaner."""

    name = "CarbonShift"
    Args = CarbonShiftArgs

    def __init__(self, args: CarbonShiftArgs | None = None) -> None:
        self.args = args or CarbonShiftArgs()
        self._classes = {POD_CLASS_IDS[c] for c in self.args.classes}

    def defer(self, ctx: CycleContext, feasible: np.ndarray) -> str | None:
        pod, st = ctx.request.pod, ctx.state
        if POD_CLASS_IDS[pod.pod_class] not in self._classes or pod.deadline is None:
            return None
        if not can_defer(pod, st.now) or not feasible.any():
            return None
        work = _work_hours(ctx)
        # Hours it may still wait, keeping the margin (and a re-run) before its latest start.
        dur = pod.duration or 0.0
        reserve = 0.0
        if self.args.restart_reserve:
            every = pod.checkpoint_interval_s
            reserve = dur if every is None else min(dur, float(every))
        slack = (pod.deadline - st.now - dur - reserve) / 3600.0 - self.args.margin_h
        later = math.floor(slack)
        if later < 1:
            return None
        f = _site_outlook(ctx, later + work)[:, :later + work]
        sites = np.unique(st.site_id[feasible])
        cum = np.concatenate([np.zeros((sites.size, 1)), np.cumsum(f[sites], axis=1)], axis=1)
        windows = cum[:, work:work + later + 1] - cum[:, :later + 1]  # [S, starts]
        now_best = windows[:, 0].min()
        best = windows.min()
        if best < now_best:
            when = int(np.argmin(windows.min(axis=0)))
            return (f"waiting {when} h for a cleaner grid ({best / work:.0f} vs "
                    f"{now_best / work:.0f} gCO2/kWh expected)")
        return None


class GridCarbon:
    """Prefer nodes whose grid (times PUE) is expected to be cleanest over the pod's run."""

    name = "GridCarbon"
    Args = GridCarbonArgs

    def __init__(self, args: GridCarbonArgs | None = None) -> None:
        self.args = args or GridCarbonArgs()

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray | float:
        st = ctx.state
        if len(st.spec.sites) < 2:
            return 0.0
        work = _work_hours(ctx)
        per_site = _site_outlook(ctx, work)[:, :work].mean(axis=1)
        return lowest_best(per_site[st.site_id], feasible)


class GreenScore:
    """Prefer the node whose GreenScore is highest with the pod on it."""

    name = "GreenScore"
    Args = GreenScoreArgs

    def __init__(self, args: GreenScoreArgs | None = None) -> None:
        self.args = args or GreenScoreArgs()

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray:
        st = ctx.state
        use = node_use(st, "allocation", extra=ctx.request.vector)
        ren = None
        if self.args.over == "run":
            work = _work_hours(ctx)
            ren = _site_renewable_outlook(ctx, work)[:, :work].mean(axis=1)
        return 100.0 * node_scores(st, st.now, use, self.args.weights, renewable=ren)
