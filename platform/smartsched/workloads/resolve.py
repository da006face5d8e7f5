"""Resolve a ``--workload`` argument to a list of pods.

Owns the workload naming scheme: ``openb:<variant>`` (the Alibaba trace under
the data dir), ``mixed`` or ``mixed:<profile.yaml>`` (the synthetic
generator), ``finance`` or ``finance:<profile.yaml>`` (the finance case), a
path to an openb-format CSV or a SmartSched Parquet file, or
``resample:<any of these>[?block_s=S]`` (a block-bootstrap episode of it, drawn
by the run's seed: ``workloads.resample``).
"""

from __future__ import annotations

from pathlib import Path

from smartsched.model.cluster import ClusterSpec
from smartsched.model.errors import UnknownReferenceError, ValidationError
from smartsched.model.pod import Pod


def load_workload(spec: str, cluster: ClusterSpec, hours: float, seed: int) -> list[Pod]:
    """Pods for ``spec`` (see module docstring); ``hours``/``seed`` drive generators."""
    head, sep, tail = spec.partition(":")
    if sep and head in ("openb", "mixed", "finance") and not tail.strip():
        # ("mixed:" read the working directory as the profile: "cannot read .")
        what = ("a trace variant, e.g. openb:default" if head == "openb"
                else f"a profile file, e.g. {head}:profile.yaml (or {head} alone)")
        raise ValidationError("workload", f"{spec[:200]!r} names nothing after the colon: give "
                              f"{what}")
    if spec.startswith("resample:"):
        from smartsched.workloads.resample import parse_resample_spec, resample_blocks

        inner, block_s = parse_resample_spec(spec.split(":", 1)[1])
        # The recorded episode itself is the same whatever the seed; the seed draws the
        # resampled one.
        return resample_blocks(load_workload(inner, cluster, hours, seed), seed, block_s)
    if spec.startswith("openb:"):
        from smartsched.workloads.openb import load_openb_pods, openb_pod_path

        path = openb_pod_path(spec.split(":", 1)[1])
        if not path.is_file():
            raise UnknownReferenceError("workload", f"no openb variant file {path}")
        return _checked(load_openb_pods(path), path)
    if spec == "mixed" or spec.startswith("mixed:"):
        from smartsched.workloads.mixed import generate_mixed, load_profile

        profile = load_profile(spec.split(":", 1)[1]) if ":" in spec else None
        return generate_mixed(cluster, hours=hours, seed=seed, profile=profile)
    if spec == "finance" or spec.startswith("finance:"):
        from smartsched.workloads.finance import generate_finance
        from smartsched.workloads.finance import load_profile as load_finance

        fin = load_finance(spec.split(":", 1)[1]) if ":" in spec else None
        return generate_finance(cluster, hours=hours, seed=seed, profile=fin)
    path = Path(spec)
    if path.suffix == ".csv" and path.is_file():
        from smartsched.workloads.openb import load_openb_pods

        return _checked(load_openb_pods(path), path)
    if path.suffix == ".parquet" and path.is_file():
        from smartsched.workloads.parquet_io import read_pods

        if _is_openb_table(path):
            from smartsched.workloads.openb import load_openb_pods

            return _checked(load_openb_pods(path), path)
        return _checked(read_pods(path), path)
    raise ValidationError(
        "workload",
        f"{spec[:200]!r} is not openb:<variant>, mixed[:profile.yaml], finance[:profile.yaml], "
        "resample:<workload>, or an existing .csv/.parquet file",
    )


def _is_openb_table(path: Path) -> bool:
    """A Parquet pod list in the openb trace's columns (``name``, ...) rather than the
    project's own pod schema (``id``, ...): each is read by its own loader."""
    import pyarrow as pa

    from smartsched.model.table import parquet_names

    try:
        names = set(parquet_names(path))
    except (OSError, pa.ArrowInvalid):
        return False  # read_pods names the unreadable file
    return "id" not in names and "name" in names


def _checked(pods: list[Pod], path: Path) -> list[Pod]:
    """A trace's pods, refused when it holds none (a header only) or names a pod twice
    (the service, the reports and gang grouping key pods by name)."""
    if not pods:
        raise ValidationError("workload", f"{path} holds no pods (a header only?)")
    seen: dict[str, int] = {}
    for row, p in enumerate(pods):
        first = seen.setdefault(p.id, row)
        if first != row:
            raise ValidationError("name", f"pod {p.id!r} appears twice (rows {first} and {row})",
                                  row=row, source=str(path))
    return pods
