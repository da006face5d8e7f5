"""Reduced telemetry features read from a real Prometheus: the production twin of the hook.

Owns ``features_from_prometheus``: the twin's ``TelemetryFeatures`` synthesizes
the wide vector and projects it; here the same columns come from Prometheus
(counters as ``rate``) and go through the same projection.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from smartsched.model.errors import ValidationError
from smartsched.twin.telemetry.reduction import TelemetryProjection


def features_from_prometheus(source: Any, projection: TelemetryProjection
                             ) -> tuple[np.ndarray, list[str]]:
    """The production path of ``TelemetryFeatures``: read the wide vector of the source's
    nodes from Prometheus (counters as ``rate``) and project it -> ([N, k], query errors).
    Put the result in ``ClusterState.telemetry_features`` for the policy."""
    from smartsched.twin.telemetry.catalogue import Layout, column_names, dimensions

    if column_names(Layout.STANDARD) != projection.columns:
        raise ValidationError("telemetry", "the projection was fitted on a cluster-specific "
                              "layout; fit it on the standard layout to read Prometheus")
    X, errors = source.read_vector(dimensions(Layout.STANDARD))
    return projection.transform(X), errors
