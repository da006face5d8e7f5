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
W_e e + W_c c``); logits agree with ``forward_inference`` to float32 rounding
(``tests/rl/test_fast_scorer.py``). A batch of pods of a few shapes then costs
one full forward per shape plus O(N h) per pod, instead of a full forward per
pod ("score pods in batches": the rows a decision leaves untouched are scored
once for the whole batch).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from ray.rllib.utils.torch_utils import FLOAT_MIN

from smartsched.rl.observation import HEURISTIC_COLS, STATIC_COLS

KEEP_SHAPES = 8  # pod-feature vectors whose rows are kept (a batch cycles through a few)


@dataclass
class _Rows:
    nodes: np.ndarray  # [N, F] the observation these rows were computed from
    emb: torch.Tensor  # [N, h]
    a: torch.Tensor  # [N, h]
    prior: torch.Tensor | None  # [N]
    pod_term: torch.Tensor  # [h] first layer's pod-and-weights part, plus its bias
    gate: torch.Tensor | None  # [K] the heuristic prior's coefficients for this pod


class FastScorer:
    """``logits(obs)`` of a NodeScorerModule in eval mode, per-node rows cached."""

    def __init__(self, module: Any) -> None:
        self.m = module
        h = module.node_mlp[-2].out_features
        first = module.score_mlp[0][0]  # Linear(2h, h): [e, c] -> h
        self.w_e = first.weight[:, :h].detach()
        self.w_c = first.weight[:, h:].detach()
        self.b1 = first.bias.detach()
        self.last = module.score_mlp[1]  # Linear(h, 1)
        # node_mlp's first layer split by input part: [node | pod, weights | topology].
        l1 = module.node_mlp[0]
        self.f_node = module.observation_space["nodes"].shape[-1]
        self.f_podw = (module.observation_space["pod"].shape[0]
                       + module.observation_space["weights"].shape[0])
        w1 = l1.weight.detach()
        self.w1_node = w1[:, : self.f_node]
        self.w1_podw = w1[:, self.f_node : self.f_node + self.f_podw]
        self.w1_topo = w1[:, self.f_node + self.f_podw :]
        self.b1_node = l1.bias.detach()
        self.layer2 = module.node_mlp[2]  # Linear(h, h), then ReLU
        self.heur = list(HEURISTIC_COLS)
        self.static_cols = list(STATIC_COLS)
        self._topo: tuple[np.ndarray, torch.Tensor] | None = None
        self._rows: OrderedDict[bytes, _Rows] = OrderedDict()

    def _topology(self, nodes: np.ndarray) -> torch.Tensor | None:
        """[N, h] first-layer term of the cluster's topology embedding, cached per cluster
        (static columns). A new topology drops every cached row: a node's embedding
        depends on its neighbours' (rack, zone), whose own feature rows may not change."""
        if self.m.topology is None:
            return None
        static = nodes[:, self.static_cols]
        if self._topo is None or not np.array_equal(self._topo[0], static):
            topo = self.m._topology(torch.from_numpy(nodes))
            self._topo = (static, topo @ self.w1_topo.T)
            self._rows.clear()
        return self._topo[1]

    @torch.inference_mode()
    def logits(self, obs: dict[str, np.ndarray]) -> torch.Tensor:
        """[N + 1] masked logits (nodes, then defer), as ``forward_inference`` gives them."""
        nodes = obs["nodes"]
        podw = torch.from_numpy(np.concatenate([obs["pod"], obs["weights"]]).astype(
            np.float32, copy=False))
        key = podw.numpy().tobytes()
        topo = self._topology(nodes)
        rows = self._rows.get(key)
        if rows is None or rows.nodes.shape != nodes.shape:
            todo = np.arange(nodes.shape[0])
            n, h = nodes.shape[0], self.w_e.shape[0]
            gated = self.m.gate is not None
            rows = _Rows(nodes.copy(), torch.zeros(n, h), torch.zeros(n, h),
                         torch.zeros(n) if gated else None,
                         self.w1_podw @ podw + self.b1_node,
                         self.m.gate(podw) if gated else None)
        else:
            todo = np.flatnonzero((nodes != rows.nodes).any(axis=1))
            rows.nodes[todo] = nodes[todo]
        self._rows[key] = rows
        self._rows.move_to_end(key)
        while len(self._rows) > KEEP_SHAPES:
            self._rows.popitem(last=False)
        if todo.size:
            self._update(rows, todo, nodes, podw, topo)
        mask = torch.from_numpy(obs["action_mask"])
        feasible = mask[: nodes.shape[0]]
        ctx = (rows.emb * feasible.unsqueeze(-1)).sum(0) / feasible.sum().clamp(min=1.0)
        hidden = torch.relu(rows.a + (self.w_c @ ctx + self.b1))
        node_logits = self.last(hidden).squeeze(-1)
        if rows.prior is not None:
            node_logits = node_logits + rows.prior
        glob = torch.cat([podw, ctx])
        logits = torch.cat([node_logits, self.m.defer_head(glob)])
        return logits + torch.clamp(torch.log(mask), min=FLOAT_MIN)

    def _update(self, rows: _Rows, todo: np.ndarray, nodes: np.ndarray, podw: torch.Tensor,
                topo: torch.Tensor | None) -> None:
        idx = torch.from_numpy(todo)
        x = torch.from_numpy(nodes[todo])
        pre = x @ self.w1_node.T + rows.pod_term
        if topo is not None:
            pre += topo[idx]
        emb = torch.relu(self.layer2(torch.relu(pre)))
        rows.emb[idx] = emb
        rows.a[idx] = emb @ self.w_e.T
        if rows.prior is not None:
            rows.prior[idx] = x[:, self.heur] @ rows.gate
