"""Moved to ``smartsched.prometheus.source``; this re-export keeps old imports working."""

from smartsched.prometheus.source import *  # noqa: F403
