"""Reservations for gangs: room promised on some nodes at a due time (backfill's anchor).

Owns which nodes hold room for which waiting gang and until when, as arrays
over nodes so a filter reads them in one expression: the member's charged
request and whole GPUs reserved on each node, the due time, and the owner's
priority. A gang that cannot start gets one (``scheduling.plugins.gangs``
computes it from when running pods are expected to end); other pods may use
reserved room only when they would not delay it (Slurm's backfill rule,
``Reservations`` filter); the gang starts on its nodes at the due time; the
reservation ends when the gang is placed or is replaced by a newer one.
One node holds at most one reservation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# The key of a single pod's reservation (``GangReservationArgs.singles_from_gpus``): no
# gang id can begin with a control character, so the two never collide.
SINGLE = "\x00pod:"


def holder(pod: Any) -> str | None:
    """The key a reservation for ``pod`` is held under: its gang's id, or for a pod not in
    a gang ``SINGLE`` + its id."""
    if pod.gang_id is not None and pod.gang_size > 1:
        return str(pod.gang_id)
    return SINGLE + pod.id


@dataclass(frozen=True)
class Reservation:
    """Room for one member of ``gang`` on each of ``nodes`` from ``due`` on (``gang``: the
    key from ``holder``; a single pod's reservation is a gang of one)."""

    gang: str
    priority: int
    nodes: tuple[int, ...]
    request: np.ndarray  # [R] charged request of one member
    gpus: int  # whole GPUs one member takes (0: none or a share)
    due: float
    displaces: tuple[str, ...] = ()  # lower-priority gangs whose reservations it replaces


class Reservations:
    """The reservations of one cluster, by gang and as per-node arrays."""

    def __init__(self, num_nodes: int, num_resources: int) -> None:
        self.by_gang: dict[str, Reservation] = {}
        self.reserved = np.zeros((num_nodes, num_resources), dtype=np.int64)
        self.gpus = np.zeros(num_nodes, dtype=np.int64)
        self.due = np.full(num_nodes, np.inf)
        self.priority = np.zeros(num_nodes, dtype=np.int64)
        self.owner = np.full(num_nodes, -1, dtype=np.int64)  # gang id (see ``gang_id``)
        self._gang_ids: dict[str, int] = {}
        # Whether a gang evicts lower-priority pods from its reserved nodes once due (the
        # twin carries such preemptions out). Only then may those pods backfill reserved
        # room whatever their length (the Reservations filter); the service and the
        # Kubernetes scheduler never let a gang preempt, so there the room stays held.
        self.gang_preempts = False

    def gang_id(self, gang: str | None) -> int:
        """The integer standing for ``gang`` in ``owner`` (-2 for no gang: owns nothing)."""
        if gang is None:
            return -2
        return self._gang_ids.setdefault(gang, len(self._gang_ids))

    def known_id(self, gang: str | None) -> int:
        """``gang_id`` without taking a number for a key never reserved (-2: owns nothing):
        a filter asks it for every pod, and single pods' keys would pile up."""
        return self._gang_ids.get(gang, -2) if gang is not None else -2

    def __len__(self) -> int:
        return len(self.by_gang)

    def add(self, r: Reservation) -> None:
        """Hold ``r`` (replacing the gang's earlier one); nodes held by another gang are
        not taken from it."""
        self.remove(r.gang)
        for g in r.displaces:
            self.remove(g)
        gid = self.gang_id(r.gang)
        nodes = tuple(n for n in r.nodes if self.owner[n] < 0)
        if len(nodes) < len(r.nodes):
            r = Reservation(r.gang, r.priority, nodes, r.request, r.gpus, r.due)
        else:
            r = Reservation(r.gang, r.priority, r.nodes, r.request, r.gpus, r.due)
        self.by_gang[r.gang] = r
        for n in nodes:
            self.reserved[n] = r.request
            self.gpus[n] = r.gpus
            self.due[n] = r.due
            self.priority[n] = r.priority
            self.owner[n] = gid

    def settle(self, gang: str, reserve: Reservation | None, now: float
               ) -> Reservation | None:
        """After ``gang``'s rejection, the one rule every driver applies: hold the room its
        scheduler reserved (``reserve``, replacing an earlier one); without a new one, its
        earlier reservation stands until due, and one that came due and still did not fit
        is dropped (nodes are not held for a gang that cannot use them). Returns what is
        held for the gang now (None: nothing)."""
        if reserve is not None:
            self.add(reserve)
            return self.by_gang[gang]
        held = self.by_gang.get(gang)
        if held is not None and held.due <= now:
            self.remove(gang)
            return None
        return held

    def remove(self, gang: str) -> Reservation | None:
        r = self.by_gang.pop(gang, None)
        if r is not None:
            for n in r.nodes:
                self.reserved[n] = 0
                self.gpus[n] = 0
                self.due[n] = np.inf
                self.priority[n] = 0
                self.owner[n] = -1
        return r

    def drop_node(self, node: int) -> None:
        """A reserved node went down: its gang's reservation no longer holds."""
        gid = int(self.owner[node])
        if gid >= 0:
            gang = next(g for g, i in self._gang_ids.items() if i == gid)
            self.remove(gang)

    def copy(self) -> Reservations:
        other = object.__new__(Reservations)
        other.by_gang = dict(self.by_gang)
        other.reserved = self.reserved.copy()
        other.gpus = self.gpus.copy()
        other.due = self.due.copy()
        other.priority = self.priority.copy()
        other.owner = self.owner.copy()
        other._gang_ids = dict(self._gang_ids)
        other.gang_preempts = self.gang_preempts
        return other
