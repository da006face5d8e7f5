"""A damaged policy folder is a clear error naming the scheduler, never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from smartsched.model.errors import ValidationError
from smartsched.scheduling.base import make_scheduler

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "ppo_mixed_small"


@pytest.mark.parametrize(("damaged", "content", "says"), [
    ("smartsched_policy.json", "{bad json", "not a readable policy description"),
    ("smartsched_policy.json", "[1, 2]", "not a policy description"),
    ("module_weights.pt", "junk", "cannot load the policy module"),
    ("module_spec.json", '{"class": "os.system"}', "is not one SmartSched builds"),
])
def test_a_damaged_policy_names_the_scheduler(tmp_path: Path, damaged: str, content: str,
                                              says: str) -> None:
    folder = tmp_path / "policy"
    shutil.copytree(SHIPPED, folder)
    (folder / damaged).write_text(content)
    with pytest.raises(ValidationError) as e:
        make_scheduler(f"rl:{folder}", 0)
    assert e.value.field == "scheduler" and says in e.value.message


def test_the_shipped_policy_holds_no_pickle() -> None:
    # Loading a pickle runs whatever it holds: the export is JSON plus tensors only.
    assert not list(SHIPPED.glob("*.pkl"))
    assert (SHIPPED / "module_spec.json").exists() and (SHIPPED / "module_weights.pt").exists()
