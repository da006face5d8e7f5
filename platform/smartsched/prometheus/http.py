"""A Prometheus registry served over HTTP at ``/metrics``, and nothing else.

Owns the small HTTP server of ``smartsched telemetry serve`` and of the Kubernetes
scheduler's ``--metrics-port``. prometheus_client's own ``start_http_server`` answered the
metrics on every path (``/../../etc/passwd`` included), refused HEAD with a 405, put the
request line back into its error page, named the Python version in a ``Server`` header,
and kept a thread for every client that stopped sending, for ever. Here: ``/metrics``
(and ``/``) only, HEAD as GET without the body, plain errors that echo nothing, no
version header, a connection that sends nothing for ``IDLE_TIMEOUT_S`` is dropped, and so
is one whose request head is not whole ``HEAD_TIMEOUT_S`` after it opened (one byte every
10 s kept a thread for ever); at most ``MAX_CONNECTIONS`` are served at once, the next
closed unanswered.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer, make_server

# How long a connection may send nothing before it is dropped (a stalled client's thread).
IDLE_TIMEOUT_S = 15.0
HEAD_TIMEOUT_S = 15.0  # ... and the longest a whole request head may take to arrive
MAX_CONNECTIONS = 64  # a scrape is one short request; no Prometheus needs more at once
PATHS = ("/metrics", "/")


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):  # full: no thread for this one
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out or went away: nothing to report, no traceback


class _Answer(ServerHandler):
    server_software = "smartsched"  # not wsgiref's "WSGIServer/0.2 CPython/3.x.y"


class _Handler(WSGIRequestHandler):
    timeout = IDLE_TIMEOUT_S  # StreamRequestHandler sets it on the socket
    server_version = "smartsched"
    sys_version = ""

    def handle(self) -> None:
        """wsgiref's own, with the answer's ``Server`` header our name (as the stdlib's
        loop: one request a connection), and the head's deadline: the socket is shut when
        the request line and headers are not in ``HEAD_TIMEOUT_S`` after the connection
        opened (the idle timeout bounds each read only)."""
        import socket

        def too_slow() -> None:
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(HEAD_TIMEOUT_S, too_slow)
        timer.daemon = True
        timer.start()
        try:
            self._read_and_answer(timer)
        finally:
            timer.cancel()

    def _read_and_answer(self, timer: threading.Timer) -> None:
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline, self.request_version, self.command = "", "", ""
            self.send_error(414)
            return
        if not self.parse_request():  # (parse_request reads the headers too)
            return
        timer.cancel()  # the head is whole: the answer is ours to write
        answer = _Answer(self.rfile, self.wfile, self.get_stderr(), self.get_environ(),
                         multithread=False)
        answer.request_handler = self
        answer.run(self.server.get_app())

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        # The stdlib's page holds the request line (the client's input): a plain line.
        body = f"{code} {self.responses.get(code, ('',))[0]}\n".encode()
        self.send_response_only(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.close_connection = True


def _only_metrics(metrics: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "")
        if environ.get("PATH_INFO") not in PATHS:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"404 Not Found: scrape /metrics\n"]
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed",
                           [("Content-Type", "text/plain; charset=utf-8"),
                            ("Allow", "GET, HEAD")])
            return [b"405 Method Not Allowed\n"]
        if method == "GET":
            return metrics(environ, start_response)
        said: list[Any] = []  # HEAD: GET's status and headers, its length, no body
        body = b"".join(metrics({**environ, "REQUEST_METHOD": "GET"},
                                lambda status, headers, *_: said.extend((status, headers))))
        headers = [(k, v) for k, v in said[1] if k.lower() != "content-length"]
        start_response(said[0], [*headers, ("Content-Length", str(len(body)))])
        return []
    return app


def serve_registry(registry: Any, port: int, addr: str = "127.0.0.1") -> Any:
    """Serve ``registry`` at ``http://addr:port/metrics`` from a daemon thread; returns the
    server (``shutdown()`` then ``server_close()`` stop it and free the port; its
    ``server_port`` is the port taken, for ``port=0``)."""
    import socket

    from prometheus_client import make_wsgi_app

    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]

    class Server(_Server):
        address_family = family

    httpd = make_server(addr, port, _only_metrics(make_wsgi_app(registry)), Server,
                        handler_class=_Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True,
                     name="smartsched-metrics").start()
    return httpd
