"""Round three of the command-line probe: bad input that still gave a traceback, a hang
(thousands of forked workers), a service listening where it was not asked to, or a
silently wrong answer. Each is now one error naming the option or field, with exit 2
(exit 1, "FAILED: ...", for the audit checks, whose answer is a verdict), before any
work starts.

CLI cases run in-process (CliRunner) in an empty working directory; where the fix is
an up-front check, the command line also carries a value a later stage would refuse
(``--cluster nonesuch``), so the test fails if the option is no longer checked first.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from smartsched.cli import main
from smartsched.model.errors import ValidationError


@pytest.fixture(autouse=True)
def _workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def _run(args: list[str]) -> tuple[int, str]:
    r = CliRunner().invoke(main, args)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    return r.exit_code, r.output


def _refused(args: list[str], *names: str) -> str:
    code, out = _run(args)
    assert code == 2, out
    for name in names:
        assert name in out, out
    return out


# ------------------------------------------------------------------ audit
@pytest.fixture
def audit_log(tmp_path: Path) -> dict[str, Path]:
    from smartsched.audit.keys import generate_key, load_private_key
    from smartsched.audit.log import AuditLog

    generate_key(tmp_path / "key.pem")
    with AuditLog(tmp_path / "log", tmp_path / "heads.jsonl",
                  load_private_key(tmp_path / "key.pem")) as log:
        for i in range(8):
            log.append("placement", "tenant:bank", {"pod": f"p{i}", "node": "n1"},
                       tenant="bank")
    return {"log": tmp_path / "log", "heads": tmp_path / "heads.jsonl",
            "pub": tmp_path / "key.pub"}


@pytest.mark.parametrize("value", ["1e30", "1e400", "-5", str(2**63)])
def test_verify_names_a_head_whose_numbers_cannot_be_signed(audit_log: dict[str, Path],
                                                            value: str) -> None:
    """last_seq 1e30 was a struct.error traceback (1e400: an OverflowError)."""
    heads = audit_log["heads"]
    heads.write_text(heads.read_text().replace('"last_seq":7', f'"last_seq":{value}'))
    code, out = _run(["audit", "verify", "--log", str(audit_log["log"]), "--heads",
                      str(heads), "--public-key", str(audit_log["pub"])])
    assert code == 1 and "FAILED" in out and "not a head" in out, out


@pytest.mark.parametrize("seq", ["1e400", "3.9", '"3"', "true", "NaN"])
def test_check_proof_takes_only_a_whole_record_number(audit_log: dict[str, Path],
                                                      tmp_path: Path, seq: str) -> None:
    """seq 1e400 was an OverflowError traceback; 3.9 and "3" were read as record 3 and
    the proof reported OK for a record the log does not hold."""
    proof = tmp_path / "p.bin"
    code, out = _run(["audit", "prove", "--log", str(audit_log["log"]), "--heads",
                      str(audit_log["heads"]), "--seq", "3", "--out", str(proof)])
    assert code == 0, out
    record = Path(str(proof) + ".record.json")
    args = ["audit", "check-proof", "--proof", str(proof), "--record", str(record),
            "--public-key", str(audit_log["pub"])]
    assert _run(args)[0] == 0  # the genuine record still checks
    text = record.read_text()
    record.write_text(text.replace('"seq": 3', f'"seq": {seq}'))
    code, out = _run(args)
    assert code == 1 and "FAILED" in out and "seq" in out, out


def test_audit_usage_refuses_a_rate_window_before_opening_the_log(tmp_path: Path) -> None:
    (tmp_path / "k.pem").write_text("unused")
    _refused(["audit", "usage", "--prometheus", "http://127.0.0.1:1", "--log", "log",
              "--heads", "h.jsonl", "--key-file", "k.pem", "--rate-window", "zz", "--once"],
             "'--rate-window'")
    assert not (tmp_path / "log").exists()


# ------------------------------------------------------------------ policy gate
@pytest.mark.parametrize("text", ["[1, 2]\n", "hello\n", "0\n"])
def test_gate_config_that_is_no_mapping_is_named_with_seeds(tmp_path: Path,
                                                            text: str) -> None:
    """With --seeds, a list or scalar file was a TypeError traceback and a file holding
    0 ran the gate on every default."""
    (tmp_path / "gate.yaml").write_text(text)
    _refused(["policy", "gate", "--candidate", "fgd", "--incumbent", "fgd", "--config",
              "gate.yaml", "--seeds", "3"], "error: gate")


# ------------------------------------------------------------------ workers
def test_workers_is_bounded() -> None:
    """--workers 100000 forked processes by the thousand (2,739 before the probe's
    timeout) and left them running."""
    _refused(["bench", "fgd", "--workers", "100000", "--variants", "nonesuch"],
             "'--workers'")


def _pid(_: int) -> int:
    return os.getpid()


def test_pool_never_starts_more_workers_than_jobs() -> None:
    from smartsched.pool import map_jobs

    assert map_jobs(_pid, [0], workers=64) == [os.getpid()]  # one job: no pool at all


# ------------------------------------------------------------------ bench sandbox
@pytest.mark.parametrize("options", ["validate=nope", "zzz=1", "&&&"])
def test_sandbox_options_checked_first(options: str) -> None:
    """They were found bad only after the latency measurement (and never with
    --skip-twin)."""
    _refused(["bench", "sandbox", "--profiles", "fgd", "--cluster", "nonesuch",
              "--options", options], "'--options'")
    _refused(["bench", "sandbox", "--profiles", "fgd", "--skip-twin", "--options", options],
             "'--options'", "--skip-twin")


# ------------------------------------------------------------------ federation
def test_federate_names_a_site_without_a_training_window(tmp_path: Path) -> None:
    """Series shorter than lookback + horizon failed in a site actor: a traceback of the
    actor's death after Ray had started."""
    rows = ["series_id,timestamp,cpu"] + [f"s{i},{t * 300},{10 + t}" for i in range(12)
                                          for t in range(10)]
    (tmp_path / "short.csv").write_text("\n".join(rows) + "\n")
    import ray

    running = ray.is_initialized()  # the suite's session Ray may be up already
    _refused(["federate", "--data", "short.csv", "--cluster", "large", "--rounds", "1",
              "--out", "fed"], "no training window")
    assert ray.is_initialized() == running  # refused before any Ray was started


# ------------------------------------------------------------------ services
@pytest.mark.parametrize("args", [
    ["serve", "--host", "", "--cluster", "nonesuch"],
    ["serve", "--host", " ", "--cluster", "nonesuch"],
    ["k8s", "extender", "--host", "", "--profile", "nonesuch"],
    ["telemetry", "serve", "--host", "", "--cluster", "nonesuch"],
])
def test_empty_host_is_refused(args: list[str]) -> None:
    """An empty host listens on every interface: serve --host '' started the service
    reachable from the network."""
    _refused(args, "'--host'")


# Hosts refused without asking a name server (so the test needs no DNS): a label over 63
# characters (the IDNA codec refuses it), brackets around an IPv6 address, and an address
# of another machine (TEST-NET-1, RFC 5737), which resolves but cannot be bound.
BAD_HOSTS = [("a" * 64 + ".example", "not a valid host name"),
             ("[::1]", "without brackets"),
             ("192.0.2.1", "not an address this machine can listen on")]


@pytest.mark.parametrize("host,says", BAD_HOSTS)
@pytest.mark.parametrize("command", [
    ["k8s", "extender", "--profile", "nonesuch"],
    ["serve", "--cluster", "nonesuch"],
    ["telemetry", "serve", "--cluster", "nonesuch"],
])
def test_a_host_no_service_can_listen_on_is_refused(command: list[str], host: str,
                                                    says: str) -> None:
    """A host that named nothing made uvicorn exit with the resolver's bare errno
    ('[Errno -2] Name or service not known', exit 0 for the extender), and one of another
    machine with the socket's; both are now refused as the option, before anything
    starts (the bad profile or cluster behind it is never reached)."""
    out = _refused([*command, "--host", host], "'--host'", says)
    assert "nonesuch" not in out


@pytest.mark.parametrize("host,says", [*BAD_HOSTS, ("", "is empty")])
def test_a_config_files_host_is_checked_alike(tmp_path: Path, host: str, says: str) -> None:
    """``http_options.host`` in the service's config file is where ``serve`` listens
    without --host: it is checked as --host is (an empty one listened on every
    interface)."""
    import yaml

    from smartsched.serving.local import http_address

    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "serve_apps"
                          / "placement.yaml").read_text())
    doc["http_options"]["host"] = host
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ValidationError, match=says) as e:
        http_address(tmp_path / "c.yaml", None, None)
    assert e.value.field == "config.http_options.host"


def test_loopback_host_is_accepted() -> None:
    """The check resolves and binds the host; the default loopback and 0.0.0.0 pass it
    (the bad cluster behind them is what is refused)."""
    for host in ("127.0.0.1", "0.0.0.0", "localhost"):
        out = _refused(["serve", "--host", host, "--cluster", "nonesuch"], "nonesuch")
        assert "'--host'" not in out


def test_serve_models_dir_that_is_a_file(tmp_path: Path) -> None:
    """It was read as missing, and the service started without the models."""
    (tmp_path / "models").write_text("x")
    _refused(["serve", "--models-dir", "models", "--cluster", "nonesuch"], "'--models-dir'")


@pytest.mark.parametrize("args", [["--site", "", "--profile", "fgd"],
                                  ["--site", "x", "--profile", " "]])
def test_reload_refuses_empty_names(args: list[str]) -> None:
    _refused(["serve", "reload", "--url", "http://127.0.0.1:1", *args], "is empty")


@pytest.mark.parametrize("warm", ["24", "1e9"])
def test_telemetry_warm_up_past_the_span(warm: str) -> None:
    """It was cut to the span without a word; the twin then restarted empty."""
    _refused(["telemetry", "serve", "--warm-hours", warm, "--hours", "24", "--cluster",
              "nonesuch"], "'--warm-hours'")


# ------------------------------------------------------------------ bench finance / carbon
@pytest.mark.parametrize("variants", ["", ","])
def test_finance_variants_naming_nothing(variants: str) -> None:
    """'' ran every variant."""
    _refused(["bench", "finance", "--variants", variants, "--cluster", "nonesuch"],
             "'--variants'")


def test_carbon_twin_series_shorter_than_a_run(tmp_path: Path) -> None:
    """The error said "the last start day is -1"."""
    rows = ["Time,Carbon Intensity"] + [f"2020-01-01 00:{m:02d}:00,100" for m in range(0, 60, 5)]
    (tmp_path / "ci.csv").write_text("\n".join(rows) + "\n")
    out = _refused(["bench", "carbon", "--twin", "--hours", "1", "--series", "ci.csv",
                    "--days", "0", "--variants", "agnostic", "--workers", "1"], "days")
    assert "no run fits" in out and "-1" not in out


# ------------------------------------------------------------------ input files
def test_compliance_residency_nowhere_and_bad_tenants() -> None:
    """residency {shop: []} let shop's pods run nowhere (they pended through the run);
    a tenant listed twice or named '' was taken as it was."""
    from smartsched.scheduling.compliance import load_policy

    for doc, field in (({"tenants": ["shop"], "residency": {"shop": []}},
                        "compliance.residency"),
                       ({"tenants": ["shop", "shop"], "residency": {"shop": ["region-a"]}},
                        "compliance.tenants"),
                       ({"tenants": [""], "residency": {"": ["region-a"]}},
                        "compliance.tenants")):
        with pytest.raises(ValidationError) as e:
            load_policy(doc)
        assert e.value.field == field
    assert load_policy({"tenants": ["shop"], "residency": {"shop": ["region-a"]}})


def test_compliance_residency_nowhere_at_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("tenants: [shop]\nresidency: {shop: []}\n")
    _refused(["simulate", "--compliance", "c.yaml", "--hours", "0.2", "--no-plots"],
             "compliance.residency", "nowhere")


CLUSTER = ("sites: [{name: r1}]\nzones: [{name: z1, site: r1}]\n"
           "nodes: [{name: n, zone: z1, cpu_milli: 64000, memory_mib: 262144}]\n")


@pytest.mark.parametrize("text, field", [
    ("sitez: []\n" + CLUSTER, "sitez: unknown field"),  # was dropped: the run went on
    (CLUSTER.replace("cpu_milli: 64000, ", ""), "nodes[0].cpu_milli: missing field"),
])
def test_cluster_file_fields(tmp_path: Path, text: str, field: str) -> None:
    (tmp_path / "c.yaml").write_text(text)
    _refused(["simulate", "--cluster", "c.yaml", "--hours", "0.2", "--no-plots"], field)


def test_parquet_pod_file_with_a_malformed_toleration(tmp_path: Path) -> None:
    """'bad::x' tolerated nothing, without a word."""
    from smartsched.model.pod import Pod, PodClass
    from smartsched.workloads.parquet_io import read_pods, write_pods

    pods = [Pod(id=f"p{i}", cpu_milli=1000, memory_mib=1024, arrival=float(i),
                duration=60.0, pod_class=PodClass.BATCH,
                tolerations=("nvidia.com/gpu=present:NoSchedule", "*")) for i in range(3)]
    write_pods(pods, tmp_path / "ok.parquet")
    assert len(read_pods(tmp_path / "ok.parquet")) == 3  # the twin's own forms still read
    rows = pq.read_table(tmp_path / "ok.parquet").to_pylist()
    rows[1]["tolerations"] = ["bad::x"]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet")
    _refused(["simulate", "--workload", "bad.parquet", "--no-plots"], "tolerations (row 1)")


@pytest.mark.parametrize("body, what", [
    ("tenants: {online: []}\n", "workload.tenants.online"),  # was the class's name
    ("".join(f"{s}: {{load: 0}}\n" for s in ("online", "ai-train", "ai-infer", "batch",
                                             "edge-rt")), "every section's load is 0"),
])
def test_mixed_profile_that_names_nothing(tmp_path: Path, body: str, what: str) -> None:
    (tmp_path / "p.yaml").write_text("extends: mixed\n" + body)
    _refused(["simulate", "--workload", "mixed:p.yaml", "--hours", "0.2", "--no-plots"], what)


@pytest.mark.parametrize("spec", ["mixed:", "finance:", "openb:"])
def test_workload_prefix_naming_nothing(spec: str) -> None:
    """'mixed:' read the working directory as the profile ("cannot read .")."""
    _refused(["simulate", "--workload", spec, "--hours", "0.2", "--no-plots"],
             "names nothing after the colon")


def test_a_good_run_still_runs(tmp_path: Path) -> None:
    code, out = _run(["simulate", "--hours", "0.2", "--no-plots", "--json", "r.json"])
    assert code == 0, out
    doc = json.loads((tmp_path / "r.json").read_text())
    assert math.isfinite(doc["metrics"]["decisions_per_second"])
