"""Kubernetes integration: snapshots from API objects (scheduler and extender to come)."""
