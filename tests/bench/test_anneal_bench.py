"""``smartsched bench anneal`` on real openb nodes and pods, at toy sizes: the exact
comparison, the clock on the whole cluster, and fill mode in windows beside fgd."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from smartsched.bench.anneal import gang_window, run_fill, run_gangs, run_gap, run_speed
from smartsched.cli import main


def test_gap_against_the_exact_solver_with_a_curve(tmp_path: Path) -> None:
    lines: list[str] = []
    res = run_gap([0, 1], nodes=12, pods=16, sweeps=(1, 10), limit_s=20.0, workers=1,
                  echo=lines.append, plot=str(tmp_path / "curve.png"))
    assert len(res["instances"]) == 2
    for inst in res["instances"]:
        assert inst["variables"] > 0
        assert [r["sweeps"] for r in inst["anneal"]] == [1, 10]
        for row in inst["anneal"]:
            assert row["feasible"]
            if inst["exact_optimal"]:  # nothing beats a proven optimum
                assert row["objective"] <= inst["exact_objective"] + 1e-6
                assert row["gap_pct"] >= -1e-6
    assert "proven optimal" in lines[0]
    if res["curve"]:
        assert (tmp_path / "curve.png").stat().st_size > 5_000


def test_gangs_in_windows_whole_or_not_at_all() -> None:
    _, _, window, _, gangs = gang_window(3, 12, 30, 1.0)
    sizes: dict[str, list[int]] = {}
    for r in window:
        if r.pod.gang_id is not None:
            sizes.setdefault(r.pod.gang_id, []).append(r.pod.gang_size)
    assert gangs == len(sizes) > 0
    assert all(len(v) == v[0] and 2 <= v[0] <= 4 for v in sizes.values())
    lines: list[str] = []
    res = run_gangs([3, 4], nodes=12, pods=30, share=1.0, sweeps=4, limit_s=20.0,
                    workers=1, echo=lines.append, colocate=0.5)
    for inst in res["instances"]:
        for how in ("sequential", "after", "model", "colocated"):
            assert inst[how]["gangs_partial"] == 0
            assert inst[how]["pods"] <= 30
            if inst[how]["gangs_whole"]:
                assert 1.0 <= inst[how]["gang_nodes"] <= 4.0
                assert 0.0 <= inst[how]["pairs_together_pct"] <= 100.0
        for key in ("exact", "exact_colocated"):
            ex = inst[key]
            if ex["optimal"]:  # nothing beats a proven optimum of the same model
                assert ex["model_objective"] <= ex["objective"] + 1e-6
    assert "gangs in the model" in lines[0] and "colocate=0.5" in lines[0]
    assert "member pairs on one node" in lines[0]


def test_speed_on_the_whole_openb_cluster() -> None:
    res = run_speed(window=60, levels=(0, 500), options=[{"homes": "shapes", "sweeps": 2}],
                    echo=lambda _: None)
    assert [r["level"] for r in res["rows"]] == [0, 500]
    for r in res["rows"]:
        assert r["placed_by_model"] + r["placed_by_profile"] + r["unplaced"] == 60
        assert r["seconds"] > 0 and r["build_s"] > 0
    assert res["rows"][1]["gpu_allocated"] > 0


@pytest.mark.slow
def test_fill_in_windows_beside_fgd() -> None:
    res = run_fill(["multigpu50"], [1], ["fgd", "anneal:fgd?window=500&sweeps=2&homes=profile"],
                   workers=1, echo=lambda _: None)
    runs = res["runs"]["multigpu50"]
    assert 80.0 < runs["fgd"][1] <= 100.0
    assert 80.0 < runs["anneal:fgd?window=500&sweeps=2&homes=profile"][1] <= 100.0


def test_cli_bench_anneal_gap(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    r = CliRunner().invoke(main, ["bench", "anneal", "--part", "gap", "--seeds", "2",
                                  "--nodes", "10", "--pods", "12", "--sweeps", "1,4",
                                  "--limit-s", "10", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "| sweeps |" in r.output and out.exists()
    bad = CliRunner().invoke(main, ["bench", "anneal", "--part", "quantum"])
    assert bad.exit_code == 2 and "--part" in bad.output
