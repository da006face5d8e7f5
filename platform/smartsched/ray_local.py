"""An embedded, single-machine Ray that only this machine's owner can use.

Owns how SmartSched starts Ray itself (``smartsched serve``, ``train``, ``tune``
and the benchmarks, when no cluster address is given). Ray's own default for a
local start leaves its servers listening on every interface, and with token
authentication disabled any process that reaches the GCS port can run code in
the cluster: in a replica of the placement service or a training env runner,
whatever the HTTP token says. So this start

- turns on Ray's token authentication (``RAY_AUTH_MODE=token``) with a token of
  its own in a 0600 file (``RAY_AUTH_TOKEN_PATH``; children inherit both), and
- binds Ray's servers to loopback: Ray replaces a loopback node address by the
  machine's outward one on purpose (so that other nodes can join); that
  substitution is skipped for this start. The one port Ray 2.60 always binds on
  every interface, a Serve replica's gRPC server, requires the token;
- keeps Ray's files (its Unix sockets among them) inside a 0700 directory: Ray
  makes its own temp directory world-writable (0777), so it goes one level
  below one that only the owner can enter;
- has Serve's HTTP proxy bound request heads in time and size
  (``listen.guard_serve_proxy``, through Ray's proxy callback variable, unless
  the operator set that variable).

A cluster reached through an address keeps its own settings.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

LOOPBACK = "127.0.0.1"
# Ray puts Unix sockets under <temp dir>/session_<date>_<time>_<us>_<pid>/sockets/plasma_store
# (about 64 characters after the temp dir) and AF_UNIX paths end at 107 bytes.
MAX_RAY_TEMP_DIR_CHARS = 40
RAY_DIR = "smartsched-ray"  # ours (0700); Ray's own temp directory is RAY_DIR/r
SERVE_PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"


def private_dir(path: Path) -> Path:
    """``path`` created 0700 if new (an existing directory is left as the operator made it)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def secret_file(path: Path, nbytes: int = 24) -> Path:
    """``path`` holding a fresh random token, created 0600 and never overwritten."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(nbytes) + "\n")
    return path


def start_embedded_ray(token_dir: Path, temp_dir: Path | None = None,
                       num_cpus: int | None = None) -> None:
    """ray.init on loopback with token auth; Ray's token in ``token_dir/ray_token``, its
    files in ``<temp_dir or token_dir>/smartsched-ray/r`` (``smartsched-ray`` made 0700;
    a fresh private temporary directory instead when that path is too deep for Ray's
    socket names)."""
    import ray
    import ray._private.services as ray_services
    from ray._private.authentication import authentication_token_setup as ray_auth
    from ray._raylet import AuthenticationTokenLoader

    from smartsched.listen import SERVE_PROXY_CALLBACK

    os.environ.setdefault(SERVE_PROXY_CALLBACK_ENV, SERVE_PROXY_CALLBACK)  # (children inherit)
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(secret_file(private_dir(token_dir) / "ray_token"))
    os.environ.pop("RAY_AUTH_TOKEN", None)
    ray_auth._enable_token_auth()  # RAY_AUTH_MODE=token for this process and its children
    AuthenticationTokenLoader.instance().reset_cache()
    ours = (temp_dir if temp_dir is not None else token_dir) / RAY_DIR
    if len(str(ours)) + 2 > MAX_RAY_TEMP_DIR_CHARS:
        ours = Path(tempfile.mkdtemp(prefix="smartsched-ray-"))  # 0700 as well
    private_dir(ours).chmod(0o700)  # Ray's own 0777 directory goes inside
    resolve = ray_services.resolve_ip_for_localhost
    ray_services.resolve_ip_for_localhost = (
        lambda host: host if host == LOOPBACK else resolve(host))
    try:
        ray.init(include_dashboard=False, _temp_dir=str(ours / "r"),
                 _node_ip_address=LOOPBACK, num_cpus=num_cpus, log_to_driver=False)
    finally:
        ray_services.resolve_ip_for_localhost = resolve
