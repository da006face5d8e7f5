"""Image-aware scores: upstream's ImageLocality, and a layer- and pull-aware variant.

Owns scoring nodes by the pod's container image (``ClusterState.images``: each
node's layer cache and pull queue; pods without an image score 0 everywhere).

ImageLocality (kubernetes/pkg/scheduler/framework/plugins/imagelocality, v1.30;
a pod has one container here):

  sum   = size(image) * (nodes holding the whole image / all nodes)   if the node holds it
  sum   = clamp(sum, 23 MiB, 1000 MiB)
  score = 100 * (sum - 23 MiB) // (1000 MiB - 23 MiB)                  (integer, bytes)

ImagePull: the seconds until the image would be on the node -- the MiB of
layers it lacks at its bandwidth, after the pulls already queued there -- so
a node holding most layers of an image (a shared CUDA base, say) is preferred
to one holding none, and a node busy pulling is avoided:

  t     = max(puller free - now, 0) + missing MiB * 8.39 / Mbit/s
  score = 100 * (t_max - t) / (t_max - t_min) over the feasible nodes (all 100 when equal)
"""

from __future__ import annotations

from typing import Final

import numpy as np
from pydantic import BaseModel, ConfigDict

from smartsched.scheduling.framework import MAX_NODE_SCORE, CycleContext, lowest_best
from smartsched.twin.images import MBIT_PER_MIB

MB: Final = 1024 * 1024
MIN_THRESHOLD: Final = 23 * MB
MAX_CONTAINER_THRESHOLD: Final = 1000 * MB


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


def image_locality(present: np.ndarray, size_bytes: int, holders: int,
                   total_nodes: int) -> np.ndarray:
    """Upstream's ImageLocality score per node for one single-container pod."""
    spread = holders / max(total_nodes, 1)
    scaled = int(float(size_bytes) * spread)
    sums = np.where(present, scaled, 0).astype(np.int64)
    sums = np.clip(sums, MIN_THRESHOLD, MAX_CONTAINER_THRESHOLD)
    return (MAX_NODE_SCORE * (sums - MIN_THRESHOLD)
            // (MAX_CONTAINER_THRESHOLD - MIN_THRESHOLD)).astype(np.float64)


class ImageLocality:
    """Prefer nodes that already hold the pod's image, weighted by how widely it is spread."""

    name = "ImageLocality"
    Args = NoArgs

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray | float:
        img = ctx.request.image
        if img < 0:
            return 0.0
        im = ctx.state.images
        return image_locality(im.present[:, img], im.image_mib[img] * MB, im.nodes_with(img),
                              ctx.state.num_nodes)


class ImagePull:
    """Prefer nodes where the pod's image would be ready soonest (layers and pull queue)."""

    name = "ImagePull"
    Args = NoArgs

    def __init__(self, args: NoArgs | None = None) -> None:
        pass

    @staticmethod
    def pull_seconds(ctx: CycleContext) -> np.ndarray | None:
        img = ctx.request.image
        if img < 0:
            return None
        st = ctx.state
        im = st.images
        wait = np.maximum(im.free_at - st.now, 0.0)
        return wait + im.missing_mib(img) * MBIT_PER_MIB / im.mbps

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray | float:
        t = self.pull_seconds(ctx)
        return 0.0 if t is None else lowest_best(t, feasible)
