"""The scheduler daemon behind ``smartsched k8s scheduler``: leader election, passes, watches.

Owns the long-running loop around ``SchedulerLoop`` and ``LeaseLock`` (both
built by the caller): take or renew the lease (a replica without it waits an
interval and tries again), run one pass, then watch pods until one of this
scheduler's pods is pending, a pod frees room, or the lease needs renewing
(at most ``max(interval, 5)`` s); a failed watch is reported and retried after
a backoff that doubles up to 60 s and resets on the next good watch. With
``once`` it runs one pass (if leader) and returns. Sleeping and the clock are
injected, so tests drive it without real waiting. ``kube_clients`` builds the
API clients from a kubeconfig or the in-cluster service account.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smartsched.k8s.scheduler import LeaseLock, SchedulerLoop

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


def kube_clients(kubeconfig: str | None = None) -> tuple[Any, Any]:
    """(CoreV1Api, CoordinationV1Api) from ``kubeconfig``; without one, the in-cluster
    service account, else ``~/.kube/config`` (or ``$KUBECONFIG``)."""
    from kubernetes import client, config

    cfg = client.Configuration()  # the clients' own: the process-wide default stays as it is
    if kubeconfig:
        config.load_kube_config(kubeconfig, client_configuration=cfg)
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)
    api = client.ApiClient(cfg)
    return client.CoreV1Api(api), client.CoordinationV1Api(api)


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
    leader" under ``once``); ``warn`` a line per failed watch.
    """
    stats = DaemonStats()
    backoff = interval
    while stop is None or not stop():
        if not lock.try_acquire():
            stats.not_leader += 1
            if once:
                echo("not the leader: another replica holds the lease")
                return stats
            sleep(interval)
            continue
        res = loop.run_once()
        stats.passes += 1
        stats.bound += len(res.bound)
        stats.unschedulable += len(res.failed)
        stats.conflicts += len(res.conflicts)
        if res.bound or res.failed or res.conflicts:
            echo(f"bound {len(res.bound)}, unschedulable {len(res.failed)}, "
                 f"conflicts {len(res.conflicts)}")
        if once:
            return stats
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
