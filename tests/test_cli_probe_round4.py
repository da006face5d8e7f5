"""Round four of the command-line probe (2026-12-07): a policy promoted that the gate
never measured, options read as their opposite, repeated seeds judged as more seeds,
merge files that gave tracebacks or a hang, and checks that came only after hours of
work. Each is now an error naming the option or field (exit 2), before the work.

CLI cases run in-process (CliRunner) in an empty working directory.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from smartsched.model.errors import ValidationError
from tests.test_cli_probe_round3 import _refused, _run, _workdir  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]
S0 = ROOT / "models" / "ppo_shortlist_online_s0"
S1 = ROOT / "models" / "ppo_shortlist_online_s1"


# ------------------------------------------------------------------ the gate's store
def test_the_gate_will_not_store_a_candidate_with_options(tmp_path: Path) -> None:
    """The gate measured the three-member ensemble, the store kept its first folder and
    promoted it (exit 0)."""
    (tmp_path / "gate.yaml").write_text("cluster: nonesuch\n")  # the gate would fail later
    out = _refused(["policy", "gate", "--candidate", f"rl:{S0}?ensemble={S1}",
                    "--incumbent", "k8s-default", "--config", "gate.yaml",
                    "--store", "store"], "--store", "without options")
    assert "nonesuch" not in out and not (tmp_path / "store").exists()


def test_the_gate_checks_its_store_before_the_episodes(tmp_path: Path) -> None:
    (tmp_path / "gate.yaml").write_text("cluster: nonesuch\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("not a store")
    _refused(["policy", "gate", "--candidate", f"rl:{S0}", "--incumbent", "k8s-default",
              "--config", "gate.yaml", "--store", "mine"], "store", "holds other files")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "log.jsonl").write_text('{"event": "add"}\nnot json\n')
    _refused(["policy", "gate", "--candidate", f"rl:{S0}", "--incumbent", "k8s-default",
              "--config", "gate.yaml", "--store", "bad"], "store", "line 2")
    assert (bad / "log.jsonl").read_text() == '{"event": "add"}\nnot json\n'


# ------------------------------------------------------------------ rl: options
def test_an_empty_class_list_is_refused_not_read_as_every_class() -> None:
    from smartsched.scheduling.base import make_scheduler

    for spec in (f"rl:{S0}?classes=", f"rl:{S0}?classes=,"):
        with pytest.raises(ValidationError) as e:
            make_scheduler(spec, 0)
        assert e.value.field == "scheduler.classes"


def test_a_plus_in_a_member_folder_is_itself(tmp_path: Path) -> None:
    """``ensemble=fake/s1+copy`` looked for "s1 copy"; the path before '?' kept its '+'."""
    from smartsched.scheduling.base import make_scheduler

    member = tmp_path / "s1+copy"
    shutil.copytree(S1, member)
    sched = make_scheduler(f"rl:{S0}?ensemble={member}", 0)
    assert len(sched.members) == 1


# ------------------------------------------------------------------ seeds
@pytest.mark.parametrize("seeds", ["5,5", "1-3,2", "1_000", "\u0663"])
def test_a_seed_list_with_a_repeat_or_odd_digits_is_refused(seeds: str) -> None:
    """``--seeds 5,5`` passed the two-seed minimum and reported zero-width intervals."""
    _refused(["bench", "heldout", "--seeds", seeds, "--schedulers", "fgd"], "--seeds")


# ------------------------------------------------------------------ heldout --merge
def _metrics(x: float) -> dict[str, Any]:
    return {"usage_on_pct": {"cpu": 30.0 + x, "gpu": 40.0}, "cross_zone_gb_per_h": 10.0,
            "classes": {"ai-train": {"start_latency_all_s": {"p95": 100.0 + x}},
                        "online": {"queueing_delay_s": {"p95": 0.0}}},
            "slo": {"online_contended_time_pct": 1.0, "latency_violations": 5.0}}


def _merge_file(path: Path, seeds: list[int], **edit: Any) -> Path:
    runs = [{"scheduler": s, "seed": seed, "metrics": _metrics(seed % 7)}
            for s in ("k8s-default", "fgd") for seed in seeds]
    if edit:
        runs[0] = {**runs[0], **edit}
    doc = {"cluster": "medium", "workload": "mixed", "hours": 24.0, "warmup_hours": 6.0,
           "runs": runs}
    path.write_text(json.dumps(doc))
    return path


def test_merge_needs_no_scheduler_it_will_not_run_and_keeps_its_inputs(tmp_path: Path
                                                                       ) -> None:
    """From another folder the default --schedulers (a policy folder relative to the
    repository) could not be built, and --merge was refused; --json onto an input wrote a
    summary without runs over it."""
    a = _merge_file(tmp_path / "a.json", [1, 2])
    b = _merge_file(tmp_path / "b.json", [3, 4])
    code, out = _run(["bench", "heldout", "--merge", str(a), "--merge", str(b),
                      "--json", "v.json"])
    assert code == 0, out
    assert json.loads((tmp_path / "v.json").read_text())["seeds"] == [1, 2, 3, 4]
    before = a.read_text()
    _refused(["bench", "heldout", "--merge", str(a), "--merge", str(b), "--json", str(a)],
             "--json", "--merge")
    assert a.read_text() == before


@pytest.mark.parametrize("edit,field", [
    ({"metrics": {}}, "merge[0].runs[0].metrics"),
    ({"metrics": {"usage_on_pct": {"cpu": "abc"}}}, "merge[0].runs[0].metrics.usage_on_pct.cpu"),
    ({"metrics": {"cross_zone_gb_per_h": [1]}}, "merge[0].runs[0].metrics.cross_zone_gb_per_h"),
    ({"seed": True}, "merge[0].runs[0]"),
    ({"seed": -30000}, "merge[0].runs[0].seed"),
])
def test_a_merged_run_with_bad_figures_is_named(tmp_path: Path, edit: dict, field: str
                                                ) -> None:
    a = _merge_file(tmp_path / "a.json", [1, 2], **edit)
    b = _merge_file(tmp_path / "b.json", [3, 4])
    _refused(["bench", "heldout", "--merge", str(a), "--merge", str(b)], field)


def test_merge_reads_regular_files_only(tmp_path: Path) -> None:
    """A FIFO hung until killed; /dev/zero filled memory; deep nesting was a
    RecursionError traceback."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    _refused(["bench", "heldout", "--merge", str(fifo)], "merge[0]", "not a regular file")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    _refused(["bench", "heldout", "--merge", str(deep)], "merge[0]")


def test_a_report_is_not_written_into_a_trained_policy(tmp_path: Path) -> None:
    """``simulate --json models/p/smartsched_policy.json`` replaced the model's own
    description, exit 0."""
    pol = tmp_path / "pol"
    shutil.copytree(S0, pol)
    before = (pol / "smartsched_policy.json").read_bytes()
    _refused(["simulate", "--cluster", "nonesuch", "--json",
              str(pol / "smartsched_policy.json")], "--json", "trained model")
    assert (pol / "smartsched_policy.json").read_bytes() == before


# ------------------------------------------------------------------ distill, up front
def _distill(out: str, *more: str) -> list[str]:
    return ["distill", "--teacher", f"rl:{S0}", "--output-dir", out, "--seeds", "1",
            "--val-seeds", "2", "--hours", "0.5", "--warmup-hours", "0", *more]


def test_distill_loads_its_init_before_collecting(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(S0, broken)
    weights = next(p for p in broken.iterdir() if p.name.startswith("module_weights"))
    weights.write_bytes(weights.read_bytes()[:100])
    out = _refused(_distill("student", "--init", str(broken)), "init")
    assert "collecting" not in out


def test_distill_refuses_outputs_it_would_find_wrong_only_at_the_end(tmp_path: Path
                                                                    ) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert "collecting" not in _refused(_distill("link"), "output_dir", "link")
    (tmp_path / "d3.distill.json").mkdir()
    assert "collecting" not in _refused(_distill("d3"), "output_dir", "summary")
    inside = tmp_path / "teacher"
    shutil.copytree(S0, inside)
    args = _distill(str(inside / "sub"))
    args[2] = f"rl:{inside}"
    assert "collecting" not in _refused(args, "output_dir", "inside")
    args = _distill("x")
    args[args.index("--hours") + 1] = "8000"
    args[args.index("--warmup-hours") + 1] = "1000"
    _refused(args, "warmup_hours", "8784")


# ------------------------------------------------------------------ twin, bench rl
def test_a_warm_up_past_the_traces_last_arrival_is_refused() -> None:
    """The run measured nothing and reported 0 pods, exit 0."""
    from smartsched.model.pod import Pod
    from smartsched.scheduling.run import build_run

    pods = [Pod(id=f"p{i}", cpu_milli=100, memory_mib=64, arrival=600.0 * i,
                duration=60.0) for i in range(5)]
    with pytest.raises(ValidationError) as e:
        build_run("small", pods, "k8s-default", mode="replay", warmup_hours=2.0)
    assert e.value.field == "warmup_hours"
    build_run("small", pods, "k8s-default", mode="replay", warmup_hours=0.5)


def test_the_rl_bench_names_a_size_too_small_for_its_trace(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    d = Path(os.environ.get("SMARTSCHED_DATA_DIR", "../shared/data"))
    d = d if d.is_absolute() else (ROOT / d).resolve()  # relative to the repository
    if not (d / "alibaba-openb-gpu-2023").is_dir():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"public traces not found at {d}")
        pytest.skip(f"public traces not found at {d}")
    monkeypatch.setenv("SMARTSCHED_DATA_DIR", str(d))
    _refused(["bench", "rl", "--latency-only", "--sizes", "2"], "sizes")
    _refused(["bench", "rl", "--latency-only", "--policy", ""], "--policy")


def test_loading_a_policy_logs_no_deprecation_line() -> None:
    """Every load logged RLModule's own deprecation WARNING, printed before the CLI's
    one-line errors (each error two lines). Ray's loggers do not propagate to the root:
    the record is caught on the logger itself."""
    import logging

    import ray.rllib  # noqa: F401 (its loggers exist once it is imported)

    from smartsched.rl.artifact import read_module

    seen: list[logging.LogRecord] = []
    catch = logging.Handler()
    catch.emit = seen.append  # type: ignore[method-assign]
    for name in ("ray", "ray._common.deprecation"):
        logging.getLogger(name).addHandler(catch)
    try:
        read_module(S0)
    finally:
        for name in ("ray", "ray._common.deprecation"):
            logging.getLogger(name).removeHandler(catch)
    assert not [r for r in seen if "deprecated" in r.getMessage()]
