"""Clusters from files: the Parquet cluster schema and the openb trace's node list.

Owns reading and writing a ``ClusterSpec``: one Parquet row per node, with
sites and zones as JSON in the file's schema metadata, and the Alibaba GPU
trace's node CSV (``sn, cpu_milli, memory_mib, gpu, model``). Reading
validates through ``NodeSpec``'s constructor, naming the row on failure.
Lives in model (not workloads) so cluster presets never import upward.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from smartsched.model.carbon import GAS_G_PER_KWH, CarbonSeries
from smartsched.model.cluster import ClusterSpec, NodeSpec, Site, Zone
from smartsched.model.errors import ValidationError
from smartsched.model.table import numeric_column, read_frame, require_columns, text_column

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")


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
        "image_disk_mib": [n.image_disk_mib for n in nodes],
        "pull_mbps": [float(n.pull_mbps) for n in nodes],
        "max_pods": [n.max_pods for n in nodes],
    })
    meta = {
        "name": spec.name,
        "sites": [
            {
                "name": s.name, "kind": s.kind, "coords_km": list(s.coords_km),
                "access_latency_ms": s.access_latency_ms, "pue": s.pue,
                "price_core_hour": s.price_core_hour, "price_gpu_hour": s.price_gpu_hour,
                "carbon": {"values": s.carbon.values.tolist(), "step_s": s.carbon.step_s,
                           "name": s.carbon.name, "offset_s": s.carbon.offset_s,
                           "renewable": (None if s.carbon.renewable is None
                                         else s.carbon.renewable.tolist()),
                           "fossil_g_per_kwh": s.carbon.fossil_g_per_kwh},
            }
            for s in spec.sites
        ],
        "zones": [{"name": z.name, "site": z.site} for z in spec.zones],
    }
    table = table.replace_schema_metadata({"smartsched.cluster": json.dumps(meta)})
    pq.write_table(table, path)


def read_cluster(path: str | Path) -> ClusterSpec:
    """Read a cluster written by :func:`write_cluster`; a file that is not one (not
    Parquet, truncated, another schema, edited metadata) is a ValidationError naming
    what is wrong, never a reader's traceback."""
    src = str(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as e:
        raise ValidationError("file", f"cannot read Parquet: {e}", source=src) from None
    raw = (table.schema.metadata or {}).get(b"smartsched.cluster")
    if raw is None:
        raise ValidationError("metadata", "not a SmartSched cluster file", source=src)
    try:
        return _cluster_of(table, json.loads(raw), src)
    except ValidationError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, pa.ArrowException) as e:
        what = f"{type(e).__name__}: {e}"[:200]
        raise ValidationError("metadata", f"malformed cluster file ({what})",
                              source=src) from None


def _cluster_of(table: pa.Table, meta: dict, src: str) -> ClusterSpec:
    sites = []
    for s in meta["sites"]:
        c = s.pop("carbon")
        sites.append(Site(**{**s, "coords_km": tuple(s["coords_km"])},
                          carbon=CarbonSeries(
                              np.asarray(c["values"]), c["step_s"], c["name"],
                              float(c.get("offset_s", 0.0)),
                              None if c.get("renewable") is None else np.asarray(c["renewable"]),
                              float(c.get("fossil_g_per_kwh", GAS_G_PER_KWH)))))
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


def load_openb_nodes(path: str | Path, zone: str, rack_size: int = 32) -> list[NodeSpec]:
    """Read an openb node list into nodes in one zone, ``rack_size`` nodes per rack."""
    path = Path(path)
    src = str(path)
    df = read_frame(path)
    require_columns(df, NODE_COLUMNS, src)
    names = text_column(df, "sn", src)
    cpu = numeric_column(df, "cpu_milli", src, integral=True).astype(np.int64)
    mem = numeric_column(df, "memory_mib", src, integral=True).astype(np.int64)
    gpu = numeric_column(df, "gpu", src, integral=True).astype(np.int64)
    model = text_column(df, "model", src)
    nodes = []
    for i in range(len(df)):
        try:
            nodes.append(
                NodeSpec(
                    name=str(names[i]),
                    cpu_milli=int(cpu[i]),
                    memory_mib=int(mem[i]),
                    num_gpu=int(gpu[i]),
                    gpu_model=str(model[i]) if gpu[i] > 0 else "",
                    zone=zone,
                    rack=f"{zone}-r{i // rack_size}",
                )
            )
        except ValidationError as e:
            raise ValidationError(e.field, e.message, row=i, source=src) from None
    return nodes
