"""Continuous learning: a round promotes only through the gate, a crash keeps the
incumbent, experience becomes a replayable workload, a real fine-tune round runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod
from smartsched.rl.gate import GateConfig, GateResult
from smartsched.rl.learning import (
    LearningLoop,
    experience_workload,
    load_learn_config,
)
from smartsched.rl.versions import PolicyStore

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "ppo_mixed_small"


def _store(tmp_path: Path) -> PolicyStore:
    store = PolicyStore(tmp_path / "store")
    store.promote(store.add(SHIPPED))
    return store


def _gate(promoted: bool):
    def gate(candidate: str, incumbent: str, cfg: GateConfig) -> GateResult:
        assert candidate.startswith("rl:") and incumbent.startswith("rl:")
        return GateResult(promoted, [] if promoted else ["gain not shown"], 1.0 if promoted
                          else 0.0, 0.5 if promoted else -0.1, [1.0, 1.0], 0, 0.1)
    return gate


def _copy_policy(inc: Path, workload: str, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(inc, out / "policy", dirs_exist_ok=True)
    return out / "policy"


def test_a_round_promotes_through_the_gate_and_reloads(tmp_path: Path) -> None:
    store = _store(tmp_path)
    reloaded = []
    cfg = load_learn_config({"store": str(store.root), "work_dir": str(tmp_path / "work")})
    loop = LearningLoop(cfg, fine_tune=_copy_policy, gate=_gate(True),
                        on_promote=lambda v, p: reloaded.append((v, p)))
    out = loop.round()
    assert out["outcome"] == "promoted" and out["version"] == "v0002"
    assert store.current() == "v0002" and reloaded == [("v0002", store.path_of("v0002"))]
    refused = LearningLoop(cfg, fine_tune=_copy_policy, gate=_gate(False)).round()
    assert refused["outcome"] == "refused" and store.current() == "v0002"
    events = [e["event"] for e in store.log()]
    assert events[-3:] == ["add", "promote", "refuse"]
    assert store.log()[-2]["gate"]["gain_lower"] == 0.5  # the figures are logged


def test_a_crash_mid_fine_tune_keeps_the_incumbent(tmp_path: Path) -> None:
    store = _store(tmp_path)

    def crash(inc: Path, workload: str, out: Path) -> Path:
        raise RuntimeError("learner died")

    cfg = load_learn_config({"store": str(store.root), "work_dir": str(tmp_path / "w"),
                             "interval_s": 0.01})
    loop = LearningLoop(cfg, fine_tune=crash, gate=_gate(True))
    outs: list[dict] = []
    loop.run(rounds=2, report=outs.append)  # the loop goes on after a failed round
    assert [o["outcome"] for o in outs] == ["error", "error"]
    assert "learner died" in outs[0]["error"] and store.current() == "v0001"
    assert [e["event"] for e in store.log()][-2:] == ["error", "error"]


def test_experience_becomes_a_workload(tmp_path: Path) -> None:
    from smartsched.model.presets import load_cluster
    from smartsched.workloads.resolve import load_workload

    pods = [Pod(id="a", cpu_milli=500, memory_mib=256, arrival=1000.0),
            Pod(id="b", cpu_milli=500, memory_mib=256, arrival=1010.0),
            Pod(id="a", cpu_milli=700, memory_mib=256, arrival=1020.0)]  # a reused name
    path = experience_workload(pods, tmp_path / "x" / "exp.parquet")
    got = load_workload(str(path), load_cluster("small"), 1.0, 0)
    assert [(p.id, p.arrival, p.cpu_milli) for p in got] == [
        ("a", 0.0, 500), ("b", 10.0, 500), ("a#1", 20.0, 700)]


@pytest.mark.parametrize(("doc", "field"), [
    ({"store": "s", "interval_s": -5}, "learn.interval_s"),
    ({"store": "s", "gate": {"confidence": 2}}, "learn.gate.confidence"),
    ({"store": "s", "fine_tune": {"iterations": 0}}, "learn.fine_tune.iterations"),
    ({"interval_s": 5}, "learn.store"),
    ({"store": "s", "fine_tune": {"minibatch_size": 100_000,
                                  "train_batch_size_per_learner": 8}}, "learn.fine_tune"),
])
def test_bad_learning_settings_name_the_field(doc: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        load_learn_config(doc)
    assert e.value.field == field


@pytest.mark.parametrize("text", ["", "- 1\n"])
def test_settings_that_are_not_a_mapping_are_named(tmp_path: Path, text: str) -> None:
    """An empty file or a list was a TypeError traceback from reading a path of None."""
    f = tmp_path / "learn.yaml"
    f.write_text(text)
    with pytest.raises(ValidationError, match="must be a mapping") as e:
        load_learn_config(f)
    assert e.value.field == "learn"


def test_the_learn_command_checks_its_store_before_ray_starts(tmp_path: Path) -> None:
    """A store with no current policy failed inside the learner actor, after Ray was up."""
    from click.testing import CliRunner

    from smartsched.cli import main

    f = tmp_path / "learn.yaml"
    f.write_text(f"store: {tmp_path / 'empty-store'}\n")
    r = CliRunner().invoke(main, ["learn", "--config", str(f), "--rounds", "1"])
    assert r.exit_code == 2 and "no current policy version" in r.output, r.output


@pytest.mark.parametrize(("doc", "field"), [
    ({"workload": "nosuchworkload"}, "learn.workload"),
    ({"gate": {"workload": "nosuch"}}, "learn.gate.workload"),
    ({"gate": {"cluster": "nosuch"}}, "learn.gate.cluster"),
    ({"gate": {"filters": "nosuch"}}, "learn.gate.filters"),
])
def test_every_name_in_the_settings_is_resolved_before_ray(doc: dict, field: str) -> None:
    """A workload or gate cluster that does not exist was found inside the first round,
    after Ray started (the gate's after a fine-tune), and the command exited 0 (probe
    round 8)."""
    from smartsched.rl.learning import check_references

    check_references(load_learn_config({"store": "s"}))  # the defaults resolve
    with pytest.raises(ValidationError) as e:
        check_references(load_learn_config({"store": "s", **doc}))
    assert e.value.field == field


def test_a_store_without_a_current_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="no current policy"):
        LearningLoop(load_learn_config({"store": str(tmp_path / "empty")}))


@pytest.mark.slow
def test_a_real_round_fine_tunes_gates_and_logs(ray_session, tmp_path: Path) -> None:
    """One real round on a tiny budget: PPO from the incumbent's weights on the twin, the
    gate on paired episodes; whatever the verdict, the store and its log agree."""
    store = _store(tmp_path)
    cfg = load_learn_config({
        "store": str(store.root), "work_dir": str(tmp_path / "work"),
        "fine_tune": {"iterations": 1, "train_batch_size_per_learner": 64,
                      "minibatch_size": 32, "num_epochs": 1, "max_decisions": 40},
        "gate": {"cluster": "small", "hours": 1, "warmup_hours": 0, "seeds": 2,
                 "workers": 1}})
    out = LearningLoop(cfg).round()
    assert out["outcome"] in ("promoted", "refused"), out
    last = store.log()[-1]
    assert last["event"] == ("promote" if out["outcome"] == "promoted" else "refuse")
    assert set(last["gate"]) >= {"gain_mean", "gain_lower", "violations", "gated_on"}
    assert store.current() == ("v0002" if out["outcome"] == "promoted" else "v0001")


@pytest.mark.slow
def test_learn_command_runs_rounds_in_a_ray_actor(ray_session, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from smartsched.cli import main

    store = _store(tmp_path)
    cfg = tmp_path / "learn.yaml"
    cfg.write_text(
        f"store: {store.root}\nwork_dir: {tmp_path / 'work'}\ninterval_s: 1\n"
        "fine_tune: {iterations: 1, train_batch_size_per_learner: 64, minibatch_size: 32, "
        "num_epochs: 1, max_decisions: 40}\n"
        "gate: {cluster: small, hours: 1, warmup_hours: 0, seeds: 2, workers: 1}\n")
    r = CliRunner().invoke(main, ["learn", "--config", str(cfg), "--rounds", "1"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("round: ") and ("promoted" in r.output or "refused" in r.output)
    assert store.log()[-1]["event"] in ("promote", "refuse")
    bad = CliRunner().invoke(main, ["learn", "--config", str(cfg), "--service",
                                    "http://127.0.0.1:9"])
    assert bad.exit_code != 0 and "--sites" in bad.output


def test_a_failed_reload_keeps_the_incumbent_current_and_served(tmp_path: Path) -> None:
    store = _store(tmp_path)
    calls: list[str] = []

    def reload(version: str, path: Path) -> None:
        calls.append(version)
        if version == "v0002":
            raise ConnectionError("site unreachable")

    cfg = load_learn_config({"store": str(store.root), "work_dir": str(tmp_path / "w")})
    out = LearningLoop(cfg, fine_tune=_copy_policy, gate=_gate(True), on_promote=reload).round()
    assert out["outcome"] == "error" and "site unreachable" in out["error"]
    assert store.current() == "v0001" and calls == ["v0002", "v0001"]  # put back


def test_a_reused_gang_name_is_another_gang_in_the_experience(tmp_path: Path) -> None:
    from smartsched.workloads.parquet_io import read_pods

    pods = [Pod(id=f"m{r}-{i}", cpu_milli=500, memory_mib=256, arrival=10.0 * r,
                gang_id="g", gang_size=2) for r in range(3) for i in range(2)]
    out = read_pods(experience_workload(pods, tmp_path / "x.parquet"))
    assert [p.gang_id for p in out] == ["g", "g", "g#1", "g#1", "g#2", "g#2"]


def test_the_candidate_is_judged_on_newer_experience_than_it_trained_on(tmp_path: Path) -> None:
    store = _store(tmp_path)
    pods = [Pod(id=f"p{i}", cpu_milli=500, memory_mib=256, arrival=float(i)) for i in range(40)]
    seen: dict[str, str] = {}

    def fine_tune(inc: Path, workload: str, out: Path) -> Path:
        seen["train"] = workload
        return _copy_policy(inc, workload, out)

    def gate(c: str, i: str, g: GateConfig) -> GateResult:
        seen["gate"] = g.workload
        return _gate(False)(c, i, g)

    cfg = load_learn_config({"store": str(store.root), "work_dir": str(tmp_path / "w"),
                             "min_pods": 10})
    LearningLoop(cfg, experience=lambda: pods, fine_tune=fine_tune, gate=gate).round()
    from smartsched.workloads.parquet_io import read_pods

    trained = {p.id for p in read_pods(seen["train"])}
    # Judged on episodes resampled from the newer half (one per gate seed).
    assert seen["gate"].startswith("resample:")
    judged = {p.id for p in read_pods(seen["gate"].split(":", 1)[1])}
    assert trained == {f"p{i}" for i in range(20)} and judged == {f"p{i}" for i in range(20, 40)}
    # A restarted loop numbers its rounds on from the last one.
    again = LearningLoop(cfg, experience=lambda: pods, fine_tune=fine_tune, gate=gate)
    assert again.rounds == 1 and again.round()["outcome"] == "refused"
    assert (tmp_path / "w" / "round_00002").is_dir()


def flipped_policy(folder: Path) -> Path:
    """The shipped policy with its node scores negated (its ranking reversed: what a
    flipped reward sign learns): a policy that loads and is clearly worse."""
    import torch

    shutil.copytree(SHIPPED, folder)
    sd = torch.load(folder / "module_weights.pt", weights_only=True)
    for key in ("score_mlp.1.weight", "score_mlp.1.bias", "gate.1.weight", "gate.1.bias"):
        sd[key] = -sd[key]
    torch.save(sd, folder / "module_weights.pt")
    return folder


def test_a_staged_candidate_is_gated_before_any_fine_tune_and_taken_off_the_stage(
        tmp_path: Path) -> None:
    store = _store(tmp_path)
    first = store.stage(SHIPPED)
    second = store.stage(flipped_policy(tmp_path / "flipped"))
    assert [p.name for p in store.staged()] == [first, second]  # oldest first
    judged: list[str] = []

    def gate(c: str, i: str, g: GateConfig) -> GateResult:
        judged.append(c)
        return _gate(len(judged) == 1)(c, i, g)

    def no_fine_tune(inc: Path, workload: str, out: Path) -> Path:
        raise AssertionError("a staged candidate goes first")

    cfg = load_learn_config({"store": str(store.root), "work_dir": str(tmp_path / "w")})
    loop = LearningLoop(cfg, fine_tune=no_fine_tune, gate=gate)
    out = loop.round()
    assert out["outcome"] == "promoted" and out["candidate"] == f"staged:{first}"
    assert judged[0].endswith(f"/staged/{first}") and store.current() == "v0002"
    out = loop.round()  # the second is refused, and is not tried again
    assert out["outcome"] == "refused" and out["candidate"] == f"staged:{second}"
    assert store.staged() == [] and store.current() == "v0002"
    assert store.log()[-1]["gate"]["candidate"] == f"staged:{second}"
    # With nothing staged the loop fine-tunes again.
    loop._fine_tune = _copy_policy
    assert loop.round()["candidate"] == "fine-tune"


def test_staging_refuses_a_policy_that_does_not_load(tmp_path: Path) -> None:
    store = _store(tmp_path)
    bad = tmp_path / "bad"
    shutil.copytree(SHIPPED, bad)
    (bad / "module_spec.json").unlink()
    (bad / "module_state.pkl").write_bytes(b"\x80\x04K\x01.")  # a pickle: never read
    with pytest.raises(ValidationError):
        store.stage(bad)
    assert store.staged() == []
    from click.testing import CliRunner

    from smartsched.cli import main

    r = CliRunner().invoke(main, ["policy", "stage", "--store", str(store.root), str(SHIPPED)])
    assert r.exit_code == 0 and "staged as" in r.output and len(store.staged()) == 1


def test_each_round_fine_tunes_with_its_own_seed(tmp_path: Path, monkeypatch) -> None:
    """Rounds with no new experience train on the same workload: a seed per round keeps
    them from training the very same candidate again."""
    import smartsched.rl.train as train_mod

    seeds: list[int] = []

    def fake_train(cfg, echo=None):
        seeds.append(cfg.seed)
        return {"policy": str(_copy_policy(SHIPPED, "", Path(cfg.output_dir)))}

    monkeypatch.setattr(train_mod, "train", fake_train)
    store = _store(tmp_path)
    cfg = load_learn_config({"store": str(store.root), "work_dir": str(tmp_path / "w"),
                             "fine_tune": {"seed": 7}})
    loop = LearningLoop(cfg, gate=_gate(False))
    for _ in range(3):
        assert loop.round()["outcome"] == "refused"
    assert seeds == [8, 9, 10]
