"""Block-bootstrap episodes of a recorded workload (the gate's paired episodes on
experience): one per seed, reproducible, gangs whole, bad settings named."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod
from smartsched.model.presets import load_cluster
from smartsched.workloads.parquet_io import write_pods
from smartsched.workloads.resample import resample_blocks
from smartsched.workloads.resolve import load_workload


def _trace(n: int = 60) -> list[Pod]:
    pods = [Pod(id=f"p{i}", cpu_milli=100 * (1 + i % 7), memory_mib=64, arrival=10.0 * i)
            for i in range(n)]
    # A gang of 4 whose members arrive across what will be a block boundary.
    pods += [Pod(id=f"g{j}", cpu_milli=1000, memory_mib=64, gang_id="g", gang_size=4,
                 arrival=74.0 + j) for j in range(4)]
    return sorted(pods, key=lambda p: p.arrival)


def test_a_seed_is_one_episode_and_seeds_differ() -> None:
    pods = _trace()
    a, again, b = resample_blocks(pods, 1), resample_blocks(pods, 1), resample_blocks(pods, 2)
    assert [(p.id, p.arrival) for p in a] == [(p.id, p.arrival) for p in again]
    assert Counter(p.id.split("~")[0] for p in a) != Counter(p.id.split("~")[0] for p in b)
    span = max(p.arrival for p in pods) - min(p.arrival for p in pods)
    for ep in (a, b):
        assert len({p.id for p in ep}) == len(ep)  # a block drawn twice: other names
        assert all(0 <= p.arrival <= span + 1e-6 for p in ep)
        assert [p.arrival for p in ep] == sorted(p.arrival for p in ep)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), block_s=st.floats(1.0, 500.0))
def test_gangs_stay_whole(seed: int, block_s: float) -> None:
    ep = resample_blocks(_trace(), seed, block_s)
    gangs = Counter(p.gang_id for p in ep if p.gang_id is not None)
    assert all(n == 4 for n in gangs.values())
    for gid in gangs:  # one copy of the gang: its members keep their spacing
        times = sorted(p.arrival for p in ep if p.gang_id == gid)
        assert times[-1] - times[0] == pytest.approx(3.0)


def test_a_recorded_file_resamples_by_the_runs_seed(tmp_path: Path) -> None:
    path = tmp_path / "recent.parquet"
    write_pods(_trace(), path)
    spec = load_cluster("small")
    same = load_workload(str(path), spec, 1.0, 1) == load_workload(str(path), spec, 1.0, 2)
    assert same  # the recording itself does not change with the seed
    one = load_workload(f"resample:{path}", spec, 1.0, 1)
    two = load_workload(f"resample:{path}", spec, 1.0, 2)
    assert [p.id for p in one] != [p.id for p in two]
    fixed = load_workload(f"resample:{path}?block_s=20", spec, 1.0, 1)
    assert fixed == resample_blocks(_trace(), 1, 20.0)


@pytest.mark.parametrize("spec,field", [("resample:", "workload"),
                                        ("resample:mixed?block_s=x", "workload.block_s"),
                                        ("resample:mixed?block_s=-5", "workload.block_s"),
                                        ("resample:nope.parquet", "workload")])
def test_bad_resample_specs_name_the_field(spec: str, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        load_workload(spec, load_cluster("small"), 1.0, 0)
    assert e.value.field == field


def test_deadlines_move_with_their_pods() -> None:
    """A pod drawn into a later slot keeps its slack (a deadline is absolute time)."""
    pods = [Pod(id=f"d{i}", cpu_milli=100, memory_mib=64, arrival=100.0 * i,
                deadline=100.0 * i + 30.0) for i in range(50)]
    for seed in range(20):
        for p in resample_blocks(pods, seed, 100.0):
            assert p.deadline == pytest.approx(p.arrival + 30.0)


def test_a_block_length_that_cuts_too_fine_is_refused() -> None:
    with pytest.raises(ValidationError) as e:
        resample_blocks(_trace(), 0, 1e-6)
    assert e.value.field == "workload.block_s"
