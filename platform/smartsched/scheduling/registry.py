"""Plugin registry and profile loading: profiles are data.

Owns the map from plugin names to classes (each with a pydantic ``Args``
model, so arguments are typed and validated), and turning a profile document
(YAML) into a ``Profile``. A bad profile raises ValidationError naming the
profile, the plugin and the field.

Profile YAML::

    name: k8s-default
    filters: [NodeUnschedulable, NodeResourcesFit, NodeAffinity, TaintToleration]
    score:
      - {name: NodeResourcesFit, weight: 1, args: {strategy: LeastAllocated}}
      - {name: TaintToleration, weight: 3}
    binder: {name: BestFitGpu}        # optional
    tie_break: random                  # or "first"
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic import ValidationError as PydanticError

from smartsched.model.errors import UnknownReferenceError, ValidationError
from smartsched.scheduling.framework import BindPlugin, FilterPlugin, Profile, ScorePlugin

_PLUGINS: dict[str, type] = {}


def register_plugin(cls: type) -> type:
    """Register a plugin class under its ``name`` (usable as a decorator)."""
    _PLUGINS[cls.name] = cls  # type: ignore[attr-defined]
    return cls


def plugin_names() -> list[str]:
    _ensure_builtins()
    return sorted(_PLUGINS)


def _ensure_builtins() -> None:
    if _PLUGINS:
        return
    from smartsched.scheduling.plugins import binders, gpu, k8s, load, topology

    for mod in (k8s, gpu, binders, topology, load):
        for obj in vars(mod).values():
            if isinstance(obj, type) and isinstance(getattr(obj, "name", None), str) and hasattr(
                obj, "Args"
            ):
                _PLUGINS.setdefault(obj.name, obj)


def make_plugin(spec: str | dict[str, Any], where: str) -> Any:
    """Instantiate a plugin from ``"Name"`` or ``{name, args}``, validating its args."""
    _ensure_builtins()
    if isinstance(spec, str):
        name, args = spec, {}
    elif isinstance(spec, dict) and "name" in spec:
        name, args = str(spec["name"]), spec.get("args") or {}
    else:
        raise ValidationError(where, f"expected a plugin name or {{name, args}}, got {spec!r}")
    cls = _PLUGINS.get(name)
    if cls is None:
        raise UnknownReferenceError(
            f"{where}.name", f"unknown plugin {name!r} (known: {', '.join(sorted(_PLUGINS))})"
        )
    args_model: type[BaseModel] = cls.Args
    try:
        parsed = args_model.model_validate(args)
    except PydanticError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "args"
        raise ValidationError(f"{where}.args.{loc}", err["msg"]) from None
    try:
        return cls(parsed)
    except ValueError as e:
        raise ValidationError(f"{where}.args", str(e)) from None


_PROFILE_KEYS = {"name", "filters", "score", "binder", "tie_break", "description",
                 "forecaster"}


def profile_from_dict(doc: dict[str, Any], source: str = "profile") -> Profile:
    """Build a Profile from its document (see module docstring)."""
    if not isinstance(doc, dict):
        raise ValidationError(source, "a profile must be a mapping")
    unknown = set(doc) - _PROFILE_KEYS
    if unknown:
        raise ValidationError(f"{source}.{sorted(unknown)[0]}", "unknown field")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise ValidationError(f"{source}.name", "required")
    filters = []
    for i, f in enumerate(doc.get("filters") or []):
        p = make_plugin(f, f"{name}.filters[{i}]")
        if not isinstance(p, FilterPlugin):
            raise ValidationError(f"{name}.filters[{i}]", f"{p.name} is not a filter plugin")
        filters.append(p)
    if not filters:
        raise ValidationError(f"{name}.filters", "a profile needs at least one filter")
    scorers = []
    for i, s in enumerate(doc.get("score") or []):
        where = f"{name}.score[{i}]"
        weight = s.get("weight", 1) if isinstance(s, dict) else 1
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not (
            0 < weight <= 10_000
        ):
            raise ValidationError(f"{where}.weight", f"must be within (0, 10000], got {weight!r}")
        p = make_plugin(s, where)
        if not isinstance(p, ScorePlugin):
            raise ValidationError(where, f"{p.name} is not a score plugin")
        scorers.append((p, float(weight)))
    binder = None
    if doc.get("binder") is not None:
        spec = doc["binder"]
        bname = spec if isinstance(spec, str) else (
            spec.get("name") if isinstance(spec, dict) else None
        )
        # A scorer that also binds (FGD) binds with the devices it scored: reuse it.
        same = [p for p, _ in scorers if p.name == bname and isinstance(p, BindPlugin)]
        binder = same[0] if same else make_plugin(spec, f"{name}.binder")
        if not isinstance(binder, BindPlugin):
            raise ValidationError(f"{name}.binder", f"{binder.name} is not a bind plugin")
    tie = doc.get("tie_break", "random")
    if tie not in ("random", "first", "rank"):
        raise ValidationError(f"{name}.tie_break", f"must be random, first or rank, got {tie!r}")
    forecaster = doc.get("forecaster")
    if forecaster is not None and (not isinstance(forecaster, str) or not forecaster):
        raise ValidationError(f"{name}.forecaster", "must be the path of a forecaster folder")
    return Profile(name, tuple(filters), tuple(scorers), binder, tie, forecaster)


def builtin_profiles() -> dict[str, Path | Any]:
    """Names of the packaged profiles -> their YAML resources."""
    root = resources.files("smartsched.scheduling").joinpath("profiles")
    return {p.name[: -len(".yaml")]: p for p in root.iterdir() if p.name.endswith(".yaml")}


def load_profile(spec: str) -> Profile:
    """A packaged profile by name, or a user profile from a YAML file path."""
    doc, source = read_profile_doc(spec)
    return profile_from_dict(doc, source)


def read_profile_doc(spec: str) -> tuple[dict[str, Any], str]:
    """The YAML document of a packaged profile or a profile file, and where it came from."""
    builtin = builtin_profiles()
    if spec in builtin:
        text, source = builtin[spec].read_text(), spec
    else:
        path = Path(spec)
        if path.suffix not in (".yaml", ".yml") or not path.is_file():
            raise UnknownReferenceError(
                "scheduler",
                f"unknown scheduler {spec!r} (profiles: {', '.join(sorted(builtin))}; "
                "or a profile .yaml file)",
            )
        text, source = path.read_text(), str(path)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValidationError(source, f"not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise ValidationError(source, "a profile must be a mapping")
    return doc, source
