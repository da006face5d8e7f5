"""The scheduler daemon: leader election, passes, watches between them, backoff; no real
waiting (sleep and the clock are injected)."""

from __future__ import annotations

import copy
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from smartsched.k8s.daemon import MAX_BACKOFF_S, kube_clients, run_scheduler_daemon
from smartsched.k8s.scheduler import LeaseLock, PassResult, SchedulerLoop
from tests.k8s.fake_apiserver import FakeAPIServer
from tests.k8s.test_scheduler import _client, objects, write_kubeconfig  # noqa: F401 (fixture)


class Clock:
    """A fake monotonic clock that only moves when slept on (or told to)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def _stop_after(n: int) -> Any:
    """A stop() that lets ``n`` lease attempts through."""
    calls = [0]

    def stop() -> bool:
        calls[0] += 1
        return calls[0] > n

    return stop


def test_once_as_leader_runs_one_pass_and_binds(objects) -> None:  # noqa: F811
    nodes, pods = objects
    lines: list[str] = []
    clock = Clock()
    with FakeAPIServer(nodes, pods) as api:
        core, coord = _client(api.url)
        loop = SchedulerLoop(core, "smartsched", "fgd")
        lock = LeaseLock(coord, "smartsched", "kube-system", "replica-a")
        stats = run_scheduler_daemon(loop, lock, interval=2.0, once=True, echo=lines.append,
                                     sleep=clock.sleep, clock=clock)
        assert lines == ["bound 3, unschedulable 1, conflicts 0"]
        assert (stats.passes, stats.bound, stats.unschedulable) == (1, 3, 1)
        assert len(api.bindings) == 3 and clock.sleeps == []
        # Another replica finds the lease held: it says so and binds nothing.
        lines.clear()
        core_b, coord_b = _client(api.url)
        other = run_scheduler_daemon(SchedulerLoop(core_b, "smartsched", "fgd"),
                                     LeaseLock(coord_b, "smartsched", "kube-system", "replica-b"),
                                     interval=2.0, once=True, echo=lines.append,
                                     sleep=clock.sleep, clock=clock)
        assert lines == ["not the leader: another replica holds the lease"]
        assert other.passes == 0 and other.not_leader == 1 and len(api.bindings) == 3


def test_a_follower_waits_an_interval_between_lease_attempts(objects) -> None:  # noqa: F811
    nodes, pods = objects
    clock = Clock()
    with FakeAPIServer(nodes, pods) as api:
        core, coord = _client(api.url)
        assert LeaseLock(coord, "smartsched", "kube-system", "leader").try_acquire()
        lines: list[str] = []
        stats = run_scheduler_daemon(
            SchedulerLoop(core, "smartsched", "fgd"),
            LeaseLock(coord, "smartsched", "kube-system", "follower"), interval=3.0,
            echo=lines.append, sleep=clock.sleep, clock=clock, stop=_stop_after(3))
        assert stats.not_leader == 3 and stats.passes == 0 and api.bindings == []
        assert clock.sleeps == [3.0, 3.0, 3.0] and lines == []


def test_the_watch_between_passes_wakes_on_a_new_pod(objects) -> None:  # noqa: F811
    nodes, pods = objects
    with FakeAPIServer(nodes, pods) as api:
        core, coord = _client(api.url)
        loop = SchedulerLoop(core, "smartsched", "fgd")
        lock = LeaseLock(coord, "smartsched", "kube-system", "replica-a")
        new = copy.deepcopy(pods[1])
        new["metadata"]["name"] = "late-arrival"
        timer = threading.Timer(0.3, api.add_pod, args=(new,))
        timer.start()
        lines: list[str] = []
        # The real clock: the watch blocks on the server until the pod arrives (well
        # before its 30 s deadline), and the second pass binds it; after that pass the
        # clock jumps past the deadline so the test ends without a second watch.
        passes = [0]
        run_once = loop.run_once

        def counted() -> PassResult:
            passes[0] += 1
            return run_once()

        loop.run_once = counted  # type: ignore[method-assign]

        reads_after_second_pass = [0]

        def clock() -> float:
            if passes[0] < 2:
                return time.monotonic()
            reads_after_second_pass[0] += 1  # the first read sets the deadline
            return time.monotonic() + (3600.0 if reads_after_second_pass[0] > 1 else 0.0)

        t0 = time.monotonic()
        stats = run_scheduler_daemon(loop, lock, interval=30.0, echo=lines.append,
                                     clock=clock, stop=_stop_after(2))
        assert time.monotonic() - t0 < 15
        timer.join()
        assert stats.passes == 2 and stats.watch_errors == 0
        assert lines == ["bound 3, unschedulable 1, conflicts 0",
                         "bound 1, unschedulable 1, conflicts 0"]
        assert api.bindings[-1][0] == "pai-gpu/late-arrival" and len(api.bindings) == 4


class StubLoop:
    """A SchedulerLoop double: empty passes, a scripted watch."""

    def __init__(self, watch: Any) -> None:
        self.last_rv: str | None = "1"
        self.watch = watch
        self.passes = 0
        self.timeouts: list[float] = []

    def run_once(self) -> PassResult:
        self.passes += 1
        return PassResult()

    def watch_pods(self, rv: str | None, timeout_s: float) -> tuple[str | None, bool]:
        self.timeouts.append(timeout_s)
        return self.watch(rv, timeout_s)


class AlwaysLeader:
    def try_acquire(self) -> bool:
        return True


def test_a_quiet_watch_ends_at_its_deadline_then_the_next_pass_runs() -> None:
    clock = Clock()

    def quiet(rv: str | None, timeout_s: float) -> tuple[str | None, bool]:
        clock.now += 2.0  # each watch call returns after 2 s without work
        return rv, False

    loop = StubLoop(quiet)
    lines: list[str] = []
    stats = run_scheduler_daemon(loop, AlwaysLeader(), interval=1.0, echo=lines.append,
                                 sleep=clock.sleep, clock=clock, stop=_stop_after(2))
    # interval 1 s, but a watch lasts at least 5 s: calls at t = 0, 2, 4 per pass.
    assert stats.passes == loop.passes == 2 and len(loop.timeouts) == 6
    assert loop.timeouts[:3] == [5.0, 3.0, 1.0]
    assert lines == [] and clock.sleeps == []  # empty passes say nothing, never sleep


def test_failed_watches_back_off_doubling_up_to_a_minute_and_reset() -> None:
    clock = Clock()
    script = iter([RuntimeError("boom")] * 8 + [("2", False), RuntimeError("again")])

    def flaky(rv: str | None, timeout_s: float) -> tuple[str | None, bool]:
        step = next(script)
        if isinstance(step, Exception):
            raise step
        clock.now += 10.0  # a good watch that runs out its deadline
        return step

    warnings: list[str] = []
    stats = run_scheduler_daemon(StubLoop(flaky), AlwaysLeader(), interval=1.0,
                                 warn=warnings.append, sleep=clock.sleep, clock=clock,
                                 stop=_stop_after(10))
    assert clock.sleeps == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, MAX_BACKOFF_S, MAX_BACKOFF_S, 1.0]
    assert stats.watch_errors == 9 and stats.passes == 10
    assert warnings[0] == "watch failed (boom); retrying in 1 s"
    assert warnings[-1] == "watch failed (again); retrying in 1 s"  # reset by the good watch


def test_no_resource_version_means_the_next_pass_lists_again() -> None:
    loop = StubLoop(lambda rv, t: pytest.fail("no watch without a resourceVersion"))
    loop.last_rv = None
    stats = run_scheduler_daemon(loop, AlwaysLeader(), interval=1.0, stop=_stop_after(3))
    assert stats.passes == 3


def test_kube_clients_from_a_kubeconfig_talk_to_its_server(objects, tmp_path: Path  # noqa: F811
                                                           ) -> None:
    nodes, pods = objects
    with FakeAPIServer(nodes, pods) as api:
        kc = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        core, coord = kube_clients(str(kc))
        assert core.api_client is coord.api_client
        assert core.api_client.configuration.host == api.url
        assert len(core.list_node().items) == len(nodes)
        from kubernetes import client

        assert client.Configuration.get_default_copy().host != api.url  # no global change
