"""Pods and clusters to and from Parquet (pyarrow).

Owns the on-disk schema: one row per pod (tuples as list columns, the usage
profile flattened into ``usage_*`` columns) and one row per node, with sites
and zones as JSON in the file's schema metadata. Reading validates through
the same constructors as every other source, naming the row on failure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from smartsched.model.carbon import CarbonSeries
from smartsched.model.cluster import ClusterSpec, NodeSpec, Site, Zone
from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod, UsageProfile

_USAGE_FIELDS = ("kind", "mean", "amplitude", "peak_hour", "burst_factor", "burst_probability")
_POD_SCALARS = (
    "id", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "num_fpga", "tenant", "priority",
    "origin_site", "latency_slo_ms", "arrival", "duration", "deadline", "gang_id", "gang_size",
    "app", "traffic_mbps", "best_effort",
)
_POD_LISTS = ("gpu_models", "tolerations", "allowed_regions")


def write_pods(pods: Sequence[Pod], path: str | Path) -> None:
    """Write pods to a Parquet file."""
    cols: dict[str, list[Any]] = {k: [getattr(p, k) for p in pods] for k in _POD_SCALARS}
    cols["pod_class"] = [p.pod_class.value for p in pods]
    for k in _POD_LISTS:
        cols[k] = [list(getattr(p, k)) for p in pods]
    cols["node_selector"] = [[f"{a}={b}" for a, b in p.node_selector] for p in pods]
    for f in _USAGE_FIELDS:
        cols[f"usage_{f}"] = [
            getattr(p.usage, f).value if f == "kind" else getattr(p.usage, f) for p in pods
        ]
    pq.write_table(pa.table(cols), path)


def read_pods(path: str | Path) -> list[Pod]:
    """Read pods written by :func:`write_pods`, validating every row."""
    src = str(path)
    try:
        rows = pq.read_table(path).to_pylist()
    except (OSError, pa.ArrowInvalid) as e:
        raise ValidationError("file", f"cannot read Parquet: {e}", source=src) from None
    pods = []
    required = {*_POD_SCALARS[:3]}
    for i, r in enumerate(rows):
        missing = required - r.keys()
        if missing:
            raise ValidationError(sorted(missing)[0], "missing column", source=src)
        try:
            kw = {k: r[k] for k in _POD_SCALARS if k in r and r[k] is not None}
            for k in _POD_LISTS:
                kw[k] = tuple(r.get(k) or ())
            kw["node_selector"] = tuple(
                tuple(s.split("=", 1)) for s in (r.get("node_selector") or ())
            )
            if "pod_class" in r:
                kw["pod_class"] = r["pod_class"]
            usage = {f: r[f"usage_{f}"] for f in _USAGE_FIELDS if r.get(f"usage_{f}") is not None}
            kw["usage"] = UsageProfile(**usage)
            pods.append(Pod(**kw))
        except ValidationError as e:
            raise ValidationError(e.field, e.message, row=i, source=src) from None
        except TypeError as e:
            raise ValidationError("row", str(e), row=i, source=src) from None
    return pods


def write_cluster(spec: ClusterSpec, path: str | Path) -> None:
    """Write a cluster: nodes as rows, sites and zones as JSON metadata."""
    nodes = spec.nodes
    table = pa.table({
        "name": [n.name for n in nodes],
        "zone": [n.zone for n in nodes],
        "rack": [n.rack for n in nodes],
        "cpu_milli": [n.cpu_milli for n in nodes],
        "memory_mib": [n.memory_mib for n in nodes],
        "num_gpu": [n.num_gpu for n in nodes],
        "gpu_model": [n.gpu_model for n in nodes],
        "num_fpga": [n.num_fpga for n in nodes],
        "fpga_model": [n.fpga_model for n in nodes],
        "sockets": [n.sockets for n in nodes],
        "labels": [json.dumps(dict(n.labels)) for n in nodes],
        "taints": [list(n.taints) for n in nodes],
        "unschedulable": [n.unschedulable for n in nodes],
    })
    meta = {
        "name": spec.name,
        "sites": [
            {
                "name": s.name, "kind": s.kind, "coords_km": list(s.coords_km),
                "access_latency_ms": s.access_latency_ms, "pue": s.pue,
                "price_core_hour": s.price_core_hour, "price_gpu_hour": s.price_gpu_hour,
                "carbon": {"values": s.carbon.values.tolist(), "step_s": s.carbon.step_s,
                           "name": s.carbon.name},
            }
            for s in spec.sites
        ],
        "zones": [{"name": z.name, "site": z.site} for z in spec.zones],
    }
    table = table.replace_schema_metadata({"smartsched.cluster": json.dumps(meta)})
    pq.write_table(table, path)


def read_cluster(path: str | Path) -> ClusterSpec:
    """Read a cluster written by :func:`write_cluster`."""
    src = str(path)
    table = pq.read_table(path)
    raw = (table.schema.metadata or {}).get(b"smartsched.cluster")
    if raw is None:
        raise ValidationError("metadata", "not a SmartSched cluster file", source=src)
    meta = json.loads(raw)
    sites = []
    for s in meta["sites"]:
        c = s.pop("carbon")
        sites.append(Site(**{**s, "coords_km": tuple(s["coords_km"])},
                          carbon=CarbonSeries(np.asarray(c["values"]), c["step_s"], c["name"])))
    zones = [Zone(**z) for z in meta["zones"]]
    nodes = []
    for i, r in enumerate(table.to_pylist()):
        try:
            r["labels"] = json.loads(r["labels"])
            r["taints"] = tuple(r["taints"] or ())
            nodes.append(NodeSpec(**r))
        except ValidationError as e:
            raise ValidationError(e.field, e.message, row=i, source=src) from None
    return ClusterSpec(meta["name"], tuple(sites), tuple(zones), tuple(nodes))
