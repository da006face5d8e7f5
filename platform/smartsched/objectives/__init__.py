"""Reward components and weight vectors, computed from the twin's metrics only."""
