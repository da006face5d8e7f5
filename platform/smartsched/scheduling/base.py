"""The scheduler interface and how a ``--scheduler`` name becomes a scheduler.

Owns the ``Scheduler`` protocol (``decide(state, request) -> Decision``), the
optional protocols a scheduler or plugin implements to ask something of the
run (``WorkloadAware.prepare(pods)``: learn the workload first;
``NeedsTwin.twin_needs()``: hooks the twin must carry, a load forecaster or
reduced telemetry; ``Reseedable.reseed(seed)``), and the name resolution:
programmatic registrations first (the RL policy registers ``rl:``), then
packaged profiles (``scheduling/profiles/*.yaml``) or a user profile file. A
scheduler reads the twin's state and never mutates it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod
from smartsched.paths import relative_to
from smartsched.twin.decision import Decision, Migration
from smartsched.twin.state import ClusterState, PodRequest

if TYPE_CHECKING:
    from smartsched.scheduling.profile_doc import SplitProfileDoc


@runtime_checkable
class Scheduler(Protocol):
    """A placement policy."""

    name: str

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        """Choose a node (and optionally devices) for ``request``, or reject with reasons."""
        ...


@runtime_checkable
class WindowPlanner(Protocol):
    """A scheduler that places pods jointly, a window at a time: in fill mode the drive
    loop hands it each window of ``window`` arrivals (``plan_window``) before offering
    their pods one by one (``decide``)."""

    window: int

    def planned(self, request: PodRequest) -> bool: ...

    def plan_window(self, state: ClusterState, requests: Sequence[PodRequest]) -> None: ...


@runtime_checkable
class WorkloadAware(Protocol):
    """A scheduler or plugin that models the workload before placing it (FGD's typical
    pods): the run builder calls ``prepare`` with the workload's pods first."""

    def prepare(self, pods: Sequence[Pod]) -> None: ...


@runtime_checkable
class Deschedules(Protocol):
    """A scheduler with a periodic descheduling pass: every ``deschedule_interval_s``
    (None: never) the twin offers it the pods waiting, in queue order, and moves the bound
    pods it names (``Migration``)."""

    @property
    def deschedule_interval_s(self) -> float | None: ...

    def deschedule(self, state: ClusterState,
                   waiting: Sequence[PodRequest]) -> tuple[Migration, ...]: ...


@runtime_checkable
class Reseedable(Protocol):
    """A plugin with its own random choices, seeded with the scheduler's seed."""

    def reseed(self, seed: int) -> None: ...


@dataclass(frozen=True)
class TwinNeeds:
    """Hooks a scheduler needs on the twin it runs on (attached by ``build_run``).

    Attributes:
        forecaster: folder of a load forecaster (``models/forecast[?plan=median]``): the
            twin feeds it node usage at every tick and exposes the prediction as
            ``ClusterState.predicted_usage``.
        telemetry: folder of a telemetry projection: the twin synthesizes node telemetry
            and stores its reduced columns in ``ClusterState.telemetry_features``.
    """

    forecaster: str | None = None
    telemetry: str | None = None

    def merge(self, other: TwinNeeds, where: str) -> TwinNeeds:
        """Both sets of needs; two different forecasters (or projections) cannot share a
        twin, and the error names ``where``."""
        from smartsched.model.errors import ValidationError

        def one(name: str, a: str | None, b: str | None) -> str | None:
            if a is not None and b is not None and a != b:
                raise ValidationError(f"{where}.{name}", f"{a!r} and {b!r} cannot share a twin")
            return a if a is not None else b

        return TwinNeeds(one("forecaster", self.forecaster, other.forecaster),
                         one("telemetry", self.telemetry, other.telemetry))


@runtime_checkable
class NeedsTwin(Protocol):
    """A scheduler that asks for hooks on the twin (see ``TwinNeeds``)."""

    def twin_needs(self) -> TwinNeeds: ...


SchedulerFactory = Callable[[str, int], Scheduler]
_PREFIXES: dict[str, SchedulerFactory] = {}


def register_prefix(prefix: str, factory: SchedulerFactory) -> None:
    """Resolve names ``<prefix>:<rest>`` with ``factory(rest, seed)`` (e.g. ``rl:PATH``)."""
    _PREFIXES[prefix] = factory


def option_names(spec: str) -> frozenset[str] | None:
    """The option names the scheduler ``spec`` names takes in its own ``?...`` part: none
    for a profile, the factory's ``option_names`` for a ``<prefix>:`` scheduler, None when
    a plugin prefix does not declare them."""
    prefix, _, rest = spec.partition(":")
    if not rest:
        return frozenset()
    if prefix not in _PREFIXES:
        _load_prefix_plugins()
    factory = _PREFIXES.get(prefix)
    names = getattr(factory, "option_names", None)
    return None if names is None else frozenset(names)


def split_wrapper_spec(wrapper: str, spec: str, own: Collection[str]
                       ) -> tuple[str, dict[str, list[str]]]:
    """(base spec, the wrapper's options) of a wrapper's ``<base>[?<base's>][?<its own>]``
    (``lookahead:``, ``sandboxed:``). The part after the last ``?`` is the wrapper's when
    every key in it is one of ``own``; otherwise the whole spec is the base's. A lone part
    whose every key the base takes too (``lookahead:rl:P?k=8``: the shortlist's k or the
    lookahead's?) is refused naming a key: ``<base>??k=8`` gives it to the wrapper,
    ``<base>?k=8?`` to the base (an empty last part: the wrapper takes none)."""
    from urllib.parse import parse_qs

    head, sep, query = spec.rpartition("?")
    if not sep:
        return spec, {}
    if not query:  # "<base>?": the base ends here; no options of the wrapper's
        return head, {}
    parsed = parse_qs(query, keep_blank_values=True)
    if not parsed or not set(parsed) <= set(own):
        return spec, {}
    refuse_repeated_options(parsed)
    if head.endswith("?"):  # "<base>??opts": the base has no options of its own
        return head[:-1], parsed
    base_takes = option_names(head) or frozenset()
    if "?" not in head and set(parsed) <= base_takes:  # either could take the whole part
        key = sorted(parsed)[0][:64]
        raise ValidationError(
            f"scheduler.{key}",
            f"an option of {wrapper}: and of its base {head.split(':')[0][:32]}: alike; "
            f"write {wrapper}:<base>??<options> for {wrapper}:'s, or "
            f"{wrapper}:<base>?<options>? for the base's")
    return head, parsed


def refuse_repeated_options(parsed: Mapping[str, Sequence[str]],
                            lists: Sequence[str] = ()) -> None:
    """ValidationError naming an option a scheduler spec gives twice (``rl:P?weights=a&
    weights=b``): the last one was used without a word, as a YAML file's second key was
    before it was refused. ``parsed``: ``urllib.parse.parse_qs``'s answer; ``lists``: the
    options that collect every value given (``classes=batch&classes=ai-train``)."""
    for key, values in parsed.items():
        if len(values) > 1 and key not in lists:
            raise ValidationError(f"scheduler.{key[:64]}", f"given {len(values)} times; "
                                  "give it once")


def scheduler_names() -> list[str]:
    from smartsched.scheduling.registry import builtin_profiles

    return sorted(builtin_profiles())


def make_scheduler(name: str, seed: int = 0) -> Scheduler:
    """A packaged profile, a profile YAML path, a split profile, or ``<prefix>:...``."""
    from smartsched.scheduling.framework import ProfileScheduler
    from smartsched.scheduling.registry import profile_from_dict, read_profile_doc

    prefix, _, rest = name.partition(":")
    if rest and prefix not in _PREFIXES:
        _load_prefix_plugins()
    if rest and prefix in _PREFIXES:
        return _PREFIXES[prefix](rest, seed)
    doc, source = read_profile_doc(name)
    if "routes" in doc:
        return SplitScheduler.from_doc(doc, source, seed)
    return ProfileScheduler(profile_from_dict(doc, source), seed)


def _load_prefix_plugins() -> None:
    """Register ``prefix:`` schedulers declared as entry points (group
    ``smartsched.schedulers``), e.g. the RL policy's ``rl:`` — so scheduling never
    imports rl, and other packages can add their own prefixes."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="smartsched.schedulers"):
        if ep.name not in _PREFIXES:
            _PREFIXES[ep.name] = ep.load()


# The split profiles being built, outermost first: a route that leads back to one of them
# (directly or through other splits) would recurse without end.
_SPLITS_BUILDING: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "smartsched_splits_building", default=())


def _profile_key(source: str) -> str:
    """One name per profile file however it was written (``s/a.yaml``, ``./s/a.yaml``)."""
    from pathlib import Path

    path = Path(source)
    return str(path.resolve()) if path.is_file() else source


def _split_folder(source: str) -> Path | None:
    """Where a split's routes read their relative files and policy folders: beside the
    split file, whatever the working directory (a same-named file there was used
    silently), in wrapped routes (``lookahead:``, ``sandboxed:``, ``anneal:``) and
    ``rl:`` ones alike. A packaged split's routes are packaged names (None)."""
    src = Path(source)
    return src.parent if src.suffix in (".yaml", ".yml") and src.is_file() else None


class SplitScheduler:
    """Several schedulers side by side, each pod routed by its class.

    The multi-scheduler split of a real cluster (online pods through one
    profile, batch and AI through another): every route sees the same state,
    so their decisions never conflict.
    """

    def __init__(self, name: str, routes: dict[str, Scheduler], queue_sort: str = "priority",
                 failure_toleration_s: float | None = None) -> None:
        self.name = name
        self.routes = routes
        # The split's own run settings (one queue, one cluster): not merged from routes.
        self.queue_sort = queue_sort
        self.failure_toleration_s = failure_toleration_s

    @staticmethod
    def from_doc(doc: SplitProfileDoc | Mapping[str, Any], source: str, seed: int
                 ) -> SplitScheduler:
        """The split a validated document describes (a raw mapping is validated first,
        its errors named ``<name>.routes...``); each route's profile is built once."""
        from smartsched.scheduling import profile_doc

        split = (doc if isinstance(doc, profile_doc.SplitProfileDoc)
                 else profile_doc.parse_split(doc, source))
        building = _SPLITS_BUILDING.get()
        key = _profile_key(source)
        keys = [_profile_key(b) for b in building]
        if key in keys:
            chain = " -> ".join([*building[keys.index(key):], source])
            raise ValidationError(f"{split.name}.routes", f"routes come back to {source} "
                                  f"({chain}): a split cannot reach itself")
        token = _SPLITS_BUILDING.set((*building, source))
        try:
            cache: dict[str, Scheduler] = {}
            for cls, target in split.routes.items():
                if target in cache:
                    continue
                try:
                    with relative_to(_split_folder(source)):
                        cache[target] = make_scheduler(target, seed)
                except ValidationError as e:
                    if ".routes" in e.field:
                        raise  # a nested split's own route, named already
                    inner = f" ({e.field} in {e.source})" if e.source not in (None, source) \
                        else ""
                    raise type(e)(f"{split.name}.routes.{cls}", e.message + inner,
                                  source=source) from None
        finally:
            _SPLITS_BUILDING.reset(token)
        return SplitScheduler(split.name, {k: cache[t] for k, t in split.routes.items()},
                              split.queue_sort, split.failure_toleration_s)

    def _route(self, request: PodRequest) -> Scheduler:
        return self.routes.get(request.pod.pod_class.value) or self.routes["default"]

    def route(self, request: PodRequest) -> Scheduler:
        """The scheduler this split hands ``request`` to (by the pod's class)."""
        return self._route(request)

    def _distinct(self) -> list[Scheduler]:
        return list({id(s): s for s in self.routes.values()}.values())

    def prepare(self, pods: Sequence[Pod]) -> None:
        for s in self._distinct():
            if isinstance(s, WorkloadAware):
                s.prepare(pods)

    def twin_needs(self) -> TwinNeeds:
        """What any route needs: the routes share one twin."""
        needs = TwinNeeds()
        for s in self._distinct():
            if isinstance(s, NeedsTwin):
                needs = needs.merge(s.twin_needs(), f"{self.name}.routes")
        return needs

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        return self._route(request).decide(state, request)

    def ranked(self, state: ClusterState, request: PodRequest, k: int
               ) -> list[tuple[int, tuple[int, ...] | None]]:
        """The pod's route's best feasible nodes (empty when that route cannot rank)."""
        inner = getattr(self._route(request), "ranked", None)
        return inner(state, request, k) if inner is not None else []

    @property
    def deschedule_interval_s(self) -> float | None:
        """The shortest pass interval of any route (the routes share one cluster)."""
        found = [s.deschedule_interval_s for s in self._distinct()
                 if isinstance(s, Deschedules) and s.deschedule_interval_s is not None]
        return min(found) if found else None

    def deschedule(self, state: ClusterState,
                   waiting: Sequence[PodRequest]) -> tuple[Migration, ...]:
        """The first route whose pass moves anything decides this pass."""
        for s in self._distinct():
            if isinstance(s, Deschedules) and s.deschedule_interval_s is not None:
                moves = s.deschedule(state, waiting)
                if moves:
                    return moves
        return ()
