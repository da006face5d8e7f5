"""What crosses a site's boundary: model weights as bytes, and nothing that can run code.

Owns the encoding of a model update (or the global model sent down): a NumPy
``.npz`` archive of named float32 arrays, read back with ``allow_pickle=False``
so a forged blob can be wrong but never execute anything. ``decode_weights``
checks names, shapes and finiteness against the model it is meant for, so a
site with a different model or a corrupted update is refused by name instead of
poisoning the average.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping

import numpy as np

from smartsched.model.errors import ValidationError


def encode_weights(weights: Mapping[str, np.ndarray]) -> bytes:
    """Named arrays -> bytes (float32, uncompressed: the byte count is what a round costs)."""
    buf = io.BytesIO()
    np.savez(buf, **{k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()})
    return buf.getvalue()


def decode_weights(blob: bytes, like: Mapping[str, tuple[int, ...]] | None = None,
                   field: str = "update") -> dict[str, np.ndarray]:
    """Bytes -> named float32 arrays; with ``like`` (name -> shape), exactly those arrays."""
    if not isinstance(blob, bytes | bytearray):
        raise ValidationError(field, f"must be bytes, got {type(blob).__name__}")
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            out = {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise ValidationError(field, f"not a weights archive: {e}") from None
    if like is not None:
        if set(out) != set(like):
            missing, extra = sorted(set(like) - set(out)), sorted(set(out) - set(like))
            raise ValidationError(field, f"arrays do not match the model (missing {missing}, "
                                  f"unexpected {extra})")
        for k, shape in like.items():
            if tuple(out[k].shape) != tuple(shape):
                raise ValidationError(f"{field}.{k}", f"shape {tuple(out[k].shape)}, the model "
                                      f"has {tuple(shape)}")
    for k, v in out.items():
        if v.dtype != np.float32:
            raise ValidationError(f"{field}.{k}", f"dtype {v.dtype}, expected float32")
        if not np.isfinite(v).all():
            raise ValidationError(f"{field}.{k}", "holds NaN or infinite values")
    return out
