"""Prometheus as a resource-use collector (``audit.usage.UsageCollector``).

Reads what kubelet's cAdvisor exports per container, summed per pod:
``container_cpu_usage_seconds_total`` (a rate, in millicores),
``container_memory_working_set_bytes`` (MiB) and, where NVIDIA's dcgm-exporter runs
with pod labels, ``DCGM_FI_DEV_GPU_UTIL`` (per cent of a device, as milli). The
namespace is the tenant, as in the Kubernetes snapshot. A pod missing from a metric
reads 0 for it; a failed query raises ``PrometheusQueryError`` naming it (an audit
sample is not silently partial), and so does a value that is no usage (NaN, infinite or
negative: it was recorded as null or as negative use), naming the pod and the field.
"""

from __future__ import annotations

import math
import time
from typing import Any

from smartsched.audit.usage import PodUsage
from smartsched.prometheus.source import PrometheusQueryError, PrometheusSource

CPU_Q = ('sum by (namespace, pod, node) (rate(container_cpu_usage_seconds_total'
         '{{container!="", pod!=""}}[{window}])) * 1000')
MEM_Q = ('sum by (namespace, pod, node) (container_memory_working_set_bytes'
         '{container!="", pod!=""}) / 1048576')
GPU_Q = 'sum by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{pod!=""}) * 10'


class PrometheusPodUsage:
    name = "prometheus"

    def __init__(self, url: str, rate_window: str = "1m", gpu: bool = True,
                 source: PrometheusSource | None = None) -> None:
        self.src = source or PrometheusSource(url, [])
        self.rate_window = rate_window
        self.gpu = gpu

    def sample(self) -> list[PodUsage]:
        now = time.time()
        per: dict[tuple[str, str], dict[str, Any]] = {}

        def into(expr: str, field: str) -> None:
            for s in self.src.instant(expr):
                ns, pod = s.labels.get("namespace", "default"), s.labels.get("pod")
                if not pod:
                    continue
                if not (math.isfinite(s.value) and s.value >= 0):
                    raise PrometheusQueryError(expr, "bad_data", f"pod {ns}/{pod}: {field} "
                                               f"{s.value:g} is no usage value", 1)
                row = per.setdefault((ns, pod), {"node": "", "cpu_milli": 0.0,
                                                 "memory_mib": 0.0, "gpu_milli": 0.0})
                row[field] = s.value
                row["node"] = s.labels.get("node") or row["node"]

        into(CPU_Q.format(window=self.rate_window), "cpu_milli")
        into(MEM_Q, "memory_mib")
        if self.gpu:
            into(GPU_Q, "gpu_milli")
        return [PodUsage(f"{ns}/{pod}", ns, r["node"], r["cpu_milli"], r["memory_mib"],
                         r["gpu_milli"], now) for (ns, pod), r in sorted(per.items())]
