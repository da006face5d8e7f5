"""Federated learning across MEC sites: the average, the wire, the partition, what leaves
a site, and the rounds (issue 22)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from smartsched.federation.aggregate import fedavg
from smartsched.federation.partition import partition_series
from smartsched.federation.rounds import InProcess, calibrate_from_counts, federate
from smartsched.federation.site import SiteLearner
from smartsched.federation.wire import decode_weights, encode_weights
from smartsched.forecast.data import Series
from smartsched.forecast.lstm import LSTMForecaster, LSTMSettings
from smartsched.model.errors import UnknownReferenceError, ValidationError

SETTINGS = {"lookback": 6, "horizon": 2, "hidden": 8, "seed": 0, "batch": 64}


def fleet(jobs: int = 12, days: int = 2, seed: int = 0, level_step: float = 4.0
          ) -> list[Series]:
    """Jobs of 1-2 series each; load levels differ by job (what ``level`` splits on)."""
    rng = np.random.default_rng(seed)
    out = []
    for j in range(jobs):
        for r in range(1 + j % 2):
            t = np.arange(days * 72)
            base = 20.0 + level_step * j
            cpu = base + 8 * np.sin(2 * np.pi * t / 72 + rng.uniform(0, 6)) + rng.normal(0, 1,
                                                                                          t.size)
            mem = base / 2 + rng.normal(0, 0.3, t.size)
            out.append(Series(f"job{j}-r{r}", float(r * 1e6), 1200.0, ("cpu", "mem"),
                              np.stack([cpu, mem], axis=1).astype(np.float32)))
    return out


def model_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"a.weight": rng.normal(size=(3, 4)).astype(np.float32),
            "b.bias": rng.normal(size=5).astype(np.float32)}


# ------------------------------------------------------------------ the average
def test_the_average_of_identical_updates_is_the_update_bit_for_bit():
    w = model_arrays()
    avg = fedavg([(w, 3), (dict(w), 17), (dict(w), 1.5)])
    for k in w:
        assert avg[k].dtype == np.float32
        assert np.array_equal(avg[k], w[k])


def test_the_average_weights_sites_by_their_training_samples():
    a, b = model_arrays(0), model_arrays(1)
    avg = fedavg([(a, 1), (b, 3)])
    for k in a:
        np.testing.assert_allclose(avg[k], 0.25 * a[k] + 0.75 * b[k], rtol=1e-6)


@pytest.mark.parametrize("updates,field", [
    ([], "updates"),
    ([(model_arrays(), 1), (model_arrays(), 0)], "updates[1].samples"),
    ([(model_arrays(), 1), (model_arrays(), float("nan"))], "updates[1].samples"),
    ([(model_arrays(), 1), ({"a.weight": np.zeros((3, 4), np.float32)}, 1)], "updates[1]"),
    ([(model_arrays(), 1), ({"a.weight": np.zeros((4, 3), np.float32),
                             "b.bias": np.zeros(5, np.float32)}, 1)], "updates[1].a.weight"),
])
def test_the_average_refuses_bad_updates_naming_them(updates, field):
    with pytest.raises(ValidationError) as e:
        fedavg(updates)
    assert e.value.field == field


# ------------------------------------------------------------------ the wire
def test_weights_cross_as_bytes_and_come_back_equal():
    w = model_arrays()
    back = decode_weights(encode_weights(w), {k: v.shape for k, v in w.items()})
    assert set(back) == set(w) and all(np.array_equal(back[k], w[k]) for k in w)


def test_a_blob_that_would_unpickle_is_refused_not_run():
    buf = io.BytesIO()
    np.savez(buf, evil=np.array([{"x": 1}], dtype=object))  # needs pickle to read
    with pytest.raises(ValidationError, match="not a weights archive") as e:
        decode_weights(buf.getvalue())
    assert e.value.field == "update"
    with pytest.raises(ValidationError):
        decode_weights(b"not an archive at all")


def test_an_update_for_another_model_is_refused_by_name():
    w = model_arrays()
    like = {k: v.shape for k, v in w.items()}
    with pytest.raises(ValidationError, match="missing"):
        decode_weights(encode_weights({"a.weight": w["a.weight"]}), like)
    with pytest.raises(ValidationError) as e:
        decode_weights(encode_weights({**w, "b.bias": np.zeros(6, np.float32)}), like)
    assert e.value.field == "update.b.bias"
    with pytest.raises(ValidationError, match="NaN"):
        decode_weights(encode_weights({**w, "b.bias": np.full(5, np.nan, np.float32)}), like)


# ------------------------------------------------------------------ the partition
def test_every_series_goes_to_one_site_and_jobs_stay_whole():
    series = fleet(jobs=13)
    held = partition_series(series, ["e0", "e1", "e2"], "level")
    ids = [i for v in held.values() for i in v]
    assert sorted(ids) == sorted(s.id for s in series)
    site_of_job = {}
    for site, v in held.items():
        for i in v:
            assert site_of_job.setdefault(i.split("-r")[0], site) == site
    means = {s.id: float(s.values[:, 0].mean()) for s in series}
    levels = [np.mean([means[i] for i in held[n]]) for n in ("e0", "e1", "e2")]
    assert levels[0] < levels[1] < levels[2]  # non-IID: each site its own load level
    assert all(len(v) >= 3 for v in held.values())  # about equal shares


def test_the_iid_partition_is_seeded():
    series = fleet(jobs=10)
    a = partition_series(series, ["x", "y"], "iid", seed=1)
    assert a == partition_series(series, ["x", "y"], "iid", seed=1)
    assert a != partition_series(series, ["x", "y"], "iid", seed=2)


@pytest.mark.parametrize("sites,how,field", [
    ([], "level", "sites"), (["a", "a"], "level", "sites"),
    ([f"s{i}" for i in range(20)], "level", "sites"), (["a"], "by-mood", "partition"),
])
def test_bad_partitions_are_refused_naming_the_field(sites, how, field):
    with pytest.raises(ValidationError) as e:
        partition_series(fleet(jobs=5), sites, how)
    assert e.value.field == field


# ------------------------------------------------------------------ what leaves a site
def _leaves(obj: Any) -> list[Any]:
    """Every leaf value of a nested answer (dicts, lists, tuples)."""
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _leaves(v)]
    if isinstance(obj, list | tuple):
        return [x for v in obj for x in _leaves(v)]
    return [obj]


def _answers(site: Any, get: Any, global_blob: bytes) -> list[Any]:
    return [get(site.describe.remote()), get(site.train.remote(global_blob, 1, 0.0)),
            get(site.train.remote(global_blob, 1, 0.5)), get(site.errors.remote(global_blob,
                                                                                 "val")),
            get(site.errors.remote(global_blob, "test")),
            get(site.coverage.remote(global_blob, [0.5, 1.0, 2.0]))]


def _check_nothing_raw_left(answers: list[Any], raw: np.ndarray, shapes: dict[str, tuple]
                            ) -> None:
    allowed = {"site", "targets", "step_s", "windows", "weights", "samples", "train_pinball",
               "seconds", "abs_err", "count", "covered"}
    numbers: list[float] = []
    for a in answers:
        assert set(a) <= allowed, set(a) - allowed
        for leaf in _leaves(a):
            if isinstance(leaf, bytes):  # only the model's own arrays, nothing else
                arrays = decode_weights(leaf, shapes)
                numbers += [float(x) for v in arrays.values() for x in v.ravel()]
            elif isinstance(leaf, int | float) and not isinstance(leaf, bool):
                numbers.append(float(leaf))
            else:
                assert isinstance(leaf, str), type(leaf)
    # No value of any record the site holds appears anywhere in what it sent.
    assert not np.isin(np.asarray(numbers, dtype=np.float32), raw.ravel()).any()
    total = sum(a["count"] for a in answers if "count" in a and "abs_err" in a)
    assert len(numbers) < raw.size + total + 10**6  # sanity: the check saw the answers


def test_a_site_sends_only_weights_and_counts_never_a_record():
    series = fleet(jobs=6)
    site = SiteLearner("mec-0", series, None, SETTINGS)
    shapes = site.shapes
    global_blob = encode_weights({k: v.detach().numpy() for k, v in
                                  site.fc.net.state_dict().items()})
    raw = np.concatenate([s.values for s in series])
    _check_nothing_raw_left(_answers(InProcess(site), lambda x: x, global_blob), raw, shapes)


@pytest.mark.slow
def test_a_site_actor_reads_its_own_file_and_only_weights_cross_the_process(ray_session,
                                                                             tmp_path):
    from smartsched.federation.site import site_actor

    series = fleet(jobs=6)
    path = tmp_path / "usage.csv"
    rows = [{"series_id": s.id, "timestamp": s.start_s + t * s.step_s, "cpu": v[0],
             "mem": v[1]} for s in series for t, v in enumerate(s.values)]
    import pandas as pd

    pd.DataFrame(rows).to_csv(path, index=False)
    mine = [s.id for s in series[:5]]
    actor = site_actor(num_cpus=0.25).remote("mec-1", str(path), mine, SETTINGS, threads=1)
    local = SiteLearner("probe", series[:5], None, SETTINGS)  # the same model, for shapes
    global_blob = encode_weights({k: v.detach().numpy() for k, v in
                                  local.fc.net.state_dict().items()})
    raw = pd.read_csv(path)[["cpu", "mem"]].to_numpy(np.float32)
    answers = _answers(actor, ray_session.get, global_blob)
    assert answers[0]["windows"]["train"] > 0
    _check_nothing_raw_left(answers, raw, local.shapes)
    ray_session.kill(actor)


def test_fedprox_keeps_a_site_update_nearer_the_global_model():
    site = SiteLearner("mec-0", fleet(jobs=6), None, {**SETTINGS, "lr": 0.02})
    w0 = {k: v.detach().numpy().copy() for k, v in site.fc.net.state_dict().items()}
    blob = encode_weights(w0)

    def moved(mu: float) -> float:
        site.rng = np.random.default_rng(0)
        out = decode_weights(site.train(blob, 2, mu)["weights"])
        return float(sum(((out[k] - w0[k]) ** 2).sum() for k in w0))

    assert moved(5.0) < 0.8 * moved(0.0)


def test_a_site_refuses_bad_requests_naming_the_field():
    site = SiteLearner("mec-0", fleet(jobs=4), None, SETTINGS)
    blob = encode_weights({k: v.detach().numpy() for k, v in site.fc.net.state_dict().items()})
    for call, field in ((lambda: site.train(blob, 0), "local_epochs"),
                        (lambda: site.train(blob, 1, -1.0), "mu"),
                        (lambda: site.errors(blob, "train"), "split"),
                        (lambda: site.train(encode_weights(model_arrays())), "global_model")):
        with pytest.raises(ValidationError) as e:
            call()
        assert e.value.field == field
    with pytest.raises(ValidationError) as e:
        SiteLearner("mec-0", fleet(jobs=4), ["nobody"], SETTINGS)
    assert e.value.field == "sites.mec-0"


# ------------------------------------------------------------------ rounds
def _sites(jobs: int = 12, n: int = 3) -> dict[str, Any]:
    series = fleet(jobs=jobs)
    held = partition_series(series, [f"mec-{i}" for i in range(n)], "level")
    return {name: InProcess(SiteLearner(name, series, ids, SETTINGS, seed=0))
            for name, ids in held.items()}


def test_rounds_learn_record_their_cost_and_are_deterministic(tmp_path):
    settings = LSTMSettings(**SETTINGS)
    run = federate(_sites(), settings, rounds=4)
    val = [float(np.mean(r["val_mae"])) for r in run.rounds]
    assert min(val) < val[0]  # averaging the sites' updates learned something
    assert run.best_round == 1 + int(np.argmin(val))
    n_params = run.config["parameters"]
    for r in run.rounds:
        assert r["bytes_up"] >= 3 * 4 * n_params  # three sites' float32 weights
        assert r["bytes_down"] == r["bytes_up"]
        assert r["seconds"] > 0
    again = federate(_sites(), settings, rounds=4)
    assert [r["val_mae"] for r in again.rounds] == [r["val_mae"] for r in run.rounds]
    # The result is an ordinary forecaster: saved, loaded, used by load-aware placement.
    folder = run.forecaster.save(tmp_path / "fed")
    fc = LSTMForecaster.load(folder)
    assert fc.s.targets == ("cpu", "mem") and fc.s.step_s == 1200.0
    assert len(fc.s.interval_scale) == 2 and all(x > 0 for x in fc.s.interval_scale)
    meta = json.loads((folder / "forecaster.json").read_text())
    assert meta["lookback"] == SETTINGS["lookback"]


def test_server_momentum_steps_past_the_plain_average():
    """FedAvgM: after the first round (where the velocity is the averaged update itself)
    the global model moves further than plain averaging would take it."""
    settings = LSTMSettings(**SETTINGS)
    plain = federate(_sites(), settings, rounds=3)
    moved = federate(_sites(), settings, rounds=3, server_momentum=0.9)
    assert moved.config["algorithm"] == "fedavgm"
    assert moved.rounds[0]["val_mae"] == plain.rounds[0]["val_mae"]  # same first step
    assert moved.rounds[1]["val_mae"] != plain.rounds[1]["val_mae"]


def test_calibration_from_counts_picks_the_smallest_covering_width():
    from smartsched.federation.rounds import SCALES

    covered = np.minimum(np.arange(SCALES.size), 100)  # coverage grows with the width
    reports = [{"covered": [covered.tolist()], "count": 100},
               {"covered": [covered.tolist()], "count": 100}]
    assert calibrate_from_counts(reports) == [float(SCALES[80])]


@pytest.mark.parametrize("kwargs,field", [
    ({"rounds": 0}, "rounds"), ({"rounds": True}, "rounds"), ({"local_epochs": 0},
                                                              "local_epochs"),
    ({"mu": -0.1}, "mu"), ({"mu": float("inf")}, "mu"),
    ({"server_momentum": 1.0}, "server_momentum"), ({"server_momentum": -0.5},
                                                    "server_momentum"),
])
def test_federate_refuses_bad_settings_naming_the_field(kwargs, field):
    with pytest.raises(ValidationError) as e:
        federate(_sites(jobs=6, n=2), LSTMSettings(**SETTINGS), **{"rounds": 1, **kwargs})
    assert e.value.field == field


def test_federate_needs_sites_that_agree_on_the_model():
    with pytest.raises(ValidationError) as e:
        federate({}, LSTMSettings(**SETTINGS))
    assert e.value.field == "sites"
    a = fleet(jobs=3)
    b = [Series(s.id, s.start_s, 600.0, s.targets, s.values) for s in fleet(jobs=3, seed=1)]
    sites = {"x": InProcess(SiteLearner("x", a, None, SETTINGS)),
             "y": InProcess(SiteLearner("y", b, None, SETTINGS))}
    with pytest.raises(ValidationError, match="disagree") as e:
        federate(sites, LSTMSettings(**SETTINGS), rounds=1)


# ------------------------------------------------------------------ the command's input
def test_site_names_are_checked_against_the_cluster():
    from smartsched.bench.federation import edge_sites

    assert edge_sites("large") == ["mec-0", "mec-1", "mec-2", "mec-3"]
    assert edge_sites("large", ["mec-2"]) == ["mec-2"]
    with pytest.raises(UnknownReferenceError) as e:
        edge_sites("large", ["mec-9"])
    assert e.value.field == "sites" and "mec-9" in str(e.value)
    with pytest.raises(ValidationError) as e:
        edge_sites("openb-gpu")
    assert e.value.field == "cluster"


def test_the_cli_names_the_bad_field(tmp_path: Path):
    from click.testing import CliRunner

    from smartsched.cli import main

    r = CliRunner().invoke(main, ["bench", "federation", "--rounds", "0"])
    assert r.exit_code == 2 and "rounds" in r.output
    r = CliRunner().invoke(main, ["federate", "--sites", "mec-0,mec-7", "--out",
                                  str(tmp_path / "fed")])
    assert r.exit_code == 2 and "mec-7" in r.output and "sites" in r.output
