"""Node power lifecycle: idle nodes power down, a placement wakes one up.

Owns the power state machine of every node (on -> off after
``idle_power_down_s`` with no pods; off -> booting when a pod is bound to it;
booting -> on after ``power_up_s``, when its bound pods start). Timers are
events on the engine's heap; a timer whose epoch is stale (the node got a pod
since) is ignored. Metrics hear of every change (powered-on capacity, idle
watts, price). How many watts a node draws is ``twin.power``'s, not this.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from smartsched.twin.events import EV_POWER_DOWN, EV_POWER_UP
from smartsched.twin.metrics import MetricsRecorder
from smartsched.twin.state import POWER_BOOTING, POWER_OFF, POWER_ON, ClusterState


class PowerLifecycle:
    """Power-down timers and boots of one engine's nodes."""

    def __init__(self, state: ClusterState, metrics: MetricsRecorder, enabled: bool,
                 idle_power_down_s: float, power_up_s: float,
                 push: Callable[[float, int, Any], None]) -> None:
        self.state = state
        self.metrics = metrics
        self.enabled = enabled
        self.idle_s = idle_power_down_s
        self.boot_s = power_up_s
        self._push = push
        self._idle_epoch = np.zeros(state.num_nodes, dtype=np.int64)

    def start(self) -> None:
        """Arm every node's first idle timer (the cluster starts empty)."""
        if self.enabled:
            for n in range(self.state.num_nodes):
                self._push(self.idle_s, EV_POWER_DOWN, (n, 0))

    def bound(self, node: int, now: float) -> bool:
        """A pod was bound to ``node``: cancel its idle timer, boot it if off.
        Returns whether the pod can start now (False while the node boots)."""
        st = self.state
        self._idle_epoch[node] += 1
        if st.power[node] == POWER_OFF:
            self._set(node, POWER_BOOTING)
            self._push(now + self.boot_s, EV_POWER_UP, node)
        return bool(st.power[node] != POWER_BOOTING)

    def idle_timeout(self, node: int, epoch: int) -> None:
        """An idle timer fired: power the node off if it is still idle since."""
        st = self.state
        idle = st.pod_count[node] == 0 and self._idle_epoch[node] == epoch
        if idle and st.power[node] == POWER_ON:
            self._set(node, POWER_OFF)

    def booted(self, node: int) -> bool:
        """A boot finished; True when the node is now on (its bound pods may start)."""
        if self.state.power[node] != POWER_BOOTING:
            return False
        self._set(node, POWER_ON)
        return True

    def maybe_idle(self, node: int, now: float) -> None:
        """Arm ``node``'s idle timer when it has no pods."""
        if self.enabled and self.state.pod_count[node] == 0:
            self._idle_epoch[node] += 1
            self._push(now + self.idle_s, EV_POWER_DOWN, (node, int(self._idle_epoch[node])))

    def _set(self, node: int, new: int) -> None:
        old = int(self.state.power[node])
        self.state.power[node] = new
        self.metrics.power_changed(node, old, new)
