"""The schema of scheduler profile files: a typed model of ``scheduling/profiles/*.yaml``.

Owns what a profile document may say, checked before any plugin is built:
``ProfileDoc`` (filters, weighted scorers, a binder, the tie-break rule, an
optional forecaster) and ``SplitProfileDoc`` (pod class -> profile name). The
plugins named here and their ``args`` are resolved and validated by
``scheduling.registry`` against each plugin's own ``Args`` model.

Errors name the field as it reads in the file, prefixed with the profile's
name: ``mine.filters[0].name``, ``mine.score[1].weight``, ``s.routes.gaming``;
an unknown top-level key or a bad ``name`` of a single profile is prefixed with
where the document came from (``profile.colour``), since its name is not
trustworthy then.

Profile YAML::

    name: k8s-default
    description: what it is for          # optional
    filters: [NodeUnschedulable, NodeResourcesFit, NodeAffinity, TaintToleration]
    score:
      - {name: NodeResourcesFit, weight: 1, args: {strategy: LeastAllocated}}
      - {name: TaintToleration, weight: 3}   # weight in (0, 10000], default 1
    binder: {name: BestFitGpu}               # optional; a bare name works too
    tie_break: random                        # random | first | rank
    forecaster: models/forecast              # optional
    queue_sort: priority                     # priority | least-slack (both kinds)
    failure_toleration_s: 10                 # optional (both kinds): see RunSettings

Split profile YAML::

    name: online-batch
    routes: {online: load-aware, batch: binpack, default: fgd}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic import ValidationError as PydanticError
from pydantic_core import InitErrorDetails, PydanticCustomError

from smartsched.model.configfile import first_error, refuse_bools_as_numbers, validate
from smartsched.model.errors import ValidationError
from smartsched.model.pod import PodClass

MAX_WEIGHT = 10_000
DEFAULT_ROUTE = "default"


class PluginRef(BaseModel):
    """A plugin by name, with its arguments (checked later by the plugin's ``Args``).

    A bare string is the name with no arguments; ``args:`` left empty is ``{}``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, v: Any) -> Any:
        if isinstance(v, str):
            return {"name": v}
        if not isinstance(v, dict | PluginRef):
            raise ValueError(f"expected a plugin name or {{name, args}}, got {v!r}")
        if isinstance(v, dict) and "args" in v and v["args"] is None:
            return {k: x for k, x in v.items() if k != "args"}
        return v


class ScoreRef(PluginRef):
    """A score plugin and its weight in the weighted sum."""

    weight: Annotated[float, Field(strict=True, gt=0, le=MAX_WEIGHT, allow_inf_nan=False)] = 1.0


class RunSettings(BaseModel):
    """What a profile sets beyond placement, for the whole run (single and split).

    ``queue_sort``: the order of waiting pods of one priority: ``priority`` (Kubernetes'
    PrioritySort: by arrival) or ``least-slack`` (latest start time first: deadline
    minus the work left; for jobs sharing a deadline, longest first).
    ``failure_toleration_s``: how long the profile's pods tolerate a NotReady node before
    they are evicted and placed again (a toleration of ``node.kubernetes.io/unreachable``
    and ``not-ready`` with this ``tolerationSeconds``); None keeps the cluster's default
    (300 s in Kubernetes).
    """

    queue_sort: Literal["priority", "least-slack"] = "priority"
    failure_toleration_s: float | None = Field(None, ge=0, le=86_400, allow_inf_nan=False)


class ProfileDoc(RunSettings):
    """One profile: filters -> weighted scores -> binder (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    description: str | None = None
    filters: list[PluginRef]
    score: list[ScoreRef] = Field(default_factory=list)
    binder: PluginRef | None = None
    post_filter: list[PluginRef] = Field(default_factory=list)
    deschedule: list[PluginRef] = Field(default_factory=list)
    defer: list[PluginRef] = Field(default_factory=list)
    tie_break: Literal["random", "first", "rank"] = "random"
    forecaster: str | None = Field(None, min_length=1)

    @field_validator("score", mode="before")
    @classmethod
    def _no_scorers(cls, v: Any) -> Any:
        return [] if v is None else v  # ``score:`` left empty

    @field_validator("filters")
    @classmethod
    def _some_filter(cls, v: list[PluginRef]) -> list[PluginRef]:
        if not v:
            raise ValueError("a profile needs at least one filter")
        return v

    @field_validator("filters", "score", "post_filter", "deschedule", "defer")
    @classmethod
    def _each_plugin_once(cls, v: list[PluginRef]) -> list[PluginRef]:
        """A plugin listed twice would run twice (a scorer's weight silently doubled), as
        kube-scheduler refuses in its own profiles."""
        seen: set[str] = set()
        for ref in v:
            if ref.name in seen:
                raise ValueError(f"plugin {ref.name} is listed twice (give it once, with "
                                 "its weight and args)")
            seen.add(ref.name)
        return v


class SplitProfileDoc(RunSettings):
    """Several profiles side by side, each pod routed by its class.

    ``routes`` maps a pod class (or ``default``, for every class not listed) to
    the name of a profile; every class must have a route, and no route may
    name the split itself.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    description: str | None = None
    routes: dict[str, Annotated[str, Field(min_length=1)]]

    @model_validator(mode="after")
    def _check_routes(self) -> SplitProfileDoc:
        classes = [c.value for c in PodClass]
        if not self.routes:
            _fail(("routes",), "must map pod classes to profiles", self.routes)
        for key, target in self.routes.items():
            if key not in classes and key != DEFAULT_ROUTE:
                _fail(("routes", key), f"not a pod class ({', '.join(classes)}) "
                      f"or {DEFAULT_ROUTE!r}", key)
            if target == self.name:
                _fail(("routes", key), "a split cannot route to itself", target)
        missing = [c for c in classes if c not in self.routes]
        if missing and DEFAULT_ROUTE not in self.routes:
            _fail(("routes",), f"no route for {missing} and no {DEFAULT_ROUTE!r} route",
                  self.routes)
        return self


def _fail(loc: tuple[str, ...], message: str, value: Any) -> None:
    """Raise a pydantic error at ``loc`` (a plain ValueError would lose the location)."""
    raise PydanticError.from_exception_data(
        "SplitProfileDoc",
        [InitErrorDetails(type=PydanticCustomError("routes", message), loc=loc, input=value)],
    )


def is_split(doc: Any) -> bool:
    """Whether a raw profile document is a split profile (it has ``routes``)."""
    return isinstance(doc, Mapping) and "routes" in doc


def parse_profile(doc: Any, source: str = "profile") -> ProfileDoc:
    """``doc`` (a parsed YAML mapping) as a ``ProfileDoc``; errors name the field.

    Fields are prefixed with the profile's name, except an unknown top-level
    key and the name itself, which are prefixed with ``source``.
    """
    if not isinstance(doc, Mapping):
        raise ValidationError(source, "a profile must be a mapping")
    name = doc.get("name")
    try:
        parsed = ProfileDoc.model_validate(dict(doc))
    except PydanticError as e:
        err = e.errors()[0]
        top = len(err["loc"]) == 1 and (
            err["loc"][0] == "name" or err["type"] == "extra_forbidden")
        prefix = source if top or not isinstance(name, str) or not name else name
        raise ValidationError(*first_error(e, prefix)) from None
    refuse_bools_as_numbers(parsed, dict(doc), name if isinstance(name, str) and name
                            else source)
    return parsed


def parse_split(doc: Any, source: str) -> SplitProfileDoc:
    """``doc`` as a ``SplitProfileDoc`` (named ``source`` when it has no name)."""
    if not isinstance(doc, Mapping):
        raise ValidationError(source, "a profile must be a mapping")
    name = doc.get("name") or source
    prefix = name if isinstance(name, str) else source
    return validate(SplitProfileDoc, {**doc, "name": name}, prefix=prefix, drop=("[key]",))
