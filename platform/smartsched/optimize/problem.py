"""A window of pods to place jointly, as arrays: the model every solver here reads.

Owns the formulation shared by the annealer, the exact solver and the repair
pass, and its one evaluation (energy, objective, overflow), so a solution is
scored the same whoever found it.

Each pod ``i`` chooses one *slot* ``a_i`` in ``0 .. nslots[i] - 1``: slot 0 leaves
it unplaced, slots 1.. are its candidates (a node and the devices on it, kept
by the pruning in ``optimize.candidates``). A candidate takes amounts from
*bins* -- a node's cpu, memory and FPGA, and each GPU device's milli -- each
normalized by the bin's capacity unit (the node's capacity, 1000 milli for a
device), so one unit of overflow is "one whole node (or device) too much"
whatever the resource.

Energy (lower is better; see docs/optimize.md for the QUBO form)::

    E(a) = sum_i cost[i, a_i] + sum_b pen(load_b(a), cap_b)
    cost[i, 0] = value_i                (leaving pod i out costs its value)
    cost[i, c] = -score_weight * v_min * score_ic   (c >= 1, score in [0, 1])
    pen(x, c)  = lam0 * [x > c] + lam1 * max(0, x - c)

With ``score_weight < 1`` any placement beats leaving a pod out and ``lam0`` above
the largest value makes any overflow worse than dropping the pod that caused
it, so the lowest energy is the feasible assignment that places the most value,
ties broken by the profile's scores. The *objective* reported is
``sum_i value_i - E`` on feasible assignments: the value placed plus the score
bonus (higher is better; the exact solver maximizes the same number).

Gangs (all-or-nothing groups of pods, ``group``): a group partly placed costs
``lam_g`` more, above the whole group's value, so the lowest energy places every
member of a group or none; a partly placed group is infeasible (objective -inf)::

    E(a) += lam_g * #{g : 0 < placed_g(a) < size_g}
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from smartsched.model.errors import ValidationError

EPS = 1e-9  # normalized loads are floats: a bin overflows when load > cap + EPS


@dataclass(frozen=True, eq=False)
class WindowProblem:
    """The arrays of one window (P pods, K slots at most, E bin entries a slot, B bins).

    Attributes:
        value: [P] what leaving each pod unplaced costs (> 0).
        cost: [P, K] energy of each slot; slot 0 is ``value``; slots past ``nslots`` are
            +inf (never chosen).
        nslots: [P] valid slots of each pod (1: it can only stay unplaced).
        node: [P, K] node index of each slot (-1: unplaced or padding).
        bins: [P, K, E] bins a slot takes from (padding: the dummy bin ``B``).
        amount: [P, K, E] normalized amounts taken (0 on padding).
        cap: [B + 1] free capacity of each bin, normalized; the dummy's is +inf.
        devices: [P, K, Dmax] device indices on ``node`` (-1 padding), for the decision.
        lam0, lam1: the overflow penalty's step and slope.
        num_nodes: nodes of the cluster (for conflict keys).
        start: [P] a feasible assignment to start from (the candidates' homes), or None.
        info: how the window was built (pruning figures), for reports.
        group: [P] each pod's gang (0 .. G-1; -1 for a pod of its own), or None: no gangs.
        lam_g: what a partly placed gang costs (above any gang's value and co-location).
        colocate: what each pair of one gang's members placed on the same node adds to
            the objective (gang co-location: a data-parallel job's workers talk most to
            each other, over the node's own links rather than the network); 0: none.
    """

    value: np.ndarray
    cost: np.ndarray
    nslots: np.ndarray
    node: np.ndarray
    bins: np.ndarray
    amount: np.ndarray
    cap: np.ndarray
    devices: np.ndarray
    lam0: float
    lam1: float
    num_nodes: int
    start: np.ndarray | None = None
    info: dict = field(default_factory=dict)
    group: np.ndarray | None = None
    lam_g: float = 0.0
    colocate: float = 0.0

    @property
    def num_pods(self) -> int:
        return int(self.value.shape[0])

    @property
    def num_bins(self) -> int:
        """Real bins (the dummy at index ``num_bins`` excluded)."""
        return int(self.cap.shape[0] - 1)

    @property
    def num_groups(self) -> int:
        return 0 if self.group is None else int(self.group.max(initial=-1) + 1)

    @property
    def group_size(self) -> np.ndarray:
        """[G] members of each gang."""
        if self.group is None:
            return np.zeros(0, dtype=np.int64)
        g = self.group[self.group >= 0]
        return np.bincount(g, minlength=self.num_groups).astype(np.int64)

    def group_placed(self, assign: np.ndarray) -> np.ndarray:
        """[G] members of each gang placed under ``assign``."""
        if self.group is None:
            return np.zeros(0, dtype=np.int64)
        has = (self.group >= 0) & (assign > 0)
        return np.bincount(self.group[has], minlength=self.num_groups).astype(np.int64)

    def colocated_pairs(self, assign: np.ndarray) -> int:
        """Pairs of one gang's members placed on the same node under ``assign``."""
        if self.group is None:
            return 0
        m = np.flatnonzero((self.group >= 0) & (assign > 0))
        if m.size < 2:
            return 0
        keys = self.group[m] * (self.num_nodes + 1) + self.node[m, assign[m]]
        _, c = np.unique(keys, return_counts=True)
        return int((c * (c - 1) // 2).sum())

    def partial_groups(self, assign: np.ndarray) -> np.ndarray:
        """Indices of the gangs ``assign`` places in part."""
        placed = self.group_placed(assign)
        return np.flatnonzero((placed > 0) & (placed < self.group_size))

    @property
    def num_variables(self) -> int:
        """Binary variables of the one-hot form: one per candidate slot (slot 0 excluded)."""
        return int((self.nslots - 1).sum())

    def validate(self) -> None:
        """Shapes and ranges agree, or a ValidationError naming the array."""
        p = self.num_pods
        if p == 0:
            raise ValidationError("window", "is empty: no pods to place")
        k = self.cost.shape[1] if self.cost.ndim == 2 else -1
        checks = {
            "cost": self.cost.shape == (p, k),
            "nslots": self.nslots.shape == (p,),
            "node": self.node.shape == (p, k),
            "bins": self.bins.ndim == 3 and self.bins.shape[:2] == (p, k),
            "amount": self.amount.shape == self.bins.shape,
            "devices": self.devices.ndim == 3 and self.devices.shape[:2] == (p, k),
        }
        for name, ok in checks.items():
            if not ok:
                raise ValidationError(f"problem.{name}", "shape does not match the window")
        if np.any(self.value <= 0) or not np.all(np.isfinite(self.value)):
            raise ValidationError("problem.value", "every pod's value must be finite and > 0")
        if np.any(self.nslots < 1) or np.any(self.nslots > k):
            raise ValidationError("problem.nslots", f"must be in 1..{k}")
        if np.any((self.bins < 0) | (self.bins > self.num_bins)):
            raise ValidationError("problem.bins", f"must be in 0..{self.num_bins}")
        if np.any(self.amount < 0):
            raise ValidationError("problem.amount", "must be >= 0")
        if not np.isinf(self.cap[-1]) or np.any(self.cap[:-1] < -EPS):
            raise ValidationError("problem.cap", "real bins >= 0 and a dummy bin of +inf")
        if self.lam0 <= float(self.value.max()):
            raise ValidationError("problem.lam0", "must exceed the largest value")
        if self.group is not None:
            g = self.group
            if g.shape != (p,) or np.any(g < -1):
                raise ValidationError("problem.group", "one gang index (or -1) per pod")
            size = self.group_size
            if np.any(size == 0):
                raise ValidationError("problem.group", "gang indices must be 0 .. G-1, "
                                      "each used")
            worth = np.bincount(g[g >= 0], weights=self.value[g >= 0],
                                minlength=size.size)
            worth = worth + self.colocate * size * (size - 1) / 2
            if size.size and self.lam_g <= float(worth.max()):
                raise ValidationError("problem.lam_g", "must exceed the largest gang's "
                                      "value and co-location")
        if not (np.isfinite(self.colocate) and self.colocate >= 0):
            raise ValidationError("problem.colocate", "must be finite and >= 0")
        if self.colocate and self.group is None:
            raise ValidationError("problem.colocate", "needs gangs (problem.group)")

    # ------------------------------------------------------------ evaluation
    def loads(self, assign: np.ndarray) -> np.ndarray:
        """[B + 1] load of each bin under ``assign`` ([P] slots)."""
        rows = np.arange(self.num_pods)
        b = self.bins[rows, assign].ravel()
        w = self.amount[rows, assign].ravel()
        return np.bincount(b, weights=w, minlength=self.num_bins + 1)

    def overflow(self, assign: np.ndarray) -> np.ndarray:
        """Indices of the bins ``assign`` overfills."""
        load = self.loads(assign)
        return np.flatnonzero(load[:-1] > self.cap[:-1] + EPS)

    def penalty(self, load: np.ndarray, cap: np.ndarray) -> np.ndarray:
        """``pen`` elementwise (0 on the dummy bin)."""
        over = load - cap
        return np.where(over > EPS, self.lam0 + self.lam1 * over, 0.0)

    def energy(self, assign: np.ndarray) -> float:
        """E(assign), computed from scratch."""
        self.check_assignment(assign)
        load = self.loads(assign)
        pen = self.penalty(load[:-1], self.cap[:-1]).sum()
        pen += self.lam_g * self.partial_groups(assign).size
        co = self.colocate * self.colocated_pairs(assign) if self.colocate else 0.0
        return float(self.cost[np.arange(self.num_pods), assign].sum() + pen - co)

    def objective(self, assign: np.ndarray) -> float:
        """Value placed plus the score bonus and co-location (higher is better); -inf if
        infeasible (a bin overfilled or a gang placed in part)."""
        if self.overflow(assign).size or self.partial_groups(assign).size:
            return float("-inf")
        co = self.colocate * self.colocated_pairs(assign) if self.colocate else 0.0
        return float(self.value.sum() - self.cost[np.arange(self.num_pods), assign].sum()
                     + co)

    def drop_partial(self, assign: np.ndarray) -> np.ndarray:
        """``assign`` with every member of a gang placed in part left unplaced (in place)."""
        part = self.partial_groups(assign)
        if part.size:
            assign[np.isin(self.group, part)] = 0
        return assign

    def check_assignment(self, assign: np.ndarray) -> None:
        if assign.shape != (self.num_pods,) or np.any(assign < 0) \
                or np.any(assign >= self.nslots):
            raise ValidationError("assignment", "one valid slot per pod")
