"""The promotion gate refuses broken and identical candidates, promotes a better one; the
store keeps every version and rolls back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from smartsched.model.errors import ValidationError
from smartsched.rl.gate import paired_lower_bound, parse_gate_config, run_gate
from smartsched.rl.versions import PolicyStore
from smartsched.scheduling.base import register_prefix
from smartsched.twin.decision import Decision

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "ppo_mixed_small"
QUICK = {"cluster": "medium", "hours": 0.5, "warmup_hours": 0.25, "seeds": 3, "workers": 1}


class _FirstNode:
    """A candidate that ignores every filter: each pod on node 0."""

    name = "first-node"

    def decide(self, state: object, request: object) -> Decision:
        return Decision(0)


register_prefix("test-first-node", lambda rest, seed: _FirstNode())


def test_a_candidate_that_ignores_hard_constraints_is_refused() -> None:
    res = run_gate("test-first-node:x", "k8s-default", QUICK)
    assert not res.promoted and res.violations > 0
    assert "broke a hard constraint" in res.reasons[0] and "on " in res.reasons[0]


def test_an_identical_candidate_is_never_promoted() -> None:
    res = run_gate("k8s-default", "k8s-default", QUICK)
    assert not res.promoted and res.gains == [0.0] * 3 and res.gain_lower == 0.0


def test_a_better_candidate_is_promoted_and_a_worse_refused() -> None:
    better = run_gate("composite", "random", QUICK)
    assert better.promoted and better.gain_lower > 0 and better.violations == 0, better.reasons
    worse = run_gate("random", "composite", QUICK)
    assert not worse.promoted and worse.gain_mean < 0
    assert worse.gains == pytest.approx([-g for g in better.gains])  # the same episodes


def test_on_a_recording_each_seed_is_another_episode(tmp_path: Path) -> None:
    """Gating on recorded experience: the recording replayed under every seed varies only
    by the twin's own noise (the live loop's rounds gave four identical gains: a zero
    spread, a "bound" that is one replay's gain); resampled, the paired episodes vary as
    the traffic could."""
    from smartsched.model.presets import load_cluster
    from smartsched.workloads.parquet_io import write_pods
    from smartsched.workloads.resolve import load_workload

    path = tmp_path / "recent.parquet"
    write_pods(load_workload("mixed", load_cluster("medium"), 0.75, 5), path)
    cfg = {**QUICK, "workload": str(path)}
    plain = run_gate("bestfit", "k8s-default", cfg)
    res = run_gate("bestfit", "k8s-default", {**cfg, "workload": f"resample:{path}"})
    assert len(set(res.gains)) == 3 and res.gain_lower < res.gain_mean
    assert np.std(res.gains) > 3 * np.std(plain.gains)


def test_the_bootstrap_bound() -> None:
    assert paired_lower_bound([2.0, 2.0, 2.0], 0.95, 500) == 2.0
    assert paired_lower_bound([1.0, 2.0, 3.0, 1.5], 0.95, 2000) > 0
    assert paired_lower_bound([5.0, -4.0, 4.0, -4.5], 0.95, 2000) < 0  # mean > 0, not shown
    assert paired_lower_bound([1.0, 3.0], 0.95, 2000, seed=1) == paired_lower_bound(
        [1.0, 3.0], 0.95, 2000, seed=1)


@pytest.mark.parametrize(("doc", "field"), [
    ({"seeds": 1}, "gate.seeds"),
    ({"confidence": 1.5}, "gate.confidence"),
    ({"hours": -1}, "gate.hours"),
    ({"weights": {"happiness": 1.0}}, "gate.weights.happiness"),
    ({"weights": {"utilization_pct": -1.0}}, "gate.weights.utilization_pct"),
    ({"sedes": 3}, "gate.sedes"),
])
def test_bad_gate_settings_name_the_field(doc: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        parse_gate_config(doc)
    assert e.value.field == field


def test_the_store_keeps_versions_promotes_and_rolls_back(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path / "store")
    with pytest.raises(ValidationError):
        store.path_of()  # nothing current yet
    v1 = store.promote(store.add(SHIPPED))
    v2 = store.promote(store.add(SHIPPED), {"gain_lower": 0.5})
    assert (v1, v2) == ("v0001", "v0002") and store.current() == "v0002"
    assert (store.path_of() / "smartsched_policy.json").exists()
    assert store.rollback() == "v0001" and store.current() == "v0001"
    assert store.versions() == ["v0001", "v0002"]  # nothing deleted
    with pytest.raises(ValidationError, match="no earlier version"):
        store.rollback()
    events = [e["event"] for e in store.log()]
    assert events == ["add", "promote", "add", "promote", "rollback"]
    # A folder that is not a loadable policy never becomes a version.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "smartsched_policy.json").write_text("{not json")
    with pytest.raises(ValidationError):
        store.add(bad)
    assert store.versions() == ["v0001", "v0002"]
    assert not [p for p in (tmp_path / "store" / "versions").iterdir() if p.name.startswith(".")]
    (tmp_path / "store" / "versions" / ".v0003-left-by-a-crash").mkdir()
    assert store.versions() == ["v0001", "v0002"]  # a crashed copy is not a version


def test_gate_cli_refuses_an_identical_policy_and_logs_it(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from smartsched.cli import main

    cfg = tmp_path / "gate.yaml"
    cfg.write_text("cluster: small\nhours: 1\nwarmup_hours: 0\nseeds: 2\nworkers: 1\n")
    out = tmp_path / "gate.json"
    r = CliRunner().invoke(main, ["policy", "gate", "--candidate", f"rl:{SHIPPED}",
                                  "--incumbent", f"rl:{SHIPPED}", "--config", str(cfg),
                                  "--store", str(tmp_path / "store"), "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("REFUSE") and json.loads(out.read_text())["promoted"] is False
    assert [e["event"] for e in PolicyStore(tmp_path / "store").log()] == ["refuse"]
    bad = CliRunner().invoke(main, ["policy", "rollback", "--store", str(tmp_path / "store")])
    assert bad.exit_code != 0 and "no earlier version" in bad.output


def test_the_gate_benchmark_refuses_broken_probes_and_promotes_the_better(tmp_path) -> None:
    from smartsched.bench.gate import run_gate_bench

    # (Not "worst" here: k8s-default's ranking reversed is most-allocated packing, which a
    # utilization score may rightly prefer; the benchmark reverses a learned policy.)
    res = run_gate_bench("k8s-default", trials=1, seeds=2, cluster="medium", hours=0.5,
                         warmup_hours=0.25, workers=1, degrade=1.0,
                         kinds=("nofilter", "identical", "better"), echo=lambda _: None)
    k = res["kinds"]
    assert k["nofilter"]["promoted"] == 0 and k["identical"]["promoted"] == 0
    # degrade=1.0: the "worse" incumbent is k8s-default itself -> gains of exactly 0
    assert k["better"]["gain_mean"] == 0.0 and k["better"]["promoted"] == 0
    # The QoS side is reported apart: identical runs differ in nothing.
    assert k["identical"]["qos_diff"]["online_contended_pct"] == {"mean": 0.0,
                                                                  "worse_pct": 0.0}
    assert set(k["better"]["qos_diff"]) == {"online_contended_pct", "latency_violations",
                                            "waiting_pod_hours"}
