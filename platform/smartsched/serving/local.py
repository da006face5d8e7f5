"""``smartsched serve``: the placement service on an embedded local Ray, with safe defaults.

Owns the local start: the Serve config YAML's application ``args`` (or the
built-in defaults when there is no config) plus command-line overrides; the
state directory, private to this instance (created 0700), holding

- ``token`` and ``operator_token`` -- the client and operator bearer tokens,
  generated once (mode 0600) unless the environment or the config names them;
  their paths are printed, never their values;
- ``journal/`` -- reservations and registered nodes survive a restart (unless
  the config names its own ``journal_dir``; a lock keeps two instances apart);
- ``smartsched-ray/`` and ``ray_token`` -- the embedded Ray's files and its own token.

The embedded Ray is bound to loopback with Ray's token authentication on
(``smartsched.ray_local``): without it any local process could connect to the
GCS and run code in the service's replicas, whatever the HTTP token. An
operator who points ``--ray-address`` at their own cluster keeps its settings.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from smartsched.model.configfile import read_yaml
from smartsched.model.errors import ValidationError
from smartsched.ray_local import private_dir, secret_file, start_embedded_ray

DEFAULT_CONFIG = Path("serve_apps/placement.yaml")


def service_args(config: str | Path | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """The application args of ``config`` (first application) with ``overrides`` applied;
    the built-in defaults (``ServiceConfig``) when ``config`` is None."""
    args: dict[str, Any] = {}
    if config is not None:
        doc = read_yaml(config, "config") or {}
        apps = (doc.get("applications") or []) if isinstance(doc, dict) else []
        if not apps or not isinstance(apps[0], dict):
            raise ValidationError("config.applications", "needs at least one application")
        args = dict(apps[0].get("args") or {})
    args.update({k: v for k, v in overrides.items() if v is not None})
    return args


class SideLoop(Protocol):
    """Something that runs beside the service (``serve --learn``'s learning loop): checked
    before anything starts, started once the service answers, polled while it serves."""

    def check(self, cfg: Any) -> None: ...

    def start(self, url: str, operator_token_file: str | None) -> None: ...

    def poll(self) -> bool:  # False: it has stopped (the service goes on)
        ...

    def stop(self) -> None: ...


def run_local(config: str | Path | None, overrides: dict[str, Any], host: str, port: int,
              state_dir: str | Path, echo: Callable[[str], Any] = print,
              block: bool = True, ray_address: str | None = None,
              beside: SideLoop | None = None) -> str:
    """Start the service; return its URL (and keep serving while ``block``). ``beside``
    (e.g. the learning loop) is checked first, started once the service is up and
    polled while it serves."""
    from smartsched.serving.config import parse_service_config

    if config is None and DEFAULT_CONFIG.is_file():
        config = DEFAULT_CONFIG
    state = private_dir(Path(state_dir).resolve())
    args = service_args(config, overrides)
    if not args.get("journal_dir"):
        args["journal_dir"] = str(private_dir(state / "journal"))
    cfg = parse_service_config(args)
    if beside is not None:
        beside.check(cfg)
    auth = cfg.auth.model_dump()
    if not cfg.auth.disabled:
        if not cfg.auth.token_file and not os.environ.get(cfg.auth.token_env):
            auth["token_file"] = str(secret_file(state / "token"))
            echo(f"client token (Authorization: Bearer ...) in {auth['token_file']}")
        if not cfg.auth.operator_token_file and not os.environ.get(cfg.auth.operator_token_env):
            auth["operator_token_file"] = str(secret_file(state / "operator_token"))
            echo(f"operator token (node updates, reloads) in {auth['operator_token_file']}")
    args["auth"] = auth
    import ray
    from ray import serve

    from smartsched.serving.app import build_app

    if ray_address is not None:
        ray.init(address=ray_address, log_to_driver=False)
    elif not ray.is_initialized():
        start_embedded_ray(state)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(args), name="placement", route_prefix="/")
    url = f"http://{host}:{port}"
    echo(f"placement service ready at {url}  (OpenAPI: {url}/docs, metrics: {url}/metrics)")
    for site, site_port in cfg.edge_entry.ports.items():
        echo(f"  {site}'s own entry at http://{cfg.edge_entry.host}:{site_port}")
    if beside is not None:
        beside.start(url, auth.get("operator_token_file"))
    if block:
        restore = _stop_on_sigterm()
        try:
            while True:
                time.sleep(5.0 if beside is not None else 3600)
                if beside is not None and not beside.poll():
                    beside = None
        except KeyboardInterrupt:
            if beside is not None:
                beside.stop()
            serve.shutdown()
        finally:
            restore()
    return url


def _stop_on_sigterm() -> Callable[[], None]:
    """Stop on SIGTERM as on Ctrl-C, so the embedded Ray goes with the service.

    SIGTERM is how a service manager, ``kill`` or a container runtime stops a process; its
    default action ends Python at once: no Serve shutdown, no stop for the learning loop
    beside the service (it may be half-way through a round), no exit handlers, and an
    exit status that reads as a crash. Returns what puts the previous handler back (a
    no-op off the main thread, where no handler can be set).
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, previous)
