"""Loader for the Alibaba GPU-cluster trace 2023 ("openb", FGD paper, USENIX ATC '23).

Owns the mapping from the trace's CSV columns to ``Pod`` and ``NodeSpec``.
Pod lists come in two forms: the 11-column files (with gpu_spec, qos and
times) and the 5-column ``multigpu*`` files (requests only). A file with more
than the 5 request columns must carry the full 11-column header, so a
truncated copy is rejected naming the missing column rather than silently
losing its times.

Class mapping (the trace has none): a GPU share (<1000 milli) is AI inference,
whole GPUs are AI training, CPU-only LS pods are online services and the rest
batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from smartsched.model.cluster_io import NODE_COLUMNS, load_openb_nodes
from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod, PodClass
from smartsched.model.resources import GPU_MODEL_IDS
from smartsched.model.table import numeric_column, read_frame, require_columns, text_column
from smartsched.paths import data_dir
from smartsched.workloads.profiles import default_usage

REQUEST_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
FULL_COLUMNS = (
    *REQUEST_COLUMNS,
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
TIMED_COLUMNS = (*REQUEST_COLUMNS, "gpu_spec", "qos", "creation_time", "deletion_time")
OPENB_DIR = "alibaba-openb-gpu-2023"
# The trace's QoS classes (its README): LS is latency-sensitive (online here), the rest
# batch; an empty cell is read as batch too.
QOS_VALUES = ("LS", "BE", "Burstable", "Guaranteed", "")

__all__ = ["NODE_COLUMNS", "load_openb_nodes", "load_openb_pods", "openb_pod_path"]


def openb_pod_path(variant: str, root: Path | None = None) -> Path:
    """Path of ``openb_pod_list_<variant>.csv`` under the data dir."""
    return (root or data_dir()) / OPENB_DIR / f"openb_pod_list_{variant}.csv"


def load_openb_pods(path: str | Path) -> list[Pod]:
    """Read an openb pod list (11- or 5-column form) into pods, validating every row.

    Arrival is ``creation_time``; duration is ``deletion_time - creation_time``.
    5-column files have no times: every pod arrives at 0 and never leaves
    (they are meant for ``fill`` mode).
    """
    path = Path(path)
    src = str(path)
    df = read_frame(path)
    require_columns(df, REQUEST_COLUMNS, src)
    # The timed form is told by its columns, not by their number: a 5-column list with a
    # column of one's own (a note) was asked for gpu_spec. Of the timed form's columns,
    # those read are required (pod_phase and scheduled_time are not read).
    has_times = any(c in df.columns for c in FULL_COLUMNS[len(REQUEST_COLUMNS):])
    if has_times:
        require_columns(df, TIMED_COLUMNS, src)
    n = len(df)
    names = text_column(df, "name", src)
    empty = names == ""
    if empty.any():
        raise ValidationError("name", "empty", row=int(np.flatnonzero(empty)[0]), source=src)
    cpu = numeric_column(df, "cpu_milli", src, integral=True).astype(np.int64)
    mem = numeric_column(df, "memory_mib", src, integral=True).astype(np.int64)
    ngpu = numeric_column(df, "num_gpu", src, integral=True).astype(np.int64)
    gmilli = numeric_column(df, "gpu_milli", src, integral=True).astype(np.int64)
    if has_times:
        created = numeric_column(df, "creation_time", src)
        deleted = numeric_column(df, "deletion_time", src, allow_empty=True)
        specs = text_column(df, "gpu_spec", src)
        qos = text_column(df, "qos", src)
        unknown = ~np.isin(qos, QOS_VALUES)
        if unknown.any():
            row = int(np.flatnonzero(unknown)[0])
            known = ", ".join(v for v in QOS_VALUES if v)
            raise ValidationError(
                "qos", f"unknown QoS class {qos[row]!r} (known: {known}, or empty)",
                row=row, source=src,
            )
        neg = np.isfinite(deleted) & (deleted < created)
        if neg.any():
            row = int(np.flatnonzero(neg)[0])
            raise ValidationError("deletion_time", "before creation_time", row=row, source=src)
    else:
        created = np.zeros(n)
        deleted = np.full(n, np.nan)
        specs = np.full(n, "", dtype=object)
        qos = np.full(n, "", dtype=object)

    pods: list[Pod] = []
    for i in range(n):
        # "V100M16 | T4": the cell is stripped, each model in it too
        models = tuple(s.strip() for s in str(specs[i]).split("|") if s.strip())
        for m in models:
            if m not in GPU_MODEL_IDS:
                raise ValidationError("gpu_spec", f"unknown GPU model {m!r}", row=i, source=src)
        g, gm = int(ngpu[i]), int(gmilli[i])
        if g == 0:
            gm = 0  # some traces put a nonzero share on CPU-only pods
        cls = _class_of(g, gm, str(qos[i]))
        dur = float(deleted[i] - created[i]) if np.isfinite(deleted[i]) else None
        try:
            pods.append(
                Pod(
                    id=str(names[i]),
                    cpu_milli=int(cpu[i]),
                    memory_mib=int(mem[i]),
                    num_gpu=g,
                    gpu_milli=gm,
                    pod_class=cls,
                    gpu_models=models,
                    arrival=float(created[i]),
                    duration=dur,
                    priority=1 if cls is PodClass.ONLINE else 0,
                    usage=default_usage(cls),
                )
            )
        except ValidationError as e:
            raise ValidationError(e.field, e.message, row=i, source=src) from None
    return pods


def _class_of(num_gpu: int, gpu_milli: int, qos: str) -> PodClass:
    if num_gpu > 0:
        return PodClass.AI_INFER if gpu_milli < 1000 else PodClass.AI_TRAIN
    return PodClass.ONLINE if qos == "LS" else PodClass.BATCH
