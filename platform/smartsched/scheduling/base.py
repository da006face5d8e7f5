"""The scheduler interface and how a ``--scheduler`` name becomes a scheduler.

Owns the ``Scheduler`` protocol (``decide(state, request) -> Decision``,
optionally ``prepare(pods)``) and the name resolution: programmatic
registrations first (the RL policy registers ``rl:`` later), then packaged
profiles (``scheduling/profiles/*.yaml``) or a user profile file. A scheduler
reads the twin's state and never mutates it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from smartsched.twin.engine import Decision
from smartsched.twin.state import ClusterState, PodRequest


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
    from smartsched.scheduling.registry import load_profile

    prefix, _, rest = name.partition(":")
    if rest and prefix in _PREFIXES:
        return _PREFIXES[prefix](rest, seed)
    return ProfileScheduler(load_profile(name), seed)
