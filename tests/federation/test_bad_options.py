"""`smartsched federate` and `bench federation` refuse bad options as the command line is read,
before Ray and the site actors start (run_federation is replaced by a tripwire)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from smartsched.cli import main
from smartsched.federation import MAX_ROUNDS
from smartsched.federation.rounds import federate
from smartsched.forecast.lstm import LSTMSettings
from smartsched.model.errors import ValidationError

COMMANDS = [["federate"], ["bench", "federation"]]


class Started(Exception):
    """The command got past its options and began the run."""


@pytest.fixture(autouse=True)
def _tripwire(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import smartsched.bench.federation as bench

    def run(*_a: object, **_k: object) -> None:
        raise Started

    monkeypatch.setattr(bench, "run_federation", run)
    monkeypatch.chdir(tmp_path)  # federate's default --out is made here, not in the repo


@pytest.mark.parametrize("cmd", COMMANDS)
@pytest.mark.parametrize(("args", "option"), [
    (["--local-epochs", "0"], "--local-epochs"),
    (["--local-epochs", "-1"], "--local-epochs"),
    (["--mu", "nan"], "--mu"),
    (["--mu", "inf"], "--mu"),
    (["--mu", "-1"], "--mu"),
    (["--server-momentum", "nan"], "--server-momentum"),
    (["--server-momentum", "1"], "--server-momentum"),
    (["--server-momentum", "-5"], "--server-momentum"),
    (["--rounds", "1000000000"], "--rounds"),
    (["--sites", ",,,"], "--sites"),
    (["--out", "/proc/x"], "--out"),
])
def test_a_bad_option_is_named_before_the_run(cmd: list[str], args: list[str],
                                              option: str) -> None:
    r = CliRunner().invoke(main, [*cmd, *args])
    assert r.exit_code == 2, r.output
    assert f"'{option}'" in r.output and not isinstance(r.exception, Started)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_an_out_path_that_is_a_file_is_refused(cmd: list[str], tmp_path: Path) -> None:
    f = tmp_path / "taken"
    f.write_text("x")
    r = CliRunner().invoke(main, [*cmd, "--out", str(f)])
    assert r.exit_code == 2 and "'--out'" in r.output


@pytest.mark.parametrize("cmd", COMMANDS)
def test_good_options_reach_the_run_and_make_the_out_folder(cmd: list[str],
                                                            tmp_path: Path) -> None:
    out = tmp_path / "a" / "model"
    r = CliRunner().invoke(main, [*cmd, "--sites", "mec-0,", "--rounds", str(MAX_ROUNDS),
                                  "--server-momentum", "0.9", "--out", str(out)])
    assert isinstance(r.exception, Started), r.output
    assert out.is_dir()


def test_the_library_bounds_rounds_too() -> None:
    with pytest.raises(ValidationError) as e:
        federate({"x": object()}, LSTMSettings(), rounds=MAX_ROUNDS + 1)
    assert e.value.field == "rounds"
