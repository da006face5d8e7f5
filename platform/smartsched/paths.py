"""Where SmartSched finds shared data and writes its outputs.

Owns the resolution of ``SMARTSCHED_DATA_DIR`` (default ``../shared/data``
relative to the working directory, as laid out for development) so every
loader and test agrees on one location.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "SMARTSCHED_DATA_DIR"


def data_dir() -> Path:
    """The public-trace root: ``$SMARTSCHED_DATA_DIR`` or ``../shared/data``."""
    return Path(os.environ.get(DATA_DIR_ENV, "../shared/data")).expanduser()
