"""Container images on nodes: a layer cache per node and pulls that take time.

Owns each node's image cache (layers kept within the node's ``image_disk_mib``,
least recently used evicted first, never a layer a pod on the node uses) and
its pulls. Pulls on a node are serialized, as kubelet's default
``serializeImagePulls`` does, so concurrent pulls share the node's bandwidth
one after another:

  start = max(now, node's puller free)      end = start + MiB missing * 8.39 / Mbit/s
  a pod whose layers are already coming (another pod's pull) waits for them, no bytes;
  ready = max(end, layers in flight)         the container then starts ``container_start_s``

A layer that cannot fit even after evicting every unused layer is pulled and
used but not kept (the cache never exceeds its disk). Layers shared between
images are downloaded and stored once. ``cached[N, L]`` (layers) and
``present[N, I]`` (whole images) are kept as arrays for the scheduler's
image-locality scores. Vocabularies of layers and images grow as pods are
compiled.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

import numpy as np

from smartsched.model.cluster import ClusterSpec
from smartsched.model.errors import ValidationError

MBIT_PER_MIB: Final = 8 * 1.048576


class ImageCaches:
    """Every node's layer cache, pull queue and whole-image presence."""

    def __init__(self, spec: ClusterSpec) -> None:
        n = len(spec.nodes)
        self.num_nodes = n
        self.capacity_mib = np.array([x.image_disk_mib for x in spec.nodes], dtype=np.int64)
        self.mbps = np.array([float(x.pull_mbps) for x in spec.nodes], dtype=np.float64)
        self.used_mib = np.zeros(n, dtype=np.int64)
        self.free_at = np.zeros(n, dtype=np.float64)  # when each node's puller is free
        self._lru: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(n)]
        self._pins: list[dict[int, int]] = [{} for _ in range(n)]
        self._ready: list[dict[int, float]] = [{} for _ in range(n)]  # layers in flight
        # Nodes whose three dicts above belong to this object alone; a copy shares them
        # all and each side copies a node's on its first change (forks are cheap).
        self._owned = np.ones(n, dtype=bool)
        self.layer_ids: dict[str, int] = {}
        self.layer_mib: list[int] = []
        self.image_ids: dict[str, int] = {}
        self.image_layers: list[tuple[int, ...]] = []
        self.image_mib: list[int] = []
        self.cached = np.zeros((n, 8), dtype=bool)
        self.present = np.zeros((n, 4), dtype=bool)
        # [images, layers] 0/1: which layers each image has (rebuilt when images are added).
        self._incidence = np.zeros((0, 0), dtype=np.int64)
        self._refreshed_images = np.full(n, -1, dtype=np.int64)  # images known at refresh

    # ------------------------------------------------------------ vocabulary
    def image_id(self, name: str, layers: Sequence[tuple[str, int]]) -> int:
        """The id of image ``name`` with ``layers`` (registered on first sight); the same
        name with other layers, or a layer digest with two sizes, is a ValidationError."""
        k = self.image_ids.get(name)
        ids = []
        for digest, mib in layers:
            j = self.layer_ids.get(digest)
            if j is None:
                j = self.layer_ids[digest] = len(self.layer_mib)
                self.layer_mib.append(int(mib))
            elif self.layer_mib[j] != mib:
                raise ValidationError("image_layers", f"layer {digest!r} has two sizes "
                                      f"({self.layer_mib[j]} and {mib} MiB)")
            ids.append(j)
        if k is not None:
            if self.image_layers[k] != tuple(ids):
                raise ValidationError("image_layers", f"image {name!r} has two layer lists")
            return k
        k = self.image_ids[name] = len(self.image_layers)
        self.image_layers.append(tuple(ids))
        self.image_mib.append(int(sum(self.layer_mib[j] for j in ids)))
        if len(self.layer_mib) > self.cached.shape[1]:
            self.cached = _widen(self.cached, 2 * len(self.layer_mib))
        if k >= self.present.shape[1]:
            self.present = _widen(self.present, 2 * (k + 1))
        return k

    # ----------------------------------------------------------------- pulls
    def pull(self, node: int, image: int, now: float) -> tuple[float, int, tuple[int, ...]]:
        """Start (or join) the pull of ``image`` on ``node`` at ``now``: returns when its
        layers are all on the node, the MiB this pull downloads, and the layers it pinned
        (``release`` unpins exactly those when the pod leaves)."""
        self._own(node)
        lru, ready, pins = self._lru[node], self._ready[node], self._pins[node]
        done, fetch, pinned = now, [], []
        for j in self.image_layers[image]:
            if j in lru:  # kept (or coming): pin it first, so making room never drops it
                lru.move_to_end(j)
                pins[j] = pins.get(j, 0) + 1
                pinned.append(j)
                done = max(done, ready.get(j, now))
            else:
                fetch.append(j)
        mib = sum(self.layer_mib[j] for j in fetch)
        if fetch:
            start = max(now, float(self.free_at[node]))
            end = start + mib * MBIT_PER_MIB / float(self.mbps[node])
            self.free_at[node] = end
            done = max(done, end)
            for j in [j for j, t in ready.items() if t <= now]:
                del ready[j]  # arrived already: no longer in flight
            for j in fetch:
                if self._make_room(node, self.layer_mib[j]):
                    lru[j] = self.layer_mib[j]
                    self.used_mib[node] += self.layer_mib[j]
                    self.cached[node, j] = True
                    ready[j] = end
                    pins[j] = pins.get(j, 0) + 1
                    pinned.append(j)
                # else: pulled and used but not kept (no room on the disk)
        # Whole-image presence changes only with the node's layers or the images known.
        if fetch or self._refreshed_images[node] != len(self.image_layers):
            self._refresh(node)
        return done, mib, tuple(pinned)

    def release(self, node: int, pinned: tuple[int, ...]) -> None:
        """A pod left ``node``: the layers its pull pinned may be evicted again."""
        self._own(node)
        pins = self._pins[node]
        for j in pinned:
            c = pins.get(j)
            if c is not None:
                if c <= 1:
                    del pins[j]
                else:
                    pins[j] = c - 1

    def _own(self, node: int) -> None:
        """Copy ``node``'s dicts before changing them, if a copy shares them."""
        if not self._owned[node]:
            self._lru[node] = OrderedDict(self._lru[node])
            self._pins[node] = dict(self._pins[node])
            self._ready[node] = dict(self._ready[node])
            self._owned[node] = True

    def _make_room(self, node: int, mib: int) -> bool:
        """Evict unused layers, least recently used first, until ``mib`` fits."""
        cap = int(self.capacity_mib[node])
        if mib > cap:
            return False
        lru, pins = self._lru[node], self._pins[node]
        if self.used_mib[node] + mib > cap:
            for j in [j for j in lru if j not in pins]:
                if self.used_mib[node] + mib <= cap:
                    break
                self.used_mib[node] -= lru.pop(j)
                self.cached[node, j] = False
                self._ready[node].pop(j, None)
        return bool(self.used_mib[node] + mib <= cap)

    def _refresh(self, node: int) -> None:
        """``present[node]`` from ``cached[node]``: an image is present when none of its
        layers is missing (one product with the image-layer incidence matrix)."""
        k = len(self.image_layers)
        if self._incidence.shape[0] != k:
            inc = np.zeros((k, len(self.layer_mib)), dtype=np.int64)
            for i, layers in enumerate(self.image_layers):
                inc[i, list(layers)] = 1
            self._incidence = inc
        inc = self._incidence
        missing = inc @ ~self.cached[node, : inc.shape[1]]
        self.present[node, :k] = missing == 0
        self._refreshed_images[node] = k

    # -------------------------------------------------------------- queries
    def missing_mib(self, image: int) -> np.ndarray:
        """[N] MiB of ``image`` each node would download."""
        layers = list(self.image_layers[image])
        sizes = np.asarray([self.layer_mib[j] for j in layers], dtype=np.int64)
        return (~self.cached[:, layers]) @ sizes

    def nodes_with(self, image: int) -> int:
        return int(self.present[:, image].sum())

    def copy(self) -> ImageCaches:
        other = object.__new__(ImageCaches)
        other.__dict__.update(self.__dict__)
        other.used_mib = self.used_mib.copy()
        other.free_at = self.free_at.copy()
        other._refreshed_images = self._refreshed_images.copy()
        other._lru = list(self._lru)
        other._pins = list(self._pins)
        other._ready = list(self._ready)
        self._owned = np.zeros(self.num_nodes, dtype=bool)  # both share every node now
        other._owned = np.zeros(self.num_nodes, dtype=bool)
        other.cached = self.cached.copy()
        other.present = self.present.copy()
        other.layer_ids = dict(self.layer_ids)
        other.layer_mib = list(self.layer_mib)
        other.image_ids = dict(self.image_ids)
        other.image_layers = list(self.image_layers)
        other.image_mib = list(self.image_mib)
        return other


def _widen(a: np.ndarray, cols: int) -> np.ndarray:
    out = np.zeros((a.shape[0], cols), dtype=a.dtype)
    out[:, : a.shape[1]] = a
    return out
