"""The digital twin: cluster state as numpy arrays, the event engine and the metrics."""
