"""AcceleratorFit: keep the large accelerator nodes for the pods only they can host.

Owns one score. A pod that needs one GPU (or a share of one) fits on a 4-GPU
node and on an 8-GPU node alike, but a pod of 8 GPUs -- or a gang of them --
fits only on the 8-GPU node, and only while it is whole. Packing scores do not
see that (BestFit prefers whichever node is fullest), so small GPU pods settle
on the big nodes and the gangs that can only go there wait for them to drain.
This score ranks nodes by how few devices a node has beyond what the pod
takes, so each pod lands on the smallest accelerator node that hosts it:

  GPU pod (needs k devices, a share needs 1):
      score = 100 * (1 - (devices(node) - k) / max devices of any node)
  pod without GPUs:
      score = 100 * (1 - devices(node) / max devices of any node)

It is a tier, not a packing rule: give it a weight that dominates the packing
score (the composite profile uses 10x) and the packing score orders nodes
within a tier.
"""

from __future__ import annotations

import numpy as np

from smartsched.scheduling.framework import MAX_NODE_SCORE, CycleContext
from smartsched.scheduling.plugins.k8s import NoArgs


class AcceleratorFit:
    """Prefer the node with the fewest GPUs beyond what the pod takes."""

    name = "AcceleratorFit"
    Args = NoArgs

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray:
        st, req = ctx.state, ctx.request
        devices = st.gpu_count
        top = max(int(devices.max()), 1)
        spare = np.maximum(devices - (max(req.num_gpu, 1) if req.num_gpu else 0), 0)
        return MAX_NODE_SCORE * (1.0 - spare / top)
