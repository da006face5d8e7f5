"""The finance workload: an online core system and nightly batch runs on their pools."""

from __future__ import annotations

import pytest

from smartsched.model.errors import ValidationError
from smartsched.model.pod import PodClass
from smartsched.model.presets import load_cluster
from smartsched.workloads.finance import generate_finance, load_profile
from smartsched.workloads.resolve import load_workload
from tests.builders import cluster, node


def test_finance_workload_shape() -> None:
    spec = load_cluster("finance")
    pods = generate_finance(spec, hours=60, seed=1)
    online = [p for p in pods if p.pod_class == PodClass.ONLINE]
    batch = [p for p in pods if p.pod_class == PodClass.BATCH]
    core_cpu = sum(n.cpu_milli for n in spec.nodes if n.labels.get("pool") == "core")
    assert 0.5 * core_cpu <= sum(p.cpu_milli for p in online) < 0.5 * core_cpu + 6 * 4000
    assert all(p.duration is None and p.tenant == "core" and p.app for p in online)
    assert {p.node_selector for p in online} == {(("pool", "core"),)}
    # Nights at 22:00 of days 0 and 1 fall within 60 h; one app per night.
    assert {p.app for p in batch} == {"eod-000", "eod-001"}
    for day in (0, 1):
        run = [p for p in batch if p.app == f"eod-{day:03d}"]
        start = (24 * day + 22) * 3600.0
        assert {p.arrival for p in run} <= {start, start + 1800.0, start + 3600.0}
        assert {p.deadline for p in run} == {start + 8 * 3600.0}
        assert max(p.duration for p in run) <= 7200.0
        pool_cpu = sum(n.cpu_milli for n in spec.nodes if n.labels.get("pool") == "batch")
        work = sum(p.cpu_milli * p.duration for p in run) / (pool_cpu * 3600.0)
        assert 2.5 <= work < 2.5 + 16000 * 7200 / (pool_cpu * 3600.0)
    assert [p.arrival for p in pods] == sorted(p.arrival for p in pods)
    # Deterministic for a seed, different across seeds.
    again = generate_finance(spec, hours=60, seed=1)
    assert [(p.id, p.duration) for p in again] == [(p.id, p.duration) for p in pods]
    other = generate_finance(spec, hours=60, seed=2)
    assert [p.duration for p in other] != [p.duration for p in pods]
    assert len(load_workload("finance", spec, 60, 1)) == len(pods)


def _profile_with(tmp_path, section: str, **changes):
    import yaml

    doc = load_profile().model_dump()
    doc[section].update(changes)
    path = tmp_path / "fin.yaml"
    path.write_text(yaml.safe_dump(doc))
    return f"finance:{path}"


@pytest.mark.parametrize(("section", "changes", "field"), [
    ("batch", {"work": -1}, "workload.batch.work"),
    ("batch", {"release": [[9.0, 1.0]]}, "workload.batch.release"),
    ("batch", {"cpu_milli": [128000]}, "workload.batch.cpu_milli"),
    ("batch", {"colour": "red"}, "workload.batch.colour"),
    ("online", {"pool": "nowhere"}, "workload.online.pool"),
    ("online", {"priority_class": "vip"}, "workload.online.priority_class"),
    # sizes that imply more pods than a run can hold: refused before any is made (a
    # billion replicas ran away on memory)
    ("online", {"replicas": [1_000_000_000]}, "workload.online.replicas[0]"),
    ("batch", {"cpu_milli": [1], "duration_minutes_mean": 0.001}, "workload.batch"),
    ("batch", {"checkpoint_minutes": float("inf")}, "workload.batch.checkpoint_minutes"),
    # relative wave shares: inf made every share nan, two of 1e308 summed to inf (each a
    # numpy traceback from the draw)
    ("batch", {"release": [[0.0, float("inf")], [0.5, 0.25]]}, "workload.batch.release[0][1]"),
    ("batch", {"release": [[0.0, 1e308], [0.5, 1e308]]}, "workload.batch.release[0][1]"),
])
def test_bad_profiles_name_the_field(tmp_path, section, changes, field) -> None:
    spec = load_cluster("finance")
    with pytest.raises(ValidationError) as e:
        load_workload(_profile_with(tmp_path, section, **changes), spec, 24, 0)
    assert e.value.field == field


def test_cluster_without_pools_is_refused() -> None:
    with pytest.raises(ValidationError) as e:
        generate_finance(cluster(node("a")), hours=24)
    assert e.value.field == "workload.online.pool"
