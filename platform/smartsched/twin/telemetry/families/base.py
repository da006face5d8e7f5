"""What every telemetry family shares: the column dict it returns and the byte units.

A family maps plain numpy inputs (per pod ``[P]``, per node ``[N]``, per slot
``[N, S]``) to the catalogue columns it owns: ``Columns`` maps a metric name to
an ``[N]`` or ``[N, instances]`` (``[N, instances, quantiles]``) array of
per-second rates (counters) or levels (gauges), before noise and integration.
"""

from __future__ import annotations

from typing import Final, TypeAlias

import numpy as np

Columns: TypeAlias = dict[str, np.ndarray]

MIB: Final = 1 << 20
KIB: Final = 1 << 10


def slot_mask(count: np.ndarray, slots: int) -> np.ndarray:
    """[N, slots] True for the instances (sockets, NICs, GPUs) a node has: ``j < count``."""
    return np.arange(slots)[None, :] < np.asarray(count)[:, None]
