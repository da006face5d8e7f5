"""Configuration of the placement service (the ``args`` of ``serve_apps/*.yaml``).

Owns the schema: which cluster (preset or file) is served, the scheduling
profile per tier and per site, edge-site parents, the region ranking weights,
reservation TTLs, auth and limits, and the CPU share of each replica (Serve's
default of one CPU per replica does not fit a 2-core machine).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from smartsched.model.configfile import check_token, read_token_file, validate
from smartsched.model.errors import ValidationError
from smartsched.scheduling.sandbox import SandboxConfig
from smartsched.serving.schemas import MIN_TTL_S, TENANT_NAME

SandboxMode = Literal["off", "request", "risky", "all"]


class Ranking(BaseModel):
    model_config = ConfigDict(extra="forbid")
    latency: float = Field(1.0, ge=0, le=100)
    load: float = Field(1.0, ge=0, le=100)
    price: float = Field(0.5, ge=0, le=100)
    carbon: float = Field(0.0, ge=0, le=100)  # grid intensity now
    green: float = Field(0.5, ge=0, le=100)  # GreenScore now (carbon.greenscore)
    # How a batch's pods that rank alike share the regions: divided in proportion to
    # region capacity (serving.tiers.divide_by_capacity), or all to the first ranked (and
    # spill over when it is full).
    division: Literal["aggregated", "by_capacity"] = "by_capacity"


class TenantToken(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token_env: str | None = None
    token_file: str | None = None


class Auth(BaseModel):
    """Two bearer credentials: placement clients and operators.

    The client token (``token_env`` / ``token_file``) places, confirms and releases.
    The operator token (``operator_token_env`` / ``operator_token_file``) also changes
    nodes and reloads profiles: a placement client must not be able to swap the policy
    every site decides with, nor rewrite the cluster. Without an operator token those
    endpoints answer 403 (the service still places). ``disabled: true`` runs without
    auth (loopback experiments only); otherwise a service with no client token
    configured refuses to start rather than run open.
    """

    model_config = ConfigDict(extra="forbid")
    token_env: str = "SMARTSCHED_API_TOKEN"
    token_file: str | None = None
    operator_token_env: str = "SMARTSCHED_OPERATOR_TOKEN"
    operator_token_file: str | None = None
    disabled: bool = False
    # Tenant name -> its own token: a tenant's token places only pods of that tenant and
    # confirms or releases only that tenant's reservations (another's answer 404, as an
    # unknown one would); the audit log names the tenant. (issue 19)
    tenants: dict[str, TenantToken] = Field(default_factory=dict)


class Audit(BaseModel):
    """The tamper-evident decision log (``smartsched.audit``): every placement, rejection,
    confirmation, release, node update and profile reload, with the principal that asked.
    ``heads`` must be outside ``dir`` (a log cut short shows against heads kept apart;
    ship them to another host or WORM storage). ``key_file``: an Ed25519 private key
    (``smartsched audit keygen``)."""

    model_config = ConfigDict(extra="forbid")
    dir: str
    heads: str
    key_file: str
    block_seconds: float = Field(1.0, gt=0, le=3600)
    fsync: bool = True
    # When the log stops after a failed write (a full disk): "refuse" answers every
    # decision-making request 503 until the service is restarted with a working log (no
    # decision without its record); "continue" keeps deciding and logs the gap as an error.
    on_failure: Literal["refuse", "continue"] = "refuse"


class UsageFromPrometheus(BaseModel):
    """Pull each site's actual node usage from Prometheus (prometheus.source.PrometheusSource):
    at most every ``interval_s``, in the background of requests, last good values kept."""

    model_config = ConfigDict(extra="forbid")
    url: str = Field(pattern=r"^https?://")
    interval_s: float = Field(15.0, gt=0, le=3600)
    timeout_s: float = Field(2.0, gt=0, le=60)
    stale_after_s: float = Field(60.0, gt=0, le=86_400)


class SandboxPolicy(BaseModel):
    """When a site validates placements in the sandbox (``scheduling.sandbox``) first.

    ``request``: when the request asks (``validate: true``); ``risky``: also batches,
    gangs asking ``gang_gpus`` GPUs or more, and placements that preempt; ``all``: every
    request; ``off``: never, even when asked. ``sites`` overrides the mode per site."""

    model_config = ConfigDict(extra="forbid")
    mode: SandboxMode = "request"
    sites: dict[str, SandboxMode] = Field(default_factory=dict)
    gang_gpus: int = Field(8, ge=1, le=100_000)
    settings: SandboxConfig = Field(default_factory=SandboxConfig)

    def mode_of(self, site: str) -> str:
        return self.sites.get(site, self.mode)


class EdgeAutonomy(BaseModel):
    """How an MEC site behaves when its region is unreachable (``serving.tiers``): it waits
    ``escalation_timeout_s`` for the region, then queues the escalation (at most
    ``max_queued_pods`` pods) and replays the queue every ``reconcile_every_s``."""

    model_config = ConfigDict(extra="forbid")
    escalation_timeout_s: float = Field(10.0, gt=0, le=600)
    reconcile_every_s: float = Field(2.0, gt=0, le=3600)
    max_queued_pods: int = Field(10_000, ge=0, le=1_000_000)


class EdgeEntry(BaseModel):
    """MEC sites' own HTTP entries (``serving.edge_entry``): site -> port on ``host``. A
    client at the site places through its site's replica directly -- no Serve proxy, no
    cloud ingress on the path -- with the same tokens, body limit, validation and audit
    (each entry's own log beside the service's). Pods go to that site first and escalate
    to its region as through the cloud; reservations are confirmed or released through
    the cloud ingress."""

    model_config = ConfigDict(extra="forbid")
    host: str = Field("127.0.0.1", min_length=1, max_length=253)
    ports: dict[str, int] = Field(default_factory=dict)

    @field_validator("ports")
    @classmethod
    def _ports(cls, v: dict[str, int]) -> dict[str, int]:
        for site, port in v.items():
            if isinstance(port, bool) or not 1024 <= port <= 65535:
                raise ValueError(f"{site}: port must be 1024..65535, got {port!r}")
        if len(set(v.values())) != len(v):
            raise ValueError("two sites share a port")
        return v


class ServiceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cluster: str = "medium"
    region_profile: str = "k8s-default"
    edge_profile: str = "k8s-default"
    profiles: dict[str, str] = Field(default_factory=dict)  # site -> profile override
    edge_parents: dict[str, str] = Field(default_factory=dict)
    ranking: Ranking = Ranking()
    # A placement's reservation lifetime when its request gives no ttl_s.
    default_ttl_s: float = Field(60.0, ge=MIN_TTL_S, le=86_400)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=1024**3)
    # Request bodies one credential may have arriving at once, in all and from one client
    # address (more is a 429): a body holds one of the ingress's 2,000 request slots until
    # it has arrived, so one token's stalled bodies held them all (a placement waited
    # 22 s). By address alone a few addresses held them all again; by credential alone
    # one stalled client locked out every other holder of a shared token. Requests without
    # a valid token are answered before their bodies are read.
    max_body_reads_per_credential: int = Field(1024, ge=1, le=100_000)
    max_body_reads_per_address: int = Field(256, ge=1, le=100_000)
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
    # A gang that cannot start gets room held for it where booked pods leave soonest (as
    # their duration_s says), for profiles with GangReservation (composite-accelerators;
    # composite for its GPU classes ai-train and ai-infer, which it routes there; a gang
    # of another class goes through a route without it): other pods backfill around it
    # until it is due, and its answer says when to come back (gang_room). Off by default
    # for the reason preemption is: priority and duration come from the request.
    gang_reservations: bool = False
    # Where a live reload (PUT /v1/admin/sites/{site}/profile) may read policies and profile
    # YAML from: a relative path is taken inside it, an absolute one must resolve inside it.
    # None: reloads accept packaged profile names only. (The profiles in this file are the
    # operator's own and are not restricted.)
    models_dir: str | None = None
    sandbox: SandboxPolicy = Field(default_factory=SandboxPolicy)
    audit: Audit | None = None
    # A compliance policy file (scheduling.compliance: residency, dedicated pools,
    # isolation) every site's decisions are bound by, whatever its profile.
    compliance: str | None = None
    edge_autonomy: EdgeAutonomy = Field(default_factory=EdgeAutonomy)
    edge_entry: EdgeEntry = Field(default_factory=EdgeEntry)
    # Where the sites run (docs/architecture.md, "Topology"). distributed: each region and
    # MEC site is its own Serve deployment (a replica's crash or restart touches one
    # site; sites can be placed on other machines). single_process: the cloud ingress's
    # replica holds every site itself, so cloud -> region is a call in the same process,
    # not a hop between replicas (~5 ms of the ~6-7 ms a single placement adds over a bare
    # Serve echo here); one replica's failure then restarts every site (each from its
    # journal), and a site's profile changes by redeploying the ingress or by a reload.
    topology: Literal["distributed", "single_process"] = "distributed"
    # The interactive API pages (/docs, /redoc): FastAPI's pages load their scripts from a
    # public CDN into the browser that holds the operator's token, and take no token
    # themselves; off unless asked for. /openapi.json, the document clients are generated
    # from, is always served.
    api_docs: bool = False

    def profile_of(self, site: str, tier: str) -> str:
        return self.profiles.get(site, self.region_profile if tier == "region"
                                 else self.edge_profile)


def parse_service_config(args: dict[str, Any] | None) -> ServiceConfig:
    cfg = validate(ServiceConfig, args, prefix="service")
    if cfg.topology == "single_process" and cfg.edge_entry.ports:
        raise ValidationError("service.edge_entry.ports", "an MEC site's own entry runs in "
                              "its site's replica: it needs topology distributed")
    return cfg


MIN_TOKEN_CHARS = 16
_TENANT = TENANT_NAME  # a pod's tenant field holds to the same rule


@dataclass(frozen=True)
class Credentials:
    """The configured bearer tokens; ``operator`` is None when no operator token is set."""

    client: str
    operator: str | None
    tenants: dict[str, str] = field(default_factory=dict)  # token -> tenant


def _read_token(env: str, file: str | None, field: str) -> str:
    if file:
        return read_token_file(file, f"service.auth.{field}")
    token = os.environ.get(env, "").strip()
    return check_token(token, f"service.auth.{field.removesuffix('_file')}_env",
                       f"${env}") if token else token


def load_credentials(auth: Auth) -> Credentials | None:
    """The configured tokens, or None when auth is disabled."""
    if auth.disabled:
        return None
    client = _read_token(auth.token_env, auth.token_file, "token_file")
    if len(client) < MIN_TOKEN_CHARS:
        raise ValidationError(
            "service.auth", f"no API token of at least {MIN_TOKEN_CHARS} characters in "
            f"${auth.token_env} or auth.token_file; set one (or auth.disabled: true for "
            "loopback experiments)")
    operator = _read_token(auth.operator_token_env, auth.operator_token_file,
                           "operator_token_file") or None
    if operator is not None and len(operator) < MIN_TOKEN_CHARS:
        raise ValidationError("service.auth.operator_token",
                              f"shorter than {MIN_TOKEN_CHARS} characters")
    if operator is not None and hmac.compare_digest(operator, client):
        raise ValidationError("service.auth.operator_token",
                              "must differ from the client token")
    tenants: dict[str, str] = {}
    for name, t in auth.tenants.items():
        where = f"service.auth.tenants.{name}"
        if not _TENANT.fullmatch(name):
            raise ValidationError(where, "a tenant name is 1-63 characters of a-z, 0-9, '-', "
                                  "'_' or '.'")
        if bool(t.token_env) == bool(t.token_file):
            raise ValidationError(where, "give exactly one of token_env, token_file")
        token = _read_token(t.token_env or "", t.token_file, f"tenants.{name}.token_file")
        if len(token) < MIN_TOKEN_CHARS:
            raise ValidationError(where, f"no token of at least {MIN_TOKEN_CHARS} characters")
        if token in tenants or token in (client, operator):
            raise ValidationError(where, "every tenant needs a token of its own (this one is "
                                  "also another credential)")
        tenants[token] = name
    return Credentials(client, operator, tenants)


# Scheduler prefixes whose rest is another scheduler spec (a base), not a path.
WRAPPER_PREFIXES = ("sandboxed", "lookahead", "anneal")


def resolve_reload_profile(profile: str, models_dir: str | None) -> str:
    """The profile a live reload may switch to: a packaged profile name as is; anything
    read from disk (a profile YAML, ``rl:PATH`` or another ``prefix:PATH``) only from
    inside ``models_dir``, returned as an absolute path so the replica's working
    directory does not matter. Raises ValidationError naming ``profile``."""
    from smartsched.scheduling.registry import builtin_profiles

    if profile in builtin_profiles():
        return profile
    prefix, sep, rest = profile.partition(":")
    if not (sep and prefix.isidentifier()):
        prefix, rest = "", profile
    if models_dir is None:
        raise ValidationError("profile", "only packaged profile names can be loaded live: "
                              "this service has no models_dir configured")
    root = Path(models_dir)

    def inside(name: str) -> Path:
        try:
            top = root.resolve()
            path = Path(name)
            target = (path if path.is_absolute() else top / path).resolve()
        except (OSError, ValueError, RuntimeError):  # a NUL; a symlink loop (RuntimeError
            raise ValidationError("profile", "not a usable path") from None  # before 3.13)
        if not target.is_relative_to(top):
            raise ValidationError("profile", "must be a packaged profile name or a path "
                                  "inside the service's models_dir")
        return target

    # Options after ``?`` (``rl:PATH?filters=FILE``, ``sandboxed:P?config=FILE``) may name
    # files too: each that is not a packaged name is held to the models_dir as the path is.
    if prefix in WRAPPER_PREFIXES:
        # A wrapper's base (``sandboxed:fgd``, ``lookahead:rl:PATH?k=8?horizon=4``) is a
        # profile spec held to the models_dir by these same rules (a packaged name as is),
        # its own options included; the wrapper's are the last part, as the wrapper reads
        # them (``scheduling.base.split_wrapper_spec``).
        from smartsched.scheduling.base import option_names, split_wrapper_spec

        try:
            base, parsed = split_wrapper_spec(prefix, rest,
                                              option_names(f"{prefix}:x") or ())
        except ValidationError as e:
            raise ValidationError("profile", e.message) from None
        target = resolve_reload_profile(base, models_dir)
        # parsed came from the last part: held as written there.
        query = rest.rpartition("?")[2] if parsed else ""
        if prefix == "anneal":
            parsed = _anneal_reload_options(parsed)
            query = "&".join(f"{k}={v[-1]}" for k, v in parsed.items())
        elif prefix == "lookahead":
            _check_lookahead_reload(parsed)
        if not parsed:  # a base's own last part must not read as the wrapper's
            return f"{prefix}:{target}?" if "?" in target else f"{prefix}:{target}"
        ambiguous = "?" not in target and set(parsed) <= (option_names(target) or set())
        sep = "??" if ambiguous else "?"
        return f"{prefix}:{target}{sep}{_held_options(query, models_dir, inside)}"
    path, sep, query = rest.partition("?") if prefix else (rest, "", "")
    target = str(inside(path))  # rl:'s rest is a path
    if sep:
        query = _held_options(query, models_dir, inside)
    return f"{prefix}:{target}{sep}{query}" if prefix else target


# A live reload's ``anneal:`` profile searches at most this long per window: the site
# answers nobody while it searches (``sweeps=100000`` held a region for 100 s, past
# Serve's health check, which then restarted it).
RELOAD_ANNEAL_TIME_S = 2.0
# ... and the options that size what one window builds and holds before any deadline is
# looked at (the problem's candidates, the replicas the annealer keeps and repairs).
RELOAD_ANNEAL_MAX = {"window": 5000, "k": 32, "d": 8, "replicas": 32, "batch": 1024}


def _anneal_reload_options(parsed: dict[str, list[str]]) -> dict[str, list[str]]:
    """An ``anneal:`` reload's options with ``time_limit_s`` set (default, and at most,
    RELOAD_ANNEAL_TIME_S) and its size options within RELOAD_ANNEAL_MAX, or a
    ValidationError naming ``profile``."""
    for key, most in RELOAD_ANNEAL_MAX.items():
        raw = parsed.get(key, [None])[-1]
        if raw is not None and not (raw.isdigit() and int(raw) <= most):
            raise ValidationError("profile", f"anneal: {key} must be a whole number of at "
                                  f"most {most:,} in a live reload")
    given = parsed.get("time_limit_s", [None])[-1]
    if given is None:
        return {**parsed, "time_limit_s": [f"{RELOAD_ANNEAL_TIME_S:g}"]}
    try:
        limit = float(given)
    except ValueError:
        limit = float("nan")
    if not 0 < limit <= RELOAD_ANNEAL_TIME_S:
        raise ValidationError("profile", "anneal: time_limit_s must be in (0, "
                              f"{RELOAD_ANNEAL_TIME_S:g}] seconds in a live reload (a site "
                              "answers nobody while it searches)")
    return parsed


# A live reload's ``lookahead:`` rolls out at most this many pods per decision (k x
# horizon x samples; the defaults: 64): the site answers nobody while it rolls out, and
# k=64, horizon=100, samples=100 held a region ~2 minutes a decision, past Serve's health
# check, which restarted it into the same journaled profile.
RELOAD_LOOKAHEAD_ROLLOUTS = 256


def _check_lookahead_reload(parsed: dict[str, list[str]]) -> None:
    """A ``lookahead:`` reload's rollout work within RELOAD_LOOKAHEAD_ROLLOUTS, and its
    rollout profile not another search (a wrapper); else a ValidationError naming
    ``profile``. Every size must be written as digits."""
    import inspect

    from smartsched.scheduling.lookahead import LookaheadScheduler

    defaults = inspect.signature(LookaheadScheduler).parameters
    work = 1
    for key in ("k", "horizon", "samples"):
        raw = parsed.get(key, [None])[-1]
        if raw is not None and not (raw.isascii() and raw.isdigit()):
            # ('+64' and '6_4' read as 64 past a digits-only check, and '²' failed later)
            raise ValidationError("profile", f"lookahead: {key} must be a whole number "
                                  "written as digits in a live reload")
        work *= int(raw) if raw is not None else defaults[key].default
    if work > RELOAD_LOOKAHEAD_ROLLOUTS:
        raise ValidationError("profile", f"lookahead: k x horizon x samples is {work:,} "
                              f"pods a decision; at most {RELOAD_LOOKAHEAD_ROLLOUTS} in a "
                              "live reload (a site answers nobody while it rolls out)")
    rollout = parsed.get("rollout", [""])[-1]
    if rollout.partition(":")[0] in WRAPPER_PREFIXES:
        raise ValidationError("profile", "lookahead: in a live reload the rollout profile "
                              "cannot be another search (sandboxed:, lookahead:, anneal:)")


def _held_options(query: str, models_dir: str, inside: Callable[[str], Path]) -> str:
    """A spec's ``key=value&...`` with every value naming a file or another scheduler
    held to the models_dir (``resolve_reload_profile``), re-encoded."""
    from urllib.parse import parse_qsl, quote, urlencode

    from smartsched.scheduling.registry import builtin_profiles

    # '+' is itself and a space %20, as the rl: loader reads them (a folder's name).
    opts = parse_qsl(query.replace("+", "%2B"), keep_blank_values=True)
    names = builtin_profiles()

    def held(key: str, value: str) -> str:
        if key in FILE_OPTIONS:  # a path however it reads (``ensemble=fgd``: ./fgd)
            return str(inside(value))
        if value in names:
            return value
        # A scheduler spec (``sandboxed:...?rollout=rl:NAME``, ``rl:P?base=...``) is
        # held by these same rules: its path reached the loader unchecked before.
        if key in SPEC_OPTIONS or _names_a_spec(value):
            return resolve_reload_profile(value, models_dir)
        if _names_a_file(value):
            return str(inside(value))
        return value

    return urlencode([(k, held(k, v)) for k, v in opts], safe="/:,", quote_via=quote)


# Options whose value is always a path, however it is written (``ensemble=seed2`` names
# a folder though it has no slash): held to the models_dir like the policy's own path.
FILE_OPTIONS = frozenset({"ensemble", "config"})  # config: sandboxed's YAML settings
# Options whose value is another scheduler spec (a profile name, ``rl:PATH``, ...).
SPEC_OPTIONS = frozenset({"rollout", "base"})


def _names_a_spec(value: str) -> bool:
    """Whether an option's value reads as a prefixed scheduler spec (``rl:NAME``)."""
    prefix, sep, _ = value.partition(":")
    return bool(sep) and prefix.isidentifier()


def _names_a_file(value: str) -> bool:
    """Whether an option's value can be read as a file (a path or a YAML/data file name),
    rather than a name, a number or a flag."""
    return "/" in value or "\\" in value or value.startswith((".", "~")) or value.lower().endswith(
        (".yaml", ".yml", ".json", ".parquet", ".csv", ".npz", ".pt"))
