"""A Prometheus registry served over HTTP at ``/metrics``, and nothing else.

Owns the small HTTP server of ``smartsched telemetry serve`` and of the Kubernetes
scheduler's ``--metrics-port``. prometheus_client's own ``start_http_server`` answered the
metrics on every path (``/../../etc/passwd`` included), refused HEAD with a 405, put the
request line back into its error page, named the Python version in a ``Server`` header,
and kept a thread for every client that stopped sending, for ever. Here: ``/metrics``
(and ``/``) only, HEAD as GET without the body, plain errors that echo nothing, no
version header, and a connection that sends nothing for ``IDLE_TIMEOUT_S`` is dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer, make_server

# How long a connection may send nothing before it is dropped (a stalled client's thread).
IDLE_TIMEOUT_S = 15.0
PATHS = ("/metrics", "/")


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True

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
        loop: one request a connection)."""
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536:
            self.requestline, self.request_version, self.command = "", "", ""
            self.send_error(414)
            return
        if not self.parse_request():
            return
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
