"""Hard compliance constraints: data residency, dedicated tenancy, isolation classes.

Owns the compliance policy (a YAML file, validated, errors naming the field) and the
filter that enforces it in every profile and every driver (issue 19). The policy is
attached to a ``ClusterState`` (``attach``); ``ProfileScheduler.feasible`` adds its
verdict after the profile's own filters, so whatever decides through a profile -- the
twin, the service's sites, the Kubernetes scheduler and extender, the learned policy's
action mask, preemption's candidates, the sandbox -- cannot place against it. A rule
a profile would break is not a score to trade: the nodes fail the filter.

- residency: ``tenant -> [region or site, ...]``: the tenant's pods run only there;
- dedicated: ``tenant -> {nodes: [...], labels: {k: v}}``: the tenant's pods run only
  on its pool, and no other tenant's pod runs there;
- isolation: ``[{between: [A, B]}, ...]`` with ``tenant:<name>``, ``class:<pod class>``
  or ``app:<name>``: a pod of A never shares a node with another pod of B (a pod that
  is both keeps every other pod of A or B off its node).

Pods of tenants the policy does not name are bound by the dedicated pools (they stay
out) and by isolation rules that name their class or app. The filter's checks are
UnschedulableAndUnresolvable (residency, pools: no eviction changes them) or
Unschedulable (isolation: the conflicting pod may leave); preemption never targets a
node that fails either.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from smartsched.model.configfile import read_yaml, validate
from smartsched.model.errors import UnknownReferenceError, ValidationError
from smartsched.model.pod import POD_CLASS_IDS, PodClass
from smartsched.scheduling.status import Code, Status
from smartsched.twin.state import ClusterState

PLUGIN = "Compliance"
_KINDS = ("tenant", "class", "app")


class Pool(BaseModel):
    """A dedicated pool: nodes by name, by labels (all must match), or both (union)."""

    model_config = ConfigDict(extra="forbid")
    nodes: list[str] = Field(default_factory=list, max_length=100_000)
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)


class Isolation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    between: tuple[str, str]

    @field_validator("between")
    @classmethod
    def _selectors(cls, v: tuple[str, str]) -> tuple[str, str]:
        for s in v:
            kind, sep, name = s.partition(":")
            if not sep or kind not in _KINDS or not name or name != name.strip():
                raise ValueError(f"{s!r}: a selector is tenant:<name>, class:<pod class> or "
                                 "app:<name>")
            if kind == "class" and name not in POD_CLASS_IDS:
                raise ValueError(f"{s!r}: unknown pod class (known: "
                                 f"{', '.join(c.value for c in PodClass)})")
        if v[0] == v[1]:
            raise ValueError("a rule needs two different selectors")
        return v


class CompliancePolicy(BaseModel):
    """The policy file (``compliance:`` at its top, or the mapping itself)."""

    model_config = ConfigDict(extra="forbid")
    tenants: list[str] = Field(default_factory=list, max_length=10_000)
    residency: dict[str, list[str]] = Field(default_factory=dict)
    dedicated: dict[str, Pool] = Field(default_factory=dict)
    isolation: list[Isolation] = Field(default_factory=list, max_length=10_000)

    @field_validator("tenants")
    @classmethod
    def _tenant_names(cls, v: list[str]) -> list[str]:
        """Names, each once: an empty name matched no pod (a pod's tenant is never empty),
        and a name given twice is a slip to point at, not to merge."""
        for t in v:
            if not t.strip():
                raise ValueError("a tenant name is empty")
            if t != t.strip():  # "finance " matched no pod's tenant, silently
                raise ValueError(f"tenant {t!r} has spaces around it")
        twice = sorted({t for t in v if v.count(t) > 1})
        if twice:
            raise ValueError(f"tenant {twice[0]!r} is listed twice")
        return v

    @field_validator("residency")
    @classmethod
    def _somewhere(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        """Each tenant's regions are a non-empty list: ``shop: []`` allowed its pods
        nowhere, and they waited out every run without a word."""
        for tenant, regions in v.items():
            if not regions:
                raise ValueError(f"{tenant!r} lists no region or site (its pods could run "
                                 "nowhere); leave the tenant out to allow every region")
        return v

    def check_tenants(self) -> None:
        """Every tenant a rule names is declared in ``tenants``."""
        known = set(self.tenants)
        for field, names in (("residency", self.residency), ("dedicated", self.dedicated)):
            for t in names:
                if t not in known:
                    raise UnknownReferenceError(f"compliance.{field}.{t}",
                                                f"unknown tenant {t!r} (not in tenants)")
        for i, rule in enumerate(self.isolation):
            for j, s in enumerate(rule.between):
                kind, _, name = s.partition(":")
                if kind == "tenant" and name not in known:
                    raise UnknownReferenceError(f"compliance.isolation[{i}].between[{j}]",
                                                f"unknown tenant {name!r} (not in tenants)")


def load_policy(source: str | Path | dict[str, Any]) -> Compliance:
    """A policy from a YAML file (or its parsed mapping); errors name ``compliance.*``."""
    doc = source if isinstance(source, dict) else read_yaml(source, "compliance")
    if isinstance(doc, dict) and set(doc) == {"compliance"}:
        doc = doc["compliance"]
    if not doc:  # an empty file given as a policy is a mistake, not "none" (so are [],
        # '' and 0, which validation read as {})
        raise ValidationError("compliance", "the policy is empty: give residency, dedicated "
                              "or isolation rules (or no policy at all)",
                              source=None if isinstance(source, dict) else str(source))
    policy = validate(CompliancePolicy, doc, prefix="compliance")
    policy.check_tenants()
    return Compliance(policy)


class Compliance:
    """A policy ready to filter; per-state masks are built once per cluster layout."""

    name = PLUGIN

    def __init__(self, policy: CompliancePolicy) -> None:
        self.policy = policy
        self._layout: list[str] | None = None
        self._residency: dict[str, np.ndarray] = {}  # tenant -> node mask
        self._pool: dict[str, np.ndarray] = {}  # tenant -> node mask
        self._pooled: np.ndarray | None = None  # nodes in any pool
        # selector -> the selectors it must not share a node with
        self._conflicts: dict[str, list[str]] = {}
        for rule in policy.isolation:
            a, b = rule.between
            self._conflicts.setdefault(a, []).append(b)
            self._conflicts.setdefault(b, []).append(a)

    # ------------------------------------------------------------ cluster
    def check_cluster(self, state: ClusterState) -> None:
        """Every region/site and node the policy names exists in ``state``'s cluster, and
        every dedicated pool has nodes. Raises UnknownReferenceError naming the field."""
        self._bind(state, strict=True)

    def _bind(self, state: ClusterState, strict: bool = False) -> None:
        # The node list itself (held, so its identity cannot be reused by another list):
        # forks share it; a rebuilt state (nodes added) has a new one.
        if self._layout is state.names and not strict:
            return
        sites = state.site_ids
        self._residency = {}
        for tenant, regions in self.policy.residency.items():
            allowed = np.zeros(len(state.site_names), dtype=bool)
            for j, r in enumerate(regions):
                if r in sites:
                    allowed[sites[r]] = True
                elif strict:  # MEC sites are sites of their own: list them to allow them
                    raise UnknownReferenceError(f"compliance.residency.{tenant}[{j}]",
                                                f"unknown region or site {r!r}")
            self._residency[tenant] = allowed[state.site_id]
        self._pool = {}
        pooled = np.zeros(state.num_nodes, dtype=bool)
        for tenant, pool in self.policy.dedicated.items():
            mask = np.zeros(state.num_nodes, dtype=bool)
            for j, n in enumerate(pool.nodes):
                i = state.index.get(n)
                if i is None:
                    if strict:
                        raise UnknownReferenceError(f"compliance.dedicated.{tenant}.nodes[{j}]",
                                                    f"unknown node {n!r}")
                    continue  # a node gone from the cluster: the pool shrinks
                mask[i] = True
            if pool.labels:
                cols = [state.label_vocab.get(f"{k}={v}") for k, v in pool.labels.items()]
                if all(c is not None for c in cols):
                    mask |= state.labels[:, cols].all(axis=1)
            if strict and not mask.any():
                raise ValidationError(f"compliance.dedicated.{tenant}",
                                      "the pool matches no node of this cluster")
            overlap = mask & pooled
            if strict and overlap.any():
                raise ValidationError(f"compliance.dedicated.{tenant}", "shares node "
                                      f"{state.names[int(np.flatnonzero(overlap)[0])]!r} "
                                      "with another tenant's pool")
            self._pool[tenant] = mask
            pooled |= mask
        # Leniently bound (a node list that changes: the Kubernetes drivers, a site's nodes
        # relabelled), a node two pools claim is in neither pool and still pooled: nobody
        # runs there until the labels are fixed (closed, not open).
        seen = np.zeros(state.num_nodes, dtype=np.int32)
        for mask in self._pool.values():
            seen += mask
        contested = seen > 1
        if contested.any():
            for mask in self._pool.values():
                mask &= ~contested
        self._pooled = pooled
        self._layout = state.names

    # ------------------------------------------------------------ filtering
    def _present(self, state: ClusterState, selector: str) -> np.ndarray:
        kind, _, name = selector.partition(":")
        if kind == "class":
            return state.bound.nodes_holding_class(POD_CLASS_IDS[name])
        return state.bound.nodes_holding(kind, name)

    def filter(self, ctx: Any) -> Status:
        state: ClusterState = ctx.state
        self._bind(state)
        pod = ctx.request.pod
        n = state.num_nodes
        checks = []
        residency = self._residency.get(pod.tenant)
        if residency is not None:
            checks.append(("node(s) outside the tenant's data-residency regions",
                           Code.UNSCHEDULABLE_AND_UNRESOLVABLE, residency))
        pool = self._pool.get(pod.tenant)
        if pool is not None:
            checks.append(("node(s) outside the tenant's dedicated pool",
                           Code.UNSCHEDULABLE_AND_UNRESOLVABLE, pool))
        elif self._pooled is not None and self._pooled.any():
            checks.append(("node(s) dedicated to another tenant",
                           Code.UNSCHEDULABLE_AND_UNRESOLVABLE, ~self._pooled))
        if self._conflicts:
            mine = [f"tenant:{pod.tenant}", f"class:{pod.pod_class}"]
            if pod.app:
                mine.append(f"app:{pod.app}")
            clash = np.zeros(n, dtype=bool)
            for s in mine:
                for other in self._conflicts.get(s, ()):
                    clash |= self._present(state, other)
            if clash.any():
                checks.append(("node(s) running pods this pod must be isolated from",
                               Code.UNSCHEDULABLE, ~clash))
        if not checks:  # nothing applies (an unresolvable no-op: no retry hint changes)
            return Status.single(PLUGIN, "", Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
                                 np.ones(n, dtype=bool))
        return Status(PLUGIN, tuple(checks))


def attach(state: ClusterState, policy: Compliance | None, check: bool = True) -> ClusterState:
    """Make ``policy`` bind every decision on ``state`` (and its forks); None detaches.
    ``check=False`` for a part of a cluster (a service site: the policy names the other
    regions and their nodes too; check it against the whole cluster once)."""
    if policy is not None and check:
        policy.check_cluster(state)
    state.compliance = policy
    return state


def pool_members(state: ClusterState, policy: CompliancePolicy) -> dict[str, set[str]]:
    """Each dedicated pool's node names, read from the nodes' labels one by one."""
    pools: dict[str, set[str]] = {}
    for tenant, pool in policy.dedicated.items():
        names = {n for n in pool.nodes if n in state.index}
        if pool.labels:
            for i, name in enumerate(state.names):
                labels = dict(kv.split("=", 1) for kv, c in state.label_vocab.items()
                              if state.labels[i, c])
                if all(labels.get(k) == v for k, v in pool.labels.items()):
                    names.add(name)
        pools[tenant] = names
    return pools


def violations(state: ClusterState, policy: CompliancePolicy,
               nodes: list[int] | None = None,
               pools: dict[str, set[str]] | None = None) -> list[str]:
    """Every breach of ``policy`` among the pods bound in ``state`` (on ``nodes``, default
    all), node by node -- an independent check (plain Python over the bound pods, not the
    filter's masks), for tests and audits."""
    out: list[str] = []
    b = state.bound
    pools = pool_members(state, policy) if pools is None else pools
    rows = np.flatnonzero(b.used if nodes is None else b.used & np.isin(b.node, nodes))
    per_node: dict[int, list[Any]] = {}
    for r in rows:
        per_node.setdefault(int(b.node[r]), []).append(b.pods[r])
    for node, pods in per_node.items():
        name = state.names[node]
        site = state.site_names[int(state.site_id[node])]
        for p in pods:
            allowed = policy.residency.get(p.tenant)
            if allowed is not None and site not in allowed:
                out.append(f"{p.id} ({p.tenant}) on {name} in {site}: residency")
            own = pools.get(p.tenant)
            if own is not None and name not in own:
                out.append(f"{p.id} ({p.tenant}) on {name}: outside its pool")
            for t, names in pools.items():
                if t != p.tenant and name in names:
                    out.append(f"{p.id} ({p.tenant}) on {name}: {t}'s dedicated node")
        for rule in policy.isolation:  # two different pods (one pod may match both sides)
            a, b_ = rule.between
            in_a = [i for i, p in enumerate(pods) if _matches(p, a)]
            in_b = [i for i, p in enumerate(pods) if _matches(p, b_)]
            if in_a and in_b and (len(in_a) > 1 or len(in_b) > 1 or in_a != in_b):
                out.append(f"{name}: {a} beside {b_}")
    return out


def unmatched(policy: CompliancePolicy, pods: Iterable[Any]) -> list[ValidationError]:
    """The rules' names no pod of ``pods`` carries: a tenant of ``residency``,
    ``dedicated`` or an isolation rule, an isolation rule's app. A name that differs from
    one the pods carry only by case or spaces is a slip (a policy for ``Finance`` bound no
    ``finance`` pod, the run was the run without a policy, and nothing said so): it is
    raised. The others are returned, for the run to report: a workload may simply have
    none of that tenant's pods in its window."""
    tenants = {str(p.tenant) for p in pods if getattr(p, "tenant", None) is not None}
    apps = {str(p.app) for p in pods if getattr(p, "app", None) is not None}
    named: list[tuple[str, str, str]] = []  # (field, kind, name)
    for field, names in (("residency", policy.residency), ("dedicated", policy.dedicated)):
        named.extend((f"compliance.{field}.{t}", "tenant", t) for t in names)
    for i, rule in enumerate(policy.isolation):
        for j, sel in enumerate(rule.between):
            kind, _, name = sel.partition(":")
            if kind in ("tenant", "app"):
                named.append((f"compliance.isolation[{i}].between[{j}]", kind, name))
    out: list[ValidationError] = []
    for field, kind, name in named:
        have = tenants if kind == "tenant" else apps
        if name in have:
            continue
        near = sorted(h for h in have if h.strip().casefold() == name.strip().casefold())
        if near:
            raise ValidationError(field, f"no pod has {kind} {name!r}; the workload's pods "
                                  f"have {near[0]!r} (names must match exactly)")
        out.append(ValidationError(field, f"no pod of the workload has {kind} {name!r}: "
                                   "the rule binds nothing in this run"))
    return out


def _matches(pod: Any, selector: str) -> bool:
    kind, _, name = selector.partition(":")
    if kind == "tenant":
        return pod.tenant == name
    if kind == "class":
        return str(pod.pod_class) == name
    return pod.app == name
