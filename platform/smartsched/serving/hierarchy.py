"""The hierarchy the placement service federates: cloud regions and their MEC edge sites.

Owns which sites exist, which region each edge site escalates to, and how the
cloud tier ranks regions for a pod. Ranking, in order of precedence:

1. compliance -- a pod with ``allowed_regions`` is only offered to those
   regions, never elsewhere (a hard rule);
2. latency -- regions whose client latency from the pod's origin site is
   within its ``latency_slo_ms`` come before those that are not;
3. a cost score, lower is better, each term scaled to [0, 1] over the
   candidate regions: latency from the origin, load (1 - free share of the
   resource the pod needs most, from the region summaries), price of the pod
   per hour, grid carbon intensity now, and the region's GreenScore now
   (``carbon.greenscore``: its PUE share, its grid's renewable share, and the
   work per watt of its nodes at that load; higher is better, so it enters as
   its negative). Weights are configurable; by default GreenScore stands for
   the grid (``green`` 0.5) and raw intensity is off (``carbon`` 0).

The cloud tier asks regions in this order and spills over to the next when
one is full.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from smartsched.carbon.greenscore import efficiency, green_score, pue_share
from smartsched.model.cluster import ClusterSpec, Site
from smartsched.model.errors import UnknownReferenceError, ValidationError
from smartsched.model.pod import Pod


@dataclass(frozen=True)
class RankWeights:
    latency: float = 1.0
    load: float = 1.0
    price: float = 0.5
    carbon: float = 0.0
    green: float = 0.5

    def __post_init__(self) -> None:
        for k in ("latency", "load", "price", "carbon", "green"):
            v = getattr(self, k)
            if not (isinstance(v, int | float) and 0 <= v <= 100 and math.isfinite(v)):
                raise ValidationError(f"ranking.{k}", f"must be within [0, 100], got {v!r}")


@dataclass(frozen=True)
class Hierarchy:
    """Regions (cloud sites) and edge sites with their parent region."""

    spec: ClusterSpec
    regions: tuple[str, ...]
    edges: tuple[str, ...]
    parent: Mapping[str, str]  # edge site -> region

    @staticmethod
    def from_spec(spec: ClusterSpec, parents: Mapping[str, str] | None = None) -> Hierarchy:
        """Every cloud site is a region; an edge site escalates to ``parents[site]`` or,
        by default, the nearest region."""
        sites_with_nodes = {z.site for z in spec.zones
                            if any(n.zone == z.name for n in spec.nodes)}
        regions = tuple(s.name for s in spec.sites
                        if s.kind == "cloud" and s.name in sites_with_nodes)
        edges = tuple(s.name for s in spec.sites
                      if s.kind == "edge" and s.name in sites_with_nodes)
        if not regions:
            raise ValidationError("cluster.sites", "the service needs at least one cloud region "
                                  "with nodes")
        parents = dict(parents or {})
        for e, r in parents.items():
            if e not in edges:
                raise UnknownReferenceError("edge_parents", f"unknown edge site {e!r}")
            if r not in regions:
                raise UnknownReferenceError(f"edge_parents.{e}", f"unknown region {r!r}")
        out = {}
        for e in edges:
            if e in parents:
                out[e] = parents[e]
            else:
                es = spec.site(e)
                out[e] = min(regions, key=lambda r: spec.site(r).latency_ms_from(es))
        return Hierarchy(spec, regions, edges, out)

    def site(self, name: str) -> Site:
        return self.spec.site(name)

    @cached_property
    def region_watts(self) -> dict[str, tuple[float, float]]:
        """Each region's nodes' watts summed: (idle, full load), for its efficiency."""
        from smartsched.twin.power import PowerModel

        pm = PowerModel.of_spec(self.spec)
        zone_site = self.spec.zone_site()
        site = np.array([zone_site[n.zone] for n in self.spec.nodes])
        return {r: (float(pm.idle_w[site == r].sum()), float(pm.max_w[site == r].sum()))
                for r in self.regions}

    def green(self, region: str, load: float, now_s: float) -> float:
        """The region's GreenScore at ``load`` (0..1, its nodes' share in use) and time."""
        s = self.site(region)
        idle, peak = self.region_watts[region]
        eff = float(efficiency(np.array([load]), np.array([idle]), np.array([peak]))[0])
        return float(green_score(pue_share(s.pue), float(s.carbon.renewable_at(now_s)), eff))

    def region_of(self, site: str) -> str:
        """The region a site belongs to (itself for a region)."""
        if site in self.regions:
            return site
        if site in self.parent:
            return self.parent[site]
        raise UnknownReferenceError("site", f"unknown site {site!r}")

    def rank_regions(self, pod: Pod, free: Mapping[str, Mapping[str, float]], now_s: float,
                     weights: RankWeights | None = None) -> list[tuple[str, str]]:
        """Regions to try for ``pod``, best first, each with why it is where it is."""
        weights = weights or RankWeights()
        cand = list(self.regions)
        if pod.allowed_regions:
            allowed = set(pod.allowed_regions)
            cand = [r for r in cand if r in allowed]
        if not cand:
            return []
        origin = self.site(pod.origin_site) if pod.origin_site else None
        lat = np.array([self.site(r).latency_ms_from(origin) if origin else 0.0 for r in cand])
        need = dominant_resource(pod)
        load = np.array([1.0 - float(free.get(r, {}).get(need, 1.0)) for r in cand])
        price = np.array([_price(self.site(r), pod) for r in cand])
        carbon = np.array([self.site(r).carbon.at(now_s) for r in cand])
        green = np.array([self.green(r, float(u), now_s) for r, u in zip(cand, load,
                                                                           strict=True)])
        score = (weights.latency * _unit(lat) + weights.load * _unit(load)
                 + weights.price * _unit(price) + weights.carbon * _unit(carbon)
                 + weights.green * _unit(-green))
        meets = (lat <= pod.latency_slo_ms) if pod.latency_slo_ms is not None else np.ones(
            len(cand), dtype=bool)
        order = np.lexsort((score, ~meets))
        def why(i: int) -> str:
            where = (f"latency {lat[i]:.1f} ms from {pod.origin_site}"
                     f"{'' if meets[i] else ' (over SLO)'}, " if origin else "")
            return (f"{where}load {100 * load[i]:.0f} % {need}, {price[i]:.2f} USD/h, "
                    f"{carbon[i]:.0f} gCO2/kWh, GreenScore {green[i]:.2f}")

        return [(cand[i], why(i)) for i in order]


def dominant_resource(pod: Pod) -> str:
    """The resource a pod's region choice weighs (load) and divides (capacity) by."""
    return "gpu" if pod.num_gpu > 0 else ("cpu" if pod.cpu_milli > 0 else "memory")


def _price(site: Site, pod: Pod) -> float:
    return (site.price_core_hour * pod.cpu_milli / 1000
            + site.price_gpu_hour * pod.gpu_total_milli / 1000)


def _unit(x: np.ndarray) -> np.ndarray:
    span = float(x.max() - x.min()) if x.size else 0.0
    return (x - x.min()) / span if span > 0 else np.zeros_like(x, dtype=float)


def regions_for(h: Hierarchy, names: Sequence[str]) -> None:
    for n in names:
        if n not in h.regions:
            raise UnknownReferenceError("region", f"unknown region {n!r}")
