"""What drivers and the twin exchange at each decision: requests, decisions, rejections.

Owns the value types of the step-wise API: ``DecisionRequest`` (a pod that
needs placing now), ``Decision`` (a node and devices, a deferral, or a
rejection), ``Rejection`` (one reason a pod was refused: which plugin, on how
many nodes, whether an event could change it) and ``RetryHint`` (what could
make a rejected pod schedulable, so the twin's queue retries it only then:
kube-scheduler's QueueingHint, vectorized). Scheduling builds them; the twin
reads them and never imports scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

import numpy as np

from smartsched.model.pod import Pod
from smartsched.twin.reservations import Reservation
from smartsched.twin.state import ClusterState, PodRequest


class Code(IntEnum):
    """A filter verdict's code, as kube-scheduler's framework.Code."""

    SUCCESS = 0
    # The pod might pass after a cluster event (room freed, load fell).
    UNSCHEDULABLE = 1
    # Nothing short of a change to the node makes the pod pass (selector, taint, region).
    UNSCHEDULABLE_AND_UNRESOLVABLE = 2
    # The check itself failed (a bug or bad data), not the pod.
    ERROR = 3


@dataclass(frozen=True, slots=True)
class Rejection:
    """One reason a pod was not placed: ``plugin`` failed it on ``nodes`` nodes."""

    reason: str
    plugin: str = ""
    nodes: int = 0
    code: Code = Code.UNSCHEDULABLE

    def __str__(self) -> str:
        """kube's per-reason form: "3 nodes: Insufficient cpu" (or the bare reason)."""
        return f"{self.nodes} nodes: {self.reason}" if self.nodes else self.reason


class NodeCondition(Protocol):
    """A pod-independent filter (node load, for instance) the twin may re-evaluate."""

    def node_condition(self, state: ClusterState,
                       nodes: np.ndarray | slice = ...) -> np.ndarray:
        """Bool per node (all nodes, or the ``nodes`` given): those that pass now, for
        any pod."""
        ...


@dataclass(frozen=True, eq=False)
class RetryHint:
    """When a rejected pod could become schedulable, exactly.

    The pod passes a node when the node is in ``open_nodes`` (it passed every
    check no cluster event changes: selector, taints, region, GPU model, node
    cordoned or down), the pod fits the node's free resources (the twin's own
    ``ClusterState.fit_checks``), and every ``conditions`` entry passes there.
    The twin retries the pod when an event makes that true on some node;
    without a hint it retries on every event that frees room, as before.
    """

    open_nodes: np.ndarray
    conditions: tuple[NodeCondition, ...] = ()
    # The pod may preempt pods of priority strictly below this (the profile preempts):
    # room they hold counts as room the pod could get.
    preempt_below: int | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """A scheduler's answer for the offered pod.

    ``node`` None rejects the pod (``rejections`` say why, per plugin, and
    ``retry`` when to try again); ``devices`` None lets the twin's default
    binder pick devices; ``defer`` keeps a deferrable pod waiting although it
    might fit. ``victims``: bound pods to evict first (preemption); the pod
    then takes ``node``. ``reserve``: with a rejected gang member, the room the
    gang should hold until it can start (``twin.reservations``).
    """

    node: int | None
    devices: tuple[int, ...] | None = None
    defer: bool = False
    rejections: tuple[Rejection, ...] = ()
    retry: RetryHint | None = None
    victims: tuple[Pod, ...] = ()
    reserve: Reservation | None = None

    @property
    def reasons(self) -> tuple[str, ...]:
        """The rejections as kube's "N nodes: <reason>" strings."""
        return tuple(str(r) for r in self.rejections)

    @staticmethod
    def reject(*reasons: str | Rejection, retry: RetryHint | None = None) -> Decision:
        """A rejection; plain strings become rejections with no plugin named."""
        return Decision(None, rejections=tuple(
            r if isinstance(r, Rejection) else Rejection(r) for r in reasons), retry=retry)

    def rejected_by(self) -> tuple[str, ...]:
        """The plugins that rejected the pod, in order, each once."""
        return tuple(dict.fromkeys(r.plugin for r in self.rejections if r.plugin))


@dataclass(frozen=True, slots=True)
class Migration:
    """Move bound ``pod`` to ``node`` (a descheduling pass): it is evicted, restarts there
    at once (image pull and container start again; what it ran since its last checkpoint
    is lost, as for any eviction) and counts as a migration, not a preemption."""

    pod: Pod
    node: int


def can_defer(pod: Pod, now: float) -> bool:
    """Whether ``pod`` may still be deferred at ``now``: it has a deadline and, if it
    started now, would finish before it. Shared by the RL env and the rl: scheduler."""
    if pod.deadline is None:
        return False
    return now + (pod.duration or 0.0) < pod.deadline


@dataclass(frozen=True, slots=True)
class DecisionRequest:
    """A pod that needs placing now."""

    pod: Pod
    request: PodRequest
    pod_index: int
    time: float
    gang_remaining: int = 0  # members still to place after this one
