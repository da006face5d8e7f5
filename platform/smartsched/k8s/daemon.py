"""The scheduler daemon behind ``smartsched k8s scheduler``: leader election, passes, watches.

Owns the long-running loop around ``SchedulerLoop`` and ``LeaseLock`` (both
built by the caller): take or renew the lease (a replica without it waits an
interval and tries again), run one pass, then watch pods until one of this
scheduler's pods is pending, a pod frees room, or the lease needs renewing
(at most ``max(interval, 5)`` s); a failed watch is reported and retried after
a backoff that doubles up to 60 s and resets on the next good watch. A lease attempt
or a pass that fails (the API server down, refusing, timing out) is reported the same
way and tried again after the same backoff (or the ``Retry-After`` a 429 gives),
never ending the daemon; a pass the API server stopped with a 429 waits as it asks.
Each pass binds only while the lease it renewed lasts (``SchedulerLoop.leader_until``).
With ``once`` it runs one pass (if leader) and returns (a failure is raised).
Sleeping and the clock are injected, so tests drive it without real waiting.
``kube_clients`` builds the API clients from a kubeconfig or the in-cluster service
account (a bad one is a ``ValidationError`` naming ``kubeconfig``); ``api_failure``
words an API server that cannot be reached, or that refuses, as one line. The names
the command puts in API paths (the scheduler's name is its Lease's name) are checked by
``k8s.names.check_name`` as the command line is read.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smartsched.k8s.scheduler import ApiAnswerError, LeaseLock, SchedulerLoop, retry_after
from smartsched.model.errors import ValidationError

MAX_BACKOFF_S = 60.0
MIN_WATCH_S = 5.0  # a watch between passes lasts at least this long (the lease is 15 s)


def _warn(message: str) -> None:
    print(message, file=sys.stderr)


@dataclass
class DaemonStats:
    """What a daemon run did (returned when it stops)."""

    passes: int = 0
    bound: int = 0
    unschedulable: int = 0
    conflicts: int = 0
    not_leader: int = 0  # lease attempts another replica won
    watch_errors: int = 0
    pass_errors: int = 0  # lease attempts or passes that failed (then retried after a backoff)


# The most a file a kubeconfig names may hold (a token, a certificate, a key): the client
# reads each whole, and a tokenFile of /dev/zero grew without end.
MAX_CREDENTIAL_BYTES = 1 << 20
# A user's credential that runs a command (kubectl's exec plugins, the old auth-provider
# hooks): the kubernetes client runs it while loading the config.
COMMAND_CREDENTIALS = ("exec", "auth-provider")
CREDENTIAL_FILES = ("tokenFile", "client-certificate", "client-key")


def check_kubeconfig(path: str, allow_exec: bool = False) -> None:
    """Refuse, naming ``kubeconfig``, a config whose users run a command to get their
    credentials unless ``allow_exec`` (a kubeconfig is then code, run as this user: say
    so on purpose), and one naming a credential file that is not a regular file of at
    most MAX_CREDENTIAL_BYTES. Read with SmartSched's own YAML reader (safe types only)."""
    from pathlib import Path

    from smartsched.model.configfile import read_yaml
    from smartsched.paths import read_regular_file

    doc = read_yaml(path, "kubeconfig")
    if not isinstance(doc, dict):
        return  # the client names what is wrong with it

    def entry(kind: str, name: Any) -> dict[str, Any]:
        """The ``kind`` (user, cluster) the current context names, as the client loads
        only that one (an unused user's exec plugin never runs)."""
        for e in doc.get(f"{kind}s") or []:
            if isinstance(e, dict) and e.get("name") == name and isinstance(e.get(kind), dict):
                return e[kind]
        return {}

    context = entry("context", doc.get("current-context"))
    user, cluster = entry("user", context.get("user")), entry("cluster", context.get("cluster"))
    runs = [k for k in COMMAND_CREDENTIALS if user.get(k)]
    if runs and not allow_exec:
        raise ValidationError("kubeconfig", f"user {context.get('user')!r} gets its "
                              f"credentials by running a command ({runs[0]}): the client "
                              "would run it while loading the config; give "
                              "--allow-exec-auth to allow that")
    for where, key in [*(("user", k) for k in CREDENTIAL_FILES),
                       ("cluster", "certificate-authority")]:
        named = (user if where == "user" else cluster).get(key)
        if not isinstance(named, str) or not named:
            continue
        target = Path(named) if Path(named).is_absolute() else Path(path).parent / named
        try:
            read_regular_file(target, MAX_CREDENTIAL_BYTES)
        except OSError as e:
            raise ValidationError("kubeconfig", f"{where} {context.get(where)!r}: {key} "
                                  f"{named!r}: {e.strerror or e}") from None


def kube_clients(kubeconfig: str | None = None, allow_exec: bool = False
                 ) -> tuple[Any, Any]:
    """(CoreV1Api, CoordinationV1Api) from ``kubeconfig``; without one, the in-cluster
    service account, else ``~/.kube/config`` (or ``$KUBECONFIG``). A config that cannot be
    read, parsed or used is a ``ValidationError`` naming ``kubeconfig`` (the client raises
    YAML parser errors, ConfigException, or a TypeError for a document of the wrong
    shape); a named one whose users run a command is refused unless ``allow_exec``
    (``check_kubeconfig``)."""
    import yaml
    from kubernetes import client, config

    cfg = client.Configuration()  # the clients' own: the process-wide default stays as it is
    where = kubeconfig or "the default kubeconfig (~/.kube/config or $KUBECONFIG)"
    if kubeconfig:  # a file handed to us; the user's own default config is theirs
        check_kubeconfig(kubeconfig, allow_exec)
    try:
        if kubeconfig:
            config.load_kube_config(kubeconfig, client_configuration=cfg)
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(client_configuration=cfg)
    except yaml.YAMLError as e:
        raise ValidationError("kubeconfig", f"{where} is not valid YAML: "
                              f"{' '.join(str(e).split())}") from None
    except config.ConfigException as e:
        hint = "" if kubeconfig else " (and this is not a pod with a service account)"
        raise ValidationError("kubeconfig", f"{' '.join(str(e).split())}{hint}") from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValidationError("kubeconfig", f"{where} is not a usable kubeconfig "
                              f"({type(e).__name__}: {e})") from None
    if not re.match(r"https?://[^/\s]", cfg.host or ""):
        raise ValidationError("kubeconfig", f"the cluster's server must be an http(s) URL, "
                              f"got {cfg.host!r}")
    api = client.ApiClient(cfg)
    return client.CoreV1Api(api), client.CoordinationV1Api(api)


def api_failure(e: BaseException, host: str) -> str | None:
    """One line for an API server that cannot be reached (refused, unresolvable, timed
    out, a failed TLS handshake: urllib3's errors, whose traceback runs to dozens of
    frames) or that refuses a request (an ``ApiException``: 401, 403, ...); None for
    any other error."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError, MaxRetryError

    if isinstance(e, ApiAnswerError):
        return f"the Kubernetes API at {host} {e}"
    if isinstance(e, RecursionError):  # the client's own reading of an answer (a Lease)
        return f"the Kubernetes API at {host} answered with JSON nested too deep to read"
    if isinstance(e, ApiException):
        hint = (" (check the kubeconfig's credentials and RBAC)" if e.status in (401, 403)
                else "")
        return f"the Kubernetes API at {host} answered {e.status} {e.reason}{hint}"
    if not isinstance(e, HTTPError):
        return None
    cause: Any = e.reason if isinstance(e, MaxRetryError) and e.reason is not None else e
    # "HTTPSConnection(host='h', port=1): Failed to ..." -> "Failed to ..."
    reason = re.sub(r"^<?[\w.]+(\(host=[^)]*\)|\s+object at 0x[0-9a-f]+>):\s*", "",
                    str(cause)) or type(cause).__name__
    return f"cannot reach the Kubernetes API at {host}: {' '.join(reason.split())}"


def _why(e: BaseException) -> str:
    """An error in one short line (an ``ApiException``'s text runs to its headers and
    body)."""
    from urllib3.exceptions import MaxRetryError

    status = getattr(e, "status", None)
    if isinstance(status, int):
        return f"HTTP {status} {getattr(e, 'reason', '')}".strip()
    if isinstance(e, MaxRetryError) and e.reason is not None:  # the client's retries ran out
        e = e.reason
    return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


def run_scheduler_daemon(
    loop: SchedulerLoop,
    lock: LeaseLock,
    *,
    interval: float,
    once: bool = False,
    echo: Callable[[str], Any] = print,
    warn: Callable[[str], Any] = _warn,
    sleep: Callable[[float], Any] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    stop: Callable[[], bool] | None = None,
) -> DaemonStats:
    """Schedule until ``stop()`` is true (checked before each lease attempt), forever
    without it; with ``once``, one pass if this replica holds the lease.

    ``echo`` gets a line per pass that bound, failed or conflicted (and "not the
    leader" under ``once``); ``warn`` a line per failed watch, lease attempt or pass.
    """
    stats = DaemonStats()
    backoff = interval
    while stop is None or not stop():
        try:
            leader = lock.try_acquire()
            if leader:
                loop.leader_until = getattr(lock, "valid_until", None)
                res = loop.run_once()
        except Exception as e:  # the API server down, refusing, timing out: back off
            if once:
                raise
            stats.pass_errors += 1
            wait = retry_after(e)
            wait = backoff if wait is None else max(wait, interval)
            warn(f"scheduling pass failed ({_why(e)}); retrying in {wait:.0f} s")
            sleep(wait)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
            continue
        if not leader:
            stats.not_leader += 1
            if once:
                echo("not the leader: another replica holds the lease")
                return stats
            sleep(interval)
            continue
        stats.passes += 1
        stats.bound += len(res.bound)
        stats.unschedulable += len(res.failed)
        stats.conflicts += len(res.conflicts)
        if res.bound or res.failed or res.conflicts:
            echo(f"bound {len(res.bound)}, unschedulable {len(res.failed)}, "
                 f"conflicts {len(res.conflicts)}")
        if once:
            return stats
        if res.retry_after is not None:  # the API server asked to wait before more binds
            sleep(max(res.retry_after, interval))
            continue
        # Until one of our pods is pending or a pod frees room (or the lease needs renewing).
        rv, work = loop.last_rv, False
        deadline = clock() + max(interval, MIN_WATCH_S)
        while not work and rv is not None and clock() < deadline:
            try:
                rv, work = loop.watch_pods(rv, timeout_s=deadline - clock())
                backoff = interval
            except Exception as e:  # API errors other than 410: back off, then re-list
                stats.watch_errors += 1
                warn(f"watch failed ({e}); retrying in {backoff:.0f} s")
                sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                break
    return stats
