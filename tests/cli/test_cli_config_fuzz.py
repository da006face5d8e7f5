"""A careless or hostile user at the command line and in the config files: every input
here once gave a traceback, a hang, work started on a value that is refused only later,
or a silently wrong answer. Each is now one error naming the option or field (exit 2 at
the command line), before any work starts and before anything stored changes.

CLI cases run in-process (CliRunner) in an empty working directory. Where the fix is
an up-front check, the command line also carries a bad value that a later stage
refuses (``--cluster nonesuch``, ``--hours nan``): before the fix that later error was
the answer (or the work ran), now the option itself is named first.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from smartsched.cli import main
from smartsched.model.errors import ValidationError

BINARY = b"\xff\xfe\x00not text"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An empty working directory (nothing a command writes lands in the repository) and
    a few bad input files."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "binary.txt").write_bytes(BINARY)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "bad.yaml").write_text("a: [\n")
    (tmp_path / "words.yaml").write_text("other.yaml\n")
    (tmp_path / "store").mkdir()
    return {"binary": str(tmp_path / "binary.txt"), "empty": str(tmp_path / "empty.txt"),
            "bad": str(tmp_path / "bad.yaml"), "words": str(tmp_path / "words.yaml"),
            "store": str(tmp_path / "store")}


def _run(args: list[str]) -> tuple[int, str]:
    r = CliRunner().invoke(main, args)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, r.output


# (arguments, what the one-line error must name); {name} is filled from ``files``.
REFUSED_UP_FRONT = [
    # Empty paths: nothing written (--json ''), or the working directory used for a
    # service's tokens, a run, a benchmark's folder (or a traceback for keygen).
    (["simulate", "--json", "", "--hours", "nan"], "'--json'"),
    (["simulate", "--out", "", "--hours", "nan"], "'--out'"),
    (["demo", "--out", "", "--hours", "nan"], "'--out'"),
    (["train", "--config", "{bad}", "--output-dir", ""], "'--output-dir'"),
    (["tune", "--sweep", "{bad}", "--output-dir", ""], "'--output-dir'"),
    (["serve", "--state-dir", "", "--cluster", "nonesuch"], "'--state-dir'"),
    (["serve", "--models-dir", "", "--cluster", "nonesuch"], "'--models-dir'"),
    (["audit", "keygen", "--out", ""], "'--out'"),
    (["bench", "audit", "--work-dir", "", "--records", "0"], "'--work-dir'"),
    (["policy", "gate", "--candidate", "random", "--incumbent", "random", "--store", "",
      "--config", "{bad}"], "'--store'"),
    (["telemetry", "reduce", "--out", "", "--hours", "nan"], "'--out'"),
    # Numbers no run can use, refused where the option is read.
    (["train", "--config", "{bad}", "--iterations", "99999999999"], "'--iterations'"),
    (["telemetry", "serve", "--warm-hours", "nan", "--cluster", "nonesuch"], "'--warm-hours'"),
    (["telemetry", "serve", "--warm-hours", "-1", "--cluster", "nonesuch"], "'--warm-hours'"),
    (["telemetry", "serve", "--duration", "-1", "--cluster", "nonesuch"], "'--duration'"),
    (["telemetry", "reduce", "--test-seed", "-1", "--cluster", "nonesuch"], "'--test-seed'"),
    (["telemetry", "reduce", "--components", "0", "--cluster", "nonesuch"], "'--components'"),
    (["telemetry", "panel", "--prometheus", "http://127.0.0.1:9", "--out", "p.png",
      "--minutes", "inf", "--dashboard", "{binary}"], "'--minutes'"),
    (["audit", "usage", "--prometheus", "http://127.0.0.1:9", "--log", "log", "--heads",
      "heads", "--key-file", "{binary}", "--interval", "inf", "--once"], "'--interval'"),
    (["bench", "heldout", "--hours", "inf", "--seeds", "1"], "'--hours'"),
    # A held-out seed that is a training seed: the "held-out" R^2 was in-sample.
    (["telemetry", "reduce", "--seeds", "0-1", "--test-seed", "1", "--cluster", "nonesuch"],
     "'--test-seed'"),
    # Options the command would ignore without a word.
    (["simulate", "--repair-hours", "2", "--hours", "nan"], "'--repair-hours'"),
    (["serve", "--learn-sites", "region-a", "--cluster", "nonesuch"], "--learn-sites"),
    (["bench", "finance", "--no-failures", "--mtbf-hours", "5", "--cluster", "nonesuch"],
     "'--mtbf-hours'"),
    (["bench", "carbon", "--days", "-1", "--series", "nonesuch"], "'--days'"),
    (["bench", "carbon", "--twin", "--jobs", "5", "--series", "nonesuch"], "'--jobs'"),
    (["forecast", "evaluate", "--plot", "p.png", "--data", "/nonexistent.csv"], "'--plot'"),
    (["policy", "rollback", "--store", "{store}", "--sites", "region-a"], "--sites"),
    # Checked before the store changes: the rollback was done, then --sites was missed.
    (["policy", "rollback", "--store", "{store}", "--service", "http://127.0.0.1:9"],
     "--sites"),
    # A workload with no nightly runs printed a table of dashes and exited 0.
    (["bench", "finance", "--workload", "mixed", "--cluster", "nonesuch"], "'--workload'"),
    # Refused only after the run that needs it (the gate's episodes, the gap part).
    (["policy", "gate", "--candidate", "random", "--incumbent", "random", "--store", "st",
      "--config", "{bad}"], "'--store'"),
    (["bench", "anneal", "--part", "gap,fill", "--fill-spec", "bogus", "--sweeps", "a"],
     "'--fill-spec'"),
    # Unreadable files: a UnicodeDecodeError traceback.
    (["serve", "reload", "--site", "region-a", "--profile", "random", "--url",
      "http://127.0.0.1:9", "--operator-token-file", "{binary}"], "operator_token_file"),
    (["serve", "reload", "--site", "region-a", "--profile", "random", "--url",
      "http://127.0.0.1:9", "--operator-token-file", "{empty}"], "holds no token"),
    (["telemetry", "panel", "--prometheus", "http://127.0.0.1:9", "--out", "p.png",
      "--dashboard", "{binary}"], "dashboard"),
    # A settings file holding only a word was read as the path of another file.
    (["learn", "--config", "{words}"], "must be a mapping"),
]


@pytest.mark.parametrize(("args", "needle"), REFUSED_UP_FRONT,
                         ids=[" ".join(a)[:60] for a, _ in REFUSED_UP_FRONT])
def test_bad_options_are_one_error_naming_them(files: dict[str, str], args: list[str],
                                               needle: str) -> None:
    code, out = _run([a.format(**files) for a in args])
    assert code == 2 and needle in out, out[-600:]
    assert "Traceback" not in out


def test_an_empty_state_dir_writes_no_token_into_the_working_directory(
        files: dict[str, str]) -> None:
    _run(["serve", "--state-dir", "", "--cluster", "nonesuch"])
    assert not (Path.cwd() / "token").exists() and not (Path.cwd() / "journal").exists()


# ------------------------------------------------------------------ token files


def test_a_token_file_that_is_binary_a_fifo_a_folder_or_empty_is_named(tmp_path: Path) -> None:
    from smartsched.model.configfile import read_token_file

    (tmp_path / "bin").write_bytes(BINARY)
    (tmp_path / "empty").write_text(" \n")
    os.mkfifo(tmp_path / "fifo")  # was waited on for ever
    (tmp_path / "ok").write_text("  a-token-of-twenty-chars\n")
    for name, says in (("bin", "not UTF-8"), ("empty", "holds no token"),
                       ("fifo", "not a regular file"), (".", "is a directory")):
        with pytest.raises(ValidationError, match=says) as e:
            read_token_file(tmp_path / name, "auth.token_file")
        assert e.value.field == "auth.token_file"
    assert read_token_file(tmp_path / "ok", "f") == "a-token-of-twenty-chars"


def test_the_service_names_a_binary_or_empty_token_file(tmp_path: Path) -> None:
    """A binary file was a UnicodeDecodeError; an empty operator token file left the
    service without an operator token, without a word."""
    from smartsched.serving.config import Auth, load_credentials

    (tmp_path / "bin").write_bytes(BINARY)
    (tmp_path / "token").write_text("c" * 20)
    (tmp_path / "empty").write_text("")
    with pytest.raises(ValidationError) as e:
        load_credentials(Auth(token_file=str(tmp_path / "bin")))
    assert e.value.field == "service.auth.token_file"
    with pytest.raises(ValidationError) as e:
        load_credentials(Auth(token_file=str(tmp_path / "token"),
                              operator_token_file=str(tmp_path / "empty")))
    assert e.value.field == "service.auth.operator_token_file"


# ------------------------------------------------------------------ config files


def _train_config(tmp_path: Path, **over: object) -> Path:
    doc = yaml.safe_load((ROOT / "rllib_configs" / "ppo_default.yaml").read_text())
    for dotted, value in over.items():
        *parents, last = dotted.split("__")
        at = doc
        for p in parents:
            at = at.setdefault(p, {})
        at[last] = value
    f = tmp_path / "train.yaml"
    f.write_text(yaml.safe_dump(doc))
    return f


@pytest.mark.parametrize(("key", "value"), [
    ("workload", 5), ("workload", [1]), ("filters_profile", None), ("filters_profile", [1]),
    ("reward_weights", 0.5), ("reward_weights", []), ("forecaster", [1]), ("telemetry", 0),
    ("base", 1), ("mode", 3),
])
def test_env_settings_of_the_wrong_type_are_named(key: str, value: object) -> None:
    """Each was a TypeError or AttributeError traceback (or [] read as the defaults)."""
    from smartsched.rl.env import SchedulingEnv

    with pytest.raises(ValidationError) as e:
        SchedulingEnv({"cluster": "small", "hours": 1, key: value})
    assert e.value.field == f"env.{key}"


def test_shortlist_classes_that_are_no_list_are_named() -> None:
    from smartsched.rl.env import SchedulingEnv

    with pytest.raises(ValidationError) as e:
        SchedulingEnv({"cluster": "small", "hours": 1, "base": "k8s-default",
                       "shortlist_classes": 3})
    assert e.value.field == "env.shortlist_classes"


@pytest.mark.parametrize(("dotted", "value", "field"), [
    # inf coefficients train to NaN weights; 10**30 steps an iteration sample for ever
    ("training__entropy_coeff", float("inf"), "training.entropy_coeff"),
    ("training__vf_loss_coeff", float("inf"), "training.vf_loss_coeff"),
    ("training__train_batch_size_per_learner", 10**30, "training.train_batch_size_per_learner"),
    ("env_runners__sample_timeout_s", float("inf"), "env_runners.sample_timeout_s"),
    ("num_cpus", 10**30, "num_cpus"),
    ("output_dir", "", "output_dir"),  # the working directory
])
def test_absurd_training_settings_are_named(tmp_path: Path, dotted: str, value: object,
                                           field: str) -> None:
    from smartsched.rl.config import load_train_config

    with pytest.raises(ValidationError) as e:
        load_train_config(_train_config(tmp_path, **{dotted: value}))
    assert e.value.field == field


def test_a_learning_settings_document_that_is_text_is_not_read_as_a_path() -> None:
    from smartsched.rl.learning import load_learn_config

    with pytest.raises(ValidationError, match="must be a mapping") as e:
        load_learn_config(str(ROOT / "rllib_configs" / "ppo_default.yaml"))
    assert e.value.field == "learn"


@pytest.mark.parametrize(("text", "field"), [
    ("applications: [{args: []}]\n", "config.applications[0].args"),
    ("applications: [{args: ''}]\n", "config.applications[0].args"),
    ("http_options: []\napplications: [{args: {}}]\n", "config.http_options"),
])
def test_a_serve_config_list_where_a_mapping_goes_is_named(tmp_path: Path, text: str,
                                                           field: str) -> None:
    """Each ran the service on the built-in defaults."""
    from smartsched.serving.local import service_args

    f = tmp_path / "serve.yaml"
    f.write_text(text)
    with pytest.raises(ValidationError) as e:
        service_args(f, {})
    assert e.value.field == field


@pytest.mark.parametrize(("section", "field"), [
    ({"zipf": 2.0}, "workload.images.zipf"),  # a typo of zipf_s: the default was used
    ({"classes": {"online": {"count": 2, "gb": [1, 2], "size": 3}}},
     "workload.images.classes.online.size"),
    ({"classes": []}, "workload.images.classes"),  # no images at all, without a word
])
def test_an_images_section_with_unknown_keys_is_named(section: dict, field: str) -> None:
    from smartsched.workloads.images import catalogue

    with pytest.raises(ValidationError) as e:
        catalogue(section)
    assert e.value.field == field


@pytest.mark.parametrize(("spec", "field"), [
    ("rl:models/ppo_mixed_small?weights=balanced&weights=green", "scheduler.weights"),
    ("anneal:fgd?window=50&window=60", "scheduler.window"),
    ("sandboxed:fgd?samples=1&samples=2", "scheduler.samples"),
    ("lookahead:fgd?k=2&k=3", "scheduler.k"),
])
def test_a_scheduler_option_given_twice_is_named_not_the_last_taken(spec: str,
                                                                    field: str) -> None:
    """As a YAML key given twice is refused: the last value was used without a word."""
    from smartsched.scheduling.base import make_scheduler

    with pytest.raises(ValidationError, match="given 2 times") as e:
        make_scheduler(spec.replace("models/", f"{ROOT}/models/"))
    assert e.value.field == field


# ------------------------------------------------------------------ forecasting


def _series(n: int, steps: int) -> list:
    from smartsched.forecast.data import Series

    t = np.arange(steps)
    return [Series(f"s{i}", 0.0, 300.0, ("cpu",), (30 + 8 * np.sin(t / 20 + i))[:, None]
                   .astype(np.float32)) for i in range(n)]


def test_training_on_no_window_is_refused_not_saved_as_a_model() -> None:
    """``forecast train --lookback 10000`` trained on 0 windows and saved the result."""
    from smartsched.forecast.lstm import LSTMForecaster, LSTMSettings
    from smartsched.forecast.windows import make_windows

    fc = LSTMForecaster(LSTMSettings(lookback=500, horizon=3, hidden=4, epochs=1))
    with pytest.raises(ValidationError, match="no training window") as e:
        fc.fit(make_windows(_series(3, 100), 500, 3))
    assert e.value.field == "lookback"


def test_a_model_looking_back_further_than_the_windows_is_named_not_a_crash(
        tmp_path: Path) -> None:
    """Windows shorter than the model's lookback were a shape error -- or, at a lookback of
    10,000 over the whole test split, 24 GB of time features and the OOM killer."""
    import pandas as pd

    from smartsched.forecast.lstm import LSTMForecaster, LSTMSettings
    from smartsched.forecast.run import evaluate_forecaster
    from smartsched.forecast.windows import make_windows

    fc = LSTMForecaster(LSTMSettings(lookback=400, horizon=3, hidden=4, epochs=1))
    fc.fit(make_windows(_series(2, 410), 400, 3, stride=5))
    with pytest.raises(ValidationError) as e:
        fc.predict(make_windows(_series(1, 60), 20, 3))
    assert e.value.field == "lookback"
    model = fc.save(tmp_path / "model")
    steps = 300  # a day and a bit: scorable by the baselines, short of the model's 403
    rows = [{"series_id": f"s{i}", "timestamp": 300.0 * k, "cpu": 30.0 + (k % 7)}
            for i in range(20) for k in range(steps)]
    pd.DataFrame(rows).to_csv(tmp_path / "usage.csv", index=False)
    with pytest.raises(ValidationError, match="403 steps") as e:
        evaluate_forecaster(model, tmp_path / "usage.csv")
    assert e.value.field == "data"


def test_crossfit_with_a_lookback_longer_than_the_series_names_the_lookback() -> None:
    """It trained on no window, then failed on a shape (or blamed the folds)."""
    from smartsched.forecast.crossfit import crossfit

    with pytest.raises(ValidationError) as e:
        crossfit(_series(12, 300), folds=2, lookback=400, hidden=4, epochs=1,
                 echo=lambda _m: None)
    assert e.value.field == "lookback"


# ------------------------------------------------------------------ telemetry, panels


def test_telemetry_study_checks_components_and_seeds_before_recording(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from smartsched.bench import telemetry_study

    def no_recording(*_a: object, **_k: object) -> None:
        raise AssertionError("recorded before the settings were checked")

    monkeypatch.setattr(telemetry_study, "record", no_recording)
    with pytest.raises(ValidationError) as e:
        telemetry_study.study("small", "mixed", "k8s-default", 1.0, [0], 1, k=10_000)
    assert e.value.field == "components"
    with pytest.raises(ValidationError) as e:
        telemetry_study.study("small", "mixed", "k8s-default", 1.0, [0, 1], 1, k=4)
    assert e.value.field == "test_seed"


@pytest.mark.parametrize("content", [BINARY, b"[]", b'{"panels": 3}', b'{"panels": [1, 2]}'])
def test_a_dashboard_that_is_no_dashboard_is_named(tmp_path: Path, content: bytes) -> None:
    from smartsched.prometheus.panel import find_panel

    f = tmp_path / "dash.json"
    f.write_bytes(content)
    with pytest.raises(ValidationError) as e:
        find_panel(f, "CPU utilization by zone")
    assert e.value.field in ("dashboard", "title")


@pytest.mark.parametrize("bad", [["--region-profile", "no-such-profile"],
                                 ["--cluster", "nonesuch"]])
def test_serve_refused_writes_nothing_into_its_state_dir(tmp_path, bad: list[str]) -> None:
    """Tokens and a journal folder were written into --state-dir before a bad profile was
    found (probe round 6b)."""
    from click.testing import CliRunner

    from smartsched.cli import main

    state = tmp_path / "state"
    state.mkdir()
    r = CliRunner().invoke(main, ["serve", "--state-dir", str(state), *bad])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert list(state.iterdir()) == []
