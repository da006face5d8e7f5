"""The fifth probe of the command line (2026-12-07): each case failed before its fix.

Data loss: ``audit verify --json`` / ``audit prove --out`` wrote over the log's signed
heads or a segment; ``audit keygen --out k.pub`` wrote the public key over the private
one, and an existing ``.pub`` was replaced; ``--json`` replaced a forecaster's own
description, a trace, or the command's own input; ``tune`` and ``demo`` replaced an
earlier run's results. Silent wrong answers: a variant named twice doubled a finance
row; ``bench anneal`` printed an empty table, exit 0, and dropped options of parts it did
not run. Tracebacks: ``bench carbon --json`` (numpy integers), a carbon series of
zeros, a token a header cannot carry, a ``--plot`` name no image format has. And the
messages that named the wrong thing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from smartsched.model.errors import ValidationError
from tests.test_cli import smartsched

SIM = ("simulate", "--cluster", "small", "--hours", "0.05", "--no-plots", "--no-progress")


def _refused(r, option: str, needle: str = "") -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])
    assert "Traceback" not in r.stderr
    assert option in r.stderr, r.stderr[-500:]
    assert needle in r.stderr, r.stderr[-500:]


@pytest.fixture(scope="module")
def audit_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cryptography.hazmat.primitives import serialization

    from smartsched.audit.log import AuditLog

    root = tmp_path_factory.mktemp("audit5")
    key = Ed25519PrivateKey.generate()
    (root / "key.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with AuditLog(root / "log", root / "heads.jsonl", key, autoseal=False,
                  fsync=False) as log:
        for i in range(5):
            log.append("decision", "probe", {"i": i})
    return root


def _log_args(root: Path) -> list[str]:
    return ["--log", str(root / "log"), "--heads", str(root / "heads.jsonl")]


def test_audit_outputs_never_replace_the_log_or_its_heads(audit_log: Path) -> None:
    heads = (audit_log / "heads.jsonl").read_bytes()
    segments = {p: p.read_bytes() for p in (audit_log / "log").iterdir()}
    r = smartsched("audit", "verify", *_log_args(audit_log), "--public-key",
                   str(audit_log / "key.pub"), "--json", str(audit_log / "heads.jsonl"))
    _refused(r, "'--json'")
    seg = next(p for p in segments if p.suffix == ".parquet")
    for out in (audit_log / "heads.jsonl", seg, audit_log / "log" / "new.proof"):
        r = smartsched("audit", "prove", *_log_args(audit_log), "--seq", "0", "--out", str(out))
        _refused(r, "'--out'", "part of the audit log")
    other = audit_log / "notes.txt"
    other.write_text("mine\n")
    r = smartsched("audit", "prove", *_log_args(audit_log), "--seq", "0", "--out", str(other))
    _refused(r, "'--out'", "not an earlier proof")
    assert other.read_text() == "mine\n"
    assert (audit_log / "heads.jsonl").read_bytes() == heads
    assert {p: p.read_bytes() for p in (audit_log / "log").iterdir()} == segments
    # A proof may replace an earlier proof (and its record), and verification still holds.
    proof = audit_log / "p" / "r0.proof"
    proof.parent.mkdir()
    for _ in range(2):
        r = smartsched("audit", "prove", *_log_args(audit_log), "--seq", "0", "--out",
                       str(proof))
        assert r.returncode == 0, r.stderr
    r = smartsched("audit", "verify", *_log_args(audit_log), "--public-key",
                   str(audit_log / "key.pub"), "--json", str(audit_log / "p" / "v.json"))
    assert r.returncode == 0, r.stderr
    # ... and so may a second verify report replace the first.
    r = smartsched("audit", "verify", *_log_args(audit_log), "--public-key",
                   str(audit_log / "key.pub"), "--json", str(audit_log / "p" / "v.json"))
    assert r.returncode == 0, r.stderr


def test_keygen_never_writes_one_key_over_another(tmp_path: Path) -> None:
    r = smartsched("audit", "keygen", "--out", str(tmp_path / "k.pub"))
    assert r.returncode == 2 and "both keys" in r.stderr, r.stderr
    assert not (tmp_path / "k.pub").exists()
    (tmp_path / "y.pub").write_text("my old public key\n")
    r = smartsched("audit", "keygen", "--out", str(tmp_path / "y.pem"))
    assert r.returncode == 2 and "y.pub exists" in r.stderr, r.stderr
    assert (tmp_path / "y.pub").read_text() == "my old public key\n"
    assert not (tmp_path / "y.pem").exists()  # no private key without its public one
    r = smartsched("audit", "keygen", "--out", str(tmp_path / "z.pem"))
    assert r.returncode == 0 and (tmp_path / "z.pub").is_file()


def test_a_report_never_replaces_a_model_a_trace_or_an_input(tmp_path: Path) -> None:
    fc = tmp_path / "fc"
    fc.mkdir()
    (fc / "forecaster.json").write_text('{"targets": ["cpu"]}\n')
    r = smartsched(*SIM, "--json", str(fc / "forecaster.json"))
    _refused(r, "'--json'", "trained model")
    r = smartsched(*SIM, "--json", str(fc / "other.json"))
    _refused(r, "'--json'", "trained model")
    trace = tmp_path / "pods.csv"
    trace.write_text("a,b\n1,2\n")
    r = smartsched(*SIM, "--json", str(trace))
    _refused(r, "'--json'", "not a JSON report")
    assert trace.read_text() == "a,b\n1,2\n"
    # An input that is itself JSON (JSON is YAML: a cluster file) is refused as an input.
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({
        "name": "t", "sites": [{"name": "s1", "kind": "cloud"}],
        "zones": [{"name": "z1", "site": "s1"}],
        "nodes": [{"name": "n", "zone": "z1", "cpu_milli": 64000, "memory_mib": 262144,
                   "count": 2}]}))
    before = cluster.read_text()
    r = smartsched("simulate", "--cluster", str(cluster), "--hours", "0.05", "--no-plots",
                   "--no-progress", "--json", str(cluster))
    _refused(r, "'--json'", "--cluster")
    assert cluster.read_text() == before
    # An earlier report may be replaced, as before.
    rep = tmp_path / "r.json"
    for _ in range(2):
        r = smartsched(*SIM, "--json", str(rep))
        assert r.returncode == 0, r.stderr
    json.loads(rep.read_text())


def test_demo_keeps_an_earlier_demo_unless_told(tmp_path: Path) -> None:
    out = tmp_path / "dem"
    out.mkdir()
    (out / "comparison.txt").write_text("earlier\n")
    args = ("demo", "--out", str(out), "--hours", "0.1", "--warmup-hours", "0",
            "--schedulers", "k8s-default")
    r = smartsched(*args)
    _refused(r, "'--out'", "--overwrite")
    assert (out / "comparison.txt").read_text() == "earlier\n"
    r = smartsched(*args, "--overwrite")
    assert r.returncode == 0, r.stderr
    assert "k8s-default" in (out / "comparison.txt").read_text()


def test_a_sweep_keeps_an_earlier_sweeps_results_unless_told(tmp_path: Path) -> None:
    from smartsched.tuning.runner import run_sweep

    out = tmp_path / "tune"
    out.mkdir()
    (out / "summary.json").write_text('{"earlier": true}\n')
    sweep = Path(__file__).resolve().parents[1] / "tune_sweeps" / "reward_weights.yaml"
    with pytest.raises(ValidationError) as e:
        run_sweep(sweep, output_dir=str(out), echo=lambda _: None)
    assert e.value.field == "output_dir" and "--overwrite" in e.value.message
    assert not (out / "baseline.json").exists()
    assert (out / "summary.json").read_text() == '{"earlier": true}\n'


@pytest.mark.parametrize(("args", "option"), [
    (["bench", "finance", "--seeds", "0", "--variants", "k8s-default,k8s-default"],
     "--variants"),
    (["bench", "carbon", "--series", "gb-2020,gb-2020"], "--series"),
    (["bench", "gate", "--kinds", "identical,identical"], "--kinds"),
    (["bench", "anneal", "--part", "gap", "--sweeps", "1,1", "--seeds", "0", "--nodes", "2",
      "--pods", "2"], "--sweeps"),
    (["bench", "federation", "--references", ","], "--references"),
])
def test_a_list_naming_something_twice_or_nothing_is_refused(args: list[str],
                                                              option: str) -> None:
    _refused(smartsched(*args), option)


@pytest.mark.parametrize(("args", "option"), [
    (["--part", "gap", "--gang-share", "0.3"], "'--gang-share'"),
    (["--part", "gap", "--colocate", "2"], "'--colocate'"),
    (["--part", "speed", "--variants", "default"], "'--variants'"),
    (["--part", "fill", "--sweeps", "1,2"], "'--sweeps'"),
    (["--part", "gangs", "--colocate", "1e6"], "'--colocate'"),
])
def test_anneal_refuses_options_of_parts_it_does_not_run(args: list[str], option: str
                                                         ) -> None:
    _refused(smartsched("bench", "anneal", *args), option)


def test_anneal_with_nothing_to_compare_is_an_error() -> None:
    r = smartsched("bench", "anneal", "--part", "gap", "--seeds", "0", "--nodes", "2",
                   "--pods", "3", "--sweeps", "1", "--limit-s", "1e-300", "--workers", "1")
    assert r.returncode == 2 and "limit_s" in r.stderr and "Traceback" not in r.stderr, \
        r.stderr[-400:]


def test_reports_are_strict_json() -> None:
    from smartsched.outputs import json_text

    text = json_text({"p95": float("nan"), "n": np.int64(3), "x": np.float32(0.5),
                      "inf": -math.inf, "arr": np.array([1.0, np.nan]), "t": (1, 2),
                      "deep": [{"y": np.bool_(True)}]})
    assert json.loads(text, parse_constant=lambda c: pytest.fail(c)) == {
        "p95": None, "n": 3, "x": 0.5, "inf": None, "arr": [1.0, None], "t": [1, 2],
        "deep": [{"y": True}]}


def test_bench_carbon_writes_its_json_and_a_series_of_zeros_is_no_traceback(
        tmp_path: Path) -> None:
    r = smartsched("bench", "carbon", "--series", "gb-2020", "--jobs", "10", "--slack-hours",
                   "24", "--json", str(tmp_path / "gb.json"))
    assert r.returncode == 0, r.stderr[-400:]
    doc = json.loads((tmp_path / "gb.json").read_text())
    assert doc
    from smartsched.paths import data_dir

    src = data_dir() / "carbon-intensity-letswaitawhile-2020" / "gb_ci.csv"
    lines = src.read_text().splitlines()[:2000]
    head = lines[0].split(",")
    zero = tmp_path / "zero.csv"
    zero.write_text("\n".join([lines[0], *(f"{x.split(',')[0]},0" for x in lines[1:])]) + "\n")
    assert len(head) == 2
    r = smartsched("bench", "carbon", "--series", str(zero), "--jobs", "10", "--slack-hours",
                   "24")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-400:]


@pytest.mark.parametrize("name", ["week.txt", "noext"])
def test_a_plot_name_no_image_format_has_is_refused_before_the_work(tmp_path: Path,
                                                                    name: str) -> None:
    r = smartsched("bench", "carbon", "--series", "gb-2020", "--jobs", "10", "--plot",
                   str(tmp_path / name))
    _refused(r, "'--plot'", "image format")
    assert not list(tmp_path.iterdir())


def test_a_token_a_header_cannot_carry_is_named(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from smartsched.client import PlacementClient, ServiceUnreachable
    from smartsched.model.configfile import read_token_file

    with pytest.raises(ValidationError) as e:
        PlacementClient("http://127.0.0.1:9", token="\u20ac")
    assert e.value.field == "token" and "\u20ac" not in e.value.message
    monkeypatch.setenv("SMARTSCHED_API_TOKEN", "a\nb")
    with pytest.raises(ValidationError) as e:
        PlacementClient("http://127.0.0.1:9")
    assert e.value.field == "SMARTSCHED_API_TOKEN" and "one line" in e.value.message
    monkeypatch.delenv("SMARTSCHED_API_TOKEN")
    for text in ("\u65e5\u672c\n", "abc\ndef\n", "a b\n"):
        f = tmp_path / "tok"
        f.write_text(text)
        with pytest.raises(ValidationError) as e:
            read_token_file(f, "operator_token_file")
        assert e.value.field == "operator_token_file"
    r = smartsched("serve", "reload", "--url", "http://127.0.0.1:9", "--site", "a",
                   "--profile", "k8s-default", "--operator-token-file", str(f))
    _refused(r, "operator_token_file")
    # A URL's credentials are never shown.
    c = PlacementClient("http://user:secret@127.0.0.1:9", token="t" * 20, retries=0,
                        timeout_s=2)
    with pytest.raises(ServiceUnreachable) as e2:
        c.release("r1")
    assert "secret" not in str(e2.value) and "***@127.0.0.1:9" in str(e2.value)
    from smartsched.client import shown_url

    assert shown_url("user:secret@host:8000") == "***@host:8000"  # no scheme (review)


def test_messages_name_what_is_wrong(tmp_path: Path) -> None:
    from smartsched.forecast.data import _read_table
    from smartsched.k8s.nodelist import parse_node_list
    from smartsched.model.configfile import read_yaml_text
    from smartsched.rl.learning import load_learn_config

    r = smartsched("bench", "telemetry", "--clusters", "small", "--hours", "inf")
    _refused(r, "'--hours'", "finite")
    r = smartsched("audit", "verify", "--log", str(tmp_path), "--heads", __file__,
                   "--public-key", "")
    _refused(r, "'--public-key'", "empty")
    with pytest.raises(ValidationError) as e:
        load_learn_config({"store": ""})
    assert e.value.field == "learn.store" and "empty" in e.value.message
    for doc, field in (({"kind": "NodeList", "items": []}, "nodes.items"),
                       ({"kind": "NodeList", "items": None}, "nodes.items"),
                       ([], "nodes")):
        with pytest.raises(ValidationError) as e:
            parse_node_list(doc)
        assert e.value.field == field and "row" not in str(e.value)
    with pytest.raises(ValidationError) as e:
        _read_table(tmp_path)
    assert "folder" in e.value.message
    # YAML 1.2's exponent numbers are numbers (YAML 1.1 read 1e300 as text).
    assert read_yaml_text("pue: 1e300\nm: 2E-3\nname: e5", "x") == {
        "pue": 1e300, "m": 0.002, "name": "e5"}
