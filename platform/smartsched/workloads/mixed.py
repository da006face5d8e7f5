"""The synthetic ``mixed`` workload: online, AI training gangs, inference, nightly batch, edge.

Owns the generator matching the seed's production case. Loads in the YAML
profile are fractions of the target cluster's own capacity, so one profile
puts a 16-node and a 1,800-node cluster under comparable pressure:
diurnal online services with a flash-sale surge (``multiplier`` x arrivals
for a few minutes), AI training gangs of 1-64 GPUs split into whole-node
members, fractional-GPU inference, nightly batch with deadlines, and
real-time pods originating at MEC sites with a latency SLO.

Arrivals are a non-homogeneous Poisson process per class, sampled by
thinning; durations are log-normal with the configured mean (sigma 0.8).
All randomness comes from one seeded generator.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from smartsched.model.cluster import ClusterSpec
from smartsched.model.configfile import deep_merge, read_resource, read_yaml
from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod, PodClass
from smartsched.model.presets import GPU_NODE_TAINT
from smartsched.model.priority import priority_classes, resolve
from smartsched.workloads.images import assign_images, catalogue
from smartsched.workloads.profile_checks import check_profile
from smartsched.workloads.profiles import default_usage

HOUR = 3600.0
SIGMA = 0.8


PACKAGED = ("mixed", "iiot")  # profiles_data/<name>.yaml, named without a path


def load_profile(path: str | Path | None = None) -> dict[str, Any]:
    """The mixed profile from ``path``, a packaged one by name (``iiot``), or the packaged
    default. A profile with ``extends: <packaged name>`` is that profile with its own
    sections laid over (mappings merged key by key, anything else replaced)."""
    if path is None:
        path = "mixed"
    if str(path) in PACKAGED and not Path(path).is_file():
        doc = read_resource("smartsched.workloads", f"profiles_data/{path}.yaml", "workload")
        source = f"packaged profile {path}"
    else:
        doc = read_yaml(path, "workload")
        source = str(path)
    if not isinstance(doc, dict):
        raise ValidationError("workload", "profile must be a mapping", source=source)
    base = doc.pop("extends", None)
    if base is None:
        return doc
    if base not in PACKAGED or base == path:
        raise ValidationError("workload.extends", f"must name a packaged profile "
                              f"({', '.join(PACKAGED)}), got {base!r}", source=source)
    return deep_merge(load_profile(base), doc)


# Pods one generated workload may hold: ~100 days of the `large` preset (95,000 a day).
MAX_ARRIVALS = 10_000_000


class _Gen:
    def __init__(self, cluster: ClusterSpec, profile: dict[str, Any], hours: float, seed: int):
        self.c = cluster
        self.p = profile
        self.classes = priority_classes(profile.get("priority_classes"),
                                        "workload.priority_classes")
        self.horizon = hours * HOUR
        self.rng = np.random.default_rng(seed)
        day = profile.get("day") or {}  # `day:` with nothing under it: the defaults
        self.peak_hour = float(day.get("peak_hour", 20.0))
        self.trough_hour = float(day.get("trough_hour", 4.0))
        self.floor = float(day.get("night_floor", 0.25))
        zone_site = cluster.zone_site()
        kinds = {s.name: s.kind for s in cluster.sites}
        self.cloud_nodes = [n for n in cluster.nodes if kinds[zone_site[n.zone]] == "cloud"]
        self.edge_sites = [s.name for s in cluster.sites if s.kind == "edge"]
        self.edge_cpu = sum(
            n.cpu_milli for n in cluster.nodes if kinds[zone_site[n.zone]] == "edge"
        )
        self.cloud_cpu_free = sum(n.cpu_milli for n in self.cloud_nodes if n.num_gpu == 0)
        self.gpus = cluster.total_gpus
        self.max_gpu_node = max((n.num_gpu for n in cluster.nodes), default=0)
        self.pods: list[Pod] = []
        self.expected = 0.0  # arrivals drawn so far, in expectation (``count``)

    def section(self, name: str) -> dict[str, Any]:
        sec = self.p.get(name, {})
        if not isinstance(sec, dict):
            raise ValidationError(f"workload.{name}", "must be a mapping")
        return sec

    def shape(self, t: np.ndarray, daytime: float = 1.0) -> np.ndarray:
        """Diurnal rate shape in [floor, 1]: 1 at peak_hour, floor at trough_hour.

        Half-cosine rise from trough to peak and half-cosine fall back, so an
        evening peak can have its trough in the small hours (not 12 h later).
        """
        rise = (self.peak_hour - self.trough_hour) % 24.0 or 12.0
        phase = ((t / HOUR) % 24.0 - self.trough_hour) % 24.0
        d = np.where(
            phase < rise,
            0.5 - 0.5 * np.cos(np.pi * phase / rise),
            0.5 + 0.5 * np.cos(np.pi * (phase - rise) / (24.0 - rise)),
        )
        floor = 1.0 - daytime * (1.0 - self.floor)
        return floor + (1.0 - floor) * d

    def count(self, expected: float) -> int:
        """A Poisson draw of ``expected`` arrivals, refused when the profile's numbers
        imply more pods than any simulation here could hold (a load of 10^5, a mean
        duration of a millisecond): a named error instead of exhausting memory."""
        self.expected += expected
        if not np.isfinite(self.expected) or self.expected > MAX_ARRIVALS:
            raise ValueError(f"its load, sizes and durations imply {self.expected:.3g} pods "
                             f"over {self.horizon / HOUR:g} h (at most {MAX_ARRIVALS:,}): "
                             "check load and duration_hours_mean")
        return int(self.rng.poisson(expected))

    def arrivals(self, rate_peak_per_s: float, shape_fn: Any) -> np.ndarray:
        """Thinned Poisson arrival times over the horizon (sorted)."""
        if rate_peak_per_s <= 0 or self.horizon <= 0:
            return np.zeros(0)
        n = self.count(rate_peak_per_s * self.horizon)
        t = np.sort(self.rng.uniform(0.0, self.horizon, n))
        keep = self.rng.uniform(0.0, 1.0, n) < shape_fn(t)
        return t[keep]

    def durations(self, mean_hours: float, n: int) -> np.ndarray:
        mu = math.log(mean_hours * HOUR) - SIGMA**2 / 2
        return self.rng.lognormal(mu, SIGMA, n)

    def priority(self, s: dict[str, Any], default: str,
                 key: str = "priority_class") -> dict[str, Any]:
        """The ``priority`` and ``preemption_policy`` of a section's pods: its named
        priority class (``key``, default the class named like the section), or a bare
        ``priority`` number (older profiles; preemption policy then the default)."""
        if key == "priority_class" and "priority" in s:
            if key in s:
                raise ValidationError(f"workload.{default}.priority",
                                      "give a priority_class or a priority, not both")
            return {"priority": int(s["priority"])}
        pc = resolve(self.classes, str(s.get(key, default)), f"workload.{default}.{key}")
        return {"priority": pc.value, "preemption_policy": pc.preemption_policy}

    def pick(self, choices: list[Any], n: int) -> np.ndarray:
        return np.asarray(choices)[self.rng.integers(0, len(choices), n)]

    def tenant(self, cls: str, n: int) -> np.ndarray:
        tenants = self.p.get("tenants", {}).get(cls) or [cls]
        return self.pick(list(tenants), n)

    # ------------------------------------------------------------- classes
    def online(self) -> None:
        s = self.section("online")
        if not s or self.cloud_cpu_free == 0:
            return
        cpu = np.asarray(s["cpu_milli"], dtype=np.float64)
        mean_dur = float(s["duration_hours_mean"]) * HOUR
        rate = float(s["load"]) * self.cloud_cpu_free / (cpu.mean() * mean_dur)
        t = self.arrivals(rate, self.shape)
        dur = self.durations(float(s["duration_hours_mean"]), t.size)
        fs = s.get("flash_sale")
        if fs:
            start = float(fs["hour"]) * HOUR
            span = float(fs["minutes"]) * 60.0
            extra_rate = rate * (float(fs["multiplier"]) - 1.0)
            starts = np.arange(start, self.horizon, 24 * HOUR)
            for st in starts:
                n = self.count(extra_rate * min(span, self.horizon - st))
                ts = np.sort(self.rng.uniform(st, min(st + span, self.horizon), n))
                t = np.concatenate([t, ts])
                dur = np.concatenate([dur, self.durations(float(fs["duration_hours_mean"]), n)])
        req = self.pick(list(s["cpu_milli"]), t.size)
        apps = self.rng.integers(0, int(s.get("apps", 8)), t.size)
        tenants = self.tenant("online", t.size)
        usage = default_usage(PodClass.ONLINE)
        for i in range(t.size):
            self.pods.append(Pod(
                id=f"online-{i:07d}", cpu_milli=int(req[i]),
                memory_mib=int(req[i] * float(s["memory_mib_per_core"]) / 1000),
                pod_class=PodClass.ONLINE, tenant=str(tenants[i]),
                **self.priority(s, "online"), arrival=float(t[i]),
                duration=float(dur[i]), app=f"svc-{apps[i]}",
                traffic_mbps=float(s.get("traffic_mbps", 0.0)), usage=usage,
            ))

    def ai_train(self) -> None:
        s = self.section("ai-train")
        if not s or self.gpus == 0:
            return
        sizes = {int(k): float(v) for k, v in s["gpus"].items() if int(k) <= self.gpus // 2 or
                 int(k) == 1}
        if sum(sizes.values()) <= 0:
            raise ValidationError("workload.ai-train.gpus", f"no job size with weight fits "
                                  f"this cluster ({self.gpus} GPUs: jobs of up to "
                                  f"{max(1, self.gpus // 2)} GPUs, or 1)")
        g = np.array(list(sizes), dtype=np.int64)
        w = np.array(list(sizes.values()))
        w /= w.sum()
        mean_dur = float(s["duration_hours_mean"]) * HOUR
        rate = float(s["load"]) * self.gpus / (float((g * w).sum()) * mean_dur)
        daytime = float(s.get("daytime_share", 0.6))
        t = self.arrivals(rate, lambda x: self.shape(x, daytime))
        size = self.rng.choice(g, t.size, p=w)
        dur = self.durations(float(s["duration_hours_mean"]), t.size)
        tenants = self.tenant("ai-train", t.size)
        constrained = self.rng.uniform(0, 1, t.size) < float(s.get("model_constraint_share", 0))
        usage = default_usage(PodClass.AI_TRAIN)
        per_node = max(1, self.max_gpu_node)
        minutes = s.get("checkpoint_minutes")
        checkpoint = None if minutes is None else float(minutes) * 60.0
        for i in range(t.size):
            total = int(size[i])
            per_pod = min(total, per_node)
            members = -(-total // per_pod)
            models: tuple[str, ...] = ()
            if constrained[i]:
                fit = sorted({n.gpu_model for n in self.c.nodes if n.num_gpu >= per_pod})
                models = (str(self.pick(fit, 1)[0]),) if fit else ()
            gang = f"train-{i:06d}" if members > 1 else None
            for m in range(members):
                self.pods.append(Pod(
                    id=f"train-{i:06d}-{m}", cpu_milli=per_pod * int(s["cpu_milli_per_gpu"]),
                    memory_mib=per_pod * int(s["memory_mib_per_gpu"]), num_gpu=per_pod,
                    gpu_milli=1000, pod_class=PodClass.AI_TRAIN, tenant=str(tenants[i]),
                    **self.priority(s, "ai-train"), gpu_models=models,
                    tolerations=(GPU_NODE_TAINT,), arrival=float(t[i]), duration=float(dur[i]),
                    gang_id=gang, gang_size=members, usage=usage,
                    checkpoint_interval_s=checkpoint,
                ))

    def ai_infer(self) -> None:
        s = self.section("ai-infer")
        if not s or self.gpus == 0:
            return
        milli = np.asarray(s["gpu_milli"], dtype=np.float64)
        mean_dur = float(s["duration_hours_mean"]) * HOUR
        rate = float(s["load"]) * self.gpus * 1000 / (milli.mean() * mean_dur)
        t = self.arrivals(rate, self.shape)
        dur = self.durations(float(s["duration_hours_mean"]), t.size)
        gm = self.pick(list(s["gpu_milli"]), t.size)
        cpu = self.pick(list(s["cpu_milli"]), t.size)
        mem = self.pick(list(s["memory_mib"]), t.size)
        tenants = self.tenant("ai-infer", t.size)
        constrained = self.rng.uniform(0, 1, t.size) < float(s.get("model_constraint_share", 0))
        models_all = sorted({n.gpu_model for n in self.c.nodes if n.num_gpu})
        usage = default_usage(PodClass.AI_INFER)
        for i in range(t.size):
            models = (str(self.pick(models_all, 1)[0]),) if constrained[i] else ()
            self.pods.append(Pod(
                id=f"infer-{i:07d}", cpu_milli=int(cpu[i]), memory_mib=int(mem[i]), num_gpu=1,
                gpu_milli=int(gm[i]), pod_class=PodClass.AI_INFER, tenant=str(tenants[i]),
                **self.priority(s, "ai-infer"), gpu_models=models,
                tolerations=(GPU_NODE_TAINT,), arrival=float(t[i]), duration=float(dur[i]),
                usage=usage,
            ))

    def batch(self) -> None:
        s = self.section("batch")
        if not s or self.cloud_cpu_free == 0:
            return
        lo, hi = (float(x) for x in s.get("window_hours", [22.0, 4.0]))
        width = (hi - lo) % 24.0 or 24.0
        cpu = np.asarray(s["cpu_milli"], dtype=np.float64)
        mean_dur = float(s["duration_hours_mean"]) * HOUR
        # The window's arrivals sustain `load` over the window plus one mean duration.
        rate = float(s["load"]) * self.cloud_cpu_free / (cpu.mean() * mean_dur)

        def in_window(x: np.ndarray) -> np.ndarray:
            return (((x / HOUR) % 24.0 - lo) % 24.0 < width).astype(np.float64)

        t = self.arrivals(rate, in_window)
        dur = self.durations(float(s["duration_hours_mean"]), t.size)
        req = self.pick(list(s["cpu_milli"]), t.size)
        tenants = self.tenant("batch", t.size)
        usage = default_usage(PodClass.BATCH)
        dl = float(s.get("deadline_hours", 8.0)) * HOUR
        be = self.rng.uniform(0, 1, t.size) < float(s.get("best_effort_share", 0.0))
        priority = self.priority(s, "batch")
        be_priority = self.priority(s, "best-effort", key="best_effort_priority_class")
        for i in range(t.size):
            self.pods.append(Pod(
                id=f"batch-{i:07d}", cpu_milli=int(req[i]),
                memory_mib=int(req[i] * float(s["memory_mib_per_core"]) / 1000),
                pod_class=PodClass.BATCH, tenant=str(tenants[i]),
                **(be_priority if be[i] else priority), arrival=float(t[i]),
                duration=float(dur[i]), deadline=float(t[i]) + dl, usage=usage,
                best_effort=bool(be[i]),
            ))

    def edge(self) -> None:
        s = self.section("edge-rt")
        if not s or not self.edge_sites or self.edge_cpu == 0:
            return
        cpu = np.asarray(s["cpu_milli"], dtype=np.float64)
        mean_dur = float(s["duration_hours_mean"]) * HOUR
        rate = float(s["load"]) * self.edge_cpu / (cpu.mean() * mean_dur)
        t = self.arrivals(rate, self.shape)
        dur = self.durations(float(s["duration_hours_mean"]), t.size)
        req = self.pick(list(s["cpu_milli"]), t.size)
        mem = self.pick(list(s["memory_mib"]), t.size)
        origin = self.pick(self.edge_sites, t.size)
        tenants = self.tenant("edge-rt", t.size)
        usage = default_usage(PodClass.EDGE_RT)
        for i in range(t.size):
            self.pods.append(Pod(
                id=f"edge-{i:07d}", cpu_milli=int(req[i]), memory_mib=int(mem[i]),
                pod_class=PodClass.EDGE_RT, tenant=str(tenants[i]),
                **self.priority(s, "edge-rt"), origin_site=str(origin[i]),
                latency_slo_ms=float(s["latency_slo_ms"]), arrival=float(t[i]),
                duration=float(dur[i]), usage=usage,
            ))


def generate_mixed(
    cluster: ClusterSpec,
    hours: float = 24.0,
    seed: int = 0,
    profile: dict[str, Any] | None = None,
) -> list[Pod]:
    """Generate the mixed workload for ``cluster`` over ``hours``, sorted by arrival."""
    if isinstance(hours, bool) or not isinstance(hours, int | float) or not 0 < hours <= 24 * 366:
        raise ValidationError("hours", f"must be within (0, 8784], got {hours}")
    doc = load_profile() if profile is None else profile
    check_profile(doc)
    gen = _Gen(cluster, doc, hours, seed)
    for section, step in (("online", gen.online), ("ai-train", gen.ai_train),
                          ("ai-infer", gen.ai_infer), ("batch", gen.batch), ("edge-rt", gen.edge)):
        try:
            step()
        except KeyError as e:
            raise ValidationError(f"workload.{section}.{e.args[0]}", "missing field") from None
        except (TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
            if isinstance(e, ValidationError):
                raise
            raise ValidationError(f"workload.{section}", f"bad value: {e}") from None
    gen.pods.sort(key=lambda p: (p.arrival, p.id))
    section = gen.p.get("images")
    if section is None:
        return gen.pods
    return assign_images(gen.pods, catalogue(section), seed)
