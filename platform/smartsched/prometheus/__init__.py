"""Prometheus: the twin's telemetry exporter, the PromQL source that reads a real
Prometheus back into ``ClusterState``, reduced features from it, and panel rendering."""
