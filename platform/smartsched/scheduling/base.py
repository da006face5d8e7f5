"""The scheduler interface and how a ``--scheduler`` name becomes a scheduler.

Owns the ``Scheduler`` protocol (``decide(state, request) -> Decision``,
optionally ``prepare(pods)``) and the name resolution: programmatic
registrations first (the RL policy registers ``rl:`` later), then packaged
profiles (``scheduling/profiles/*.yaml``) or a user profile file. A scheduler
reads the twin's state and never mutates it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from smartsched.twin.engine import Decision
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


SchedulerFactory = Callable[[str, int], Scheduler]
_PREFIXES: dict[str, SchedulerFactory] = {}


def register_prefix(prefix: str, factory: SchedulerFactory) -> None:
    """Resolve names ``<prefix>:<rest>`` with ``factory(rest, seed)`` (e.g. ``rl:PATH``)."""
    _PREFIXES[prefix] = factory


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


class SplitScheduler:
    """Several schedulers side by side, each pod routed by its class.

    The multi-scheduler split of a real cluster (online pods through one
    profile, batch and AI through another): every route sees the same state,
    so their decisions never conflict.
    """

    def __init__(self, name: str, routes: dict[str, Scheduler]) -> None:
        self.name = name
        self.routes = routes

    @staticmethod
    def from_doc(doc: SplitProfileDoc | Mapping[str, Any], source: str, seed: int
                 ) -> SplitScheduler:
        """The split a validated document describes (a raw mapping is validated first,
        its errors named ``<name>.routes...``); each route's profile is built once."""
        from smartsched.scheduling import profile_doc

        split = (doc if isinstance(doc, profile_doc.SplitProfileDoc)
                 else profile_doc.parse_split(doc, source))
        cache: dict[str, Scheduler] = {}
        for target in split.routes.values():
            if target not in cache:
                cache[target] = make_scheduler(target, seed)
        return SplitScheduler(split.name, {k: cache[t] for k, t in split.routes.items()})

    def _route(self, request: PodRequest) -> Scheduler:
        return self.routes.get(request.pod.pod_class.value) or self.routes["default"]

    def prepare(self, pods: object) -> None:
        for s in {id(s): s for s in self.routes.values()}.values():
            if hasattr(s, "prepare"):
                s.prepare(pods)

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        return self._route(request).decide(state, request)
