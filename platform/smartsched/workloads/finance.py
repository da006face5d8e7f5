"""The synthetic ``finance`` workload: an online core system beside a nightly batch run.

Owns the generator of the design's finance case (issue 19): a bank's online core
system runs around the clock on its own pool (apps of several replicas that never
end, their use following the business day), and every night at the end-of-day
close a batch run of independent jobs is released on a dedicated pool, in waves as
upstream feeds arrive, all due by the morning deadline. Each night's jobs share an
``app`` (``eod-<day>``), so the twin's ``batch_runs`` figure measures the window
the run took: first release to last finish.

Sizes are fractions of the pools' own capacity (nodes labelled ``pool=<name>``), so
the same profile puts any cluster with such pools under comparable pressure; job
lengths are log-normal (a few long jobs a night), capped (a nightly job longer than
the cap is one its owners split). All randomness comes from one
seeded generator; the profile is validated and errors name ``workload.<field>``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from smartsched.model.cluster import ClusterSpec
from smartsched.model.configfile import read_resource, read_yaml, validate
from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod, PodClass, UsageKind, UsageProfile
from smartsched.model.priority import priority_classes
from smartsched.model.resources import MAX_NODE_CPU_MILLI
from smartsched.workloads.mixed import MAX_ARRIVALS

HOUR = 3600.0
POOL_LABEL = "pool"
Positive = Annotated[int, Field(ge=1)]
Replicas = Annotated[int, Field(ge=1, le=10_000)]  # one app's replicas
CpuMilli = Annotated[int, Field(ge=1, le=MAX_NODE_CPU_MILLI)]  # must fit some node


class _Online(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant: str = Field("core", min_length=1, pattern=r"^\S+$")  # "   " was a tenant
    pool: str = Field("core", min_length=1)
    load: float = Field(0.5, gt=0, le=1.0)
    replicas: list[Replicas] = Field(min_length=1)
    cpu_milli: list[CpuMilli] = Field(min_length=1)
    memory_mib_per_core: int = Field(4096, gt=0, le=1 << 20)
    usage_peak_hour: float = Field(11.0, ge=0, lt=24)
    priority_class: str = "online"


class _Batch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant: str = Field("batch", min_length=1, pattern=r"^\S+$")
    pool: str = Field("batch", min_length=1)
    window_start_hour: float = Field(22.0, ge=0, lt=24)
    deadline_hour: float = Field(6.0, ge=0, lt=24)
    # Waves: (hours after the start >= 0, share > 0). Shares are relative, but one of inf,
    # or two summing past the largest float, turned every share into nan or 0.
    release: list[tuple[Annotated[float, Field(ge=0, allow_inf_nan=False)],
                        Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]]] = Field(
        min_length=1)
    work: float = Field(gt=0, le=24)
    cpu_milli: list[CpuMilli] = Field(min_length=1)
    memory_mib_per_core: int = Field(4096, gt=0, le=1 << 20)
    duration_minutes_mean: float = Field(gt=0, le=24 * 60)
    duration_sigma: float = Field(1.0, ge=0, le=3)
    duration_minutes_max: float = Field(120.0, gt=0, le=24 * 60)
    checkpoint_minutes: float | None = Field(None, gt=0, le=24 * 60)
    priority_class: str = "batch"

    @model_validator(mode="after")
    def _longest_not_below_the_mean(self) -> _Batch:
        # A cap below the mean made every job the cap (max 1, mean 600: 1-minute jobs, and
        # sixteen times the pods for the same work).
        if self.duration_minutes_max < self.duration_minutes_mean:
            raise ValueError("duration_minutes_max must be at least duration_minutes_mean")
        return self


class FinanceProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    online: _Online
    batch: _Batch
    priority_classes: dict[str, Any] | None = None


def load_profile(path: str | Path | None = None) -> FinanceProfile:
    """The finance profile from ``path`` or the packaged default, validated."""
    doc = (read_resource("smartsched.workloads", "profiles_data/finance.yaml", "workload")
           if path is None else read_yaml(path, "workload"))
    return validate(FinanceProfile, doc, prefix="workload",
                    source=None if path is None else str(path))


def pool_nodes(cluster: ClusterSpec, pool: str, field: str) -> list[int]:
    """Indices of the nodes labelled ``pool=<pool>``; none is an error naming ``field``."""
    nodes = [i for i, n in enumerate(cluster.nodes) if n.labels.get(POOL_LABEL) == pool]
    if not nodes:
        raise ValidationError(field, f"no node of cluster {cluster.name!r} is labelled "
                              f"{POOL_LABEL}={pool}")
    return nodes


def generate_finance(cluster: ClusterSpec, hours: float = 24.0, seed: int = 0,
                     profile: FinanceProfile | None = None) -> list[Pod]:
    """The finance workload for ``cluster`` over ``hours``, sorted by arrival."""
    if isinstance(hours, bool) or not isinstance(hours, int | float) or not 0 < hours <= 24 * 366:
        raise ValidationError("hours", f"must be within (0, 8784], got {hours}")
    prof = load_profile() if profile is None else profile
    classes = priority_classes(prof.priority_classes, "workload.priority_classes")
    rng = np.random.default_rng(seed)
    pods = _online(cluster, prof.online, classes, rng)
    pods += _batch(cluster, prof.batch, classes, rng, hours * HOUR)
    pods.sort(key=lambda p: p.arrival)  # stable: a wave keeps its (random) job order
    return pods


def _bounded(field: str, expected: float) -> None:
    """Refuse a section whose sizes imply more pods than a run can hold (as the mixed
    generator does), before any is made: a named error instead of exhausting memory."""
    if not math.isfinite(expected) or expected > MAX_ARRIVALS:
        raise ValidationError(field, f"its load, sizes and durations imply about "
                              f"{expected:.3g} pods (at most {MAX_ARRIVALS:,})")


def _priority(classes: dict[str, Any], name: str, field: str) -> dict[str, Any]:
    from smartsched.model.priority import resolve

    pc = resolve(classes, name, field)
    return {"priority": pc.value, "preemption_policy": pc.preemption_policy}


def _online(cluster: ClusterSpec, s: _Online, classes: dict[str, Any],
            rng: np.random.Generator) -> list[Pod]:
    """Apps of several replicas that run for the whole span, until their requests reach
    ``load`` of the core pool's cpu."""
    nodes = pool_nodes(cluster, s.pool, "workload.online.pool")
    budget = s.load * sum(cluster.nodes[i].cpu_milli for i in nodes)
    prio = _priority(classes, s.priority_class, "workload.online.priority_class")
    usage = UsageProfile(UsageKind.DIURNAL, mean=0.55, amplitude=0.35,
                         peak_hour=s.usage_peak_hour)
    _bounded("workload.online", budget / float(np.mean(s.cpu_milli)) + max(s.replicas))
    pods: list[Pod] = []
    used, app = 0.0, 0
    while used < budget:
        replicas = int(rng.choice(s.replicas))
        cpu = int(rng.choice(s.cpu_milli))
        for r in range(replicas):
            pods.append(Pod(
                id=f"core-{app:03d}-{r}", cpu_milli=cpu,
                memory_mib=cpu * s.memory_mib_per_core // 1000, pod_class=PodClass.ONLINE,
                tenant=s.tenant, node_selector=((POOL_LABEL, s.pool),), arrival=0.0,
                duration=None, app=f"core-{app:03d}", traffic_mbps=5.0, usage=usage, **prio,
            ))
        used += replicas * cpu
        app += 1
    return pods


def _batch(cluster: ClusterSpec, s: _Batch, classes: dict[str, Any],
           rng: np.random.Generator, span: float) -> list[Pod]:
    """One run per night whose release falls within the span: jobs until their cpu-time
    reaches ``work`` hours of the pool's whole cpu, released in waves."""
    nodes = pool_nodes(cluster, s.pool, "workload.batch.pool")
    pool_cpu = sum(cluster.nodes[i].cpu_milli for i in nodes)
    biggest = max(cluster.nodes[i].cpu_milli for i in nodes)
    if max(s.cpu_milli) > biggest:
        raise ValidationError("workload.batch.cpu_milli",
                              f"{max(s.cpu_milli)} fits no node of pool {s.pool} "
                              f"(largest: {biggest})")
    prio = _priority(classes, s.priority_class, "workload.batch.priority_class")
    shares = np.array([w for _, w in s.release], dtype=np.float64)
    shares /= shares.sum()
    offsets = np.array([h for h, _ in s.release]) * HOUR
    mu = math.log(s.duration_minutes_mean * 60.0) - s.duration_sigma**2 / 2
    until_deadline = ((s.deadline_hour - s.window_start_hour) % 24.0 or 24.0) * HOUR
    if float(offsets.max()) >= until_deadline:
        raise ValidationError("workload.batch.release",
                              "a wave is released at or after the run's deadline")
    longest = s.duration_minutes_max * 60.0
    ckpt = None if s.checkpoint_minutes is None else s.checkpoint_minutes * 60.0
    usage = UsageProfile(UsageKind.CONSTANT, mean=0.85)
    nights = math.ceil(max(span / HOUR - s.window_start_hour, 0.0) / 24.0)
    # A job lasts about its mean, or the cap when the cap is shorter (a lower bound on
    # its length, so the estimate does not undercount).
    typical_s = min(s.duration_minutes_mean, s.duration_minutes_max) * 60.0
    _bounded("workload.batch",
             nights * s.work * pool_cpu * HOUR / (float(np.mean(s.cpu_milli)) * typical_s))
    pods: list[Pod] = []
    day = 0
    while (start := (day * 24.0 + s.window_start_hour) * HOUR) < span:
        target = s.work * pool_cpu * HOUR  # cpu-milli-seconds of the night
        total, j = 0.0, 0
        while total < target:
            cpu = int(rng.choice(s.cpu_milli))
            dur = min(float(rng.lognormal(mu, s.duration_sigma)), longest)
            wave = int(rng.choice(len(shares), p=shares))
            pods.append(Pod(
                id=f"eod-{day:03d}-{j:05d}", cpu_milli=cpu,
                memory_mib=cpu * s.memory_mib_per_core // 1000, pod_class=PodClass.BATCH,
                tenant=s.tenant, node_selector=((POOL_LABEL, s.pool),),
                arrival=start + float(offsets[wave]), duration=dur,
                deadline=start + until_deadline, app=f"eod-{day:03d}", usage=usage,
                checkpoint_interval_s=ckpt, **prio,
            ))
            total += cpu * dur
            j += 1
        day += 1
    return pods
