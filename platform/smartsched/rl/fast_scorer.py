"""Greedy inference of ``NodeScorerModule`` for long runs of decisions, node rows cached.

Owns the policy's hot path outside training (the service's batch endpoint, the
twin, the Kubernetes scheduler). The module scores every node from its own
features, the pod's and the reward weights (see ``rl.module``); between two
decisions for pods with the same features only the rows of the nodes whose
features changed -- the node just allocated, as a rule -- produce different
per-node terms. So for each recent pod-feature vector (a small LRU) this keeps

    emb_n  = node_mlp([node_n, pod, weights, topo_n])      [N, h]
    a_n    = W_e . emb_n                                   [N, h]  (score layer, node part)
    prior_n = sum_k gate(pod)_k * heur_{n,k}               [N]     (heuristic prior)

and recomputes them for the rows that differ from that vector's last
observation (found by comparing the rows, so nothing outside may change a row
unnoticed). The rest of the forward pass -- the context (mean of emb over the
feasible nodes, which changes with the mask), the score layer's context part,
the deferral head and the mask -- is computed every time, and is cheap: O(N h).

The arithmetic is the module's, split at its first score layer (``W [e; c] =
W_e e + W_c c``). Cached rows are computed with torch in float32 as the module's
forward computes them, never on fewer than ``MIN_ROWS`` rows (zero rows pad a
smaller update): a row's value must not depend on how many rows were recomputed
with it, or identical nodes differ in the last bit and argmax breaks their tie
unlike the module (a one-to-four-row product takes another kernel; numpy's BLAS
rounds rows by their position in any product). The per-decision rest -- context,
score layer, deferral head, mask -- runs in numpy, where torch's per-operation
overhead was most of the cost. Logits agree with ``forward_inference`` to float32
rounding and pick the same node (``tests/rl/test_fast_scorer.py``). The weights
are copied when the scorer is built: a policy that changes gets a new scheduler,
and with it a new scorer.

A batch of pods of a few shapes then costs one full forward per shape plus O(N h)
per pod, instead of a full forward per pod ("score pods in batches": the rows a
decision leaves untouched are scored once for the whole batch).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from ray.rllib.utils.torch_utils import FLOAT_MIN

from smartsched.rl.observation import HEURISTIC_COLS, STATIC_COLS

# Pod-feature vectors whose rows are kept: a batch cycles through its pods' shapes, and a
# shape whose rows were dropped costs every node's rows at its next decision (a mix of more
# than 8 shapes did so at almost every one). Up to KEEP_SHAPES, as ROW_CACHE_BYTES allows
# at this cluster's size (about 1 MiB a shape at 1,500 nodes), never under MIN_KEEP.
KEEP_SHAPES = 32
MIN_KEEP = 8
ROW_CACHE_BYTES = 64 * 2**20
MIN_ROWS = 16  # rows computed together at least (see the module docstring)


@dataclass
class _Rows:
    nodes: np.ndarray  # [N, F] the observation these rows were computed from
    emb: np.ndarray  # [N, h] float32
    a: np.ndarray  # [N, h] float32
    prior: np.ndarray | None  # [N] float32
    pod_term: torch.Tensor  # [h] first layer's pod-and-weights part, plus its bias
    gate: torch.Tensor | None  # [K] the heuristic prior's coefficients for this pod
    # ``best``'s reference: each node's logit at the score layer's context term ``ref_c``
    # (None: not computed yet, or dropped by a full update).
    ref_c: np.ndarray | None = None
    ref: np.ndarray | None = None  # [N] float32
    amax: np.ndarray | None = None  # [h] upper bound of |a| over the rows (never shrinks)
    pmax: float = 0.0  # upper bound of |prior| over the rows


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy().astype(np.float64)


def _layers(seq: torch.nn.Module) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """A stack of Linear and ReLU modules as [(W, b) | None for ReLU], in order."""
    out: list[tuple[np.ndarray, np.ndarray] | None] = []
    for mod in seq.modules():
        if isinstance(mod, torch.nn.Linear):
            out.append((_f64(mod.weight), _f64(mod.bias)))
        elif isinstance(mod, torch.nn.ReLU):
            out.append(None)
        elif not isinstance(mod, torch.nn.Sequential):
            raise TypeError(f"fast scorer: unexpected layer {type(mod).__name__}")
    return out


def _run(layers: list[tuple[np.ndarray, np.ndarray] | None], x: np.ndarray) -> np.ndarray:
    for layer in layers:
        x = np.maximum(x, 0.0) if layer is None else x @ layer[0].T + layer[1]
    return x


class FastScorer:
    """``logits(obs)`` of a NodeScorerModule in eval mode, per-node rows cached."""

    def __init__(self, module: Any) -> None:
        self.m = module
        h = module.node_mlp[-2].out_features
        first = module.score_mlp[0][0]  # Linear(2h, h): [e, c] -> h
        w = first.weight.detach().numpy()
        self.w_c = w[:, h:].astype(np.float32)
        self.b1 = first.bias.detach().numpy().astype(np.float32)
        last = module.score_mlp[1]  # Linear(h, 1)
        self.w_last = last.weight.detach().numpy()[0].astype(np.float32)
        self.b_last = np.float32(last.bias.detach().numpy()[0])
        # node_mlp's first layer split by input part: [node | pod, weights | topology].
        l1 = module.node_mlp[0]
        self.f_node = module.observation_space["nodes"].shape[-1]
        self.f_podw = (module.observation_space["pod"].shape[0]
                       + module.observation_space["weights"].shape[0])
        # The row terms, in torch (see the module docstring), as copies.
        w1 = l1.weight.detach().clone()
        self.w1_node_t = w1[:, : self.f_node].T
        self.w1_podw = w1[:, self.f_node : self.f_node + self.f_podw]
        self.w1_topo_t = w1[:, self.f_node + self.f_podw :].T
        self.b1_node = l1.bias.detach().clone()
        l2 = module.node_mlp[2]  # Linear(h, h), then ReLU
        self.w2_t = l2.weight.detach().clone().T
        self.b2 = l2.bias.detach().clone()
        self.w_e_rows = first.weight.detach().clone()[:, :h].T
        self.gate = copy.deepcopy(module.gate) if module.gate is not None else None
        self.defer = _layers(module.defer_head)
        self.heur = torch.tensor(HEURISTIC_COLS, dtype=torch.long)
        self.static_cols = list(STATIC_COLS)
        self._topo: tuple[np.ndarray, np.ndarray] | None = None  # static columns, [N, h]
        self._sid: np.ndarray | None = None  # [N] topology embedding ids (None: no topology)
        self._rows: OrderedDict[bytes, _Rows] = OrderedDict()
        # ``best``'s work: decisions taken and node logits computed for them (benchmarks).
        self.decisions = 0
        self.nodes_scored = 0
        # ``_update``'s work: rows brought up to date, and distinct rows computed for them.
        self.rows_updated = 0
        self.rows_computed = 0
        self.memo: DistinctMemo | None = None  # set by an ensemble (``RLScheduler``)

    def _topology(self, nodes: np.ndarray, changed: np.ndarray | None) -> np.ndarray | None:
        """[N, h] first-layer term of the cluster's topology embedding, cached per cluster
        (static columns). A new topology drops every cached row: a node's embedding
        depends on its neighbours' (rack, zone), whose own feature rows may not change.

        ``changed``: the only rows that may differ from the last observation (the rows
        of a pod seen before that differ from what it saw then; every cached row was seen
        under the current topology, since a new one drops them all); None: any row."""
        if self.m.topology is None:
            return None
        if self._topo is not None and changed is not None and np.array_equal(
                self._topo[0][changed], nodes[changed][:, self.static_cols]):
            return self._topo[1]
        static = nodes[:, self.static_cols]
        if self._topo is None or not np.array_equal(self._topo[0], static):
            with torch.inference_mode():
                topo = (self.m._topology(torch.from_numpy(nodes)) @ self.w1_topo_t).numpy()
            self._topo = (static, topo)
            # Nodes whose topology embeddings are the same bits share an id (``_update``
            # computes alike rows once), numbered by first appearance: an ensemble's
            # members, whose encoders group the nodes alike, then hold equal ids
            # (``DistinctMemo``), where the order of the embeddings' bits would not.
            _, first, inv = np.unique(topo.view(np.int32), axis=0, return_index=True,
                                      return_inverse=True)
            rank = np.empty(first.size, np.int64)
            rank[np.argsort(first, kind="stable")] = np.arange(first.size)
            self._sid = rank[inv.reshape(-1)]
            self._rows.clear()
        return self._topo[1]

    def _prepare(self, obs: dict[str, np.ndarray]) -> tuple[_Rows, np.ndarray, np.ndarray]:
        """The pod's cached rows, brought up to date with ``obs``; the feasible-node mean
        of the embeddings (context) and the pod-and-weights vector."""
        nodes = obs["nodes"]
        podw = np.concatenate([obs["pod"], obs["weights"]]).astype(np.float32, copy=False)
        key = podw.tobytes()
        rows = self._rows.get(key)
        todo = None
        if rows is not None and rows.nodes.shape == nodes.shape:
            # Bit patterns compared (a row whose bits differ is recomputed), as 8-byte
            # words where the width allows: about half the time of a float comparison.
            todo = np.flatnonzero(_rows_differ(nodes, rows.nodes))
        topo = self._topology(nodes, todo)
        if key not in self._rows:  # a new topology dropped every pod's rows
            rows = todo = None
        if rows is None or todo is None:
            n, h = nodes.shape[0], self.w_c.shape[0]
            gated = self.gate is not None
            pt = torch.from_numpy(podw)
            with torch.inference_mode():
                rows = _Rows(nodes.copy(), np.zeros((n, h), np.float32),
                             np.zeros((n, h), np.float32),
                             np.zeros(n, np.float32) if gated else None,
                             self.w1_podw @ pt + self.b1_node,
                             self.gate(pt) if self.gate is not None else None)
        else:
            rows.nodes[todo] = nodes[todo]
        self._rows[key] = rows
        self._rows.move_to_end(key)
        while len(self._rows) > self._keep(rows):
            self._rows.popitem(last=False)
        if todo is None or todo.size:
            self._update(rows, todo, nodes, topo)
        feasible = obs["action_mask"][: nodes.shape[0]]
        ctx = (feasible @ rows.emb) / np.float32(max(float(feasible.sum()), 1.0))
        return rows, ctx, podw

    @staticmethod
    def _keep(rows: _Rows) -> int:
        """How many pod-feature vectors' rows to keep, rows like ``rows`` each."""
        size = rows.nodes.nbytes + rows.emb.nbytes + rows.a.nbytes + 8 * rows.nodes.shape[0]
        return max(MIN_KEEP, min(KEEP_SHAPES, ROW_CACHE_BYTES // max(size, 1)))

    def _node_logits(self, rows: _Rows, c: np.ndarray, sel: np.ndarray | slice) -> np.ndarray:
        """Unmasked node logits of rows ``sel`` for the score layer's context term ``c``."""
        return self._logits_of(rows.a[sel], None if rows.prior is None else rows.prior[sel], c)

    def _logits_of(self, a: np.ndarray, prior: np.ndarray | None, c: np.ndarray) -> np.ndarray:
        """Unmasked logits of nodes with score-layer terms ``a`` [k, h] and priors ``prior``."""
        hidden = a + c
        np.maximum(hidden, 0.0, out=hidden)
        # einsum's own loop: the same arithmetic for every row wherever it sits (a BLAS
        # matrix-vector product may round rows at a block's edge differently), so a row's
        # logit is the same bits whether it is computed alone or with every other row.
        out = np.einsum("nh,h->n", hidden, self.w_last)
        out += self.b_last
        if prior is not None:
            out += prior
        return out

    def logits(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """[N + 1] masked logits (nodes, then defer), as ``forward_inference`` gives them."""
        rows, ctx, podw = self._prepare(obs)
        mask = obs["action_mask"]
        n = rows.nodes.shape[0]
        out = np.empty(n + 1, np.float32)
        out[:n] = self._node_logits(rows, self.w_c @ ctx + self.b1, slice(None))
        out[n:] = _run(self.defer, np.concatenate([podw, ctx]).astype(np.float64))
        with np.errstate(divide="ignore"):
            out += np.maximum(np.log(mask), FLOAT_MIN)
        return out

    def logits_at(self, obs: dict[str, np.ndarray], idx: np.ndarray) -> np.ndarray:
        """``logits(obs)[idx]``, the same bits, computing only those entries (``idx``:
        action indices 0..N, N = defer; no negatives, no boolean mask): an ensemble weighs
        a shortlist of a few nodes, and every member scoring all N of them was a tenth of
        its time at 1,500 nodes."""
        idx = np.asarray(idx)
        n = obs["action_mask"].shape[0] - 1
        if idx.dtype.kind not in "iu" or idx.ndim != 1 or (
                idx.size and (idx.min() < 0 or idx.max() > n)):
            raise ValueError(f"logits_at: action indices 0..{n} expected")
        idx = idx.astype(np.int64, copy=False)
        rows, ctx, podw = self._prepare(obs)
        mask = obs["action_mask"]
        out = np.empty(idx.size, np.float32)
        on_node = idx < n
        if on_node.any():
            out[on_node] = self._node_logits(rows, self.w_c @ ctx + self.b1, idx[on_node])
        if not on_node.all():
            out[~on_node] = _run(self.defer, np.concatenate([podw, ctx]).astype(np.float64))
        with np.errstate(divide="ignore"):
            out += np.maximum(np.log(mask[idx]), FLOAT_MIN)
        return out

    def best(self, obs: dict[str, np.ndarray], choices: np.ndarray | None = None) -> int:
        """``argmax(logits(obs))`` (N = defer) without scoring every node; with
        ``choices`` ([N] bool), the argmax over those feasible nodes only (and defer): the
        context still averages every feasible node, as the policy observed it in training.

        Between decisions the context term ``c`` of the score layer moves a little (one
        node's embedding in the mean changed); every node logit is ``w . relu(a_n + c)``
        plus terms of the node alone, and relu is 1-Lipschitz, so it moves by at most
        ``B = sum_j |w_j| |c_j - c0_j|`` from its value at a reference ``c0``. Only nodes
        whose reference logit is within ``2B`` of the best feasible one can win; those are
        scored exactly (the same bits as ``logits``, see ``_node_logits``) and the first
        of the highest wins, as argmax picks it. The reference is refreshed when too
        many nodes come that close. Rows changed since are rescored at ``c0`` first.
        """
        rows, ctx, podw = self._prepare(obs)
        n = rows.nodes.shape[0]
        self.decisions += 1
        feasible = obs["action_mask"][:n] > 0
        if choices is not None:
            feasible &= choices
        c = (self.w_c @ ctx + self.b1).astype(np.float32, copy=False)
        defer = -np.inf
        if obs["action_mask"][n] > 0:  # float32, as ``logits`` stores it
            defer = float(np.float32(
                _run(self.defer, np.concatenate([podw, ctx]).astype(np.float64))[0]))
        if not feasible.any():
            return n if obs["action_mask"][n] > 0 else 0
        cand = None
        if rows.ref is not None and rows.ref_c is not None:
            w = np.abs(self.w_last).astype(np.float64)
            bound = float(w @ np.abs(c.astype(np.float64) - rows.ref_c))
            ref = rows.ref
            top = float(ref[feasible].max())
            # Float32 rounding of both values: relative to the largest magnitude the sums
            # could reach (terms may cancel), far above what 64 float32 products lose.
            mag = float(w @ (rows.amax + np.abs(c))) + abs(float(self.b_last)) + rows.pmax
            slack = 2.0 * bound + 1e-4 * (1.0 + mag)
            cand = np.flatnonzero(feasible & (ref >= top - slack))
            if cand.size > max(MIN_ROWS, n // 8):
                cand = None
        if cand is None:  # a new reference at this context: every node scored once
            rows.ref_c = c.copy()
            rows.ref = self._node_logits(rows, c, slice(None))
            self.nodes_scored += n
            vals = np.where(feasible, rows.ref, -np.inf)
            i = int(np.argmax(vals))
            return n if defer > vals[i] else i
        vals = self._node_logits(rows, c, cand)
        self.nodes_scored += cand.size
        j = int(np.argmax(vals))
        return n if defer > vals[j] else int(cand[j])

    def _distinct_rows(self, x: np.ndarray, sid: np.ndarray | None
                       ) -> tuple[np.ndarray, np.ndarray] | None:
        """``_distinct(x, sid)``, from the ensemble's memo when another member just asked
        about the same rows (see ``DistinctMemo``)."""
        m = self.memo
        if m is not None and m.x is x and (
                (m.sid is None and sid is None)
                or (m.sid is not None and sid is not None and np.array_equal(m.sid, sid))):
            return m.found
        found = _distinct(x, sid)
        if m is not None:
            m.x, m.sid, m.found = x, sid, found
        return found

    def _update(self, rows: _Rows, todo: np.ndarray | None, nodes: np.ndarray,
                topo: np.ndarray | None) -> None:
        """Recompute the cached terms of rows ``todo`` (None: every row).

        Nodes alike -- the same feature row and topology embedding, as the empty nodes of
        one type in one rack are -- have the same terms, so each distinct row is computed
        once and copied to its likes (``_distinct``). That is most of a large update: a
        min-max normalized score (``score_bestfit``) moves with the feasible nodes' best
        and worst, and with it the rows of every node of a kind at once. A row's terms are
        the same bits whichever rows it is computed with (see the module docstring)."""
        x = nodes if todo is None else nodes[todo]
        k = x.shape[0]
        first = inv = None
        if k > MIN_ROWS:
            sid = None if self._sid is None else (self._sid if todo is None
                                                   else self._sid[todo])
            found = self._distinct_rows(x, sid)
            if found is not None:
                first, inv = found
                x = x[first]
        # Node indices of the rows computed (None: every node, in order).
        which = todo if first is None else (first if todo is None else todo[first])
        ku = x.shape[0]
        self.rows_updated += k
        self.rows_computed += ku
        if ku < MIN_ROWS:  # zero rows below: the kernel (and rounding) of a full pass
            x = np.concatenate([x, np.zeros((MIN_ROWS - ku, x.shape[1]), np.float32)])
        xt = torch.from_numpy(x)
        with torch.inference_mode():
            pre = torch.addmm(rows.pod_term, xt, self.w1_node_t)
            if topo is not None:  # gathered in numpy: torch's row indexing costs more
                pre[:ku] += torch.from_numpy(topo if which is None else topo[which])
            emb_t = torch.relu(torch.addmm(self.b2, torch.relu(pre), self.w2_t))
            a_t = emb_t @ self.w_e_rows
            prior_t = (xt.index_select(1, self.heur) @ rows.gate if rows.gate is not None
                       else None)
        emb = emb_t[:ku].numpy()
        a_new = a_t[:ku].numpy()
        prior_new = None if prior_t is None else prior_t[:ku].numpy()
        ref_new = None
        if todo is not None and rows.ref is not None and rows.ref_c is not None:
            ref_new = self._logits_of(a_new, prior_new, rows.ref_c)
        if ku:
            new_amax = np.abs(a_new).max(axis=0).astype(np.float64)
            rows.amax = (new_amax if todo is None or rows.amax is None
                         else np.maximum(rows.amax, new_amax))
            if prior_new is not None:
                pm = float(np.abs(prior_new).max())
                rows.pmax = pm if todo is None else max(rows.pmax, pm)
        if inv is not None:  # each row from its distinct one
            emb, a_new = emb[inv], a_new[inv]
            prior_new = None if prior_new is None else prior_new[inv]
            ref_new = None if ref_new is None else ref_new[inv]
        sel = slice(None) if todo is None else todo
        rows.emb[sel] = emb
        rows.a[sel] = a_new
        if rows.prior is not None:
            assert prior_new is not None
            rows.prior[sel] = prior_new
        if todo is None:
            rows.ref = rows.ref_c = None
        elif ref_new is not None and rows.ref is not None:
            rows.ref[todo] = ref_new


class DistinctMemo:
    """``_distinct``'s last answer, shared by an ensemble's members within one decision.

    Every member brings all N rows up to date from the same observation (the pod's
    features change with the hour, so each decision misses every member's cache), and
    finding the alike rows was a fifth of a member's time. A member reuses the answer
    when it asks about the same array object with the same topology ids (their
    encoders group alike nodes alike as a rule; when they do not, it computes its own).
    The owner clears it after each decision, so no answer outlives its observation."""

    __slots__ = ("found", "sid", "x")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.x: np.ndarray | None = None
        self.sid: np.ndarray | None = None
        self.found: tuple[np.ndarray, np.ndarray] | None = None


def _distinct(x: np.ndarray, sid: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
    """``(first, inverse)``: the first of each distinct row of ``x`` (float32 bits, with its
    node's topology id ``sid``) and each row's distinct one, ``x == x[first][inverse]``;
    None when no two rows are alike. Rows are hashed, and the hash checked: rows alike
    under a hash that collides are compared bit for bit, and a collision gives None."""
    if x.shape[1] % 2 == 0 and x.flags.c_contiguous:
        words = x.view(np.uint64)
    else:
        words = x.view(np.uint32).astype(np.uint64)
    h = words @ _hash_mults(words.shape[1])  # integer arithmetic: wraps modulo 2**64
    if sid is not None:
        h += sid.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    if first.size == x.shape[0]:
        return None
    inv = inv.reshape(-1)
    rep = first[inv]  # each row's distinct one
    if not np.array_equal(words[rep], words) or (
            sid is not None and not np.array_equal(sid[rep], sid)):
        return None  # a collision: every row computed, as without this
    return first, inv


_MULTS: dict[int, np.ndarray] = {}


def _hash_mults(width: int) -> np.ndarray:
    """``width`` fixed odd 64-bit multipliers, one per word of a row."""
    m = _MULTS.get(width)
    if m is None:
        rng = np.random.default_rng(0x5EED)
        m = _MULTS[width] = rng.integers(1, 2**63, width, dtype=np.uint64) | np.uint64(1)
    return m


def _rows_differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[N] bool: rows of two equal-shaped float32 arrays whose bits differ anywhere."""
    if a.shape[1] % 2 == 0 and a.flags.c_contiguous and b.flags.c_contiguous:
        a, b = a.view(np.int64), b.view(np.int64)
    else:
        a, b = a.view(np.int32), b.view(np.int32)
    return np.bitwise_or.reduce(a ^ b, axis=1) != 0
