"""Filter verdicts as values: a Status per filter, with its checks over every node.

Owns what a filter plugin returns (kube-scheduler's framework.Status,
vectorized): the plugin's name and, per check, the reason, the code
(Unschedulable, UnschedulableAndUnresolvable, Error) and the mask of nodes
that pass it. Nobody re-parses reason strings: rejections name the plugin,
the Kubernetes extender reports unresolvable nodes from the codes, and the
twin's queue retries a pod only on an event that could change a verdict.

Also owns which events can change a filter's verdicts (``QueueingHint``, as
kube's EnqueueExtensions): a filter declares whether its Unschedulable
verdicts are the twin's resource fit, a pod-independent node condition it
can re-evaluate (``node_condition``), or whether it has only verdicts that
no event changes.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol, runtime_checkable

import numpy as np

from smartsched.twin.decision import Code, Rejection
from smartsched.twin.state import ClusterState

__all__ = ["Check", "Code", "EnqueueExtensions", "NodeConditionFilter", "QueueingHint",
           "Rejection", "Status"]

# One check of a filter over all nodes: (reason, code, passing mask [N]).
Check = tuple[str, Code, np.ndarray]


class Status:
    """One filter's verdict for one pod over all nodes: its checks, and where all pass.

    ``passing`` is the AND of the checks' masks; a node that fails is blamed on
    its first failing check (kube's per-node status message).
    """

    __slots__ = ("checks", "passing", "plugin")

    def __init__(self, plugin: str, checks: tuple[Check, ...]) -> None:
        self.plugin = plugin
        self.checks = checks
        if len(checks) == 1:
            self.passing: np.ndarray = checks[0][2]
            return
        passing = checks[0][2] & checks[1][2]  # a new array: the checks' masks stay intact
        for _, _, mask in checks[2:]:
            passing &= mask
        self.passing = passing

    @staticmethod
    def single(plugin: str, reason: str, code: Code, passing: np.ndarray) -> Status:
        """A filter with one check."""
        return Status(plugin, ((reason, code, passing),))

    def __repr__(self) -> str:
        fails = {r: int((~m).sum()) for r, _, m in self.checks}
        return f"Status({self.plugin}, failing={fails})"


class QueueingHint(Enum):
    """What can turn a filter's rejections around (the events the twin's queue watches)."""

    # Only UnschedulableAndUnresolvable verdicts: a change to the node (labels, taints,
    # cordon, up/down) is needed; the twin retries everything when a node goes up or down.
    STATIC = "static"
    # Unschedulable verdicts are exactly the twin's resource fit (ClusterState.fit_checks):
    # the twin re-derives them when room is freed.
    RESOURCES = "resources"
    # Unschedulable verdicts depend on the node only (its load, say), not on the pod: the
    # twin re-evaluates ``node_condition`` when the node's state changes.
    NODE_CONDITION = "node-condition"


@runtime_checkable
class EnqueueExtensions(Protocol):
    """A filter that says which events can change its verdicts."""

    queueing_hint: QueueingHint


@runtime_checkable
class NodeConditionFilter(Protocol):
    """A pod-independent filter: its verdict on each node, for any pod."""

    def node_condition(self, state: ClusterState,
                       nodes: np.ndarray | slice = ...) -> np.ndarray:
        """Bool per node (all, or the ``nodes`` given): those that pass now."""
        ...
