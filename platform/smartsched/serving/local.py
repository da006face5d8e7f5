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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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


def learning_plan(learn: str | Path, models_dir: str | None, sites: Sequence[str],
                  known_sites: Sequence[str]) -> dict[str, Any]:
    """Check ``serve --learn`` before anything starts: the learning settings, a store with
    a current policy inside the service's ``models_dir`` (a live reload reads nothing
    else), and the sites to reload. Returns the learner's config and its service part
    (without the URL). Raises ValidationError naming the field."""
    from smartsched.rl.learning import load_learn_config
    from smartsched.rl.versions import PolicyStore

    doc = read_yaml(learn, "learn") or {}
    cfg = load_learn_config(doc)
    PolicyStore(cfg.store).path_of()  # a current version, or an error naming the store
    if models_dir is None:
        raise ValidationError("models_dir", "serve --learn needs a models directory holding "
                              "the learning store (the service reloads only from there)")
    root, store = Path(models_dir).resolve(), Path(cfg.store).resolve()
    if not store.is_relative_to(root):
        raise ValidationError("learn.store", f"{cfg.store} is not inside the service's "
                              f"models_dir {models_dir}")
    unknown = [s for s in sites if s not in known_sites]
    if unknown:
        raise ValidationError("learn_sites", f"unknown site(s) {', '.join(unknown)}; "
                              f"known: {', '.join(known_sites)}")
    return {"config": doc, "sites": list(sites), "served_as": str(store.relative_to(root))}


def start_service_learner(plan: dict[str, Any], url: str, operator_token_file: str | None,
                          echo: Callable[[str], Any] = print) -> Any:
    """Serve the store's current version at the plan's sites, then start the learning loop
    (a Ray actor) against this service: its first round one interval from now."""
    from smartsched.client import PlacementClient
    from smartsched.rl.learning import start_learner
    from smartsched.rl.versions import PolicyStore

    token = Path(operator_token_file).read_text().strip() if operator_token_file else None
    store = PolicyStore(plan["config"]["store"])
    version = store.current()
    client = PlacementClient(url, operator_token=token)
    for site in plan["sites"]:
        client.set_profile(site, f"rl:{plan['served_as']}/versions/{version}")
    service = {"url": url, "sites": plan["sites"], "served_as": plan["served_as"],
               "operator_token_file": operator_token_file}
    actor = start_learner(plan["config"], service)
    actor.run.remote(None, True)
    echo(f"learning: {', '.join(plan['sites'])} serve {version} from {store.root}; a round "
         f"every {float(plan['config'].get('interval_s', 300.0)):.0f} s")
    return actor


def _report_rounds(actor: Any, seen: int, echo: Callable[[str], Any]) -> int:
    import ray

    st = ray.get(actor.status.remote(seen), timeout=30)
    for out in st["outcomes"]:
        echo(f"learning round: {out['outcome']} (current {out.get('version')}) "
             f"{'; '.join(out.get('reasons', []))}{out.get('error', '')}")
    return int(st["total"])


def run_local(config: str | Path | None, overrides: dict[str, Any], host: str, port: int,
              state_dir: str | Path, echo: Callable[[str], Any] = print,
              block: bool = True, ray_address: str | None = None,
              learn: str | Path | None = None,
              learn_sites: Sequence[str] | None = None) -> str | tuple[str, Any]:
    """Start the service; return its URL (and keep serving while ``block``). With
    ``learn`` (a learning settings YAML), also the continuous-learning loop reloading
    ``learn_sites`` (default: every region); unblocked, returns (URL, learner actor)."""
    from smartsched.serving.config import parse_service_config

    if config is None and DEFAULT_CONFIG.is_file():
        config = DEFAULT_CONFIG
    state = private_dir(Path(state_dir).resolve())
    args = service_args(config, overrides)
    if not args.get("journal_dir"):
        args["journal_dir"] = str(private_dir(state / "journal"))
    cfg = parse_service_config(args)
    plan = None
    if learn is not None:
        from smartsched.serving.app import service_hierarchy

        h = service_hierarchy(cfg)
        plan = learning_plan(learn, cfg.models_dir, list(learn_sites or h.regions),
                             [*h.regions, *h.edges])
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
    learner = (start_service_learner(plan, url, auth.get("operator_token_file"), echo)
               if plan is not None else None)
    if block:
        seen = 0
        try:
            while True:
                time.sleep(5.0 if learner is not None else 3600)
                if learner is not None:
                    try:
                        seen = _report_rounds(learner, seen, echo)
                    except Exception as e:  # the loop died: the service goes on serving
                        echo(f"learning stopped ({type(e).__name__}); the incumbent serves")
                        learner = None
        except KeyboardInterrupt:
            if learner is not None:
                learner.stop.remote()
            serve.shutdown()
    return (url, learner) if learn is not None else url
