"""Container images as data: a name and its layers (digest, size), shared between images.

Owns the image a pod runs and its validation. Layers are what a node's image
cache stores and what a pull downloads: two images sharing a base layer (the
OS, CUDA, a Python runtime) share that part of the download and of the disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from smartsched.model.errors import ValidationError

MAX_LAYER_MIB: Final = 200 * 1024  # a layer larger than 200 GiB is a mistake
Layers = tuple[tuple[str, int], ...]  # (digest, MiB)


def check_image(image: str | None, layers: Sequence[tuple[str, int]], where: str = "") -> None:
    """An image needs a name and at least one layer, each a non-empty digest with a size in
    MiB in (0, 200 GiB]; no digest twice. Errors name ``<where>image_layers``."""
    f = f"{where}image_layers"
    if image is None:
        if layers:
            raise ValidationError(f"{where}image", "required when image_layers are given")
        return
    if not image:
        raise ValidationError(f"{where}image", "must be a non-empty name")
    if not layers:
        raise ValidationError(f, f"image {image!r} needs at least one layer")
    seen: set[str] = set()
    for k, layer in enumerate(layers):
        if not (isinstance(layer, tuple | list) and len(layer) == 2):
            raise ValidationError(f"{f}[{k}]", f"must be (digest, MiB), got {layer!r}")
        digest, size = layer
        if not isinstance(digest, str) or not digest:
            raise ValidationError(f"{f}[{k}]", "needs a non-empty digest")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_LAYER_MIB:
            raise ValidationError(f"{f}[{k}]", f"size must be an integer MiB in (0, "
                                  f"{MAX_LAYER_MIB}], got {size!r}")
        if digest in seen:
            raise ValidationError(f"{f}[{k}]", f"layer {digest!r} appears twice")
        seen.add(digest)


def image_mib(layers: Sequence[tuple[str, int]]) -> int:
    return sum(size for _, size in layers)
