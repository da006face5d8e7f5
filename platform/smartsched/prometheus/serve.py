"""The lifecycle of ``smartsched telemetry serve``: a live twin served at ``/metrics``.

Owns the order of things around a ``LiveTwin`` (built, and so validated, by
the caller): the warm start, listening (a port that cannot be bound is a
``ValidationError`` naming ``port``), starting the twin's thread, waiting until
a duration has passed or Ctrl-C, surfacing an error of the twin's thread as
``TwinStopped``, and -- whatever happened -- stopping the twin and closing the
server so the port is free again. Sleeping and the clock are injected, so a
test runs the wait without real waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from smartsched.model.errors import ValidationError
from smartsched.prometheus.exporter import LiveTwin, serve_telemetry

POLL_S = 0.5  # how often the wait checks the twin's thread


class TwinStopped(RuntimeError):
    """The live twin's thread died; its exception is the ``__cause__``."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"the live twin stopped: {error}")
        self.error = error


@dataclass(frozen=True)
class ServeSummary:
    """Where the twin was when serving stopped."""

    sim_hours: float  # simulated time of the current episode
    restarts: int  # episodes finished (the twin restarts with the next seed)
    scrapes: int  # /metrics scrapes served by the current episode's collector

    def line(self) -> str:
        return (f"stopped at simulated {self.sim_hours:.2f} h after {self.restarts} "
                f"restart(s); {self.scrapes} scrapes served")


class TelemetryServer:
    """``with TelemetryServer(twin, host, port) as s:`` listens and runs the twin; leaving
    the block stops the twin and closes the server."""

    def __init__(self, twin: LiveTwin, host: str = "127.0.0.1", port: int = 0) -> None:
        self.twin, self.host, self.requested_port = twin, host, port
        self._server: Any = None

    @property
    def port(self) -> int:
        """The bound port (the one picked when 0 was asked for)."""
        if self._server is None:
            raise RuntimeError("not listening: use the server as a context manager")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def __enter__(self) -> TelemetryServer:
        try:
            self._server = serve_telemetry(self.twin, self.requested_port, self.host)
        except OSError as e:
            raise ValidationError(
                "port", f"cannot listen on {self.host}:{self.requested_port}: {e}") from None
        try:
            self.twin.start()
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.twin.stop()
        finally:
            self._close()

    def _close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def wait(self, duration: float | None = None, *, poll_s: float = POLL_S,
             sleep: Callable[[float], Any] = time.sleep,
             clock: Callable[[], float] = time.monotonic) -> None:
        """Until ``duration`` wall-clock seconds have passed (None: forever) or Ctrl-C;
        ``TwinStopped`` as soon as the twin's thread has died."""
        t_end = None if duration is None else clock() + duration
        try:
            while t_end is None or clock() < t_end:
                sleep(poll_s)
                if self.twin.error is not None:
                    raise TwinStopped(self.twin.error) from self.twin.error
        except KeyboardInterrupt:
            pass

    def summary(self) -> ServeSummary:
        return ServeSummary(self.twin.sim_now / 3600, self.twin.episodes,
                            self.twin.collector.samples)


def serve_live_twin(twin: LiveTwin, *, host: str = "127.0.0.1", port: int = 0,
                    warm_hours: float = 0.0, duration: float | None = None,
                    echo: Callable[[str], Any] = print, poll_s: float = POLL_S,
                    sleep: Callable[[float], Any] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> ServeSummary:
    """Warm the twin up (at most its horizon), serve it until ``duration`` or Ctrl-C, stop.

    ``echo`` gets the address when serving starts and the summary line when it stops
    (not after ``TwinStopped``).
    """
    twin.advance(min(warm_hours, twin.hours) * 3600.0)
    with TelemetryServer(twin, host, port) as server:
        n, d = twin.engine.state.num_nodes, len(twin.collector.dims)
        echo(f"serving {n} nodes x {d} dimensions at {server.url} "
             f"({twin.speed:g}x clock, scheduler {twin.scheduler_name})")
        server.wait(duration, poll_s=poll_s, sleep=sleep, clock=clock)
    summary = server.summary()
    echo(summary.line())
    return summary
