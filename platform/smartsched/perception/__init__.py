"""Moved: the exporter, PromQL source and panel live in ``smartsched.prometheus``, the
telemetry reduction in ``smartsched.twin.telemetry.reduction``. These modules re-export
them so existing imports keep working; new code imports the new homes."""
