"""The scheduler interface every placement policy implements.

Owns the ``Scheduler`` protocol (``decide(state, request) -> Decision``) and
the registry of named schedulers. A scheduler reads the twin's state and the
offered pod and returns a Decision; it never mutates the state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from smartsched.model.errors import UnknownReferenceError
from smartsched.twin.engine import Decision
from smartsched.twin.state import ClusterState, PodRequest


@runtime_checkable
class Scheduler(Protocol):
    """A placement policy."""

    name: str

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        """Choose a node (and optionally devices) for ``request``, or reject with reasons."""
        ...


SchedulerFactory = Callable[[int], Scheduler]
_REGISTRY: dict[str, SchedulerFactory] = {}


def register(name: str, factory: SchedulerFactory) -> None:
    """Make ``name`` resolvable by :func:`make_scheduler` (factory gets the seed)."""
    _REGISTRY[name] = factory


def scheduler_names() -> list[str]:
    _ensure_builtins()
    return sorted(_REGISTRY)


def make_scheduler(name: str, seed: int = 0) -> Scheduler:
    """Build the scheduler registered as ``name``."""
    _ensure_builtins()
    if name not in _REGISTRY:
        raise UnknownReferenceError(
            "scheduler", f"unknown scheduler {name!r} (known: {', '.join(sorted(_REGISTRY))})"
        )
    return _REGISTRY[name](seed)


def _ensure_builtins() -> None:
    from smartsched.scheduling import simple  # noqa: F401  (registers on import)
