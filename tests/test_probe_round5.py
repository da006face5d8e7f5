"""Cases left open by the fourth probe (2026-12-07), fixed in the fifth round: each failed
before its fix.

- ``lookahead:rl:P?k=8`` gave k to the lookahead, though the shortlist policy takes a k of
  its own (and ``sandboxed:lookahead:fgd?samples=3`` gave samples to the sandbox): which
  one a lone option part belongs to is now said, or the spec is refused naming the key;
- ``simulate --out DIR`` into a folder holding an earlier run's report replaced it unasked,
  and a run without plots left the earlier run's plots beside its own figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smartsched.model.errors import ValidationError
from smartsched.scheduling.base import make_scheduler, option_names, split_wrapper_spec
from smartsched.scheduling.lookahead import OPTION_NAMES as LOOKAHEAD
from smartsched.serving.config import resolve_reload_profile
from tests.test_cli import smartsched

POLICY = str(Path(__file__).resolve().parents[1] / "models" / "ppo_mixed_small")


@pytest.mark.parametrize(("spec", "base", "own"), [
    ("rl:P??k=8", "rl:P", {"k": ["8"]}),             # the lookahead's k
    ("rl:P?k=8?", "rl:P?k=8", {}),                   # the shortlist's k
    ("rl:P?k=8&horizon=2", "rl:P", {"k": ["8"], "horizon": ["2"]}),  # rl takes no horizon
    ("rl:P?weights=green", "rl:P?weights=green", {}),  # the lookahead takes no weights
    ("rl:P?weights=x?k=8", "rl:P?weights=x", {"k": ["8"]}),
    ("fgd?k=8", "fgd", {"k": ["8"]}),                # a profile takes no options
    ("fgd", "fgd", {}),
])
def test_a_wrappers_options_are_told_from_its_bases(spec: str, base: str, own: dict) -> None:
    assert split_wrapper_spec("lookahead", spec, LOOKAHEAD) == (base, own)


@pytest.mark.parametrize(("wrapper", "spec", "key"), [
    ("lookahead", "rl:P?k=8", "k"),
    ("sandboxed", "lookahead:fgd?samples=3", "samples"),
    ("sandboxed", "lookahead:fgd?rollout=fgd&samples=3", "rollout"),
])
def test_a_lone_part_either_could_take_is_refused_naming_the_key(wrapper: str, spec: str,
                                                                 key: str) -> None:
    own = option_names(f"{wrapper}:x")
    assert own
    with pytest.raises(ValidationError) as e:
        split_wrapper_spec(wrapper, spec, own)
    assert e.value.field == f"scheduler.{key}"
    assert "<base>??<options>" in e.value.message and "<base>?<options>?" in e.value.message
    assert spec.rpartition("?")[2] not in e.value.message  # the spec is not repeated
    with pytest.raises(ValidationError):  # through the scheduler factory alike
        make_scheduler(f"{wrapper}:{spec}")


def test_each_reading_builds_the_scheduler_it_says() -> None:
    wrapped = make_scheduler(f"lookahead:rl:{POLICY}??k=3&horizon=2&samples=1")
    assert wrapped.k == 3 and wrapped.base.name.startswith("rl:")
    shortlist = make_scheduler(f"lookahead:rl:{POLICY}?base=fgd&k=3?")
    assert shortlist.k == 4 and shortlist.base.shortlist.k == 3  # the lookahead's default


def test_a_reload_keeps_each_option_with_its_owner(tmp_path: Path) -> None:
    models = tmp_path / "models"
    (models / "p").mkdir(parents=True)
    top = models.resolve()
    assert resolve_reload_profile("lookahead:rl:p??k=8", str(models)) == \
        f"lookahead:rl:{top}/p??k=8"
    assert resolve_reload_profile("lookahead:rl:p?base=fgd&k=8?", str(models)) == \
        f"lookahead:rl:{top}/p?base=fgd&k=8?"
    assert resolve_reload_profile("lookahead:rl:p?k=8&horizon=2", str(models)) == \
        f"lookahead:rl:{top}/p?k=8&horizon=2"
    assert resolve_reload_profile("lookahead:fgd?k=8", str(models)) == "lookahead:fgd?k=8"
    with pytest.raises(ValidationError) as e:
        resolve_reload_profile("lookahead:rl:p?k=8", str(models))
    assert e.value.field == "profile"
    # The base's own options are held to the models dir as before.
    with pytest.raises(ValidationError):
        resolve_reload_profile("lookahead:rl:p?filters=../x.yaml?k=8", str(models))


SIM = ("simulate", "--cluster", "small", "--workload", "mixed", "--scheduler", "fgd",
       "--hours", "0.2", "--no-progress")


def test_simulate_keeps_an_earlier_report_unless_told_to_replace_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = smartsched(*SIM, "--seed", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    first = json.loads((out / "report.json").read_text())
    assert (out / "queue.png").is_file()
    r = smartsched(*SIM, "--seed", "2", "--out", str(out), "--no-plots")
    assert r.returncode == 2 and "'--out'" in r.stderr and "--overwrite" in r.stderr
    assert "Traceback" not in r.stderr
    assert json.loads((out / "report.json").read_text()) == first
    r = smartsched(*SIM, "--seed", "2", "--out", str(out), "--no-plots", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "report.json").read_text())["seed"] == 2
    assert not list(out.glob("*.png"))  # the first run's plots are not left beside it
