"""Small builders for test clusters and pods (``node(...)``, ``pod(...)``), and a free port."""

from __future__ import annotations

import socket
from typing import Any

from smartsched.model.cluster import ClusterSpec, NodeSpec, Site, Zone
from smartsched.model.pod import Pod


def node(name: str, cpu: int = 8000, mem: int = 32768, gpus: int = 0, model: str = "A100",
         zone: str = "z1", **kw: Any) -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=cpu, memory_mib=mem, num_gpu=gpus,
                    gpu_model=model if gpus else "", zone=zone, **kw)


def cluster(*nodes: NodeSpec, zones: tuple[str, ...] = ("z1", "z2")) -> ClusterSpec:
    return ClusterSpec("test", (Site("r1"),), tuple(Zone(z, "r1") for z in zones), tuple(nodes))


def pod(pid: str, cpu: int = 1000, mem: int = 1024, **kw: Any) -> Pod:
    return Pod(id=pid, cpu_milli=cpu, memory_mib=mem, **kw)


def free_port() -> int:
    """A loopback port nobody listens on now (for a test server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, timeout_s: float = 60.0, alive: Any = None) -> bool:
    """Whether ``url``/healthz answered 200 within ``timeout_s`` (polling; stops early when
    ``alive()`` turns false, e.g. a server process that exited)."""
    import time

    import requests

    deadline = time.time() + timeout_s
    while time.time() < deadline and (alive is None or alive()):
        try:
            if requests.get(f"{url}/healthz", timeout=2).status_code == 200:
                return True
        except (requests.ConnectionError, requests.Timeout):
            pass
        time.sleep(0.5)
    return False


def asgi_call(app: Any, method: str, path: str,
              headers: list[tuple[bytes, bytes]] | None = None,
              body: bytes = b"") -> tuple[dict, bytes]:
    """One request (with ``headers`` and ``body``) straight through an ASGI ``app`` (no
    server): the response's start message and its body."""
    import asyncio

    sent: list[dict] = []

    async def call() -> None:
        scope = {"type": "http", "method": method, "path": path, "root_path": "",
                 "headers": list(headers or []), "query_string": b"", "http_version": "1.1",
                 "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1)}

        async def receive() -> dict:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(msg: dict) -> None:
            sent.append(msg)

        await app(scope, receive, send)

    asyncio.run(call())
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def serve_json(handle: Any) -> Any:
    """A loopback HTTP server (started on a daemon thread; ``shutdown()`` stops it) whose
    every request is answered by ``handle(method, path, body) -> (status, doc, headers)``
    as JSON: a stand-in service for the clients' tests."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, doc, headers = handle(self.command, self.path, raw, self.headers)
            body = json.dumps(doc).encode()
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_POST = do_DELETE = _any

        def log_message(self, *_: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
