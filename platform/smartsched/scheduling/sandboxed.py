"""``sandboxed:<base>``: the base scheduler's risky decisions validated in the sandbox first.

Owns the twin's (and every driver's that takes a scheduler name: the CLI, the
Kubernetes scheduler, the service's profile) use of ``scheduling.sandbox``.
The base decides; a decision is *risky*, and validated before it is returned,
when it is one of the kinds named in ``validate``:

* ``preemption``: it evicts bound pods (victims);
* ``gangs``: the pod belongs to a gang asking ``gang_gpus`` GPUs or more in all;
* ``unusual``: the chosen node is not among the ``top`` nodes the sandbox's
  rollout profile ranks best for the pod (a learned policy's unexpected choice);
* ``migrations``: each move of the base's descheduling pass;
* ``all``: every placement.

A refused placement is replaced by the rollout profile's own decision for the
pod without preemption (the default the sandbox compared against); a refused
migration is dropped. The rollout profile is the base itself when the base is a
profile, and ``composite`` (the strongest heuristic) for a prefixed base such
as ``rl:PATH``, unless ``rollout=`` names another. Every refusal is kept
(``refusals``, with its reasons) and counted per kind (``validated``, ``refused``).

Spec: ``sandboxed:<base>`` with options in a final ``?validate=preemption,gangs
&gang_gpus=8&top=3&config=FILE&horizon_s=600&samples=2&max_arrivals=16
&rollout=k8s-default&seed=0`` (``config``: a YAML file of ``SandboxConfig``;
the other sandbox keys override it).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any

from smartsched.model.configfile import read_yaml
from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod
from smartsched.scheduling.base import (
    Scheduler,
    TwinNeeds,
    WorkloadAware,
    make_scheduler,
    split_wrapper_spec,
)
from smartsched.scheduling.sandbox import Placement, Proposal, Sandbox, validate_config
from smartsched.twin.decision import Decision, Migration
from smartsched.twin.state import ClusterState, PodRequest

KINDS = ("preemption", "gangs", "unusual", "migrations", "all")
DEFAULT_KINDS = ("preemption", "gangs", "unusual", "migrations")
WRAPPER_OPTIONS = {"validate", "gang_gpus", "top", "config"}
SANDBOX_OPTIONS = {"horizon_s": float, "samples": int, "max_arrivals": int, "rollout": str,
                   "seed": int, "history": int, "filters": str}
REFUSALS_KEPT = 1000


class SandboxedScheduler:
    """A base scheduler whose risky decisions pass sandbox validation first."""

    def __init__(self, base: Scheduler, sandbox: Sandbox, *,
                 kinds: Sequence[str] = DEFAULT_KINDS, gang_gpus: int = 8, top: int = 3,
                 name: str = "sandboxed") -> None:
        bad = [k for k in kinds if k not in KINDS]
        if bad:
            raise ValidationError("scheduler.validate", f"unknown kind {bad[0]!r} (known: "
                                  f"{', '.join(KINDS)})")
        for fld, v in (("gang_gpus", gang_gpus), ("top", top)):
            if not isinstance(v, int) or v < 1:
                raise ValidationError(f"scheduler.{fld}", "must be an integer >= 1")
        self.base, self.sandbox = base, sandbox
        self.kinds = frozenset(kinds)
        self.gang_gpus, self.top = gang_gpus, top
        self.name = name
        self.validated: dict[str, int] = {}
        self.refused: dict[str, int] = {}
        self.refusals: deque[dict[str, Any]] = deque(maxlen=REFUSALS_KEPT)
        self._offered: OrderedDict[str, None] = OrderedDict()  # pod ids seen (arrivals)

    # ------------------------------------------------------------ delegation
    def prepare(self, pods: Sequence[Pod]) -> None:
        if isinstance(self.base, WorkloadAware):
            self.base.prepare(pods)
        self.sandbox.prepare(pods)

    def twin_needs(self) -> TwinNeeds:
        needs = getattr(self.base, "twin_needs", None)
        return needs() if needs is not None else TwinNeeds()

    @property
    def deschedule_interval_s(self) -> float | None:
        return getattr(self.base, "deschedule_interval_s", None)

    def ranked(self, state: ClusterState, request: PodRequest, k: int
               ) -> list[tuple[int, tuple[int, ...] | None]]:
        ranked = getattr(self.base, "ranked", None)
        if ranked is None:
            raise ValidationError("scheduler", f"{self.base.name!r} cannot rank its nodes")
        return ranked(state, request, k)

    # ------------------------------------------------------------ decisions
    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        pod = request.pod
        if pod.id not in self._offered:  # first offer only: retries are not arrivals
            self._offered[pod.id] = None
            if len(self._offered) > self.sandbox.config.history:
                self._offered.popitem(last=False)
            self.sandbox.observe(pod, state.now)
        d = self.base.decide(state, request)
        if d.node is None:
            return d
        kind = self._risk(state, request, d)
        if kind is None:
            return d
        proposal = Proposal((Placement(request, d.node, d.devices),), evictions=d.victims,
                            kind=kind)
        verdict = self.sandbox.validate(state, proposal)
        self.validated[kind] = self.validated.get(kind, 0) + 1
        if verdict.accepted:
            return d
        self._refused(kind, state.now, pod.id, verdict.reasons)
        fallback = self.sandbox.rollout.decide(state, request)
        if fallback.victims or fallback.node == d.node:
            # The default would preempt too, or choose the refused node again: the pod
            # waits (and is offered again later).
            what = "the preemption" if d.victims else f"{kind} placement"
            return Decision.reject(f"sandbox: refused {what}; " + "; ".join(verdict.reasons))
        return fallback

    def _risk(self, state: ClusterState, request: PodRequest, d: Decision) -> str | None:
        """Which kind of risky decision ``d`` is (None: not one to validate)."""
        pod = request.pod
        if "all" in self.kinds:
            return "preemption" if d.victims else "placement"
        if d.victims and "preemption" in self.kinds:
            return "preemption"
        if ("gangs" in self.kinds and pod.gang_size > 1
                and pod.num_gpu * pod.gang_size >= self.gang_gpus):
            return "gangs"
        if "unusual" in self.kinds:
            ranked = getattr(self.sandbox.rollout, "ranked", None)
            if ranked is not None:
                top = [n for n, _ in ranked(state, request, self.top)]
                if top and d.node not in top:
                    return "unusual"
        return None

    def deschedule(self, state: ClusterState,
                   waiting: Sequence[PodRequest]) -> tuple[Migration, ...]:
        plan = getattr(self.base, "deschedule", None)
        moves = tuple(plan(state, waiting)) if plan is not None else ()
        if not moves or ("migrations" not in self.kinds and "all" not in self.kinds):
            return moves
        kept = []
        for m in moves:
            verdict = self.sandbox.validate(state, Proposal(
                (Placement(state.compile(m.pod), m.node),), evictions=(m.pod,),
                kind="migration"))
            self.validated["migration"] = self.validated.get("migration", 0) + 1
            if verdict.accepted:
                kept.append(m)
            else:
                self._refused("migration", state.now, m.pod.id, verdict.reasons)
        return tuple(kept)

    def _refused(self, kind: str, now: float, pod_id: str, reasons: Sequence[str]) -> None:
        self.refused[kind] = self.refused.get(kind, 0) + 1
        self.refusals.append({"time": now, "kind": kind, "pod": pod_id,
                              "reasons": list(reasons)})


def make_sandboxed(spec: str, seed: int) -> SandboxedScheduler:
    """Entry point for the ``sandboxed:`` prefix (see the module docstring)."""
    from urllib.parse import parse_qs

    known = WRAPPER_OPTIONS | set(SANDBOX_OPTIONS)
    base_spec, parsed = split_wrapper_spec("sandboxed", spec, known)
    opts = {k: v[-1] for k, v in parsed.items()}
    head, sep, query = spec.rpartition("?")
    if base_spec == spec and sep and query and ":" not in head:
        # A profile takes no options: these can only be the wrapper's.
        bad = sorted(set(parse_qs(query, keep_blank_values=True)) - known) or [query]
        raise ValidationError(f"scheduler.{bad[0][:64]}", "unknown sandboxed option; "
                              f"known: {', '.join(sorted(known))}")
    if not base_spec:
        raise ValidationError("scheduler", "sandboxed: needs a base, e.g. sandboxed:fgd")
    doc: dict[str, Any] = {}
    if "config" in opts:
        loaded = read_yaml(opts["config"], "scheduler.config")
        if not isinstance(loaded, dict):
            raise ValidationError("scheduler.config", "must be a mapping of sandbox settings")
        doc.update(loaded)
    doc.setdefault("seed", seed)
    # The default the sandbox compares with and falls back to: the base itself when it is
    # a profile (its decisions are then never "unusual"), else the best heuristic.
    doc.setdefault("rollout", base_spec if ":" not in base_spec else "composite")
    for key, typ in SANDBOX_OPTIONS.items():
        if key in opts:
            try:
                doc[key] = typ(opts[key])
            except ValueError:
                raise ValidationError(f"scheduler.{key}", f"must be a {typ.__name__}, got "
                                      f"{opts[key]!r}") from None
    config = validate_config(doc, prefix="scheduler")
    ints = {}
    for key, default in (("gang_gpus", 8), ("top", 3)):
        try:
            ints[key] = int(opts.get(key, default))
        except ValueError:
            raise ValidationError(f"scheduler.{key}", "must be an integer") from None
    kinds = tuple(k for k in opts.get("validate", ",".join(DEFAULT_KINDS)).split(",") if k)
    base = make_scheduler(base_spec, seed)
    return SandboxedScheduler(base, Sandbox(config, field="scheduler"), kinds=kinds,
                              gang_gpus=ints["gang_gpus"],
                              top=ints["top"], name=f"sandboxed:{base_spec}")


make_sandboxed.option_names = WRAPPER_OPTIONS | set(SANDBOX_OPTIONS)  # type: ignore[attr-defined]
