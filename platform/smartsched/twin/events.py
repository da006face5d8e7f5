"""The twin's event heap: simulated time advances from one event batch to the next.

Owns the event kinds and their order at equal times (completions free
capacity before arrivals ask for it; metric ticks see the settled state), and
a heap with a tie-breaking counter, so runs are deterministic for a seed.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Final, NamedTuple

# Event kinds; the integer also orders simultaneous events.
EV_RECOVER: Final = 0
EV_COMPLETE: Final = 1
EV_POWER_UP: Final = 2
EV_PULLED: Final = 3  # a pod's image is on its node: the container starts
EV_DUE: Final = 4  # a gang's reservation is due: offer the gang again
EV_FAIL: Final = 5  # a node stops: its pods stall (the control plane does not know yet)
EV_NOT_READY: Final = 6  # the node monitor marks a failed node NotReady: no new pods there
EV_NODE_EVICT: Final = 7  # the pods' toleration of a NotReady node ran out: evicted
EV_POWER_DOWN: Final = 8
EV_ARRIVE: Final = 9
EV_TICK: Final = 10


class Event(NamedTuple):
    """Ordered as a tuple: (time, kind, seq); ``seq`` is unique, so the payload is never
    compared. A tuple compares in C; a dataclass's generated ``__lt__`` runs in Python,
    dozens of times per decision."""

    time: float
    kind: int
    seq: int
    payload: Any


class EventHeap:
    """Pending events by (time, kind, insertion order); counts the non-tick ones, because
    a run with only ticks left is over unless a horizon asks for more."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._seq = itertools.count()
        self.non_tick = 0

    def __bool__(self) -> bool:
        return bool(self._events)

    def push(self, time: float, kind: int, payload: Any) -> None:
        if kind != EV_TICK:
            self.non_tick += 1
        heapq.heappush(self._events, Event(time, kind, next(self._seq), payload))

    def peek(self) -> Event:
        return self._events[0]

    def pop(self) -> Event:
        ev = heapq.heappop(self._events)
        if ev.kind != EV_TICK:
            self.non_tick -= 1
        return ev
