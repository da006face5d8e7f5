"""The online/batch split and the load-aware plugin."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from smartsched.model.errors import ValidationError
from smartsched.model.pod import PodClass
from smartsched.scheduling.base import SplitScheduler, make_scheduler
from smartsched.scheduling.framework import CycleContext
from smartsched.scheduling.plugins.load import LoadAware
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node, pod


def test_split_routes_by_class() -> None:
    sched = make_scheduler("online-batch")
    assert isinstance(sched, SplitScheduler)
    assert sched.routes["online"].name == "load-aware"
    assert sched.routes["batch"].name == "binpack"
    st = ClusterState(cluster(node("a", cpu=8000), node("b", cpu=8000)))
    st.allocate(0, st.compile(pod("x", cpu=4000)), ())
    sched.prepare([pod("y")])
    # binpack puts batch on the fuller node; load-aware/least-allocated puts online on the emptier
    assert sched.decide(st, st.compile(pod("b1", pod_class=PodClass.BATCH))).node == 0
    assert sched.decide(st, st.compile(pod("o1", pod_class=PodClass.ONLINE))).node == 1


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name: s\nroutes: {online: k8s-default}\n", "s.routes"),
        ("name: s\nroutes: {gaming: k8s-default, default: binpack}\n", "s.routes.gaming"),
        ("name: s\nroutes: {default: s}\n", "s.routes.default"),
        ("name: s\nroutes: {default: binpack}\nextra: 1\n", "s.extra"),
    ],
)
def test_split_errors(tmp_path: Path, text: str, field: str) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(text)
    with pytest.raises(ValidationError) as e:
        make_scheduler(str(f))
    assert e.value.field == field


def test_split_routes_that_lead_back_are_refused(tmp_path: Path) -> None:
    """A split routing to its own file, or to a split that routes back to it, recursed
    without end (a RecursionError traceback); it is refused naming the routes."""
    own = tmp_path / "own.yaml"
    own.write_text(f"name: x\nroutes: {{default: {own}}}\n")
    with pytest.raises(ValidationError) as e:
        make_scheduler(str(own))
    assert e.value.field == "x.routes" and "cannot reach itself" in e.value.message
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"name: a\nroutes: {{online: k8s-default, default: {b}}}\n")
    b.write_text(f"name: b\nroutes: {{default: {tmp_path}/./a.yaml}}\n")
    with pytest.raises(ValidationError) as e:
        make_scheduler(str(a))
    assert e.value.field == "a.routes" and "b.yaml" in e.value.message
    b.write_text("name: b\nroutes: {default: binpack}\n")  # a split of splits is fine
    assert isinstance(make_scheduler(str(a)), SplitScheduler)


def test_load_aware_uses_usage_and_recent_placements() -> None:
    st = ClusterState(cluster(node("a", cpu=10000, mem=10000), node("b", cpu=10000, mem=10000)))
    # Both nodes requested the same, but "a" actually uses far more.
    for n in (0, 1):
        st.allocate(n, st.compile(pod(f"p{n}", cpu=5000, mem=1000)), ())
    st.usage_allocated[:] = st.allocated
    st.usage[:, 0] = [7000, 1000]
    st.usage[:, 1] = [1000, 1000]
    la = LoadAware()
    ctx = CycleContext(st, st.compile(pod("new", cpu=1000, mem=1000)))
    assert la.filter(ctx).passing.tolist() == [False, True]  # a: 7000/10000 > 0.65
    s = la.score(ctx, np.ones(2, bool))
    # b: cpu (10000 - 1000 - 850)/10000*100 = 81.5, mem (10000 - 1000 - 700)/100 = 83 -> 82.25
    assert s[1] == pytest.approx(82.25) and s[0] < s[1]
    # A placement since the last sample counts at 85 % of its request.
    st.allocate(1, st.compile(pod("recent", cpu=4000, mem=100)), ())
    ctx = CycleContext(st, st.compile(pod("new2", cpu=1000, mem=1000)))
    # b: 1000 + 0.85 * 4000 = 4400 used -> 0.44, still under the threshold, lower score
    assert la.filter(ctx).passing.tolist() == [False, True]
    assert la.score(ctx, np.ones(2, bool))[1] < s[1]
    # Predicted usage, when present, counts if higher than the sample.
    st.predicted_usage = np.array([[0, 0, 0], [7000, 1000, 0]], dtype=float)
    ctx = CycleContext(st, st.compile(pod("new3", cpu=1000, mem=1000)))
    assert la.filter(ctx).passing.tolist() == [False, False]


def _two_mines(tmp_path: Path) -> Path:
    """``prof/mine.yaml`` (bestfit, renamed) beside a split to be written in ``prof/``, and
    ``mine.yaml`` (random, renamed) in ``tmp_path``, the tests' working directory."""
    import yaml

    from smartsched.scheduling.registry import builtin_profiles

    prof = tmp_path / "prof"
    prof.mkdir()
    for folder, base in ((prof, "bestfit"), (tmp_path, "random")):
        doc = yaml.safe_load(builtin_profiles()[base].read_text())
        doc["name"] = f"mine-{base}"
        (folder / "mine.yaml").write_text(yaml.safe_dump(doc))
    return prof


def test_a_routes_relative_file_is_read_beside_the_split_file(tmp_path: Path,
                                                              monkeypatch) -> None:
    """A route ``mine.yaml`` was read from the working directory: a same-named file there
    (here: random) was used silently instead of the one beside the split (bestfit), and
    with none there the error named neither the route nor the split (probe round 7)."""
    prof = _two_mines(tmp_path)
    (prof / "split.yaml").write_text("name: s\nroutes: {default: mine.yaml}\n")
    monkeypatch.chdir(tmp_path)
    split = make_scheduler("prof/split.yaml")
    assert isinstance(split, SplitScheduler)
    assert split.routes["default"].name == "mine-bestfit"
    (prof / "mine.yaml").unlink()
    with pytest.raises(ValidationError) as e:
        make_scheduler("prof/split.yaml")
    assert e.value.field == "s.routes.default" and e.value.source == "prof/split.yaml"


@pytest.mark.parametrize("route", ["lookahead:mine.yaml?samples=1&horizon=2",
                                   "lookahead:mine.yaml", "sandboxed:mine.yaml",
                                   "lookahead:sandboxed:mine.yaml"])
def test_a_wrapped_routes_file_is_read_beside_the_split_file(tmp_path: Path, monkeypatch,
                                                             route: str) -> None:
    """Only a bare ``*.yaml`` route was read beside the split: a wrapped one
    (``lookahead:mine.yaml?...``) was read from the working directory, silently, and
    ``lookahead:mine.yaml`` became ``prof/lookahead:mine.yaml``, unknown (probe round 8)."""
    prof = _two_mines(tmp_path)
    (prof / "split.yaml").write_text(f"name: s\nroutes: {{default: '{route}'}}\n")
    monkeypatch.chdir(tmp_path)
    inner = make_scheduler("prof/split.yaml").routes["default"]
    while hasattr(inner, "base"):
        inner = inner.base
    assert inner.name == "mine-bestfit"
    assert make_scheduler(route.replace("mine.yaml", "prof/mine.yaml")).name
    (prof / "mine.yaml").unlink()  # the working directory's is never the fallback
    with pytest.raises(ValidationError) as e:
        make_scheduler("prof/split.yaml")
    assert e.value.field == "s.routes.default"


def test_an_rl_routes_policy_folder_is_read_beside_the_split_file(tmp_path: Path,
                                                                  monkeypatch) -> None:
    import shutil

    repo = Path(__file__).resolve().parents[2]
    prof = tmp_path / "prof"
    prof.mkdir()
    shutil.copytree(repo / "models" / "ppo_mixed_small", prof / "pol")
    (prof / "split.yaml").write_text("name: s\nroutes: {default: 'rl:pol'}\n")
    monkeypatch.chdir(tmp_path)
    route = make_scheduler("prof/split.yaml").routes["default"]
    assert Path(route.dir).is_relative_to(prof / "pol")
