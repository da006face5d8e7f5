"""``forecast evaluate`` on bad input: a clear error naming the file or field (exit 2),
never a traceback and never figures from data the model was not trained on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from smartsched.cli import main
from smartsched.forecast.data import Series, load_google2011, load_long
from smartsched.forecast.evaluate import compare_to_best_baseline, format_table
from smartsched.forecast.lstm import LSTMForecaster, LSTMSettings
from smartsched.forecast.run import evaluate_forecaster
from smartsched.forecast.windows import make_windows
from smartsched.model.errors import ValidationError

STEPS = 300  # >= a day of 5-min steps plus the horizon: every series is scorable


def _table(n: int = 20, step: float = 300.0, columns: tuple[str, ...] = ("cpu", "mem"),
           const: float | None = None) -> pd.DataFrame:
    """``n`` series of utilization %: a daily wave per column (or ``const`` everywhere)."""
    t = np.arange(STEPS)
    rng = np.random.default_rng(0)
    rows = {"series_id": np.repeat([f"s{i}" for i in range(n)], STEPS),
            "timestamp": np.tile(t * step, n)}
    for k, col in enumerate(columns):
        wave = np.concatenate([30 + 10 * k + 8 * np.sin(2 * np.pi * t / 288 + i)
                               + rng.normal(0, 1, STEPS) for i in range(n)])
        rows[col] = np.round(wave, 3) if const is None else np.full(n * STEPS, const)
    return pd.DataFrame(rows)


def _csv(tmp_path: Path, df: pd.DataFrame, name: str = "usage.csv") -> Path:
    f = tmp_path / name
    df.to_csv(f, index=False)
    return f


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny forecaster trained (one epoch) on cpu and mem at 5-minute steps."""
    t = np.arange(STEPS)
    series = [Series(f"s{i}", 0.0, 300.0, ("cpu", "mem"), np.stack(
        [30 + 8 * np.sin(2 * np.pi * t / 288 + i), 40 + 5 * np.cos(2 * np.pi * t / 288 + i)],
        axis=1).astype(np.float32)) for i in range(4)]
    fc = LSTMForecaster(LSTMSettings(lookback=6, horizon=3, hidden=4, epochs=1, seed=0))
    fc.fit(make_windows(series, 6, 3, stride=7))
    return fc.save(tmp_path_factory.mktemp("fc") / "model")


def _evaluate(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["forecast", "evaluate", *args])
    return r.exit_code, r.output


def test_an_empty_data_file_is_named(tmp_path: Path) -> None:
    f = tmp_path / "empty.csv"
    f.write_bytes(b"")
    with pytest.raises(ValidationError, match="empty file") as e:
        load_long(f)
    assert e.value.field == "data" and str(f) in str(e.value)
    code, out = _evaluate("--data", str(f))
    assert code == 2 and "empty file" in out


def test_constant_series_leave_the_ratio_undefined_not_a_crash(tmp_path: Path) -> None:
    res = evaluate_forecaster(None, _csv(tmp_path, _table(columns=("cpu",), const=0.0)))
    cpu = res["models"]["last value"]["cpu"]["machine"]
    assert cpu["MAE"] == 0.0 and np.isnan(cpu["MASE"]) and np.isnan(cpu["MASE_vs_best"])
    assert "n/a" in format_table(res) and "undefined" in format_table(res)
    code, out = _evaluate("--data", str(_csv(tmp_path, _table(columns=("cpu",), const=5.0))))
    assert code == 0 and "n/a" in out


def test_a_ratio_to_an_exact_best_baseline_is_nan() -> None:
    res = {"targets": ["cpu"], "models": {
        "last value": {"cpu": {"machine": {"MAE": 0.0}}},
        "LSTM": {"cpu": {"machine": {"MAE": 0.5}}}}}
    compare_to_best_baseline(res, ["last value"])
    assert res["best_baseline"] == {"cpu": "last value"}
    assert np.isnan(res["models"]["LSTM"]["cpu"]["machine"]["MASE_vs_best"])


@pytest.mark.parametrize(("columns", "step", "field"), [
    (("cpu",), 300.0, "mem"),  # a target the model reads is missing
    (("a", "b"), 300.0, "cpu"),  # renamed: not what the model was trained on
    (("cpu", "mem"), 60.0, "step_s"),  # the model's steps are 5 minutes
])
def test_data_that_does_not_match_the_model_is_named(tmp_path: Path, model: Path,
                                                     columns: tuple[str, ...], step: float,
                                                     field: str) -> None:
    f = _csv(tmp_path, _table(step=step, columns=columns))
    with pytest.raises(ValidationError) as e:
        evaluate_forecaster(model, f)
    assert e.value.field == field and e.value.source == str(f)
    code, out = _evaluate("--data", str(f), "--model", str(model))
    assert code == 2 and "error:" in out and field in out


def test_columns_in_another_order_are_read_by_name(tmp_path: Path, model: Path) -> None:
    df = _table()
    same = evaluate_forecaster(model, _csv(tmp_path, df, "a.csv"))
    swapped = evaluate_forecaster(model, _csv(tmp_path, df[["series_id", "timestamp", "mem",
                                                            "cpu"]], "b.csv"))
    assert swapped["targets"] == ["cpu", "mem"]
    for t in ("cpu", "mem"):
        for level in ("machine", "aggregate"):
            assert swapped["models"]["LSTM"][t][level] == pytest.approx(
                same["models"]["LSTM"][t][level])
    assert same["models"]["LSTM"]["cpu"]["machine"]["MAE"] != pytest.approx(
        same["models"]["LSTM"]["mem"]["machine"]["MAE"])  # the two columns differ


def test_damaged_weights_or_settings_are_named(tmp_path: Path, model: Path) -> None:
    data = _csv(tmp_path, _table())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "forecaster.json").write_text((model / "forecaster.json").read_text())
    (bad / "forecaster.pt").write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ValidationError, match="cannot load the forecaster weights") as e:
        LSTMForecaster.load(bad)
    assert e.value.field == "model"
    code, out = _evaluate("--data", str(data), "--model", str(bad))
    assert code == 2 and "forecaster.pt" in out
    meta = json.loads((model / "forecaster.json").read_text())
    # ... and sizes no training makes ("hidden": 12000 built a 3 GB network first)
    for key, value in (("targets", "cpu"), ("step_s", 0), ("lookback", -1),
                       ("hidden", 12_000), ("horizon", 10**9), ("layers", 1_000)):
        (bad / "forecaster.json").write_text(json.dumps({**meta, key: value}))
        with pytest.raises(ValidationError) as e:
            LSTMForecaster.load(bad)
        assert e.value.field == key


@pytest.mark.parametrize("value", [1e300, 2e5, -20.0])
def test_absurd_utilization_is_refused_naming_the_row(tmp_path: Path, value: float) -> None:
    df = _table(columns=("cpu",))
    df.loc[7, "cpu"] = value
    f = _csv(tmp_path, df)
    with pytest.raises(ValidationError, match="utilization") as e:
        load_long(f)
    assert (e.value.field, e.value.row, e.value.source) == ("cpu", 7, str(f))
    code, out = _evaluate("--data", str(f))
    assert code == 2 and "row 7" in out


def test_the_google_loader_names_its_own_column(tmp_path: Path) -> None:
    f = tmp_path / "g.csv"
    f.write_text("vm_file,job_id,day,step,cpu_util_pct,mem_util_pct\n"
                 "v,1,1,0,3,40\nv,1,1,1,1e300,40\n")
    with pytest.raises(ValidationError) as e:
        load_google2011(f)
    assert (e.value.field, e.value.row) == ("cpu_util_pct", 1)


@pytest.mark.parametrize(("edit", "field", "says"), [
    # an empty id cell: a TypeError from the sort (a float among strings)
    (lambda text: text.replace("\ns0,", "\n,", 1), "series_id", "empty"),
    # a header only: an IndexError
    (lambda text: text.splitlines()[0] + "\n", "data", "no rows"),
    # a column named twice became a second target "cpu.1"
    (lambda text: text.replace("series_id,timestamp,cpu,mem", "series_id,timestamp,cpu,cpu"),
     "cpu", "twice"),
    # a trailing comma shifted every column by one
    (lambda text: text.replace("\n", ",\n").replace("mem,\n", "mem\n", 1), "file",
     "trailing comma"),
])
def test_malformed_long_tables_are_named_not_a_traceback(tmp_path: Path, edit, field,
                                                         says) -> None:
    f = tmp_path / "usage.csv"
    f.write_text(edit(_csv(tmp_path, _table(n=4)).read_text()))
    with pytest.raises(ValidationError, match=says) as e:
        load_long(f)
    assert e.value.field == field, str(e.value)
    code, out = _evaluate("--data", str(f))
    assert code == 2 and out.startswith("error:") and "Traceback" not in out


def test_true_false_utilization_is_refused(tmp_path: Path) -> None:
    """True/False cells were read as 1 and 0 %."""
    df = _table(n=4)
    df["cpu"] = df["cpu"] > 30
    with pytest.raises(ValidationError, match="true/false") as e:
        load_long(_csv(tmp_path, df))
    assert e.value.field == "cpu"


def test_an_out_path_that_cannot_be_a_folder_fails_before_training(tmp_path: Path) -> None:
    """``forecast train --out`` naming a file trained every epoch first, then failed as
    "error: File exists" (13 minutes with the defaults); federate's --out was already
    checked as the command line is read."""
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    r = CliRunner().invoke(main, ["forecast", "train", "--data", str(_csv(tmp_path, _table(8))),
                                  "--epochs", "1", "--out", str(taken)])
    assert r.exit_code == 2 and "Invalid value for '--out'" in r.output, r.output
    assert "saved" not in r.output and taken.read_text() == "not a folder"


@pytest.mark.parametrize("command, artifact", [
    (["forecast", "train"], "forecaster.pt"), (["federate"], "forecaster.json"),
    (["bench", "federation"], "forecaster.pt"), (["telemetry", "reduce"], "projection.npz")])
def test_a_trained_model_is_replaced_only_when_asked(tmp_path: Path, command: list[str],
                                                     artifact: str) -> None:
    """The defaults are the shipped models' folders (models/forecast, ...): retraining
    replaced the model there unasked, after minutes of work."""
    from click.testing import CliRunner

    from smartsched.cli import main

    out = tmp_path / "model"
    out.mkdir()
    (out / artifact).write_bytes(b"the model")
    r = CliRunner().invoke(main, [*command, "--out", str(out), "--data", str(tmp_path / "no")]
                           if command != ["telemetry", "reduce"]
                           else [*command, "--out", str(out), "--hours", "-1"])
    assert r.exit_code == 2 and "--overwrite" in r.output and artifact in r.output, r.output
    assert (out / artifact).read_bytes() == b"the model"
    again = CliRunner().invoke(main, [*command, "--overwrite", "--out", str(out), "--data",
                                      str(tmp_path / "no")] if command != ["telemetry", "reduce"]
                               else [*command, "--overwrite", "--out", str(out), "--hours", "-1"])
    assert "--overwrite" not in again.output, again.output  # past the check: another error
    assert again.exit_code != 0 and (out / artifact).read_bytes() == b"the model"


@pytest.mark.parametrize(("row", "field", "value"), [
    ("v,1,1.5,1,3,40", "day", "1.5"),  # truncated to day 1 without a word
    ("v,1,1,2.7,3,40", "step", "2.7"),  # truncated to step 2
    ("v,1,1,1e20,3,40", "step", "1e+20"),  # wrapped around int64
    ("v,1,1,288,3,40", "step", "288"),  # the next day's step 0
    ("v,1,0,1,3,40", "day", "0"),
])
def test_the_google_loader_refuses_a_day_or_step_that_is_no_index(tmp_path: Path, row: str,
                                                                    field: str,
                                                                    value: str) -> None:
    f = tmp_path / "g.csv"
    f.write_text("vm_file,job_id,day,step,cpu_util_pct,mem_util_pct\n"
                 f"v,1,1,0,3,40\n{row}\nv,1,1,3,3,40\n")
    with pytest.raises(ValidationError, match="whole number") as e:
        load_google2011(f)
    assert (e.value.field, e.value.row) == (field, 1) and value in str(e.value)


def test_a_device_given_as_a_data_file_is_named_as_one(tmp_path) -> None:
    from smartsched.forecast.run import load_any
    from smartsched.model.table import read_frame

    link = tmp_path / "zero.csv"
    link.symlink_to("/dev/zero")
    for read in (load_any, read_frame):  # forecast data; traces and tables
        with pytest.raises(ValidationError, match="not a regular file"):
            read(link)


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_a_typed_timestamp_column_is_read_by_its_own_unit(tmp_path: Path, unit: str) -> None:
    """pandas writes a datetime column to Parquet as a timestamp type (us or ns); read
    as a number it looked like readings years apart ("milliseconds?")."""
    df = _table(columns=("cpu",))
    plain = load_long(_csv(tmp_path, df))
    typed = df.assign(timestamp=pd.to_datetime(df["timestamp"], unit="s")
                      .astype(f"datetime64[{unit}]").dt.tz_localize("UTC")
                      .dt.tz_convert("Europe/Berlin"))
    f = tmp_path / "typed.parquet"
    typed.to_parquet(f)
    got = load_long(f)
    assert [(s.id, s.start_s, s.step_s) for s in got] == \
        [(s.id, s.start_s, s.step_s) for s in plain]
    np.testing.assert_array_equal(got[0].values, plain[0].values)


def test_a_missing_typed_timestamp_is_named_with_its_row(tmp_path: Path) -> None:
    df = _table(columns=("cpu",))
    df["timestamp"] = pd.to_datetime(df["timestamp"], unit="s")
    df.loc[3, "timestamp"] = pd.NaT
    f = tmp_path / "nat.parquet"
    df.to_parquet(f)
    with pytest.raises(ValidationError, match=r"timestamp.*row 3.*not a time"):
        load_long(f)


def test_windows_too_large_for_memory_are_refused_before_they_are_built(monkeypatch) -> None:
    """At 10-s steps a day's window is 8,643 steps: a 14 MB file's windows passed 5 GB,
    still growing, before anything was said (probe round 8)."""
    import smartsched.forecast.windows as windows

    monkeypatch.setattr(windows, "MAX_WINDOW_BYTES", 1 << 20)
    s = Series("a", 0.0, 10.0, ("cpu",), np.ones((2 * 8640, 1), np.float32))
    with pytest.raises(ValidationError, match=r"windows of 8,643 steps would need .*"
                       r"10-s steps .* resample") as e:
        make_windows([s], 8640, 3, stride=3)
    assert e.value.field == "data"
    assert len(make_windows([s], 8, 3, stride=100)) > 0  # a small lookback still fits
