"""Priority classes: who may preempt whom (Kubernetes PriorityClass, as data).

Owns the named priority values a workload gives its pods and their preemption
policy. The default table orders the workload classes as production clusters
do: latency-sensitive services (and edge real-time pods) above inference
above training above batch above best-effort. A workload may override the
table (``priority_classes:`` in a workload profile); a pod names its class,
and the class gives the pod's ``priority`` and ``preemption_policy``.

  PreemptLowerPriority  the pod may evict pods of strictly lower priority
  Never                 the pod waits; it never evicts anyone (it can still be evicted)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from smartsched.model.errors import ValidationError

PREEMPT_LOWER: Final = "PreemptLowerPriority"
NEVER: Final = "Never"
PREEMPTION_POLICIES: Final = (PREEMPT_LOWER, NEVER)


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int
    preemption_policy: str = PREEMPT_LOWER
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValidationError("priority_class.name", "must be a non-empty string")
        if isinstance(self.value, bool) or not isinstance(self.value, int) or not (
                -(2**31) <= self.value <= 2**31):
            raise ValidationError(f"priority_classes.{self.name}.value",
                                  f"must be an integer within 32 bits, got {self.value!r}")
        if self.preemption_policy not in PREEMPTION_POLICIES:
            raise ValidationError(f"priority_classes.{self.name}.preemption_policy",
                                  f"must be one of {PREEMPTION_POLICIES}, got "
                                  f"{self.preemption_policy!r}")


DEFAULT_PRIORITY_CLASSES: Final[Mapping[str, PriorityClass]] = {
    c.name: c for c in (
        PriorityClass("online", 1000, description="latency-sensitive services"),
        PriorityClass("edge-rt", 1000, description="real-time pods from an MEC site"),
        PriorityClass("ai-infer", 800, description="model serving"),
        PriorityClass("ai-train", 500, description="training jobs (resume from checkpoints)"),
        PriorityClass("batch", 100, description="batch jobs with deadlines"),
        PriorityClass("best-effort", 0, NEVER, "runs on slack; first to go"),
    )
}


def priority_classes(doc: Mapping[str, Any] | None = None,
                     where: str = "priority_classes") -> dict[str, PriorityClass]:
    """The default table, with ``doc``'s entries (``name: {value, preemption_policy}``)
    added or replacing defaults; errors name ``where.<name>.<field>``."""
    out = dict(DEFAULT_PRIORITY_CLASSES)
    if doc is None:
        return out
    if not isinstance(doc, Mapping):
        raise ValidationError(where, "must map class names to {value, preemption_policy}")
    for name, spec in doc.items():
        if not isinstance(spec, Mapping):
            raise ValidationError(f"{where}.{name}", "must be a mapping with a value")
        unknown = set(spec) - {"value", "preemption_policy", "description"}
        if unknown:
            raise ValidationError(f"{where}.{name}.{sorted(unknown)[0]}", "unknown field")
        if "value" not in spec:
            raise ValidationError(f"{where}.{name}.value", "required")
        try:
            out[str(name)] = PriorityClass(str(name), spec["value"],
                                           spec.get("preemption_policy", PREEMPT_LOWER),
                                           str(spec.get("description", "")))
        except ValidationError as e:
            raise ValidationError(e.field.replace("priority_classes", where, 1),
                                  e.message) from None
    return out


def resolve(table: Mapping[str, PriorityClass], name: str, where: str) -> PriorityClass:
    """The class called ``name``; an unknown name is a ValidationError naming ``where``."""
    try:
        return table[name]
    except KeyError:
        raise ValidationError(where, f"unknown priority class {name!r} (known: "
                              f"{', '.join(sorted(table))})") from None
