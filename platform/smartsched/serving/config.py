"""Configuration of the placement service (the ``args`` of ``serve_apps/*.yaml``).

Owns the schema: which cluster (preset or file) is served, the scheduling
profile per tier and per site, edge-site parents, the region ranking weights,
reservation TTLs, auth and limits, and the CPU share of each replica (Serve's
default of one CPU per replica does not fit a 2-core machine).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from smartsched.model.configfile import validate
from smartsched.model.errors import ValidationError


class Ranking(BaseModel):
    model_config = ConfigDict(extra="forbid")
    latency: float = Field(1.0, ge=0, le=100)
    load: float = Field(1.0, ge=0, le=100)
    price: float = Field(0.5, ge=0, le=100)
    carbon: float = Field(0.5, ge=0, le=100)


class Auth(BaseModel):
    """Bearer token for mutating endpoints: from ``token_env`` or ``token_file``.

    ``disabled: true`` runs without auth (loopback experiments only); otherwise a
    service with no token configured refuses to start rather than run open.
    """

    model_config = ConfigDict(extra="forbid")
    token_env: str = "SMARTSCHED_API_TOKEN"
    token_file: str | None = None
    disabled: bool = False


class UsageFromPrometheus(BaseModel):
    """Pull each site's actual node usage from Prometheus (prometheus.source.PrometheusSource):
    at most every ``interval_s``, in the background of requests, last good values kept."""

    model_config = ConfigDict(extra="forbid")
    url: str = Field(pattern=r"^https?://")
    interval_s: float = Field(15.0, gt=0, le=3600)
    timeout_s: float = Field(2.0, gt=0, le=60)
    stale_after_s: float = Field(60.0, gt=0, le=86_400)


class ServiceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cluster: str = "medium"
    region_profile: str = "k8s-default"
    edge_profile: str = "k8s-default"
    profiles: dict[str, str] = Field(default_factory=dict)  # site -> profile override
    edge_parents: dict[str, str] = Field(default_factory=dict)
    ranking: Ranking = Ranking()
    default_ttl_s: float = Field(60.0, gt=0, le=86_400)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=1024**3)
    auth: Auth = Auth()
    replica_cpus: float = Field(0.1, gt=0, le=64)
    journal_dir: str | None = None
    seed: int = Field(0, ge=0)
    prometheus: UsageFromPrometheus | None = None
    # Let a pod whose profile preempts (DefaultPreemption) take room held by reservations
    # of lower-priority pods: those reservations are released and named in the answer
    # (``preempted``), so their owners can evict the pods. Off by default: priority comes
    # from the request, so any client with the token could evict the others.
    preemption: bool = False

    def profile_of(self, site: str, tier: str) -> str:
        return self.profiles.get(site, self.region_profile if tier == "region"
                                 else self.edge_profile)


def parse_service_config(args: dict[str, Any] | None) -> ServiceConfig:
    return validate(ServiceConfig, args, prefix="service")


def load_token(auth: Auth) -> str | None:
    """The configured bearer token, or None when auth is disabled."""
    import os
    from pathlib import Path

    if auth.disabled:
        return None
    if auth.token_file:
        try:
            token = Path(auth.token_file).read_text().strip()
        except OSError as e:
            raise ValidationError("service.auth.token_file", f"cannot read: {e}") from None
    else:
        token = os.environ.get(auth.token_env, "").strip()
    if len(token) < 16:
        raise ValidationError(
            "service.auth", f"no API token of at least 16 characters in ${auth.token_env} or "
            "auth.token_file; set one (or auth.disabled: true for loopback experiments)")
    return token
