"""A benchmark's working folder is its own: ``bench serve --state-dir`` and ``bench audit
--work-dir`` refuse a folder holding anything they did not make, before touching a file
(pointed at ``smartsched serve``'s state, the serve benchmark overwrote the client token
with its fixed one and deleted the reservation journal; the audit benchmark deleted an
audit log's ``log/`` and ``heads/``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from smartsched.bench.workdir import bench_dir
from smartsched.cli import main
from smartsched.model.errors import ValidationError


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _untouchable(*_a: object, **_k: object) -> None:
    raise AssertionError("the benchmark wrote into a folder that is not its own")


def test_bench_serve_refuses_a_services_state_dir(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "serve"
    (state / "journal" / "region-a").mkdir(parents=True)
    (state / "journal" / "region-a" / "journal.jsonl").write_text('{"event": "confirm"}\n')
    (state / "token").write_text("the-services-own-token\n")
    before = _files(state)
    monkeypatch.setattr("smartsched.workloads.parquet_io.write_cluster", _untouchable)
    monkeypatch.setattr("smartsched.ray_local.start_embedded_ray", _untouchable)
    r = CliRunner().invoke(main, ["bench", "serve", "--state-dir", str(state)])
    assert r.exit_code == 2, r.output
    assert "--state-dir" in r.output and "did not make" in r.output
    assert "Traceback" not in r.output and _files(state) == before


def test_bench_audit_refuses_an_audit_logs_folder_and_reuses_its_own(tmp_path: Path) -> None:
    real = tmp_path / "audit"
    (real / "log").mkdir(parents=True)
    (real / "log" / "00000000000000000000.parquet").write_bytes(b"records")
    (real / "heads").mkdir()
    (real / "heads" / "head.json").write_text("{}")
    before = _files(real)
    r = CliRunner().invoke(main, ["bench", "audit", "--records", "20", "--proofs", "2",
                                  "--no-fsync", "--work-dir", str(real)])
    assert r.exit_code == 2 and "--work-dir" in r.output, r.output
    assert _files(real) == before
    own = tmp_path / "bench"
    for _ in range(2):  # a new folder, then the same one as the benchmark left it
        r = CliRunner().invoke(main, ["bench", "audit", "--records", "20", "--proofs", "2",
                                      "--no-fsync", "--work-dir", str(own)])
        assert r.exit_code == 0, r.output
    assert (own / "log").is_dir()


def test_bench_dir_takes_new_or_empty_folders_only(tmp_path: Path) -> None:
    assert bench_dir(tmp_path / "new" / "deeper", "serve", "--state-dir").is_dir()
    (tmp_path / "empty").mkdir()
    assert bench_dir(tmp_path / "empty", "serve", "--state-dir") == (tmp_path / "empty")
    with pytest.raises(ValidationError) as e:  # another benchmark's folder is not this one's
        bench_dir(tmp_path / "empty", "audit", "--work-dir")
    assert e.value.field == "--work-dir"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValidationError, match="not a folder"):
        bench_dir(tmp_path / "file", "serve", "--state-dir")
