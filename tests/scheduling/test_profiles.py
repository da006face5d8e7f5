"""Profile loading: packaged profiles, user files, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from smartsched.model.errors import UnknownReferenceError, ValidationError
from smartsched.scheduling.base import make_scheduler
from smartsched.scheduling.registry import builtin_profiles, load_profile, profile_from_dict
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node, pod

BASE = {"name": "mine", "filters": ["NodeResourcesFit"],
        "score": [{"name": "NodeResourcesFit", "weight": 1}]}


@pytest.mark.parametrize("name", sorted(builtin_profiles()))
def test_every_packaged_profile_loads_and_places(name: str) -> None:
    sched = make_scheduler(name, seed=1)
    if hasattr(sched, "prepare"):
        sched.prepare([pod("a", num_gpu=1, gpu_milli=500), pod("b")])
    st = ClusterState(cluster(node("a"), node("g", cpu=32000, mem=65536, gpus=2)))
    d = sched.decide(st, st.compile(pod("p", num_gpu=1, gpu_milli=500)))
    assert d.node == 1


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"filters": ["Nope"]}, "mine.filters[0].name"),
        ({"score": [{"name": "NodeResourcesFit", "args": {"strategy": "Fancy"}}]},
         "mine.score[0].args.strategy"),
        ({"score": [{"name": "NodeResourcesFit", "args": {"colour": 1}}]},
         "mine.score[0].args.colour"),
        ({"score": [{"name": "NodeResourcesFit", "weight": 0}]}, "mine.score[0].weight"),
        ({"filters": ["DotProd"]}, "mine.filters[0]"),
        ({"score": ["NodeUnschedulable"]}, "mine.score[0]"),
        ({"tie_break": "coin"}, "mine.tie_break"),
        ({"filters": []}, "mine.filters"),
        ({"colour": "red"}, "profile.colour"),
    ],
)
def test_profile_errors_name_the_field(patch: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        profile_from_dict({**BASE, **patch})
    assert e.value.field == field


def test_user_profile_file(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("name: packer\nfilters: [NodeUnschedulable, NodeResourcesFit]\n"
                 "score:\n  - {name: NodeResourcesFit, weight: 2,\n"
                 "     args: {strategy: MostAllocated}}\n")
    prof = load_profile(str(f))
    assert prof.name == "packer" and prof.scorers[0][1] == 2.0
    with pytest.raises(UnknownReferenceError):
        load_profile(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(ValidationError, match="YAML"):
        load_profile(str(bad))
