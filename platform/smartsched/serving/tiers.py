"""The three tiers as plain classes: a site (region or edge) and the cloud router.

Owns the decision flow of the hierarchy without Ray, so it can be tested in
process and wrapped by Serve deployments (``serving.deployments``) that hold
one instance per replica:

* ``SiteTier`` -- one region's cloud nodes or one MEC site (a ``SitePlacer``).
  An edge site answers pods from its own nodes and escalates to its parent
  region when it cannot place them.
* ``CloudTier`` -- picks regions for each pod (``federation.topology``) and
  asks them in order, spilling over when one is full; pods from an edge site
  with a latency SLO go to that site first (unless ``allowed_regions`` leaves the
  site out: compliance names sites, as in the twin). It remembers answers by request id,
  so a retry never books twice even when the first attempt spilled over.

Calls between tiers go through ``SiteCaller`` objects: direct method calls in
process, deployment handles under Serve.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from smartsched.federation.topology import Hierarchy, RankWeights
from smartsched.model.pod import Pod, PodClass
from smartsched.serving.site import IDEMPOTENCY_KEEP, SitePlacer, SiteResult, site_subspec

RID_SEP = "~"  # reservation id = "<site>~<hex>": the ingress routes by it


class SiteCaller(Protocol):
    def __call__(self, pods: list[Pod], ttl_s: float,
                 request_id: str | None) -> Awaitable[list[dict[str, Any]]]: ...


def _stage(tier: str, site: str, outcome: str, reason: str) -> dict[str, str]:
    return {"tier": tier, "site": site, "outcome": outcome, "reason": reason}


class SiteTier:
    """A region or an edge site: authoritative state, decisions, reservations."""

    def __init__(self, hierarchy: Hierarchy, site: str, profile: str, *,
                 parent: SiteCaller | None = None, seed: int = 0,
                 clock: Callable[[], float] = time.time, journal_dir: str | None = None,
                 ) -> None:
        self.h = hierarchy
        self.site = site
        self.tier = "region" if site in hierarchy.regions else "edge"
        self.region = hierarchy.region_of(site)
        journal = None
        if journal_dir is not None:
            from pathlib import Path

            from smartsched.serving.journal import Journal

            journal = Journal(Path(journal_dir) / f"{site}.jsonl")
        self.placer = SitePlacer(site_subspec(hierarchy.spec, [site]), profile, seed=seed,
                                 clock=clock, journal=journal)
        self.parent = parent

    def _result(self, r: SiteResult, stages: list[dict[str, str]]) -> dict[str, Any]:
        return {
            "pod_id": r.pod_id, "placed": r.placed,
            "region": self.region if r.placed else None,
            "site": self.site if r.placed else None, "zone": r.zone, "node": r.node,
            "devices": list(r.devices), "tier": self.tier if r.placed else None,
            "profile": self.placer.profile if r.placed else None,
            "reservation_id": f"{self.site}{RID_SEP}{r.reservation_id}" if r.placed else None,
            "expires_at": r.expires_at,
            "reasons": [*stages, _stage(self.tier, self.site,
                                        "placed" if r.placed else "full", r.reason or
                                        f"placed by {self.placer.profile}")],
        }

    async def place(self, pods: list[Pod], ttl_s: float,
                    request_id: str | None) -> list[dict[str, Any]]:
        """Place here; an edge site escalates what it cannot place to its parent region."""
        results = [self._result(r, []) for r in self.placer.place(pods, ttl_s, request_id)]
        if self.parent is None or all(r["placed"] for r in results):
            return results
        # Escalate the pods (whole gangs) that did not fit here.
        missing = [p for p, r in zip(pods, results, strict=True) if not r["placed"]]
        up = await self.parent(missing, ttl_s,
                               None if request_id is None else f"{request_id}@{self.site}")
        by_id = {r["pod_id"]: r for r in up}
        out = []
        for r in results:
            if r["placed"]:
                out.append(r)
                continue
            esc = by_id[r["pod_id"]]
            reason = r["reasons"][-1]["reason"]
            esc["reasons"] = [_stage("edge", self.site, "escalated",
                                     f"{reason}; escalated to {self.region}"), *esc["reasons"]]
            out.append(esc)
        return out

    # Reservations and views (the ingress routes by reservation id).
    def confirm(self, rid: str) -> dict[str, Any]:
        r = self.placer.confirm(rid)
        return {"reservation_id": f"{self.site}{RID_SEP}{r.id}", "confirmed": True,
                "pods": [b.pod.id for b in r.bookings]}

    def release(self, rid: str) -> dict[str, Any]:
        r = self.placer.release(rid)
        return {"reservation_id": f"{self.site}{RID_SEP}{r.id}", "released": True,
                "pods": [b.pod.id for b in r.bookings]}

    def summary(self) -> dict[str, Any]:
        return {"site": self.site, "tier": self.tier, **self.placer.summary()}

    def upsert_nodes(self, nodes: list[Any], usage: dict[str, tuple[float, float, float]],
                     ) -> dict[str, Any]:
        return {"site": self.site, **self.placer.upsert_nodes(nodes, usage)}

    def free(self) -> dict[str, float]:
        return self.placer.free_fraction()

    def set_profile(self, profile: str) -> str:
        self.placer.set_profile(profile)
        return profile


class CloudTier:
    """The global tier: region choice, spill-over, edge-first for latency-bound pods."""

    def __init__(self, hierarchy: Hierarchy, regions: dict[str, SiteCaller],
                 edges: dict[str, SiteCaller],
                 free_of: Callable[[], Awaitable[dict[str, dict[str, float]]]],
                 weights: RankWeights | None = None, clock: Callable[[], float] = time.time,
                 ) -> None:
        self.h = hierarchy
        self.regions = regions
        self.edges = edges
        self.free_of = free_of
        self.weights = weights or RankWeights()
        self.clock = clock
        self.t0 = clock()
        self.answers: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    async def place(self, pods: Sequence[Pod], ttl_s: float,
                    request_id: str | None) -> list[dict[str, Any]]:
        if request_id is not None and request_id in self.answers:
            self.answers.move_to_end(request_id)
            return self.answers[request_id]
        groups: dict[str, list[Pod]] = {}
        for p in pods:
            groups.setdefault(p.gang_id or f"\0{p.id}", []).append(p)
        free = await self.free_of()
        out: dict[str, dict[str, Any]] = {}
        for i, members in enumerate(groups.values()):
            rid = None if request_id is None else f"{request_id}#{i}"
            for r in await self._place_group(members, ttl_s, rid, free):
                out[r["pod_id"]] = r
        results = [out[p.id] for p in pods]
        if request_id is not None:
            self.answers[request_id] = results
            while len(self.answers) > IDEMPOTENCY_KEEP:
                self.answers.popitem(last=False)
        return results

    async def _place_group(self, members: list[Pod], ttl_s: float, rid: str | None,
                           free: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
        lead = members[0]
        stages: list[dict[str, str]] = []
        tried: set[str] = set()
        origin = lead.origin_site
        if (origin in self.edges and (lead.pod_class == PodClass.EDGE_RT
                                      or lead.latency_slo_ms is not None)
                and (not lead.allowed_regions or origin in lead.allowed_regions)):
            res = await self.edges[origin](members, ttl_s, rid)
            tried.add(self.h.region_of(origin))  # the edge escalated to it already
            if all(r["placed"] for r in res):
                return res
            stages += res[0]["reasons"]
        ranked = self.h.rank_regions(lead, free, self.clock() - self.t0, self.weights)
        if not ranked:
            why = ("no allowed region exists: " + ", ".join(lead.allowed_regions)
                   if lead.allowed_regions else "no region")
            return [_unplaced(p, [*stages, _stage("cloud", "global", "rejected", why)])
                    for p in members]
        for region, why in ranked:
            if region in tried:
                continue
            stages.append(_stage("cloud", "global", "escalated", f"try {region}: {why}"))
            res = await self.regions[region](members, ttl_s, rid)
            if all(r["placed"] for r in res):
                for r in res:
                    r["reasons"] = [*stages, *r["reasons"]]
                return res
            stages += res[0]["reasons"]
        return [_unplaced(p, [*stages, _stage("cloud", "global", "rejected",
                                              "no allowed region can place it")])
                for p in members]


def _unplaced(pod: Pod, stages: list[dict[str, str]]) -> dict[str, Any]:
    return {"pod_id": pod.id, "placed": False, "region": None, "site": None, "zone": None,
            "node": None, "devices": [], "tier": None, "profile": None,
            "reservation_id": None, "expires_at": None, "reasons": stages}
