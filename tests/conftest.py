"""Shared fixtures: the public-trace directory and small builders.

Under CI=true a missing data dir fails the tests that need it (CI must have
the traces); on a developer machine those tests are skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from smartsched.paths import data_dir as _data_dir


@pytest.fixture(scope="session")
def data_dir() -> Path:
    d = _data_dir()
    if not (d / "alibaba-openb-gpu-2023").is_dir():
        msg = f"public traces not found at {d.resolve()} (set SMARTSCHED_DATA_DIR)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return d
