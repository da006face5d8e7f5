"""The plugin registry: explicit built-ins, third-party registration, typed profile documents."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict

from smartsched.model.errors import ValidationError
from smartsched.scheduling import registry
from smartsched.scheduling.base import SplitScheduler
from smartsched.scheduling.framework import CycleContext, ProfileScheduler
from smartsched.scheduling.profile_doc import ProfileDoc, SplitProfileDoc, parse_profile
from smartsched.scheduling.registry import (
    BUILTIN_PLUGINS,
    load_profile_doc,
    make_plugin,
    plugin_names,
    profile_from_dict,
    register_plugin,
)
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node, pod

DOCS = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


class PreferLastArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    power: float = 1.0


class PreferLast:
    """A third party's score plugin: higher node index, higher score."""

    name = "PreferLast"
    Args = PreferLastArgs

    def __init__(self, args: PreferLastArgs | None = None) -> None:
        self.args = args or PreferLastArgs()

    def score(self, ctx: CycleContext, feasible: np.ndarray) -> np.ndarray:
        n = len(feasible)
        return 100.0 * (np.arange(n) / max(n - 1, 1)) ** self.args.power


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> dict[str, type]:
    """A private copy of the registry, so a test's registrations do not leak."""
    copy = dict(registry._PLUGINS)
    monkeypatch.setattr(registry, "_PLUGINS", copy)
    return copy


def test_third_party_plugin_is_usable_from_a_profile(plugins: dict[str, type]) -> None:
    assert register_plugin(PreferLast) is PreferLast
    assert "PreferLast" in plugin_names()
    prof = profile_from_dict({"name": "mine", "filters": ["NodeResourcesFit"],
                              "score": [{"name": "PreferLast", "weight": 2,
                                         "args": {"power": 2}}]})
    scorer, weight = prof.scorers[0]
    assert isinstance(scorer, PreferLast) and scorer.args.power == 2 and weight == 2.0
    st = ClusterState(cluster(node("a"), node("b"), node("c")))
    assert ProfileScheduler(prof).decide(st, st.compile(pod("p"))).node == 2
    with pytest.raises(ValidationError) as e:
        profile_from_dict({"name": "mine", "filters": ["NodeResourcesFit"],
                           "score": [{"name": "PreferLast", "args": {"powr": 2}}]})
    assert e.value.field == "mine.score[0].args.powr"


def test_duplicate_names_are_refused_naming_the_plugin(plugins: dict[str, type]) -> None:
    register_plugin(PreferLast)
    register_plugin(PreferLast)  # the same class again: harmless

    class Impostor(PreferLast):
        pass

    with pytest.raises(ValueError, match="'PreferLast' is already registered"):
        register_plugin(Impostor)

    class FakeFit(PreferLast):
        name = "NodeResourcesFit"

    with pytest.raises(ValueError, match="'NodeResourcesFit' is already registered"):
        register_plugin(FakeFit)
    assert plugins["NodeResourcesFit"] is not FakeFit


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"Args": PreferLastArgs, "score": PreferLast.score}, "`name`"),
        ({"name": 3, "Args": PreferLastArgs, "score": PreferLast.score}, "`name`"),
        ({"name": "NoArgs", "score": PreferLast.score}, "`Args` pydantic model"),
        ({"name": "DictArgs", "Args": dict, "score": PreferLast.score}, "`Args` pydantic model"),
        ({"name": "Idle", "Args": PreferLastArgs}, "implements none of"),
    ],
)
def test_malformed_plugins_are_refused(plugins: dict[str, type], attrs: dict,
                                       message: str) -> None:
    with pytest.raises(TypeError, match=message):
        register_plugin(type("Bad", (), attrs))
    assert set(plugins) == set(registry._PLUGINS)
    with pytest.raises(TypeError, match="expects a class"):
        register_plugin(PreferLast())  # type: ignore[arg-type]


def _documented_plugins() -> set[str]:
    """Plugin names in docs/architecture.md's ``plugins/*.py`` bullets: the first word of
    each comma-separated item (outside parentheses) of the bullet's first sentence."""
    bullets = re.findall(r"^- `plugins/\w+\.py`: (.*?)(?=^- |^$)", DOCS.read_text(), re.M | re.S)
    assert len(bullets) >= 5, "docs/architecture.md no longer lists plugins/*.py"
    names: set[str] = set()
    for bullet in bullets:
        depth, item, items = 0, "", []
        for ch in " ".join(bullet.split()):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0 and ch in ",.":
                items.append(item.split())
                item = ""
                if ch == ".":
                    break
            else:
                item += ch
        names |= {words[0] for words in items
                  if words and re.fullmatch(r"[A-Z][A-Za-z]+", words[0])}
    return names


def test_every_documented_plugin_resolves() -> None:
    documented = _documented_plugins()
    assert {"NodeResourcesFit", "FGD", "BestFitGpu", "NumaAware", "LoadAware"} <= documented
    missing = sorted(documented - set(plugin_names()))
    assert not missing, f"docs/architecture.md names plugins that do not resolve: {missing}"
    for name in documented:
        assert make_plugin(name, "docs").name == name
    section = DOCS.read_text().split("## scheduling/")[1].split("\n## ")[0]
    undocumented = sorted(c.name for c in BUILTIN_PLUGINS if c.name not in section)
    assert not undocumented, f"built-in plugins missing from docs/architecture.md: {undocumented}"


def test_builtins_are_listed_not_scanned() -> None:
    assert len({c.name for c in BUILTIN_PLUGINS}) == len(BUILTIN_PLUGINS)
    assert {c.name for c in BUILTIN_PLUGINS} <= set(plugin_names())


def test_profile_documents_are_typed(tmp_path: Path) -> None:
    doc = parse_profile({"name": "p", "filters": ["NodeResourcesFit", {"name": "TaintToleration",
                                                                      "args": None}],
                         "score": ["TaintToleration"], "binder": "BestFitGpu"})
    assert isinstance(doc, ProfileDoc)
    assert [f.name for f in doc.filters] == ["NodeResourcesFit", "TaintToleration"]
    assert doc.score[0].weight == 1.0 and doc.binder is not None and doc.tie_break == "random"
    assert isinstance(load_profile_doc("online-batch"), SplitProfileDoc)
    assert isinstance(load_profile_doc("fgd"), ProfileDoc)
    split = SplitProfileDoc(name="s", routes={"batch": "binpack", "default": "k8s-default"})
    sched = SplitScheduler.from_doc(split, "s", seed=0)
    assert sched.routes["batch"].name == "binpack" and sched.routes["default"].name == "k8s-default"


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"name": "p", "filters": ["NodeResourcesFit"], "score": [{"name": "TaintToleration",
                                                                 "weight": True}]},
         "p.score[0].weight"),
        ({"name": "p", "filters": ["NodeResourcesFit"], "score": [{"name": "TaintToleration",
                                                                 "weight": 10_001}]},
         "p.score[0].weight"),
        ({"name": "p", "filters": [{"name": "NodeResourcesFit", "weight": 2}]},
         "p.filters[0].weight"),
        ({"name": "p", "filters": [7]}, "p.filters[0]"),
        ({"name": "p", "filters": ["NodeResourcesFit"], "binder": "TaintToleration"}, "p.binder"),
        ({"name": "p", "filters": ["NodeResourcesFit"], "forecaster": ""}, "p.forecaster"),
        ({"filters": ["NodeResourcesFit"]}, "profile.name"),
        # NaN was refused as "less than or equal to 10000"; a plugin twice ran twice.
        ({"name": "p", "filters": ["NodeResourcesFit"], "score": [{"name": "TaintToleration",
                                                                 "weight": float("nan")}]},
         "p.score[0].weight"),
        ({"name": "p", "filters": ["NodeResourcesFit"], "score": [
            {"name": "TaintToleration", "weight": 2}, {"name": "TaintToleration"}]},
         "p.score"),
        ({"name": "p", "filters": ["NodeResourcesFit", "NodeResourcesFit"]}, "p.filters"),
    ],
)
def test_more_profile_errors_name_the_field(doc: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        profile_from_dict(doc)
    assert e.value.field == field
    if field == "p.score[0].weight" and doc["score"][0]["weight"] != doc["score"][0]["weight"]:
        assert "finite" in e.value.message, e.value.message  # NaN, named as such
    if field in ("p.score", "p.filters"):
        assert "listed twice" in e.value.message
