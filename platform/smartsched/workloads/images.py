"""A synthetic container-image catalogue for generated workloads, and giving pods images.

Owns turning a profile's ``images:`` section into named images with layers and
drawing each pod's image. Documented model (the numbers live in the profile):

* Base layers shared across images (an OS, a Python runtime, CUDA, ML
  frameworks), each a fixed size; an image of a class is its class's base
  layers plus two layers of its own (dependencies 70 %, application 30 %) that
  bring it to its size.
* A class has ``count`` images whose sizes run geometrically from ``gb[0]``
  to ``gb[1]`` (GiB) -- training images largest, edge images smallest.
* A pod draws its class's image by Zipf popularity: rank r has weight 1/r^s,
  so a few images are most of the pulls (and of the cache hits).

Draws use their own seeded stream, so adding images never changes the
arrivals, sizes or durations the rest of the generator draws.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from smartsched.model.errors import ValidationError
from smartsched.model.images import check_image
from smartsched.model.pod import Pod, PodClass

GIB_MIB = 1024
MAX_IMAGE_GIB = 1024  # an image's size: past a TiB is a unit slip (inf overflowed)


@dataclasses.dataclass(frozen=True)
class ClassImages:
    names: tuple[str, ...]
    layers: tuple[tuple[tuple[str, int], ...], ...]
    popularity: np.ndarray  # Zipf weights, summing to 1


SECTION_KEYS = ("zipf_s", "base_layers_mib", "classes")
CLASS_KEYS = ("count", "gb", "base")


def _refuse_unknown(doc: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    """A key the catalogue does not read is named, as the profile's other sections do: a
    typo (``zipf: 2``, ``size_gb:``) was dropped and the default used without a word."""
    for key in doc:
        if key not in known:
            raise ValidationError(f"{where}.{key}", f"unknown field (known: {', '.join(known)})")


def catalogue(section: Mapping[str, Any], where: str = "workload.images"
              ) -> dict[PodClass, ClassImages]:
    """The images of each pod class described by ``section`` (see the module docstring)."""
    if not isinstance(section, Mapping):
        raise ValidationError(where, "must be a mapping")
    _refuse_unknown(section, SECTION_KEYS, where)
    s = section.get("zipf_s", 1.1)
    if isinstance(s, bool) or not isinstance(s, int | float) or not 0 <= s <= 10:
        raise ValidationError(f"{where}.zipf_s", f"must be a number within [0, 10], got {s!r}")
    bases = section.get("base_layers_mib", {})
    if not isinstance(bases, Mapping):
        raise ValidationError(f"{where}.base_layers_mib", "must map layer names to MiB")
    for name, mib in bases.items():
        if isinstance(mib, bool) or not isinstance(mib, int) or mib <= 0:
            raise ValidationError(f"{where}.base_layers_mib.{name}",
                                  f"must be a positive integer MiB, got {mib!r}")
    classes = section.get("classes")
    if classes is None:  # `classes:` left empty
        classes = {}
    if not isinstance(classes, Mapping):
        raise ValidationError(f"{where}.classes", "must map pod classes to their images")
    out: dict[PodClass, ClassImages] = {}
    for cls_name, spec in classes.items():
        w = f"{where}.classes.{cls_name}"
        try:
            cls = PodClass(cls_name)
        except ValueError:
            raise ValidationError(w, f"not a pod class ({', '.join(c.value for c in PodClass)})"
                                  ) from None
        if not isinstance(spec, Mapping):
            raise ValidationError(w, "must be a mapping (count, gb, base)")
        _refuse_unknown(spec, CLASS_KEYS, w)
        count = spec.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 10_000:
            raise ValidationError(f"{w}.count", f"must be an integer in [1, 10000], got {count!r}")
        lo_hi = spec.get("gb")
        if not (isinstance(lo_hi, Sequence) and len(lo_hi) == 2
                and all(isinstance(x, int | float) and not isinstance(x, bool)
                        and 0 < x <= MAX_IMAGE_GIB for x in lo_hi)
                and lo_hi[0] <= lo_hi[1]):
            raise ValidationError(f"{w}.gb", f"must be [smallest, largest] GiB, got {lo_hi!r}")
        base = spec.get("base", [])
        if not isinstance(base, list):
            raise ValidationError(f"{w}.base", f"must be a list of base layers, got {base!r}")
        for b in base:
            if not isinstance(b, str) or b not in bases:
                raise ValidationError(f"{w}.base", f"unknown base layer {b!r}")
        base_layers = tuple((f"base/{b}", int(bases[b])) for b in base)
        base_mib = sum(m for _, m in base_layers)
        sizes = np.geomspace(lo_hi[0], lo_hi[1], count) * GIB_MIB
        names, layers = [], []
        for k, total in enumerate(sizes):
            own = int(total + 0.5) - base_mib
            if own < 2:
                raise ValidationError(f"{w}.gb", f"{lo_hi[0]} GiB is smaller than the base "
                                      f"layers ({base_mib} MiB)")
            deps = max(1, int(own * 0.7))
            name = f"{cls.value}/image-{k:02d}"
            lay = (*base_layers, (f"{name}/deps", deps), (f"{name}/app", own - deps))
            check_image(name, lay, f"{w}.")
            names.append(name)
            layers.append(lay)
        weights = 1.0 / np.arange(1, count + 1) ** s
        out[cls] = ClassImages(tuple(names), tuple(layers), weights / weights.sum())
    return out


def assign_images(pods: Sequence[Pod], images: Mapping[PodClass, ClassImages],
                  seed: int) -> list[Pod]:
    """``pods`` with an image each (of their class, by popularity); gang members share
    their gang's image. Classes without images keep none."""
    rng = np.random.default_rng([seed, 0x1A6E])
    u = rng.random(len(pods))  # one draw per pod, mapped through its class's popularity
    gang_draw: dict[str, float] = {}
    for i, p in enumerate(pods):  # gang members take their gang's first draw
        if p.gang_id is not None:
            u[i] = gang_draw.setdefault(p.gang_id, float(u[i]))
    cls = [p.pod_class for p in pods]
    pick = np.full(len(pods), -1, dtype=np.int64)
    for c, ci in images.items():  # one search per class, over all its pods at once
        rows = np.flatnonzero([x == c for x in cls])
        if rows.size:
            k = np.searchsorted(np.cumsum(ci.popularity), u[rows], side="right")
            pick[rows] = np.minimum(k, len(ci.names) - 1)
    out: list[Pod] = []
    for p, k in zip(pods, pick.tolist(), strict=True):
        ci = images.get(p.pod_class)
        if ci is None or k < 0:
            out.append(p)
            continue
        out.append(dataclasses.replace(p, image=ci.names[k], image_layers=ci.layers[k]))
    return out
