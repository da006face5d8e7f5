"""The cloud's side of a round: FedAvg over the sites' updates.

Owns the average only (``rounds`` drives the rounds; FedProx lives in each
site's local objective, so its aggregation is FedAvg too). Weights are the
sites' training-sample counts, as in McMahan et al. (2017). The sum runs in
float64 and is cast back to float32, so averaging identical updates returns
that update bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from smartsched.model.errors import ValidationError


def fedavg(updates: Sequence[tuple[Mapping[str, np.ndarray], float]]) -> dict[str, np.ndarray]:
    """Sample-weighted mean of ``(weights, samples)`` pairs, array by array."""
    if not updates:
        raise ValidationError("updates", "no site sent an update")
    names = set(updates[0][0])
    total = 0.0
    for i, (w, n) in enumerate(updates):
        if isinstance(n, bool) or not isinstance(n, int | float) or not (
                math.isfinite(n) and n > 0):
            raise ValidationError(f"updates[{i}].samples", f"must be > 0, got {n!r}")
        if set(w) != names:
            raise ValidationError(f"updates[{i}]", "arrays differ from the first update's: "
                                  f"{sorted(set(w) ^ names)}")
        total += float(n)
    out = {}
    for k in sorted(names):
        shape = np.shape(updates[0][0][k])
        acc = np.zeros(shape, dtype=np.float64)
        for i, (w, n) in enumerate(updates):
            if np.shape(w[k]) != shape:
                raise ValidationError(f"updates[{i}].{k}", f"shape {np.shape(w[k])}, expected "
                                      f"{shape}")
            acc += (float(n) / total) * np.asarray(w[k], dtype=np.float64)
        out[k] = acc.astype(np.float32)
    return out
