"""Moved to ``smartsched.prometheus.exporter``; this re-export keeps old imports working."""

from smartsched.prometheus.exporter import *  # noqa: F403
