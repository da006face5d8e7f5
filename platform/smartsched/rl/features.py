"""Moved to ``smartsched.rl.observation`` (named columns); this re-export keeps old imports
working."""

from smartsched.rl.observation import (  # noqa: F401
    CLIP,
    CPU_SCALE,
    DEVICE_SLOTS,
    FORECAST_COLS,
    HEURISTIC_COLS,
    MEM_SCALE,
    NODE_FEATURES,
    NVLINK_COL,
    POD_FEATURES,
    RACK_COL,
    SOCKETS_COL,
    STATIC_COLS,
    ZONE_COL,
    ZONE_SLOTS,
    FeatureBuilder,
)
