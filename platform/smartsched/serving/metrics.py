"""Prometheus metrics of the placement service (prometheus-client, own registry).

Owns what ``GET /metrics`` exposes: request latency per route, decisions per
profile and tier, rejections by reason, escalations between tiers, and
reservations (events counted at the ingress, live ones per site read from the
sites at scrape time).
"""

from __future__ import annotations

import re
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


# The methods the latency histogram names; the rest count as "other".
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.latency = Histogram("smartsched_request_seconds", "HTTP request latency",
                                 ["method", "route", "status"], buckets=LATENCY_BUCKETS,
                                 registry=r)
        self.decisions = Counter("smartsched_decisions", "Pods placed, by profile and tier",
                                 ["profile", "tier"], registry=r)
        self.rejections = Counter("smartsched_rejections", "Pods not placed, by reason",
                                  ["reason"], registry=r)
        self.escalations = Counter("smartsched_escalations",
                                   "Hand-overs between tiers (edge -> region, spill-over)",
                                   ["from_tier", "site"], registry=r)
        self.reservation_events = Counter("smartsched_reservation_events",
                                          "Reservations created, confirmed, released",
                                          ["event"], registry=r)
        self.reservations = Gauge("smartsched_reservations_active",
                                  "Live reservations per site", ["site"], registry=r)
        self.green = Gauge("smartsched_green_score",
                           "GreenScore per site now (0..1): 1/PUE, grid renewable share and "
                           "work per watt, averaged", ["site"], registry=r)
        self.green_terms = Gauge("smartsched_green_score_term",
                                 "GreenScore's terms per site (0..1)", ["site", "term"],
                                 registry=r)
        self.node_green = Gauge("smartsched_node_green_score",
                                "GreenScore per powered-on node now (0..1): its site's PUE and "
                                "grid, its own work per watt", ["site", "node"], registry=r)

    def request(self, method: str, route: str, status: int, seconds: float) -> None:
        # Any other method is one value: h11 (the edge entry) takes any token as a method,
        # and 300 requests of 2,000-character methods grew /metrics from 65 KB to 10 MB.
        shown = method if method in HTTP_METHODS else "other"
        self.latency.labels(shown, route, str(status)).observe(seconds)

    def observe_placements(self, results: list[dict[str, Any]]) -> None:
        created = set()
        for r in results:
            for s in r["reasons"][:-1]:
                if s["outcome"] in ("escalated", "full"):
                    self.escalations.labels(s["tier"], s["site"]).inc()
            if r["placed"]:
                self.decisions.labels(r["profile"], r["tier"]).inc()
                created.add(r["reservation_id"])
            elif r.get("escalation"):  # queued (or dropped) at an edge: its reason names
                # the escalation's id, one per request -- not a label value
                self.rejections.labels(f"escalation {r['escalation']['state']}").inc()
            else:
                reason = r["reasons"][-1]["reason"] if r["reasons"] else "unknown"
                self.rejections.labels(_reason_key(reason)).inc()
        if created:
            self.reservation_events.labels("created").inc(len(created))

    def reservation_event(self, event: str) -> None:
        self.reservation_events.labels(event).inc()

    def set_reservations(self, per_site: dict[str, int]) -> None:
        for site, n in per_site.items():
            self.reservations.labels(site).set(n)

    def set_green(self, per_site: dict[str, dict[str, Any]]) -> None:
        for site, g in per_site.items():
            self.green.labels(site).set(g["score"])
            for term in ("pue_share", "renewable_share", "efficiency"):
                self.green_terms.labels(site, term).set(g[term])

    def set_node_green(self, per_site: dict[str, dict[str, float]]) -> None:
        """Replace the per-node scores (a node powered off or removed since the last scrape
        drops out instead of keeping its old value)."""
        self.node_green.clear()
        for site, nodes in per_site.items():
            for node, score in nodes.items():
                self.node_green.labels(site, node).set(score)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _reason_key(reason: str) -> str:
    """A bounded label: the reason without pod ids and counts ("3 nodes: x" -> "x"). Of a
    scheduler's per-node tally ("30 Insufficient cpu, 58 Insufficient memory") the most
    common reason alone, numbers left out: each mix of counts made a new series, kept for
    the life of the replica (51 from 60 refusals on an unevenly booked region)."""
    key = reason.split(": ")[-1].split(";")[0].strip()
    parts = [p.strip() for p in key.split(", ") if p.strip()]
    if len(parts) > 1:
        counted = [(int(m.group(1)) if (m := re.match(r"(\d+)\s", p)) else 0, -i, p)
                   for i, p in enumerate(parts)]
        key = max(counted)[2]
    key = re.sub(r"\d+", "N", re.sub(r"^\d+\s+", "", key))
    return key[:80] or "unknown"
