"""The ingress replica of this process, for the FastAPI routes.

Serve pickles the FastAPI app and the ingress class by value, so module
globals of ``serving.app`` seen by the routes and by the replica are not the
same dict; both import this module instead, which every process loads once.
"""

from __future__ import annotations

from typing import Any

_CURRENT: dict[str, Any] = {}


def set_current(ingress: Any) -> None:
    _CURRENT["ingress"] = ingress


def current() -> Any:
    """The running ingress; None before its constructor ran."""
    return _CURRENT.get("ingress")
