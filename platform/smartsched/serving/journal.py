"""A site's durable journal: reservations survive a replica restart.

Owns the on-disk record of one site's reservations: an append-only JSON-lines
file (``<site>.jsonl``) with one event per change -- ``reserve`` (pods, nodes,
devices, expiry, request id), ``confirm``, ``release`` -- written and fsynced
before the answer leaves the site, so an acknowledged reservation is never
lost and a released one never comes back. On start the site replays it; when
the file grows past ``compact_after`` events it is rewritten as the live
reservations only (write to a temp file, fsync, atomic rename).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from smartsched.model.pod import Pod, UsageProfile


def pod_to_dict(pod: Pod) -> dict[str, Any]:
    d = asdict(pod)
    d["pod_class"] = str(pod.pod_class)
    d["usage"]["kind"] = str(pod.usage.kind)
    return d


def pod_from_dict(d: dict[str, Any]) -> Pod:
    d = dict(d)
    d["usage"] = UsageProfile(**d["usage"])
    for k in ("gpu_models", "tolerations", "allowed_regions"):
        d[k] = tuple(d[k])
    d["node_selector"] = tuple(tuple(x) for x in d["node_selector"])
    return Pod(**d)


class Journal:
    def __init__(self, path: Path, fsync: bool = True, compact_after: int = 10_000) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.compact_after = compact_after
        self.events = sum(1 for _ in self._lines()) if self.path.exists() else 0
        self._f = self.path.open("a", encoding="utf-8")

    def _lines(self) -> Iterator[str]:
        with self.path.open(encoding="utf-8") as f:
            yield from f

    def replay(self) -> Iterator[dict[str, Any]]:
        """Events in order; a torn last line (a crash mid-write) is ignored."""
        if not self.path.exists():
            return
        for line in self._lines():
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue

    def append(self, event: dict[str, Any]) -> None:
        self._f.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._f.flush()
        if self.fsync:
            os.fsync(self._f.fileno())
        self.events += 1

    def needs_compaction(self) -> bool:
        return self.events > self.compact_after

    def rewrite(self, events: list[dict[str, Any]]) -> None:
        """Replace the journal by ``events`` (the live state), atomically."""
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for e in events:
                f.write(json.dumps(e, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._f.close()
        os.replace(tmp, self.path)
        self._f = self.path.open("a", encoding="utf-8")
        self.events = len(events)

    def close(self) -> None:
        self._f.close()
