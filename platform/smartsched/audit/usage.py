"""Resource-use audit: what each pod actually used, sampled from a collector, into the log.

Owns the collector interface (issue 19, part 3) and the step that writes a sample to
the audit log as ``resource.use`` records (one per pod: tenant, node, CPU, memory, GPU).
Two collectors implement it: the twin's (``twin.usage_audit``: the usage profiles the
twin runs pods with) and Prometheus's (``prometheus.pod_usage``: cAdvisor's container
counters, as kubelet exports them).

An eBPF collector -- the design's regulatory isolation layer -- cannot be loaded on
these machines (no CAP_BPF, no kernel headers). One would plug in as one more
``UsageCollector``: a loader (e.g. BCC or libbpf via its Python bindings) attaching
to ``sched_switch`` and the cgroup's memory events, summing CPU time and resident
memory per cgroup id in BPF maps; ``sample()`` reads and resets the maps and maps
each cgroup id to its pod through the kubelet's cgroup path
(``kubepods/<qos>/pod<uid>/<container>``). Nothing else changes: the samples go to
the same records, signed the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

from smartsched.audit.log import AuditLog


@dataclass(frozen=True, slots=True)
class PodUsage:
    """One pod's use at one instant (``cpu_milli`` a rate, memory and GPU levels)."""

    pod: str
    tenant: str
    node: str
    cpu_milli: float
    memory_mib: float
    gpu_milli: float
    ts: float


@runtime_checkable
class UsageCollector(Protocol):
    """A source of per-pod resource use."""

    name: str

    def sample(self) -> Sequence[PodUsage]:
        """Every running pod's use now."""
        ...


def audit_usage(log: AuditLog, collector: UsageCollector) -> int:
    """Write one ``resource.use`` record per pod of a fresh sample (principal
    ``collector:<name>``, tenant the pod's); return how many."""
    samples = collector.sample()
    who = f"collector:{collector.name}"
    for s in samples:
        doc = asdict(s)
        ts = doc.pop("ts")
        log.append("resource.use", who, doc, tenant=s.tenant, ts=ts)
    return len(samples)
