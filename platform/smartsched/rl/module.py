"""The policy network: a shared per-node scorer conditioned on the pod, masked, with a value head.

Owns ``NodeScorerModule`` (RLlib new API stack: ``TorchRLModule`` +
``ValueFunctionAPI``). Every node is scored by the same network from its own
features, the pod's features and the reward weights, so one checkpoint runs
on clusters of any size (train on a small twin, evaluate on a large one):

    e_n    = MLP([node_n, pod, weights])                   per-node embedding
    c      = mean over feasible nodes of e_n               cluster context
    logit_n = w . MLP2([e_n, c])                            one logit per node
    logit_defer = MLP3([pod, weights, c])
    logits += clamp(log(action_mask), FLOAT_MIN)            infeasible -> never chosen
    V      = MLP4([pod, weights, c])

With ``heuristic_prior: true`` the logits start from the heuristics and the
network learns a correction (a heuristic-residual policy):

    g      = G([pod, weights])                              K coefficients
    logit_n = sum_k g_k * h_{n,k} + w . MLP2([e_n, c])

where ``h`` are the heuristic columns of the node features (LeastAllocated,
BestFit, FGD, app co-location on the node, app peers in the node's zone). The
gate is initialized to FGD (BestFit breaking ties) and the correction to
zero, so an untrained policy places like FGD; the gate sees the reward weights, so one checkpoint
can lean towards packing under ``green`` and spreading under ``online-peak``.

The context term lets a node's score depend on the rest of the cluster
(one round of mean-field message passing). With ``topology: true`` (the
default) each node's input also carries its embedding from the GATv2
Resource-GCN over the hardware topology (``rl.topology_encoder``), computed
once per cluster and weights version.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.rllib.utils.annotations import override
from ray.rllib.utils.torch_utils import FLOAT_MIN
from torch import nn

from smartsched.rl.observation import HEURISTIC_COLS, HEURISTIC_NAMES, STATIC_COLS
from smartsched.rl.topology_encoder import TopologyEncoder


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers)


class NodeScorerModule(TorchRLModule, ValueFunctionAPI):
    """Per-node scorer with a pooled value head; size-agnostic in the number of nodes."""

    @override(TorchRLModule)
    def setup(self) -> None:
        spaces = self.observation_space
        f_node = spaces["nodes"].shape[-1]
        f_pod = spaces["pod"].shape[0] + spaces["weights"].shape[0]
        h = int(self.model_config.get("hidden", 64))
        self.topo_dim = int(self.model_config.get("topology_dim", 32))
        self.topology: TopologyEncoder | None = None
        if self.model_config.get("topology", True):
            self.topology = TopologyEncoder(out_dim=self.topo_dim, hidden=self.topo_dim)
        else:
            self.topo_dim = 0
        self.node_mlp = _mlp([f_node + f_pod + self.topo_dim, h, h])
        self.score_mlp = nn.Sequential(_mlp([2 * h, h]), nn.Linear(h, 1))
        self.defer_head = nn.Sequential(_mlp([f_pod + h, h]), nn.Linear(h, 1))
        self.value_head = nn.Sequential(_mlp([f_pod + h, h]), nn.Linear(h, 1))
        self.gate: nn.Sequential | None = None
        if self.model_config.get("heuristic_prior", False):
            k = len(HEURISTIC_COLS)
            self.gate = nn.Sequential(_mlp([f_pod, h]), nn.Linear(h, k))
            scale = float(self.model_config.get("prior_scale", 10.0))
            with torch.no_grad():
                self.gate[-1].weight.zero_()
                self.gate[-1].bias.zero_()
                # Start as FGD, with BestFit breaking ties.
                self.gate[-1].bias[HEURISTIC_NAMES.index("score_fgd")] = scale
                self.gate[-1].bias[HEURISTIC_NAMES.index("score_bestfit")] = 0.3 * scale
                self.score_mlp[-1].weight.zero_()
                self.score_mlp[-1].bias.zero_()
                self.defer_head[-1].bias.fill_(-2.0)  # deferral starts rare

    def _encode(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        nodes = obs["nodes"]  # [B, N, F]
        pod = torch.cat([obs["pod"], obs["weights"]], dim=-1)  # [B, P]
        mask = obs["action_mask"][..., : nodes.shape[-2]]  # [B, N] feasible (padding 0)
        parts = [nodes, pod.unsqueeze(-2).expand(*nodes.shape[:-1], pod.shape[-1])]
        if self.topology is not None:
            parts.append(self._topology(nodes))
        emb = self.node_mlp(torch.cat(parts, -1))  # [B, N, h]
        w = mask.unsqueeze(-1)
        ctx = (emb * w).sum(-2) / w.sum(-2).clamp(min=1.0)  # [B, h]
        return emb, torch.cat([pod, ctx], dim=-1)

    def _topology(self, nodes: torch.Tensor) -> torch.Tensor:
        """[B, N, topo_dim]: the cached GATv2 embedding of each sample's cluster."""
        assert self.topology is not None
        static = nodes[..., list(STATIC_COLS)]  # [B, N, S]
        if nodes.dim() == 2:
            return self.topology(static)
        first = static[0]
        if bool((static == first).all()):  # one cluster in the batch: encode once
            return self.topology(first).unsqueeze(0).expand(nodes.shape[0], -1, -1)
        # A few distinct clusters (e.g. the all-zero terminal observations): encode each once.
        b, n, s = static.shape
        uniq, inverse = torch.unique(static.reshape(b, n * s), dim=0, return_inverse=True)
        embs = torch.stack([self.topology(u.reshape(n, s)) for u in uniq])
        return embs[inverse]

    def _logits(self, batch: dict[str, Any]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        obs = batch[Columns.OBS]
        emb, glob = self._encode(obs)
        ctx = glob[..., -emb.shape[-1]:]
        pair = torch.cat([emb, ctx.unsqueeze(-2).expand_as(emb)], dim=-1)
        node_logits = self.score_mlp(pair).squeeze(-1)  # [B, N]
        if self.gate is not None:
            pod = glob[..., : -emb.shape[-1]]
            heur = obs["nodes"][..., list(HEURISTIC_COLS)]  # [B, N, K]
            node_logits = node_logits + (heur * self.gate(pod).unsqueeze(-2)).sum(-1)
        logits = torch.cat([node_logits, self.defer_head(glob)], dim=-1)  # [B, N+1]
        logits = logits + torch.clamp(torch.log(obs["action_mask"]), min=FLOAT_MIN)
        return {Columns.ACTION_DIST_INPUTS: logits}, glob

    @override(TorchRLModule)
    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._logits(batch)[0]

    @override(TorchRLModule)
    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        out, glob = self._logits(batch)
        out[Columns.EMBEDDINGS] = glob
        return out

    @override(ValueFunctionAPI)
    def compute_values(
        self, batch: dict[str, Any], embeddings: torch.Tensor | None = None
    ) -> torch.Tensor:
        if embeddings is None:
            _, embeddings = self._encode(batch[Columns.OBS])
        return self.value_head(embeddings).squeeze(-1)
