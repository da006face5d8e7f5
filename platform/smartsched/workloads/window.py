"""Cut a time window out of a trace, so a long trace can be replayed from a given moment.

Owns ``window_pods``: pods that finished before ``start_s`` are dropped; pods
running at ``start_s`` arrive at 0 with their remaining duration (the cluster
starts in the trace's state, not empty); later pods keep their offset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod


def window_pods(pods: Sequence[Pod], start_s: float) -> list[Pod]:
    """Pods as seen from ``start_s`` onwards, re-timed so ``start_s`` becomes 0."""
    if not start_s >= 0:
        raise ValidationError("start_hours", f"must be >= 0, got {start_s / 3600:g}")
    out = []
    for p in pods:
        end = None if p.duration is None else p.arrival + p.duration
        if end is not None and end <= start_s:
            continue
        arrival = max(p.arrival - start_s, 0.0)
        duration = None if end is None else end - max(p.arrival, start_s)
        deadline = None if p.deadline is None else max(p.deadline - start_s, arrival)
        out.append(dataclasses.replace(p, arrival=arrival, duration=duration, deadline=deadline))
    if pods and not out:
        last = max(p.arrival + (p.duration or 0.0) for p in pods)
        raise ValidationError("start_hours", f"{start_s / 3600:g} h is past the trace's end "
                              f"(its last pod ends at {last / 3600:.1f} h): nothing to replay")
    return out
