"""Moved to ``smartsched.twin.telemetry.reduction``; this re-export keeps old imports working."""

from smartsched.prometheus.features import features_from_prometheus  # noqa: F401
from smartsched.twin.telemetry.reduction import *  # noqa: F403
