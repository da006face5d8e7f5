"""``smartsched serve``: the placement service on an embedded local Ray, with sane defaults.

Owns the local start: the Serve config YAML's application ``args`` plus
command-line overrides, a bearer token (``$SMARTSCHED_API_TOKEN``, or a fresh
one written to ``<state dir>/token`` with mode 0600 and printed once), a
journal directory so reservations survive a restart, Ray's files under the
state directory, and Serve's HTTP proxy on the requested host and port.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smartsched.model.configfile import read_yaml
from smartsched.model.errors import ValidationError


def service_args(config: str | Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """The application args of ``config`` (first application) with ``overrides`` applied."""
    doc = read_yaml(config, "config") or {}
    apps = (doc.get("applications") or []) if isinstance(doc, dict) else []
    if not apps or not isinstance(apps[0], dict):
        raise ValidationError("config.applications", "needs at least one application")
    args = dict(apps[0].get("args") or {})
    args.update({k: v for k, v in overrides.items() if v is not None})
    return args


def run_local(config: str | Path, overrides: dict[str, Any], host: str, port: int,
              state_dir: str | Path, echo: Callable[[str], Any] = print,
              block: bool = True) -> str:
    """Start the service; return its URL (and keep serving while ``block``)."""
    from smartsched.serving.config import parse_service_config

    state = Path(state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    args = service_args(config, overrides)
    args.setdefault("journal_dir", str(state / "journal"))
    cfg = parse_service_config(args)
    if not cfg.auth.disabled and not cfg.auth.token_file and not os.environ.get(
            cfg.auth.token_env):
        token_file = state / "token"
        if not token_file.exists():
            token_file.write_text(secrets.token_hex(16) + "\n")
            token_file.chmod(0o600)
        args["auth"] = {**cfg.auth.model_dump(), "token_file": str(token_file)}
        echo(f"API token (for Authorization: Bearer ...): {token_file.read_text().strip()}"
             f"  (in {token_file})")
    import ray
    from ray import serve

    from smartsched.serving.app import build_app

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not ray.is_initialized():
        ray.init(include_dashboard=False, _temp_dir=str(state / "ray"), log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(args), name="placement", route_prefix="/")
    url = f"http://{host}:{port}"
    echo(f"placement service ready at {url}  (OpenAPI: {url}/docs, metrics: {url}/metrics)")
    if block:
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            serve.shutdown()
    return url
