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
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError,
            pa.ArrowException) as e:
        what = f"{type(e).__name__}: {e}"[:200]
        raise ValidationError("metadata", f"malformed cluster file ({what})",
                              source=src) from None


def _need(value: object, kind: type | tuple[type, ...], field: str, src: str) -> object:
    """``value`` if it has the JSON type the writer gives ``field``, else a
    ValidationError naming the field (an edited file's string where a list belongs
    would otherwise fail deep inside a constructor, named by nothing)."""
    if isinstance(value, bool) or not isinstance(value, kind):
        want = {dict: "an object", list: "a list", str: "a string"}.get(kind, "a number")
        raise ValidationError(field, f"expected {want}, got {type(value).__name__}",
                              source=src)
    return value


def _numbers(value: object, field: str, src: str) -> np.ndarray:
    arr = np.asarray(_need(value, list, field, src), dtype=object)
    ok = np.array([isinstance(v, int | float) and not isinstance(v, bool) for v in arr],
                  dtype=bool)
    if arr.ndim != 1 or not ok.all():
        raise ValidationError(field, "expected a list of numbers", source=src)
    return arr.astype(np.float64)


_SITE_SCALARS: dict[str, type | tuple[type, ...]] = {
    "name": str, "kind": str, "access_latency_ms": (int, float), "pue": (int, float),
    "price_core_hour": (int, float), "price_gpu_hour": (int, float)}


def _site_of(s: object, field: str, src: str) -> Site:
    s = dict(_need(s, dict, field, src))
    c = _need(s.pop("carbon", None), dict, f"{field}.carbon", src)
    renewable = c.get("renewable")
    carbon = CarbonSeries(
        _numbers(c.get("values"), f"{field}.carbon.values", src),
        float(_need(c.get("step_s"), (int, float), f"{field}.carbon.step_s", src)),
        _need(c.get("name"), str, f"{field}.carbon.name", src),
        float(_need(c.get("offset_s", 0.0), (int, float), f"{field}.carbon.offset_s", src)),
        None if renewable is None else _numbers(renewable, f"{field}.carbon.renewable", src),
        float(_need(c.get("fossil_g_per_kwh", GAS_G_PER_KWH), (int, float),
                    f"{field}.carbon.fossil_g_per_kwh", src)))
    for key, kind in _SITE_SCALARS.items():
        if key in s:
            _need(s[key], kind, f"{field}.{key}", src)
    coords = _numbers(s.get("coords_km"), f"{field}.coords_km", src)
    if coords.size != 2:
        raise ValidationError(f"{field}.coords_km", "expected two numbers", source=src)
    try:
        return Site(**{**s, "coords_km": tuple(coords.tolist())}, carbon=carbon)
    except TypeError as e:  # a key the writer never writes, or one it always does
        raise ValidationError(field, str(e).split(") ", 1)[-1][:200],
                              source=src) from None


def _cluster_of(table: pa.Table, meta: object, src: str) -> ClusterSpec:
    meta = _need(meta, dict, "metadata", src)
    sites = [_site_of(s, f"metadata.sites[{i}]", src)
             for i, s in enumerate(_need(meta.get("sites"), list, "metadata.sites", src))]
    zones = []
    for i, z in enumerate(_need(meta.get("zones"), list, "metadata.zones", src)):
        try:
            z = _need(z, dict, f"metadata.zones[{i}]", src)
            for key in ("name", "site"):
                _need(z.get(key), str, f"metadata.zones[{i}].{key}", src)
            zones.append(Zone(**z))
        except TypeError as e:
            raise ValidationError(f"metadata.zones[{i}]",
                                  str(e).split(") ", 1)[-1][:200],
                                  source=src) from None
    name = _need(meta.get("name"), str, "metadata.name", src)
    nodes = []
    for i, r in enumerate(table.to_pylist()):
        try:
            r["labels"] = json.loads(r["labels"])
        except (ValueError, TypeError, RecursionError) as e:  # not JSON, or too deep
            raise ValidationError("labels", f"not a JSON object ({type(e).__name__})",
                                  row=i, source=src) from None
        try:
            r["taints"] = tuple(r["taints"] or ())
            nodes.append(NodeSpec(**r))
        except ValidationError as e:
            raise ValidationError(e.field, e.message, row=i, source=src) from None
    return ClusterSpec(name, tuple(sites), tuple(zones), tuple(nodes))


def load_openb_nodes(path: str | Path, zone: str, rack_size: int = 32) -> list[NodeSpec]:
    """Read an openb node list into nodes in one zone, ``rack_size`` nodes per rack."""
    path = Path(path)
    src = str(path)
    df = read_frame(path)
    require_columns(df, NODE_COLUMNS, src)
    names = text_column(df, "sn", src)
    seen: dict[str, int] = {}
    for i, name in enumerate(map(str, names)):
        if name in seen:  # named with both rows here, not later by the cluster alone
            raise ValidationError("sn", f"duplicate node name {name!r} (also row "
                                  f"{seen[name]})", row=i, source=src)
        seen[name] = i
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
