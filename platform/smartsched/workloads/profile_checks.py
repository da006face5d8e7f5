"""Checks of a ``mixed`` workload profile's numbers, before anything is generated.

Owns what a profile's fields may hold. The generator turns them into arrival rates
(``load x capacity / (mean size x mean duration)``) and draws from them, so a negative
load, an empty size list or a share of 2 would otherwise come out as no pods, a
"math domain error", or a workload quietly unlike the one asked for. Every field a
section may carry is checked where present (profiles extend each other, so absent is
fine); an error names the field as ``workload.<section>.<field>``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from smartsched.model.errors import ValidationError
from smartsched.model.resources import MAX_NODE_CPU_MILLI, MAX_NODE_MEMORY_MIB, MILLI_PER_DEVICE

SECTIONS = ("online", "ai-train", "ai-infer", "batch", "edge-rt")
MAX_HOURS = 24.0 * 3660  # ten years: far beyond any horizon the twin runs


def _number(v: Any, field: str) -> float:
    if isinstance(v, str):
        hint = ""
        try:
            float(v)
            hint = " (YAML 1.1 reads 1e30 as text: write 1.0e+30)"
        except ValueError:
            pass
        raise ValidationError(field, f"must be a number, got the text {v!r}{hint}")
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValidationError(field, f"must be a finite number, got {v!r}")
    return float(v)


def _within(lo: float, hi: float, *, open_lo: bool = False) -> Callable[[Any, str], None]:
    def check(v: Any, field: str) -> None:
        x = _number(v, field)
        if not ((lo < x if open_lo else lo <= x) and x <= hi):
            span = f"({lo:g}, {hi:g}]" if open_lo else f"[{lo:g}, {hi:g}]"
            raise ValidationError(field, f"must be within {span}, got {v!r}")
    return check


def _sizes(hi: float) -> Callable[[Any, str], None]:
    def check(v: Any, field: str) -> None:
        if not isinstance(v, list) or not v:
            raise ValidationError(field, f"must be a non-empty list of sizes, got {v!r}")
        for i, x in enumerate(v):
            _within(0, hi, open_lo=True)(x, f"{field}.{i}")
    return check


def _gpus(v: Any, field: str) -> None:
    """{GPUs per job: weight}: some weight positive, every count a whole number >= 1."""
    if not isinstance(v, Mapping) or not v:
        raise ValidationError(field, f"must map GPUs per job to weights, got {v!r}")
    total = 0.0
    for k, w in v.items():
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 4096:
            raise ValidationError(f"{field}.{k}", "GPUs per job must be a whole number "
                                  "in 1..4096")
        total += _number(w, f"{field}.{k}")
        if w < 0:
            raise ValidationError(f"{field}.{k}", f"weight must be >= 0, got {w!r}")
    if total <= 0:
        raise ValidationError(field, "no positive weight: no job size could be drawn")
    if not math.isfinite(total):  # weights are relative: their sum divides each
        raise ValidationError(field, "the weights sum past the largest number")


def _window(v: Any, field: str) -> None:
    if not isinstance(v, list) or len(v) != 2:
        raise ValidationError(field, f"must be [start hour, end hour], got {v!r}")
    for i, x in enumerate(v):
        _within(0, 24)(x, f"{field}.{i}")


def _whole(lo: int, hi: int) -> Callable[[Any, str], None]:
    def check(v: Any, field: str) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValidationError(field, f"must be a whole number in {lo}..{hi}, got {v!r}")
    return check


_POSITIVE = _within(0, 1e12, open_lo=True)
_SHARE = _within(0, 1)
_HOURS = _within(0, MAX_HOURS, open_lo=True)
FIELDS: dict[str, Callable[[Any, str], None]] = {
    "load": _within(0, 100),
    "duration_hours_mean": _HOURS,
    "cpu_milli": _sizes(MAX_NODE_CPU_MILLI),
    "memory_mib": _sizes(MAX_NODE_MEMORY_MIB),
    "gpu_milli": _sizes(MILLI_PER_DEVICE),
    "memory_mib_per_core": _within(0, MAX_NODE_MEMORY_MIB, open_lo=True),
    "cpu_milli_per_gpu": _within(0, MAX_NODE_CPU_MILLI, open_lo=True),
    "memory_mib_per_gpu": _within(0, MAX_NODE_MEMORY_MIB, open_lo=True),
    "gpus": _gpus,
    "apps": _whole(1, 100_000),
    "traffic_mbps": _within(0, 1e6),
    "latency_slo_ms": _POSITIVE,
    "deadline_hours": _HOURS,
    "window_hours": _window,
    "checkpoint_minutes": _POSITIVE,
    "best_effort_share": _SHARE,
    "model_constraint_share": _SHARE,
    "daytime_share": _SHARE,
}
FLASH_SALE: dict[str, Callable[[Any, str], None]] = {
    "hour": _within(0, 24), "minutes": _within(0, 24 * 60, open_lo=True),
    "multiplier": _within(1, 1e4), "duration_hours_mean": _HOURS,
}
DAY: dict[str, Callable[[Any, str], None]] = {
    "peak_hour": _within(0, 24), "trough_hour": _within(0, 24), "night_floor": _SHARE,
}


# What a section carries besides its numbers: sub-mappings and names checked elsewhere.
SECTION_OTHER = ("flash_sale", "priority_class", "best_effort_priority_class")


def _fields(doc: Mapping[str, Any], checks: Mapping[str, Callable[[Any, str], None]],
            prefix: str, other: tuple[str, ...] = ()) -> None:
    """Check each known field present; refuse a key that is neither checked nor in
    ``other`` (a typo such as ``laod`` would leave the default in place unseen)."""
    for key in doc:
        if key not in checks and key not in other:
            known = ", ".join(sorted([*checks, *other]))
            raise ValidationError(f"{prefix}.{str(key)[:64]}", f"unknown field (known: {known})")
    for key, check in checks.items():
        if key in doc:
            check(doc[key], f"{prefix}.{key}")


# Every top-level key a mixed profile may have (``extends`` is resolved before checks).
TOP_LEVEL = (*SECTIONS, "name", "description", "day", "tenants", "images",
             "priority_classes")


def check_profile(profile: Mapping[str, Any]) -> None:
    """Raise ValidationError naming the first field of ``profile`` out of its range, or
    the first key it does not know (a typo would otherwise leave its section at the
    defaults, or the whole workload empty, without a word)."""
    for key in profile:
        if key not in TOP_LEVEL:
            raise ValidationError(f"workload.{str(key)[:64]}", "unknown section (known: "
                                  f"{', '.join(TOP_LEVEL)})")
    if not any(profile.get(name) is not None for name in SECTIONS):
        raise ValidationError("workload", "no section of pods (any of "
                              f"{', '.join(SECTIONS)}): the workload would be empty; "
                              "`extends: mixed` lays a profile over the packaged one")
    tenants = profile.get("tenants")
    if tenants is not None:  # a tenant True or {a: 1} was named "True" or "{'a': 1}"
        if not isinstance(tenants, Mapping):
            raise ValidationError("workload.tenants", "must map pod classes to tenant names")
        for cls, names in tenants.items():
            if cls not in SECTIONS:
                raise ValidationError(f"workload.tenants.{str(cls)[:64]}",
                                      f"not a pod class ({', '.join(SECTIONS)})")
            if names is not None and not (isinstance(names, list) and all(
                    isinstance(n, str) and n.strip() for n in names)):  # (None: the class)
                raise ValidationError(f"workload.tenants.{cls}",
                                      f"must be a list of tenant names, got {names!r}"[:200])
            if names == []:  # was replaced by the class's name without a word
                raise ValidationError(f"workload.tenants.{cls}", "names no tenant (leave "
                                      "the class out, or null, for the class's own name)")
    day = profile.get("day")
    if day is not None:
        if not isinstance(day, Mapping):
            raise ValidationError("workload.day", "must be a mapping")
        _fields(day, DAY, "workload.day")
    for name in SECTIONS:
        sec = profile.get(name)
        if sec is None:
            continue
        if not isinstance(sec, Mapping):
            raise ValidationError(f"workload.{name}", "must be a mapping")
        _fields(sec, FIELDS, f"workload.{name}", SECTION_OTHER)
        fs = sec.get("flash_sale")
        if fs is not None:
            if not isinstance(fs, Mapping):
                raise ValidationError(f"workload.{name}.flash_sale", "must be a mapping")
            _fields(fs, FLASH_SALE, f"workload.{name}.flash_sale")
    loads = [profile[name].get("load") for name in SECTIONS if profile.get(name) is not None]
    if loads and all(v == 0 for v in loads):  # (each checked a number above)
        raise ValidationError("workload", "every section's load is 0: the workload would be "
                              "empty (leave a section out to drop it)")
