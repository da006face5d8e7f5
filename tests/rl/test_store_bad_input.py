"""A policy store given bad input: a damaged log or pointer is named (file, line), a folder
that is not a store is refused, and a refused rollback or promotion changes no file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from smartsched.cli import main
from smartsched.model.errors import ValidationError
from smartsched.rl.versions import PolicyStore

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "ppo_mixed_small"


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes: what a failing command must leave as is."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _cli(*args: str):
    res = CliRunner().invoke(main, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


def _two_versions(root: Path) -> PolicyStore:
    store = PolicyStore(root)
    store.promote(store.add(SHIPPED))
    store.promote(store.add(SHIPPED))
    return store


def test_a_log_line_that_is_not_an_event_is_named(tmp_path: Path) -> None:
    store = PolicyStore(tmp_path / "s")
    store.refuse("rl:x", {"gain_lower": -1.0})
    with open(store.root / "log.jsonl", "a") as f:
        f.write("{bad\n")
    with pytest.raises(ValidationError, match=r"log\.jsonl line 2: not a log event") as e:
        store.log()
    assert e.value.field == "store"
    res = _cli("policy", "versions", "--store", str(store.root))
    assert res.exit_code == 2 and "log.jsonl line 2" in res.output, res.output


def test_a_pointer_that_is_not_utf8_is_named_and_kept(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    (root / "store.json").write_bytes(b"\xff\xfe")
    before = _files(root)
    for cmd in ("rollback", "versions"):
        res = _cli("policy", cmd, "--store", str(root))
        assert res.exit_code == 2 and "store.json: unreadable" in res.output, res.output
    assert _files(root) == before


@pytest.mark.parametrize("pointer", [{"current": "v2", "history": ["v1", 2]},
                                     {"current": 7, "history": []}])
def test_a_pointer_of_the_wrong_shape_is_refused(tmp_path: Path, pointer: dict) -> None:
    (tmp_path / "store.json").write_text(json.dumps(pointer))
    with pytest.raises(ValidationError, match="not a policy store pointer"):
        PolicyStore(tmp_path).current()


def test_a_rollback_to_a_missing_version_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    (root / "store.json").write_text('{"current": "v2", "history": ["v1", "v2"]}')
    before = _files(root)
    res = _cli("policy", "rollback", "--store", str(root))
    assert res.exit_code == 2 and "unknown version 'v1'" in res.output, res.output
    assert _files(root) == before  # the pointer as it was, no rollback logged


def test_a_rollback_or_promotion_to_a_damaged_version_changes_nothing(tmp_path: Path) -> None:
    store = _two_versions(tmp_path / "s")
    (store.versions_dir / "v0001" / "smartsched_policy.json").write_text("{not json")
    before = _files(store.root)
    with pytest.raises(ValidationError):
        store.rollback()
    with pytest.raises(ValidationError):
        store.promote("v0001")
    assert _files(store.root) == before and store.current() == "v0002"


def test_a_folder_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    empty, junk = tmp_path / "empty", tmp_path / "junk"
    empty.mkdir()
    junk.mkdir()
    (junk / "current").write_text("x")
    for folder in (empty, junk):
        for cmd in ("versions", "rollback"):
            res = _cli("policy", cmd, "--store", str(folder))
            assert res.exit_code == 2 and "not a policy store" in res.output, res.output
    before = _files(junk)
    with pytest.raises(ValidationError, match="holds other files"):
        PolicyStore(junk).add(SHIPPED)
    res = _cli("policy", "stage", "--store", str(junk), str(SHIPPED))
    assert res.exit_code == 2 and "holds other files" in res.output, res.output
    assert _files(junk) == before
    # An empty folder, or a new one, becomes a store.
    res = _cli("policy", "stage", "--store", str(empty), str(SHIPPED))
    assert res.exit_code == 0, res.output
    fresh = PolicyStore(tmp_path / "new")
    assert fresh.promote(fresh.add(SHIPPED)) == "v0001"
    res = _cli("policy", "versions", "--store", str(fresh.root))
    assert res.exit_code == 0 and "* v0001" in res.output, res.output


def test_a_log_that_cannot_be_written_stops_a_promotion_before_the_pointer_moves(
        tmp_path: Path) -> None:
    """The pointer was replaced first and the log written after: a log that could not be
    written left a promotion in force that no log line recorded, and a traceback."""
    store = _two_versions(tmp_path / "s")
    log = store.root / "log.jsonl"
    log.unlink()
    log.mkdir()  # not a file: cannot be opened for appending
    before = _files(store.root)
    for act in (lambda: store.promote("v0001"), store.rollback):
        with pytest.raises(ValidationError, match=r"log\.jsonl: cannot be written") as e:
            act()
        assert e.value.field == "store"
    assert _files(store.root) == before and store.current() == "v0002"
    res = _cli("policy", "rollback", "--store", str(store.root))
    assert res.exit_code == 2 and "cannot be written" in res.output, res.output


def test_a_rollback_that_cannot_reload_the_service_leaves_the_store_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``policy rollback --service`` rolled the store back, then failed to reach the service
    (exit 2): the store no longer named what was served, and a retry rolled back again
    (probe round 7). Now the token and the service are checked first, and a reload that
    fails puts the store and the sites reloaded so far back."""
    import json

    from tests.builders import serve_json

    store = _two_versions(tmp_path / "s")
    before = store.current()
    monkeypatch.delenv("SMARTSCHED_OPERATOR_TOKEN", raising=False)
    res = _cli("policy", "rollback", "--store", str(store.root), "--service",
               "http://127.0.0.1:1", "--sites", "a")
    assert res.exit_code == 2 and "SMARTSCHED_OPERATOR_TOKEN" in res.output, res.output
    monkeypatch.setenv("SMARTSCHED_OPERATOR_TOKEN", "op")
    res = _cli("policy", "rollback", "--store", str(store.root), "--service",
               "http://127.0.0.1:1", "--sites", "a")
    assert res.exit_code == 2 and "no answer" in res.output, res.output
    assert store.current() == before

    puts: list[tuple[str, str]] = []

    def handle(method: str, path: str, body: bytes, _headers: object) -> tuple:
        if method == "GET":  # /healthz
            return 200, {"status": "ok"}, None
        site = path.split("/")[-2]  # site a reloads, site b refuses
        puts.append((site, json.loads(body)["profile"].rsplit("/", 1)[-1]))
        return ((200, {"site": site}, None) if site == "a"
                else (422, {"detail": [{"loc": ["profile"], "msg": "no"}]}, None))

    server = serve_json(handle)
    try:
        res = _cli("policy", "rollback", "--store", str(store.root), "--service",
                   f"http://127.0.0.1:{server.server_port}", "--sites", "a,b")
    finally:
        server.shutdown()
    assert res.exit_code == 2 and "put back" in res.output, res.output
    assert store.current() == before
    older = store.log()[-1]["previous"]
    # a serves `before` again, and b is asked to as well (a lost answer may hide a reload)
    assert puts == [("a", older), ("b", older), ("a", before), ("b", before)]


def test_a_store_inside_the_policy_folder_it_takes_is_refused_at_once(tmp_path: Path
                                                                       ) -> None:
    """``policy stage --store pol/st pol`` copied the folder into itself until a path was
    too long (12 s), then refused, leaving an empty ``candidates/`` (probe round 7)."""
    import shutil

    pol = tmp_path / "pol"
    shutil.copytree(SHIPPED, pol)
    store = PolicyStore(pol / "st")
    for act in (store.stage, store.add):
        with pytest.raises(ValidationError, match="inside the policy folder"):
            act(pol)
    assert not (pol / "st").exists()
