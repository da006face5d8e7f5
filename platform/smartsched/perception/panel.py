"""Moved to ``smartsched.prometheus.panel``; this re-export keeps old imports working."""

from smartsched.prometheus.panel import *  # noqa: F403
