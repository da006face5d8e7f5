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

from smartsched.listen import PROXY_BODY_LIMIT_ENV
from smartsched.model.configfile import read_yaml
from smartsched.model.errors import ValidationError
from smartsched.ray_local import private_dir, secret_file, start_embedded_ray

DEFAULT_CONFIG = Path("serve_apps/placement.yaml")


# What a Serve config file may hold (Ray Serve's schema): `smartsched serve` reads the
# first application's args and http_options, and refuses what it would otherwise ignore.
SERVE_CONFIG_KEYS = frozenset({"proxy_location", "http_options", "grpc_options",
                               "logging_config", "applications", "target_capacity"})
SERVE_APP_KEYS = frozenset({"name", "route_prefix", "import_path", "args", "deployments",
                            "runtime_env", "logging_config", "external_scaler_enabled"})
APP_IMPORT_PATH = "smartsched.serving.app:build_app"
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8000


def _config_doc(config: str | Path) -> dict[str, Any]:
    """The config file's document, its keys and first application checked: a typo or a
    setting `smartsched serve` does not apply is named, not silently dropped."""
    doc = read_yaml(config, "config") or {}
    if not isinstance(doc, dict):
        raise ValidationError("config", "must be a Serve config (a mapping with applications)")
    unknown = sorted(set(map(str, doc)) - SERVE_CONFIG_KEYS)
    if unknown:
        raise ValidationError(f"config.{unknown[0]}", "unknown key (a Serve config has: "
                              f"{', '.join(sorted(SERVE_CONFIG_KEYS))})")
    apps = doc.get("applications") or []
    if not isinstance(apps, list) or not apps or not isinstance(apps[0], dict):
        raise ValidationError("config.applications", "needs at least one application")
    app = apps[0]
    unknown = sorted(set(map(str, app)) - SERVE_APP_KEYS)
    if unknown:
        raise ValidationError(f"config.applications[0].{unknown[0]}", "unknown key")
    if app.get("import_path", APP_IMPORT_PATH) != APP_IMPORT_PATH:
        raise ValidationError("config.applications[0].import_path",
                              f"`smartsched serve` runs {APP_IMPORT_PATH}, got "
                              f"{app['import_path']!r} (use `serve run` for other apps)")
    # None (`args:` left empty) is no settings; [] or '' is no mapping (it ran on defaults).
    if not isinstance(app.get("args", {}), dict | None):
        raise ValidationError("config.applications[0].args",
                              "must be a mapping of the service's settings")
    http = doc.get("http_options")
    if http is None:
        http = {}
    if not isinstance(http, dict):
        raise ValidationError("config.http_options", "must be a mapping (host, port)")
    port = http.get("port", DEFAULT_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValidationError("config.http_options.port", f"must be a port in 1..65535, got "
                              f"{port!r}")
    if "host" in http:  # as --host is checked (empty, unresolvable, not this machine's)
        from smartsched.listen import check_listen_host

        check_listen_host(http["host"], "config.http_options.host")
    prefix = app.get("route_prefix", "/")
    if prefix not in ("/", None):  # `smartsched serve` serves the API at the root
        raise ValidationError("config.applications[0].route_prefix",
                              f"`smartsched serve` serves at /, got {prefix!r} (use `serve "
                              "run` for another prefix)")
    return doc


def _deployment_profiles(app: dict[str, Any]) -> dict[str, str]:
    """Each site's profile set in the application's ``deployments`` section (a site's
    deployment is named after it; ``user_config: {profile: ...}``), as ``serve run``
    applies it over the args. What else a deployment entry may set in Serve (replicas,
    actor options, ...) `smartsched serve` does not apply, so it is refused, not dropped."""
    deps = app.get("deployments")
    if deps is None:
        return {}
    where = "config.applications[0].deployments"
    if not isinstance(deps, list):
        raise ValidationError(where, "must be a list of deployments (name, user_config)")
    out: dict[str, str] = {}
    for i, d in enumerate(deps):
        if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not d["name"]:
            raise ValidationError(f"{where}[{i}].name", "each deployment needs a site name")
        extra = sorted(set(map(str, d)) - {"name", "user_config"})
        if extra:
            raise ValidationError(f"{where}[{i}].{extra[0]}", "`smartsched serve` applies a "
                                  "deployment's user_config only (use `serve run` for more)")
        uc = d.get("user_config") or {}
        if not isinstance(uc, dict) or set(map(str, uc)) - {"profile"}:
            raise ValidationError(f"{where}[{i}].user_config",
                                  "must be a mapping with profile only")
        if "profile" in uc:
            if not isinstance(uc["profile"], str) or not uc["profile"]:
                raise ValidationError(f"{where}[{i}].user_config.profile",
                                      "must be a profile name")
            if d["name"] in out:
                raise ValidationError(f"{where}[{i}].name", f"{d['name']!r} appears twice")
            out[d["name"]] = uc["profile"]
    return out


def service_args(config: str | Path | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """The application args of ``config`` (first application) with ``overrides`` applied;
    the built-in defaults (``ServiceConfig``) when ``config`` is None."""
    args: dict[str, Any] = {}
    if config is not None:
        app = _config_doc(config)["applications"][0]
        args = dict(app.get("args") or {})
        # A site's profile in the deployments section wins over the args, as in `serve
        # run` (it was ignored: the same file ran another profile there).
        pinned = _deployment_profiles(app)
        if pinned:
            profiles = args.get("profiles") or {}
            if not isinstance(profiles, dict):
                raise ValidationError("service.profiles", "must map sites to profiles")
            args["profiles"] = {**profiles, **pinned}
    args.update({k: v for k, v in overrides.items() if v is not None})
    return args


def http_address(config: str | Path | None, host: str | None, port: int | None
                 ) -> tuple[str, int]:
    """Where to listen: the command line's host and port, else the config file's
    ``http_options`` (a port set there used to be ignored for the default 8000), else
    127.0.0.1:8000."""
    http = (_config_doc(config).get("http_options") or {}) if config is not None else {}
    return (host if host is not None else http.get("host", DEFAULT_HOST),
            port if port is not None else http.get("port", DEFAULT_PORT))


class SideLoop(Protocol):
    """Something that runs beside the service (``serve --learn``'s learning loop): checked
    before anything starts, started once the service answers, polled while it serves."""

    def check(self, cfg: Any) -> None: ...

    def start(self, url: str, operator_token_file: str | None) -> None: ...

    def poll(self) -> bool:  # False: it has stopped (the service goes on)
        ...

    def stop(self) -> None: ...


def run_local(config: str | Path | None, overrides: dict[str, Any], host: str | None,
              port: int | None, state_dir: str | Path, echo: Callable[[str], Any] = print,
              block: bool = True, ray_address: str | None = None,
              beside: SideLoop | None = None) -> str:
    """Start the service; return its URL (and keep serving while ``block``). ``beside``
    (e.g. the learning loop) is checked first, started once the service is up and
    polled while it serves."""
    from smartsched.serving.config import parse_service_config

    if config is None and DEFAULT_CONFIG.is_file():
        config = DEFAULT_CONFIG
    from smartsched.serving.app import checked_service

    host, port = http_address(config, host, port)
    state_path = Path(state_dir).resolve()
    args = service_args(config, overrides)
    own_journal = not args.get("journal_dir")
    if own_journal:
        args["journal_dir"] = str(state_path / "journal")
    cfg = parse_service_config(args)
    if beside is not None:
        beside.check(cfg)
    # The cluster and every site's profile before anything is written: a bad profile left
    # tokens and a journal folder in whatever --state-dir named.
    checked_service(args, credentials=False)
    state = private_dir(state_path)
    if own_journal:
        private_dir(state / "journal")
    auth = cfg.auth.model_dump()
    if not cfg.auth.disabled:
        if not cfg.auth.token_file and not os.environ.get(cfg.auth.token_env):
            auth["token_file"] = str(secret_file(state / "token"))
            echo(f"client token (Authorization: Bearer ...) in {auth['token_file']}")
        if not cfg.auth.operator_token_file and not os.environ.get(cfg.auth.operator_token_env):
            auth["operator_token_file"] = str(secret_file(state / "operator_token"))
            echo(f"operator token (node updates, reloads) in {auth['operator_token_file']}")
    args["auth"] = auth
    from smartsched.serving.config import load_credentials

    load_credentials(parse_service_config(args).auth)  # the tokens, before Ray starts
    import ray
    from ray import serve

    from smartsched.serving.app import build_app

    if ray_address is not None:
        ray.init(address=ray_address, log_to_driver=False)
    elif not ray.is_initialized():
        # Serve's proxy answers an over-long declared body itself (listen.DeclaredBodyLimit).
        os.environ[PROXY_BODY_LIMIT_ENV] = str(cfg.max_body_bytes)
        start_embedded_ray(state)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(args), name="placement", route_prefix="/")
    url = f"http://{host}:{port}"
    pages = f"{url}/docs" if cfg.api_docs else f"{url}/openapi.json"
    echo(f"placement service ready at {url}  (OpenAPI: {pages}, metrics: {url}/metrics)")
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
