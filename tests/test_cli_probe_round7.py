"""The seventh probe of the command line (2026-12-07): each case failed before its fix.

Data loss: ``--json`` replaced a policy store's pointer (the store lost its current
version), an audit log's signed heads, and a file a link pointed to inside a store;
``simulate --out`` wrote its report into a trained policy's folder (a later ``policy
stage`` copied it into the store), and ``--overwrite`` deleted the earlier report before
the new one was whole (a failure while writing left neither).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from smartsched.cli import main

SIM = ["simulate", "--cluster", "small", "--hours", "0.05", "--no-plots", "--no-progress"]


def _refused(args: list[str], option: str, needle: str) -> None:
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, (r.exit_code, r.output[-500:])
    assert option in r.output and needle in r.output, r.output[-500:]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A policy store's folder as ``rl.versions`` keeps it."""
    root = tmp_path / "store"
    (root / "versions" / "v0001").mkdir(parents=True)
    (root / "store.json").write_text(json.dumps({"current": "v0001", "history": ["v0001"]}))
    return root


def test_json_refuses_a_policy_store_and_a_link_into_one(tmp_path: Path, store: Path) -> None:
    before = (store / "store.json").read_bytes()
    _refused([*SIM, "--json", str(store / "store.json")], "--json", "is a policy store")
    _refused([*SIM, "--json", str(store / "new.json")], "--json", "is a policy store")
    (tmp_path / "link.json").symlink_to(store / "store.json")
    _refused([*SIM, "--json", str(tmp_path / "link.json")], "--json", "is a link into it")
    assert (store / "store.json").read_bytes() == before


def test_json_refuses_an_audit_logs_heads_and_its_folder(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from smartsched.audit.log import AuditLog

    key = Ed25519PrivateKey.generate()
    with AuditLog(tmp_path / "log", tmp_path / "heads" / "h.jsonl", key, autoseal=False,
                  fsync=False) as log:
        log.append("decision", "probe", {"i": 1})
        log.seal()
    heads = tmp_path / "heads" / "h.jsonl"
    lines = heads.read_text().splitlines()
    heads.write_text(lines[0] + "\n")  # one head: also one JSON document
    before = heads.read_bytes()
    _refused([*SIM, "--json", str(heads)], "--json", "signed heads")
    _refused([*SIM, "--json", str(tmp_path / "log" / "r.json")], "--json", "audit log")
    assert heads.read_bytes() == before


def test_out_refuses_a_model_folder_and_a_report_name_that_is_no_file(tmp_path: Path,
                                                                       store: Path) -> None:
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "smartsched_policy.json").write_text("{}")
    _refused([*SIM, "--out", str(policy)], "--out", "holds a trained model")
    _refused([*SIM, "--out", str(store)], "--out", "is a policy store")
    assert sorted(p.name for p in policy.iterdir()) == ["smartsched_policy.json"]
    out = tmp_path / "r1"
    (out / "queue.png").mkdir(parents=True)
    _refused([*SIM, "--overwrite", "--out", str(out)], "--out", "not a regular file")


def test_an_earlier_report_stays_until_the_new_one_is_whole(tmp_path: Path) -> None:
    from smartsched.bench.report import REPORT_FILES, staged_report

    out = tmp_path / "r"
    out.mkdir()
    for name in REPORT_FILES:
        (out / name).write_text(f"old {name}")
    with pytest.raises(RuntimeError), staged_report(out) as stage:
        (stage / "timeseries.parquet").write_text("new")
        raise RuntimeError("a plot failed")
    assert {p.name: p.read_text() for p in out.iterdir()} == {
        n: f"old {n}" for n in REPORT_FILES}  # as it was, no staging folder left
    with staged_report(out) as stage:  # a run without plots: the old plots go
        (stage / "timeseries.parquet").write_text("new")
        (stage / "report.json").write_text("{}")
    assert {p.name: p.read_text() for p in out.iterdir()} == {
        "timeseries.parquet": "new", "report.json": "{}"}


def test_simulate_overwrite_replaces_the_report_whole(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = CliRunner().invoke(main, [*SIM, "--out", str(out)])
    assert r.exit_code == 0, r.output
    first = json.loads((out / "report.json").read_text())
    r = CliRunner().invoke(main, [*SIM, "--seed", "1", "--overwrite", "--out", str(out)])
    assert r.exit_code == 0, r.output
    second = json.loads((out / "report.json").read_text())
    assert (first["seed"], second["seed"]) == (0, 1)
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "timeseries.parquet"]


@pytest.mark.parametrize("name", ["log.jsonl", "store.json"])
def test_a_fifo_in_a_policy_store_is_refused_not_waited_on(tmp_path: Path, store: Path,
                                                           name: str) -> None:
    """``policy versions`` and ``policy rollback`` waited for ever on a FIFO as the
    store's log or pointer (a rollback here has no earlier version: refused before it
    would append to the log)."""
    import os

    (store / name).unlink(missing_ok=True)
    os.mkfifo(store / name)
    for cmd in (["policy", "versions"], ["policy", "rollback"])[:1 + (name == "store.json")]:
        r = CliRunner().invoke(main, [*cmd, "--store", str(store)])
        assert r.exit_code == 2, (cmd, r.output)
        assert "not a regular file" in r.output and name in r.output, r.output


def test_bench_quality_pairs_repeat_a_workload_or_a_cluster_but_not_a_pair() -> None:
    """Two workloads on one cluster (or one on two) were refused as a name given twice,
    although the lists pair by position; one pair given twice still is."""
    args = ["bench", "quality", "--schedulers", "random", "--hours", "0.05",
            "--warmup-hours", "0", "--seeds", "0"]
    r = CliRunner().invoke(main, [*args, "--workload", "mixed,mixed", "--cluster",
                                  "small,small"])
    assert r.exit_code == 2 and "'mixed on small' twice" in r.output, r.output
    r = CliRunner().invoke(main, [*args, "--workload", "mixed,mixed:iiot", "--cluster",
                                  "small,small"])
    assert r.exit_code == 0, r.output
    assert "**mixed on small" in r.output and "**mixed:iiot on small" in r.output


def test_an_openb_variant_with_no_file_is_refused_before_any_part_runs() -> None:
    for args in (["bench", "anneal", "--part", "gap,fill", "--seeds", "0", "--nodes", "2",
                  "--pods", "1", "--sweeps", "1", "--limit-s", "1", "--variants", "nosuch"],
                 ["bench", "fgd", "--variants", "default,nosuch", "--seeds", "1"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2 and "'--variants'" in r.output, r.output
        assert "nosuch" in r.output and "Gap" not in r.output and "gap" not in r.output


def test_an_empty_config_file_is_refused_not_read_as_every_default(tmp_path: Path) -> None:
    """``train --config empty.yaml`` started a default training run (an hour here)."""
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    for args in (["train", "--config", str(empty)], ["policy", "gate", "--config", str(empty),
                                                     "--candidate", "bestfit", "--incumbent",
                                                     "k8s-default"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2 and "is empty" in r.output, (args, r.output)


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
users: [{name: u, user: {token: t}}]
"""


def test_k8s_scheduler_refuses_a_fifo_kubeconfig_and_names_a_busy_metrics_port(
        tmp_path: Path) -> None:
    import os
    import socket

    os.mkfifo(tmp_path / "kc")
    r = CliRunner().invoke(main, ["k8s", "scheduler", "--once", "--kubeconfig",
                                  str(tmp_path / "kc")])
    assert r.exit_code == 2 and "'--kubeconfig'" in r.output, r.output
    assert "not a regular file" in r.output
    (tmp_path / "kc.yaml").write_text(KUBECONFIG)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = CliRunner().invoke(main, ["k8s", "scheduler", "--once", "--kubeconfig",
                                      str(tmp_path / "kc.yaml"), "--metrics-host",
                                      "127.0.0.1", "--metrics-port", str(port)])
    assert r.exit_code == 2 and "'--metrics-port'" in r.output, r.output
    assert f"127.0.0.1:{port}" in r.output


def test_json_refuses_a_file_named_inside_a_spec(tmp_path: Path) -> None:
    """``--workload mixed:prof.json --json prof.json`` replaced the profile it had just
    read: the check of outputs against inputs read whole option values only."""
    from smartsched.outputs import input_paths

    prof = tmp_path / "prof.json"
    prof.write_text("{}")
    before = prof.read_bytes()
    _refused([*SIM, "--workload", f"mixed:{prof}", "--json", str(prof)], "--json",
             "replace that input")
    assert prof.read_bytes() == before
    assert input_paths([f"lookahead:rl:{prof}?k=2,fgd"]) == [str(prof)]


def test_demo_and_model_outputs_keep_out_of_other_models_and_stores(tmp_path: Path,
                                                                    store: Path) -> None:
    """``demo --out`` wrote its comparison into a policy folder or a store, and each
    scheduler's report went to ``--out/<spec>`` (``../../prof/mine.yaml`` outside it);
    ``forecast train --out`` wrote a forecaster into a policy's folder."""
    from smartsched.bench.demo import report_folder_name

    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "smartsched_policy.json").write_text("{}")
    _refused(["demo", "--out", str(policy), "--hours", "0.1"], "--out", "trained model")
    _refused(["demo", "--out", str(store), "--hours", "0.1"], "--out", "policy store")
    _refused(["forecast", "train", "--data", "x.csv", "--out", str(policy), "--overwrite"],
             "--out", "trained model")
    for spec in ("../../prof/mine.yaml", "/abs/p.yaml", "rl:models/ppo", "..", "k8s-default"):
        name = report_folder_name(spec)
        assert "/" not in name and not name.startswith(".") and name, (spec, name)
    assert report_folder_name("k8s-default") == "k8s-default"


def test_options_of_a_part_that_does_not_run_and_an_out_that_is_no_folder() -> None:
    """``bench sandbox --skip-twin`` dropped the twin's options without a word (a typo in
    --cluster included); ``simulate --out /dev/null`` ran the whole simulation first."""
    _refused(["bench", "sandbox", "--skip-twin", "--cluster", "nosuch"], "--cluster",
             "--skip-twin")
    _refused([*SIM, "--out", "/dev/null"], "--out", "not a folder")


def test_smaller_things_of_round_7(tmp_path: Path) -> None:
    """A 100,000-character spec was echoed whole into a "one line" error; a finance
    profile whose longest job is shorter than its mean made every job the cap, and a
    tenant of spaces passed; the store's pointer was unreadable to another user (0600)."""
    import os
    import stat

    r = CliRunner().invoke(main, [*SIM, "--scheduler", "x" * 100_000])
    assert r.exit_code == 2 and len(r.output) < 2_000, len(r.output)
    r = CliRunner().invoke(main, [*SIM, "--workload", "y" * 100_000])
    assert r.exit_code == 2 and len(r.output) < 2_000, len(r.output)
    import yaml

    from smartsched.workloads.finance import load_profile

    base = Path(__file__).resolve().parents[1] / "platform/smartsched/workloads/profiles_data"
    doc = yaml.safe_load((base / "finance.yaml").read_text())
    for part, key, value, field in (("batch", "duration_minutes_max", 1, "duration_minutes"),
                                    ("online", "tenant", "   ", "tenant")):
        bad = {**doc, part: {**doc[part], key: value}}
        (tmp_path / "f.yaml").write_text(yaml.safe_dump(bad))
        with pytest.raises(Exception, match=field):
            load_profile(str(tmp_path / "f.yaml"))
    from smartsched.rl.versions import PolicyStore

    st = PolicyStore(tmp_path / "s")
    umask = os.umask(0o022)
    try:
        st._write_pointer({"current": None, "history": []})
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "s" / "store.json").stat().st_mode) == 0o644
