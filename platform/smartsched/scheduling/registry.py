"""Plugin registry and profile loading: profiles are data.

Owns the map from plugin names to classes (each with a pydantic ``Args``
model, so arguments are typed and validated), and turning a profile document
(YAML, schema in ``scheduling.profile_doc``) into a ``Profile``. A bad profile
raises ValidationError naming the profile, the plugin and the field
(``mine.score[0].args.strategy``).

The built-in plugins are listed in ``BUILTIN_PLUGINS``; another package adds
its own with ``register_plugin`` (also usable as a class decorator), after
which profiles may name it like any built-in::

    @register_plugin
    class MyScore:
        name = "MyScore"
        Args = MyScoreArgs            # a pydantic model; {} must validate if args are optional
        def __init__(self, args: MyScoreArgs) -> None: ...
        def score(self, ctx, feasible): ...
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic import ValidationError as PydanticError

from smartsched.model.configfile import (
    first_error,
    read_yaml,
    read_yaml_text,
    refuse_bools_as_numbers,
    validate,
)
from smartsched.model.errors import UnknownReferenceError, ValidationError
from smartsched.paths import user_path
from smartsched.scheduling.framework import (
    BindPlugin,
    DeferPlugin,
    DeschedulePlugin,
    FilterPlugin,
    PostFilterPlugin,
    Profile,
    ScorePlugin,
)
from smartsched.scheduling.plugins import (
    accelerators,
    binders,
    carbon,
    defrag,
    edge,
    gangs,
    gpu,
    images,
    k8s,
    load,
    preemption,
    topology,
)
from smartsched.scheduling.profile_doc import (
    PluginRef,
    ProfileDoc,
    SplitProfileDoc,
    is_split,
    parse_profile,
    parse_split,
)

log = logging.getLogger(__name__)

BUILTIN_PLUGINS: tuple[type, ...] = (
    k8s.NodeUnschedulable,
    k8s.NodeResourcesFit,
    k8s.NodeResourcesBalancedAllocation,
    k8s.NodeAffinity,
    k8s.TaintToleration,
    k8s.PodTopologySpread,
    k8s.AppZoneAffinity,
    k8s.RegionAllowed,
    gpu.DotProd,
    gpu.GpuClustering,
    gpu.GpuPacking,
    gpu.BestFit,
    gpu.FGD,
    gpu.RandomGpu,
    binders.BestFitGpu,
    binders.TopologyAwareGpu,
    topology.NumaAware,
    load.LoadAware,
    preemption.DefaultPreemption,
    edge.LatencySLO,
    images.ImageLocality,
    images.ImagePull,
    gangs.GangReservation,
    gangs.Reservations,
    accelerators.AcceleratorFit,
    defrag.GpuDefrag,
    carbon.CarbonShift,
    carbon.GridCarbon,
    carbon.GreenScore,
)

# The extension points a plugin class may implement (framework.py's Protocols).
_EXTENSION_METHODS = ("filter", "score", "devices", "post_filter", "plan", "defer")

_PLUGINS: dict[str, type] = {}


def register_plugin(cls: type) -> type:
    """Register a plugin class under its ``name``; returns ``cls`` (usable as a decorator).

    The class needs a non-empty ``name`` string, an ``Args`` pydantic model
    (its constructor receives the validated args), and at least one of
    ``filter``, ``score``, ``devices``. Registering the same class twice is a
    no-op; another class under a taken name is refused.
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_plugin expects a class, got {cls!r}")
    what = f"{cls.__module__}.{cls.__qualname__}"
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"plugin {what} needs a class attribute `name` (a non-empty str)")
    args = getattr(cls, "Args", None)
    if not (isinstance(args, type) and issubclass(args, BaseModel)):
        raise TypeError(f"plugin {name} ({what}) needs an `Args` pydantic model")
    if not any(callable(getattr(cls, m, None)) for m in _EXTENSION_METHODS):
        raise TypeError(f"plugin {name} ({what}) implements none of "
                        f"{', '.join(_EXTENSION_METHODS)}")
    other = _PLUGINS.get(name)
    if other is not None and other is not cls:
        raise ValueError(f"plugin {name!r} is already registered "
                         f"({other.__module__}.{other.__qualname__}); cannot register {what}")
    _PLUGINS[name] = cls
    return cls


for _cls in BUILTIN_PLUGINS:
    register_plugin(_cls)


_DISCOVERED = False


def _discover() -> None:
    """Register the plugins other packages declare (entry-point group
    ``smartsched.plugins``, name -> class), once: a layer above scheduling (or a user's
    package) adds plugins without scheduling importing it."""
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    from importlib.metadata import entry_points

    for ep in entry_points(group="smartsched.plugins"):
        if ep.name in _PLUGINS:
            continue
        try:
            register_plugin(ep.load())
        except Exception as e:  # a broken third-party package must not break the rest
            log.warning("plugin entry point %s could not be registered: %r", ep.name, e)


def plugin_names() -> list[str]:
    _discover()
    return sorted(_PLUGINS)


def make_plugin(spec: PluginRef | str | Mapping[str, Any], where: str) -> Any:
    """Instantiate a plugin from a ``PluginRef`` (or ``"Name"`` / ``{name, args}``),
    validating its args with the plugin's ``Args`` model; errors are named ``where...``."""
    ref = spec if isinstance(spec, PluginRef) else validate(PluginRef, spec, prefix=where)
    cls = _PLUGINS.get(ref.name)
    if cls is None:
        _discover()
        cls = _PLUGINS.get(ref.name)
    if cls is None:
        raise UnknownReferenceError(
            f"{where}.name", f"unknown plugin {ref.name!r} (known: {', '.join(sorted(_PLUGINS))})"
        )
    args_model: type[BaseModel] = cls.Args  # type: ignore[attr-defined]
    try:
        parsed = args_model.model_validate(ref.args)
    except PydanticError as e:
        raise ValidationError(*first_error(e, f"{where}.args")) from None
    refuse_bools_as_numbers(parsed, ref.args, f"{where}.args")
    try:
        return cls(parsed)
    except ValueError as e:
        raise ValidationError(f"{where}.args", str(e)) from None


def build_profile(doc: ProfileDoc) -> Profile:
    """The ``Profile`` a validated document describes: its plugins built and checked."""
    name = doc.name
    filters = []
    for i, ref in enumerate(doc.filters):
        p = make_plugin(ref, f"{name}.filters[{i}]")
        if not isinstance(p, FilterPlugin):
            raise ValidationError(f"{name}.filters[{i}]", f"{p.name} is not a filter plugin")
        filters.append(p)
    scorers = []
    for i, s in enumerate(doc.score):
        where = f"{name}.score[{i}]"
        p = make_plugin(s, where)
        if not isinstance(p, ScorePlugin):
            raise ValidationError(where, f"{p.name} is not a score plugin")
        scorers.append((p, float(s.weight)))
    binder = None
    if doc.binder is not None:
        # A scorer that also binds (FGD) binds with the devices it scored: reuse it.
        same = [p for p, _ in scorers if p.name == doc.binder.name and isinstance(p, BindPlugin)]
        binder = same[0] if same else make_plugin(doc.binder, f"{name}.binder")
        if not isinstance(binder, BindPlugin):
            raise ValidationError(f"{name}.binder", f"{binder.name} is not a bind plugin")
    post = _plugins_of(doc.post_filter, f"{name}.post_filter", PostFilterPlugin,
                       "a post-filter plugin")
    passes = _plugins_of(doc.deschedule, f"{name}.deschedule", DeschedulePlugin,
                         "a descheduling plugin")
    deferrers = _plugins_of(doc.defer, f"{name}.defer", DeferPlugin, "a defer plugin")
    return Profile(name, tuple(filters), tuple(scorers), binder, doc.tie_break, doc.forecaster,
                   post_filters=tuple(post), deschedulers=tuple(passes),
                   deferrers=tuple(deferrers), queue_sort=doc.queue_sort,
                   failure_toleration_s=doc.failure_toleration_s)


def _plugins_of(refs: list[Any], where: str, point: type, what: str) -> tuple[Any, ...]:
    """Build ``refs`` for one extension point, each checked to implement it."""
    out = []
    for i, ref in enumerate(refs):
        p = make_plugin(ref, f"{where}[{i}]")
        if not isinstance(p, point):
            raise ValidationError(f"{where}[{i}]", f"{p.name} is not {what}")
        out.append(p)
    return tuple(out)


def profile_from_dict(doc: Any, source: str = "profile") -> Profile:
    """Build a Profile from its document (schema in ``scheduling.profile_doc``)."""
    return build_profile(parse_profile(doc, source))


def builtin_profiles() -> dict[str, Path | Any]:
    """Names of the packaged profiles -> their YAML resources."""
    root = resources.files("smartsched.scheduling").joinpath("profiles")
    return {p.name[: -len(".yaml")]: p for p in root.iterdir() if p.name.endswith(".yaml")}


def load_profile(spec: str) -> Profile:
    """A packaged profile by name, or a user profile from a YAML file path."""
    doc, source = read_profile_doc(spec)
    return profile_from_dict(doc, source)


def load_profile_doc(spec: str) -> ProfileDoc | SplitProfileDoc:
    """The validated document of a packaged profile or a profile file, split or not."""
    doc, source = read_profile_doc(spec)
    return parse_split(doc, source) if is_split(doc) else parse_profile(doc, source)


def read_profile_doc(spec: str) -> tuple[dict[str, Any], str]:
    """The YAML document of a packaged profile or a profile file, and where it came from."""
    builtin = builtin_profiles()
    if spec in builtin:
        source = spec
        doc = read_yaml_text(builtin[spec].read_text(), "profile", source=source)
    else:
        path = user_path(spec)
        if path.suffix not in (".yaml", ".yml") or not path.is_file():
            raise UnknownReferenceError(
                "scheduler",
                f"unknown scheduler {spec[:200]!r} (profiles: {', '.join(sorted(builtin))}; "
                "or a profile .yaml file)",
            )
        source = str(path)
        doc = read_yaml(path, "profile")
    if not isinstance(doc, dict):
        raise ValidationError("profile", "a profile must be a mapping", source=source)
    return doc, source
