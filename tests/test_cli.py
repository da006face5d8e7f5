"""End-to-end through the real ``smartsched`` command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest


def smartsched(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "smartsched.cli", *args], capture_output=True,
                          text=True, timeout=600, check=False)


def test_simulate_mixed_replay_writes_report(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = smartsched("simulate", "--cluster", "small", "--workload", "mixed", "--scheduler",
                   "random", "--hours", "6", "--seed", "3", "--out", str(out), "--json",
                   str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    assert "GPU allocation rate" in r.stdout
    rep = json.loads((out / "report.json").read_text())
    assert rep["scheduler"] == "random" and rep["mode"] == "replay" and rep["seed"] == 3
    m = rep["metrics"]
    for key in ("gpu_allocation_rate", "energy_kwh", "carbon_kg", "cost_usd", "fairness_jain",
                "cross_zone_gb_per_h", "classes", "slo", "decisions_per_second"):
        assert key in m
    assert 0 <= m["gpu_allocation_rate"] <= 100
    assert rep["decisions"] > 0 and rep["wall_seconds"] > 0
    ts = pq.read_table(out / "timeseries.parquet")
    assert ts.num_rows >= 6 * 12 and "alloc_gpu_pct" in ts.column_names
    for png in ("utilization.png", "queue.png", "start_latency_cdf.png"):
        assert (out / png).stat().st_size > 1000
    assert json.loads((tmp_path / "r.json").read_text())["metrics"] == m


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        # an output folder that cannot be made: the OS's reason and the path, one line
        (["simulate", "--no-plots", "--no-progress", "--hours", "0.05", "--out",
          "/proc/nope"], "/proc/nope"),
        # a seed range is checked before it is expanded (this one would not fit in memory)
        (["bench", "quality", "--hours", "0.05", "--seeds", "0-99999999999"], "seed"),
        (["bench", "fgd", "--seeds", "1", "--schedulers", "random", "--workers", "-1"],
         "--workers"),
        (["bench", "heldout", "--seeds", "5-3"], "seed"),
        # each seed-list option is named, and checked before any part runs (the fill
        # part's seeds used to fail a minute in, after the gap part)
        (["bench", "anneal", "--fill-seeds", "abc"], "'--fill-seeds'"),
        # a scheduler typo is refused before the baseline's runs, naming its option
        (["bench", "heldout", "--schedulers", "bogus", "--seeds", "1"], "'--schedulers'"),
        (["bench", "speed", "--profiles", "bogus", "--skip-large"], "'--profiles'"),
        # an output file whose folder cannot be made fails before the work, not after
        (["bench", "anneal", "--part", "gap", "--seeds", "0", "--nodes", "5", "--pods", "5",
          "--json", "/proc/nope/r.json"], "'--json'"),
        # a settings model's own check (NaN passes click's range) is one line too
        (["bench", "gate", "--hours", "nan"], "hours"),
        # a list that names nothing printed an empty table (or nothing) and exited 0
        (["bench", "fgd", "--variants", ",", "--seeds", "1"], "'--variants'"),
        (["bench", "quality", "--schedulers", ",", "--seeds", "0"], "'--schedulers'"),
        (["bench", "telemetry", "--clusters", ""], "'--clusters'"),
        (["bench", "gate", "--kinds", ",,"], "'--kinds'"),
    ],
)
def test_bad_paths_seeds_and_workers_are_one_line_errors(args: list[str], needle: str) -> None:
    r = smartsched(*args)
    assert r.returncode == 2, r.stderr[-500:]
    assert "Traceback" not in r.stderr and needle in r.stderr


@pytest.mark.slow
def test_simulate_openb_fill(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "fill"
    r = smartsched("simulate", "--cluster", "openb-gpu", "--workload", "openb:default",
                   "--mode", "fill", "--inflate", "1.3", "--seed", "42", "--out", str(out))
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "report.json").read_text())["metrics"]
    curve = m["gpu_allocation_curve"]
    assert curve[-1]["arrived_gpu_pct"] >= 125
    assert 50 < m["gpu_allocation_rate"] <= 100
    assert (out / "gpu_allocation_curve.png").is_file()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--cluster", "nonesuch"], "cluster"),
        (["--workload", "openb:nonesuch"], "workload"),
        (["--workload", "whatever.txt"], "workload"),
        (["--scheduler", "oracle"], "scheduler"),
        (["--hours", "-3"], "hours"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], needle: str) -> None:
    r = smartsched("simulate", *args, "--no-plots")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0]
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("text", ["", "compliance: []\n", "[]\n", "''\n", "0\n"])
def test_an_empty_compliance_file_is_refused_not_read_as_no_policy(tmp_path: Path,
                                                                   text: str) -> None:
    """An empty list, text or 0 (given whole or under ``compliance:``) ran with no policy
    at all, as an empty file once did."""
    f = tmp_path / "policy.yaml"
    f.write_text(text)
    r = smartsched("simulate", "--compliance", str(f), "--hours", "0.1", "--no-plots")
    assert r.returncode == 2 and "policy is empty" in r.stderr, r.stderr[-300:]


def test_corrupt_trace_file_is_one_line(tmp_path: Path) -> None:
    f = tmp_path / "pods.csv"
    f.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,abc,10,0,0\n")
    r = smartsched("simulate", "--workload", str(f), "--no-plots")
    assert r.returncode == 2
    assert "cpu_milli (row 0)" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_demo_runs_two_schedulers(tmp_path: Path) -> None:
    r = smartsched("demo", "--out", str(tmp_path / "demo"), "--hours", "6",
                   "--schedulers", "first-fit,random")
    assert r.returncode == 0, r.stderr
    assert "first-fit" in r.stdout and "random" in r.stdout
    reports = json.loads((tmp_path / "demo" / "comparison.json").read_text())
    assert [x["scheduler"] for x in reports] == ["first-fit", "random"]
    assert (tmp_path / "demo" / "first-fit" / "utilization.png").is_file()


@pytest.mark.parametrize(("args", "option"), [
    (["--mode", "fill", "--warmup-hours", "3"], "'--warmup-hours'"),
    (["--mode", "fill", "--start-hours", "2"], "'--start-hours'"),
    (["--inflate", "2"], "'--inflate'"),
])
def test_an_option_of_the_other_simulation_mode_is_refused(args: list[str],
                                                           option: str) -> None:
    """Each was ignored without a word: a fill run with a warm-up measured from hour 0."""
    from click.testing import CliRunner

    from smartsched.cli import main

    r = CliRunner().invoke(main, ["simulate", "--cluster", "small", *args])
    assert r.exit_code == 2 and option in r.output and "mode only" in r.output, r.output
