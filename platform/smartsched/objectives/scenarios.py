"""Scenario profiles: named reward-weight vectors, from YAML.

Owns loading and validating scenario profiles (the packaged
``objectives/profiles/scenarios.yaml`` or a user file with the same schema:
``name: {description, weights: {component: weight}}``). A profile with an
unknown component, a negative or non-numeric weight, or all weights zero is
refused with an error naming the profile and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from smartsched.model.configfile import read_resource, read_yaml
from smartsched.model.errors import UnknownReferenceError, ValidationError
from smartsched.objectives.reward import COMPONENTS, RewardWeights


def _parse(doc: Any, source: str) -> dict[str, RewardWeights]:
    if not isinstance(doc, dict) or not doc:
        raise ValidationError(source, "scenario profiles must be a non-empty mapping")
    out: dict[str, RewardWeights] = {}
    for name, body in doc.items():
        where = f"scenarios.{name}"
        if not isinstance(body, dict) or not isinstance(body.get("weights"), dict):
            raise ValidationError(f"{where}.weights", "required mapping of component -> weight")
        unknown = set(body) - {"description", "weights"}
        if unknown:
            raise ValidationError(f"{where}.{sorted(unknown)[0]}", "unknown field")
        weights = body["weights"]
        for comp, w in weights.items():
            if comp not in COMPONENTS:
                raise ValidationError(f"{where}.weights.{comp}",
                                      f"unknown component (known: {', '.join(COMPONENTS)})")
            if isinstance(w, bool) or not isinstance(w, int | float) or w < 0:
                raise ValidationError(f"{where}.weights.{comp}",
                                      f"must be a number >= 0, got {w!r}")
        if not any(float(w) > 0 for w in weights.values()):
            raise ValidationError(f"{where}.weights", "all weights are zero: nothing to optimize")
        try:
            out[str(name)] = RewardWeights.from_mapping(
                {c: float(weights.get(c, 0.0)) for c in COMPONENTS})
        except ValidationError as e:
            raise ValidationError(f"{where}.{e.field}", e.message) from None
    return out


def load_scenarios(path: str | Path | None = None) -> dict[str, RewardWeights]:
    """All scenario profiles from ``path`` or the packaged file."""
    if path is None:
        doc = read_resource("smartsched.objectives", "profiles/scenarios.yaml", "scenarios")
        source = "scenarios.yaml"
    else:
        doc, source = read_yaml(path, "scenarios"), str(path)
    return _parse(doc, source)


def scenario(name: str, path: str | Path | None = None) -> RewardWeights:
    profiles = load_scenarios(path)
    if name not in profiles:
        raise UnknownReferenceError(
            "reward_weights", f"unknown scenario {name!r} (known: {', '.join(profiles)})")
    return profiles[name]
