"""Round 8 of the command-line and data-input probe: files that hang or eat memory where a
one-line refusal belongs, unverified figures trusted, and references checked too late."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from smartsched.audit.log import AuditLog
from smartsched.audit.store import LOG_ID_FILE
from smartsched.audit.verify import prove, verify_log
from smartsched.model.errors import ValidationError
from tests.audit.test_log import _write_log


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def _heads(root: Path) -> Path:
    return root / "heads" / "heads.jsonl"


def test_prove_bounds_an_unverified_heads_range_before_reading(tmp_path: Path, key) -> None:
    """One edited ``last_seq`` (4e18) made ``prove`` build a list as long as the claimed
    block: a MemoryError traceback (1e8: 4 GB and 16 s)."""
    _write_log(tmp_path, key, 40, block_records=16)
    lines = _heads(tmp_path).read_text().splitlines()
    d = json.loads(lines[0])
    d["last_seq"] = 4_000_000_000_000_000_000
    lines[0] = json.dumps(d, separators=(",", ":"))
    _heads(tmp_path).write_text("\n".join(lines) + "\n")
    with pytest.raises(ValidationError, match=r"covers \d+ records \(1\.\.4096 allowed\)"):
        prove(tmp_path / "log", _heads(tmp_path), 2)


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_log_id_that_is_no_regular_file_is_refused_not_waited_on(tmp_path: Path, key,
                                                                     kind: str) -> None:
    """verify, prove and every writer read the log's id file whole: a FIFO waited for a
    writer forever, a link to /dev/zero ate memory until the machine ran out."""
    _write_log(tmp_path, key, 20, block_records=16)
    lid = tmp_path / "log" / LOG_ID_FILE
    lid.unlink()
    if kind == "fifo":
        os.mkfifo(lid)
    else:
        lid.symlink_to("/dev/zero")
    why = "not a regular file"
    with pytest.raises(ValidationError, match=why):
        verify_log(tmp_path / "log", _heads(tmp_path), key.public_key())
    with pytest.raises(ValidationError, match=why):
        prove(tmp_path / "log", _heads(tmp_path), 2)
    with pytest.raises(ValidationError, match=why) as e:
        AuditLog(tmp_path / "log", _heads(tmp_path), key, autoseal=False, fsync=False)
    assert e.value.field == "audit.log"


@pytest.mark.parametrize("what", ["forecaster", "policy", "telemetry"])
@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_models_own_description_that_is_no_regular_file_is_refused(
        tmp_path: Path, what: str, kind: str) -> None:
    """A model folder's JSON description was read with a bare read: a FIFO hung every
    command that loads the model (simulate, forecast evaluate, policy stage), a link to
    /dev/zero ate memory without bound."""
    from smartsched.forecast.lstm import LSTMForecaster
    from smartsched.rl.policy import POLICY_META, read_policy_meta
    from smartsched.twin.telemetry.reduction import PROJECTION_META, TelemetryProjection

    name = {"forecaster": "forecaster.json", "policy": POLICY_META,
            "telemetry": PROJECTION_META}[what]
    target = tmp_path / name
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    load = {"forecaster": LSTMForecaster.load,
            "policy": lambda f: read_policy_meta(f, "scheduler"),
            "telemetry": TelemetryProjection.load}[what]
    with pytest.raises(ValidationError, match="not a regular file"):
        load(tmp_path)


DEEP = "[" * 30_000 + "]" * 30_000


def test_json_nested_thousands_deep_is_refused_in_one_line(tmp_path: Path, key) -> None:
    """json.loads raises RecursionError, not ValueError, on 30,000 nested arrays: a
    traceback from audit verify (exit 1, as FAILED), the policy store, cluster files and
    model folders (probe round 8)."""
    from smartsched.forecast.lstm import LSTMForecaster
    from smartsched.rl.policy import POLICY_META, read_policy_meta
    from smartsched.rl.versions import PolicyStore

    _write_log(tmp_path, key, 20, block_records=16)
    with _heads(tmp_path).open("a") as f:
        f.write(DEEP + "\n")
    rep = verify_log(tmp_path / "log", _heads(tmp_path), key.public_key())
    assert not rep.ok and "not a head" in rep.problem.reason
    store = tmp_path / "store"
    store.mkdir()
    (store / "store.json").write_text(DEEP)
    with pytest.raises(ValidationError, match="unreadable"):
        PolicyStore(store).current()
    model = tmp_path / "model"
    model.mkdir()
    (model / "forecaster.json").write_text(DEEP)
    (model / POLICY_META).write_text(DEEP)
    with pytest.raises(ValidationError):
        LSTMForecaster.load(model)
    with pytest.raises(ValidationError, match="not a readable policy description"):
        read_policy_meta(model, "scheduler")


def test_a_number_past_pythons_digit_cap_is_a_yaml_error() -> None:
    from smartsched.model.configfile import read_yaml_text

    with pytest.raises(ValidationError, match="a number of more than 4,300 digits") as e:
        read_yaml_text("count: " + "1" * 5000 + "\n", "cluster")
    assert e.value.field == "cluster"


def test_a_forecasters_weights_that_are_a_fifo_are_refused(tmp_path: Path) -> None:
    import shutil

    from smartsched.forecast.lstm import LSTMForecaster

    repo = Path(__file__).resolve().parents[1]
    model = tmp_path / "fc"
    shutil.copytree(repo / "models" / "forecast", model)
    (model / "forecaster.pt").unlink()
    os.mkfifo(model / "forecaster.pt")  # torch.load waited for a writer forever
    with pytest.raises(ValidationError, match="cannot load the forecaster weights"):
        LSTMForecaster.load(model)


def test_a_huge_cell_is_cut_where_it_is_named(tmp_path: Path) -> None:
    from smartsched.model.table import _shown

    assert len(_shown("1" * 5000)) < 100 and _shown("abc") == "'abc'"
