"""The pods bound to nodes, as arrays: what preemption and descheduling look at.

Owns one row per bound pod (kube's NodeInfo pod lists, vectorized over pods):
its node, priority, what it takes from the node (charged resources, its
best-effort pool share, per-device GPU milli), its gang, app and class, and
when it was bound. ``ClusterState.allocate`` adds a row and ``release``
removes it, so every driver (the engine, the placement service, the
Kubernetes snapshot) keeps it current without knowing it exists.

Rows are keyed by the identity of the pod's compiled request (the object
``allocate`` and ``release`` receive), so two reservations of pods with the
same name never collide; one request allocated several times (tests do) has a
row per allocation, and ``release`` takes back the one on its node. Freed rows
are reused; ``copy`` is what ``ClusterState.fork`` takes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from smartsched.model.pod import POD_CLASS_IDS, Pod
from smartsched.model.resources import CPU, MEM


class BoundPods:
    """Rows of bound pods; arrays are indexed by row, ``used`` marks live rows."""

    def __init__(self, num_nodes: int, num_resources: int, max_devices: int) -> None:
        self.num_nodes = num_nodes
        self.num_resources = num_resources
        self.max_devices = max_devices
        # id(request) -> its rows; tuples, never changed in place, so a copy of the dict
        # is a copy of the table's index (forks are taken per decision by lookahead/sandbox)
        self.row_of: dict[int, tuple[int, ...]] = {}
        self.pods: list[Pod | None] = []
        self.requests: list[Any] = []
        self._gang_ids: dict[str, int] = {}
        self._app_ids: dict[str, int] = {}
        self._tenant_ids: dict[str, int] = {}
        self._free: list[int] = []
        self._grow(64)

    def _grow(self, cap: int) -> None:
        old = getattr(self, "used", None)
        n = 0 if old is None else old.size
        new = {
            "used": np.zeros(cap, dtype=bool),
            "node": np.full(cap, -1, dtype=np.int32),
            "priority": np.zeros(cap, dtype=np.int64),
            "charged": np.zeros((cap, self.num_resources), dtype=np.int64),
            "be_req": np.zeros((cap, 2), dtype=np.int64),  # cpu, mem from the BE pool
            "devices": np.zeros((cap, self.max_devices), dtype=np.int64),  # milli per device
            "gang": np.full(cap, -1, dtype=np.int64),
            "app": np.full(cap, -1, dtype=np.int64),
            "tenant": np.full(cap, -1, dtype=np.int64),
            "cls": np.zeros(cap, dtype=np.int8),
            "since": np.zeros(cap, dtype=np.float64),
            "until": np.full(cap, np.inf, dtype=np.float64),
        }
        for name, arr in new.items():
            if old is not None:
                arr[:n] = getattr(self, name)
            setattr(self, name, arr)
        self.pods.extend([None] * (cap - n))
        self.requests.extend([None] * (cap - n))
        self._free.extend(range(cap - 1, n - 1, -1))

    def __len__(self) -> int:
        return int(self.used.sum())

    def add(self, node: int, req: Any, charged: np.ndarray, devices: tuple[int, ...],
            now: float, until: float = np.inf) -> None:
        """Record ``req``'s pod on ``node`` (taking ``charged`` and ``devices``) at ``now``,
        expected to leave at ``until`` (inf: unknown)."""
        if not self._free:
            self._grow(2 * self.used.size)
        r = self._free.pop()
        pod = req.pod
        self.row_of[id(req)] = (*self.row_of.get(id(req), ()), r)
        self.pods[r] = pod
        self.requests[r] = req
        self.used[r] = True
        self.node[r] = node
        self.priority[r] = pod.priority
        self.charged[r] = charged
        self.be_req[r] = req.vector[[CPU, MEM]] if req.best_effort else 0
        self.devices[r] = 0
        if devices:
            self.devices[r, list(devices)] = req.gpu_milli
        self.gang[r] = (self._gang_ids.setdefault(pod.gang_id, len(self._gang_ids))
                        if pod.gang_id is not None and pod.gang_size > 1 else -1)
        self.app[r] = self._app_ids.setdefault(pod.app, len(self._app_ids)) if pod.app else -1
        self.tenant[r] = self._tenant_ids.setdefault(pod.tenant, len(self._tenant_ids))
        self.cls[r] = POD_CLASS_IDS[pod.pod_class]
        self.since[r] = now
        self.until[r] = until

    def expect_until(self, req: Any, node: int, until: float) -> None:
        """``req``'s pod on ``node`` is now expected to leave at ``until`` (it started)."""
        rows = self.row_of.get(id(req))
        if rows:
            r = next((x for x in rows if self.node[x] == node), rows[0])
            self.until[r] = until

    def remove(self, req: Any, node: int) -> None:
        rows = self.row_of[id(req)]
        r = next((x for x in rows if self.node[x] == node), rows[0])
        rest = tuple(x for x in rows if x != r)
        if rest:
            self.row_of[id(req)] = rest
        else:
            del self.row_of[id(req)]
        self.used[r] = False
        self.node[r] = -1
        self.pods[r] = None
        self.requests[r] = None
        self._free.append(r)

    def nodes_holding(self, column: str, key: str) -> np.ndarray:
        """Node mask [N]: nodes with a live pod whose ``column`` (``tenant``, ``app``) is
        ``key`` -- what isolation and dedicated-tenancy rules look at."""
        ids = self._tenant_ids if column == "tenant" else self._app_ids
        out = np.zeros(self.num_nodes, dtype=bool)
        k = ids.get(key)
        if k is not None:
            out[self.node[self.used & (getattr(self, column) == k)]] = True
        return out

    def nodes_holding_class(self, cls: int) -> np.ndarray:
        out = np.zeros(self.num_nodes, dtype=bool)
        out[self.node[self.used & (self.cls == cls)]] = True
        return out

    def gang_index(self, gang: str | None) -> int | None:
        """The integer standing for ``gang`` in ``self.gang`` (None: no row ever had it)."""
        return None if gang is None else self._gang_ids.get(gang)

    def rows_on(self, node: int) -> np.ndarray:
        return np.flatnonzero(self.used & (self.node == node))

    def gang_rows(self, gang: int) -> np.ndarray:
        return np.flatnonzero(self.used & (self.gang == gang))

    def below(self, priority: int) -> np.ndarray:
        """Live rows of pods with priority strictly below ``priority``."""
        return np.flatnonzero(self.used & (self.priority < priority))

    def room(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What removing ``rows`` would give back, per node: charged resources [N, R],
        best-effort pool [N, 2] and GPU milli per device [N, D]."""
        n = self.num_nodes
        res = np.zeros((n, self.num_resources), dtype=np.int64)
        be = np.zeros((n, 2), dtype=np.int64)
        dev = np.zeros((n, self.max_devices), dtype=np.int64)
        if rows.size:
            nodes = self.node[rows]
            np.add.at(res, nodes, self.charged[rows])
            np.add.at(be, nodes, self.be_req[rows])
            np.add.at(dev, nodes, self.devices[rows])
        return res, be, dev

    def room_on(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``room`` of ``rows`` that are all on one node, as that node's single row."""
        return (self.charged[rows].sum(axis=0, keepdims=True),
                self.be_req[rows].sum(axis=0, keepdims=True),
                self.devices[rows].sum(axis=0, keepdims=True))

    def copy(self) -> BoundPods:
        other = object.__new__(BoundPods)
        other.__dict__.update(self.__dict__)
        for name in ("used", "node", "priority", "charged", "be_req", "devices", "gang", "app",
                     "tenant", "cls", "since", "until"):
            setattr(other, name, getattr(self, name).copy())
        other.row_of = dict(self.row_of)
        other.pods = list(self.pods)
        other.requests = list(self.requests)
        other._free = list(self._free)
        other._gang_ids = dict(self._gang_ids)
        other._app_ids = dict(self._app_ids)
        other._tenant_ids = dict(self._tenant_ids)
        return other
