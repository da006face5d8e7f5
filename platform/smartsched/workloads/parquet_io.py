"""Pods to and from Parquet (pyarrow); clusters are ``model.cluster_io``'s (re-exported).

Owns the on-disk pod schema: one row per pod (tuples as list columns, the usage
profile flattened into ``usage_*`` columns). Reading validates through
the same constructors as every other source, naming the row on failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from smartsched.model.cluster import check_taint
from smartsched.model.cluster_io import read_cluster, write_cluster
from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod, UsageProfile
from smartsched.model.table import check_column_names, parquet_names

__all__ = ["read_cluster", "read_pods", "write_cluster", "write_pods"]

_USAGE_FIELDS = ("kind", "mean", "amplitude", "peak_hour", "burst_factor", "burst_probability")
_POD_SCALARS = (
    "id", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "num_fpga", "tenant", "priority",
    "origin_site", "latency_slo_ms", "arrival", "duration", "deadline", "gang_id", "gang_size",
    "app", "traffic_mbps", "best_effort", "preemption_policy", "checkpoint_interval_s",
    "image",
)
_POD_LISTS = ("gpu_models", "tolerations", "allowed_regions")
# Pod's integer fields: a file may hold them as float64 (pandas' type for an integer
# column with a null in it) or decimal, which the constructor refuses as no integers.
_POD_INTS = ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "num_fpga", "priority",
             "gang_size")
_POD_COLUMNS = (*_POD_SCALARS, "pod_class", *_POD_LISTS, "node_selector", "image_layers",
                *(f"usage_{f}" for f in _USAGE_FIELDS))


def _layer(text: str) -> tuple[str, int]:
    digest, sep, mib = str(text).rpartition("@")
    if not sep or not mib.isdigit():
        raise ValidationError("image_layers", f"expected digest@MiB, got {text!r}")
    return digest, int(mib)


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = str(text).partition("=")
    if not sep or not key:
        raise ValidationError("node_selector", f"expected key=value, got {text!r}")
    return key, value


def _number(key: str, value: Any) -> Any:
    """A cell as the constructor takes it: a decimal as a float, and a whole float or
    decimal in an integer field as an int. Anything else (1000.5, NaN, text) is left for
    the constructor to refuse, naming the field."""
    if isinstance(value, Decimal):
        value = float(value)
    if key in _POD_INTS and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _blank(value: Any) -> bool:
    """A null cell, or one of spaces only (an id that a report would show as nothing)."""
    return value is None or (isinstance(value, str) and not value.strip())


def write_pods(pods: Sequence[Pod], path: str | Path) -> None:
    """Write pods to a Parquet file."""
    cols: dict[str, list[Any]] = {k: [getattr(p, k) for p in pods] for k in _POD_SCALARS}
    cols["pod_class"] = [p.pod_class.value for p in pods]
    for k in _POD_LISTS:
        cols[k] = [list(getattr(p, k)) for p in pods]
    cols["node_selector"] = [[f"{a}={b}" for a, b in p.node_selector] for p in pods]
    cols["image_layers"] = [[f"{d}@{mib}" for d, mib in p.image_layers] for p in pods]
    for f in _USAGE_FIELDS:
        cols[f"usage_{f}"] = [
            getattr(p.usage, f).value if f == "kind" else getattr(p.usage, f) for p in pods
        ]
    pq.write_table(pa.table(cols), path)


def read_pods(path: str | Path) -> list[Pod]:
    """Read pods written by :func:`write_pods`, validating every row."""
    src = str(path)
    try:
        names = parquet_names(path)
        check_column_names(names, src)
        rows = pq.read_table(path).rename_columns(names).to_pylist()
    except (OSError, pa.ArrowInvalid) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValidationError("file", f"cannot read Parquet: {first}", source=src) from None
    for name in names:  # a renamed column (arrival_s) was dropped: every pod arrived at 0
        if name not in _POD_COLUMNS and not name.startswith("__index_level_"):  # (pandas')
            raise ValidationError(name, "unknown column (a pod file has: "
                                  f"{', '.join(_POD_COLUMNS)})", source=src)
    pods = []
    required = _POD_SCALARS[:3]
    for i, r in enumerate(rows):
        missing = [k for k in required if k not in r]
        if missing:
            raise ValidationError(missing[0], "missing column", source=src)
        # An empty arrival is no "arrives at 0" (a column left out is): a null from a
        # failed conversion would otherwise move the pod to the start without a word.
        empty = [k for k in (*required, "arrival") if k in r and _blank(r[k])]
        if empty:
            raise ValidationError(empty[0], "empty cell", row=i, source=src)
        try:
            kw = {k: _number(k, r[k]) for k in _POD_SCALARS if k in r and r[k] is not None}
            for k in (*_POD_LISTS, "node_selector", "image_layers"):
                v = r.get(k)
                if v is not None and not isinstance(v, list):  # tuple("ab") is 2 names
                    raise ValidationError(k, f"must be a list column, got {v!r}")
                kw[k] = tuple(v or ())
            for t in kw["tolerations"]:  # one the twin cannot match tolerated nothing
                if t != "*":
                    check_taint("tolerations", t)
            kw["node_selector"] = tuple(_pair(s) for s in kw["node_selector"])
            kw["image_layers"] = tuple(_layer(s) for s in kw["image_layers"])
            if "pod_class" in r:
                kw["pod_class"] = r["pod_class"]
            usage = {f: _number(f, r[f"usage_{f}"]) for f in _USAGE_FIELDS
                     if r.get(f"usage_{f}") is not None}
            kw["usage"] = UsageProfile(**usage)
            pods.append(Pod(**kw))
        except ValidationError as e:
            raise ValidationError(e.field, e.message, row=i, source=src) from None
        except TypeError as e:
            raise ValidationError("row", str(e), row=i, source=src) from None
    return pods
