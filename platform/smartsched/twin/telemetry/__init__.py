"""Node telemetry of the twin: the metric catalogue and the synthesizer of per-node vectors."""

from smartsched.twin.telemetry.catalogue import (
    METRICS,
    Dimension,
    Layout,
    Metric,
    catalogue_markdown,
    column_names,
    dimensions,
    labels_of,
)
from smartsched.twin.telemetry.synth import TelemetrySynth

__all__ = [
    "METRICS",
    "Dimension",
    "Layout",
    "Metric",
    "TelemetrySynth",
    "catalogue_markdown",
    "column_names",
    "dimensions",
    "labels_of",
]
