"""A local HTTP server with the API subset the scheduler uses, objects in the real JSON form.

Serves list (with resourceVersion) of nodes and pods, one pod, pods/binding
(409 when the pod is already bound), pods/eviction (graceful: the pod
terminates until ``finish_terminating``; 429 for ``protected`` pods, as a
PodDisruptionBudget would answer), events, and coordination.k8s.io/v1 leases
(409 on a stale resourceVersion), so tests drive the official ``kubernetes``
client against it.

Faults, all off by default: ``inject`` answers the next matching requests with an
error (optionally after carrying the request out, or late, as a timeout would);
``watch_lines`` are raw lines the next watch sends first (garbage, ERROR events);
``hang_next_watch`` sends a watch's headers and then nothing.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _api_form(obj: Any) -> Any:
    """As the API server returns it: quantities (and annotation values) are strings."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ("allocatable", "capacity", "requests", "limits", "annotations",
                     "labels") and isinstance(v, dict):
                out[k] = {kk: str(vv) for kk, vv in v.items()}
            else:
                out[k] = _api_form(v)
        return out
    if isinstance(obj, list):
        return [_api_form(x) for x in obj]
    return obj


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class FakeAPIServer:
    def __init__(self, nodes: list[dict], pods: list[dict]) -> None:
        self.lock = threading.Lock()
        self.rv = 1
        self.nodes = {n["metadata"]["name"]: _api_form(copy.deepcopy(n)) for n in nodes}
        self.pods: dict[tuple[str, str], dict] = {}
        for p in pods:
            p = _api_form(copy.deepcopy(p))
            p["metadata"].setdefault("namespace", "default")
            p["metadata"].setdefault("uid", f"uid-{p['metadata']['name']}")
            p.setdefault("status", {"phase": "Pending"})
            self.pods[(p["metadata"]["namespace"], p["metadata"]["name"])] = p
        self.events: list[dict] = []
        self.log: list[tuple[int, str, dict]] = []  # (resourceVersion, type, pod) for watches
        self.oldest_rv = 0  # watches from before this get 410 Gone (etcd compaction)
        self.drop_next_watch = False
        self.changed = threading.Condition(self.lock)
        self.leases: dict[tuple[str, str], dict] = {}
        self.bindings: list[tuple[str, str]] = []  # (pod key, node), successful ones
        self.evictions: list[str] = []  # pod keys evicted through the Eviction API
        self.patches: list[str] = []  # pod keys whose tolerations were patched
        self.status_patches: list[tuple[str, dict]] = []  # (pod key, status patch)
        self.protected: set[tuple[str, str]] = set()  # pods a disruption budget keeps
        self.faults: list[dict[str, Any]] = []  # see ``inject``
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request
        self.watch_lines: list[bytes] = []  # sent first by the next watch
        self.hang_next_watch = 0.0  # seconds the next watch sends nothing at all
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # watches stream chunked responses

            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def _answer(self, method: str, path: str, serve: Any) -> None:
                """``serve()`` as it is, or as an injected fault says."""
                server.requests.append((method, path))
                fault = server.fault(method, path)
                if fault is None:
                    self._send(*serve())
                    return
                result = serve() if fault["after"] else None
                time.sleep(fault["delay"])
                if fault["code"] is None:
                    self._send(*(result or serve()))
                    return
                data = json.dumps(_status(fault["code"], fault["reason"],
                                          "injected fault")).encode()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # gave up
                    self.send_response(fault["code"])
                    for k, v in fault["headers"].items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                path = urllib.parse.unquote(path)
                q = dict(x.split("=", 1) for x in query.split("&") if "=" in x)
                if path == "/api/v1/pods" and q.get("watch") in ("true", "True", "1"):
                    server.requests.append(("WATCH", path))
                    server.watch(self, int(q.get("resourceVersion") or 0),
                                 float(q.get("timeoutSeconds") or 5))
                    return
                self._answer("GET", path, lambda: server.get(path))

            def do_POST(self) -> None:
                path, body = urllib.parse.unquote(self.path.split("?")[0]), self._body()
                self._answer("POST", path, lambda: server.post(path, body))

            def do_PUT(self) -> None:
                path, body = urllib.parse.unquote(self.path.split("?")[0]), self._body()
                self._answer("PUT", path, lambda: server.put(path, body))

            def do_PATCH(self) -> None:
                path, body = urllib.parse.unquote(self.path.split("?")[0]), self._body()
                ctype = self.headers.get("Content-Type", "")
                self._answer("PATCH", path, lambda: server.patch(path, body, ctype))

            def do_DELETE(self) -> None:
                path = urllib.parse.unquote(self.path.split("?")[0])
                self._answer("DELETE", path, lambda: server.delete(path))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeAPIServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()

    def _bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _record(self, kind: str, pod: dict) -> None:
        pod["metadata"]["resourceVersion"] = self._bump()
        self.log.append((self.rv, kind, copy.deepcopy(pod)))
        self.changed.notify_all()

    def inject(self, method: str, path: str, code: int | None, *, times: int = 1,
               reason: str = "InjectedFault", headers: dict[str, str] | None = None,
               delay: float = 0.0, after: bool = False) -> None:
        """Answer the next ``times`` ``method`` requests whose path matches the regex
        ``path`` with ``code`` (a Status, with ``headers``: e.g. ``Retry-After``) instead
        of serving them. ``after``: the request is carried out first and only its answer
        is lost (a 500 or a timeout after the write); ``delay``: the answer comes that
        many seconds late (a client with a shorter timeout gives up); ``code`` None: the
        real answer, late."""
        self.faults.append({"method": method, "path": re.compile(path), "code": code,
                            "times": times, "reason": reason, "headers": headers or {},
                            "delay": delay, "after": after})

    def fault(self, method: str, path: str) -> dict[str, Any] | None:
        with self.lock:
            for f in self.faults:
                if f["method"] == method and f["path"].fullmatch(path) and f["times"] > 0:
                    f["times"] -= 1
                    return f
        return None

    def delete_pod(self, namespace: str, name: str) -> None:
        """A pod is deleted (no grace): watchers see DELETED."""
        with self.lock:
            pod = self.pods.pop((namespace, name))
            self._record("DELETED", pod)

    def delete(self, path: str) -> tuple[int, dict]:
        with self.lock:
            if m := re.fullmatch(r"/apis/coordination.k8s.io/v1/namespaces/([^/]+)/leases/([^/]+)",
                                 path):
                if self.leases.pop((m[1], m[2]), None) is None:
                    return 404, _status(404, "NotFound", "no lease")
                return 200, _status(200, "Success", "deleted")
            if m := re.fullmatch(r"/api/v1/nodes/([^/]+)", path):
                if self.nodes.pop(m[1], None) is None:
                    return 404, _status(404, "NotFound", "no node")
                return 200, _status(200, "Success", "deleted")
            return 404, _status(404, "NotFound", path)

    def add_pod(self, pod: dict) -> None:
        """A new pod appears (as if created by a user): watchers see ADDED."""
        with self.lock:
            pod = _api_form(copy.deepcopy(pod))
            pod["metadata"].setdefault("namespace", "default")
            pod.setdefault("status", {"phase": "Pending"})
            self.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod
            self._record("ADDED", pod)

    def finish_terminating(self) -> None:
        """Evicted pods end their grace period: they are gone (watchers see DELETED)."""
        with self.lock:
            for key, pod in list(self.pods.items()):
                if pod["metadata"].get("deletionTimestamp"):
                    del self.pods[key]
                    self._record("DELETED", pod)

    def compact(self) -> None:
        """Forget history: watches from an older resourceVersion now get 410 Gone."""
        with self.lock:
            self.oldest_rv = self.rv
            self.log.clear()

    def watch(self, handler: Any, since: int, timeout_s: float) -> None:
        """Stream watch events newer than ``since`` (one JSON per line) until the timeout."""
        def chunk(data: bytes) -> None:
            handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            handler.wfile.flush()

        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.close_connection = True
        if self.hang_next_watch:  # a half-open connection: nothing comes, not even the end
            hang, self.hang_next_watch = self.hang_next_watch, 0.0
            time.sleep(hang)
            return
        lines, self.watch_lines = self.watch_lines, []
        for line in lines:
            chunk(line + b"\n")
        if self.drop_next_watch:  # the connection breaks mid-stream
            self.drop_next_watch = False
            handler.wfile.write(b"ff\r\n{\"type\": \"ADD")  # a torn chunk, then EOF
            handler.wfile.flush()
            return
        if since < self.oldest_rv:
            gone = {"type": "ERROR", "object": _status(410, "Expired", "too old resource "
                                                       f"version: {since} ({self.oldest_rv})")}
            chunk((json.dumps(gone) + "\n").encode())
            handler.wfile.write(b"0\r\n\r\n")
            return
        deadline = time.monotonic() + timeout_s
        sent = since
        while time.monotonic() < deadline:
            with self.lock:
                new = [e for e in self.log if e[0] > sent]
                if not new:
                    self.changed.wait(timeout=max(0.0, deadline - time.monotonic()))
                    new = [e for e in self.log if e[0] > sent]
            for rv, kind, obj in new:
                try:
                    chunk((json.dumps({"type": kind, "object": obj}) + "\n").encode())
                except (BrokenPipeError, ConnectionResetError):
                    return  # the client stopped watching
                sent = rv
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            handler.wfile.write(b"0\r\n\r\n")

    def get(self, path: str) -> tuple[int, dict]:
        with self.lock:
            if path == "/api/v1/nodes":
                return 200, {"kind": "NodeList", "apiVersion": "v1",
                             "metadata": {"resourceVersion": str(self.rv)},
                             "items": list(self.nodes.values())}
            if path == "/api/v1/pods":
                return 200, {"kind": "PodList", "apiVersion": "v1",
                             "metadata": {"resourceVersion": str(self.rv)},
                             "items": list(self.pods.values())}
            if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)", path):
                pod = self.pods.get((m[1], m[2]))
                return (200, pod) if pod else (404, _status(404, "NotFound", "no such pod"))
            if m := re.fullmatch(r"/apis/coordination.k8s.io/v1/namespaces/([^/]+)/leases/([^/]+)",
                                 path):
                lease = self.leases.get((m[1], m[2]))
                return (200, lease) if lease else (404, _status(404, "NotFound", "no lease"))
            return 404, _status(404, "NotFound", path)

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        with self.lock:
            if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/binding", path):
                pod = self.pods.get((m[1], m[2]))
                if pod is None:
                    return 404, _status(404, "NotFound", "no such pod")
                if pod["spec"].get("nodeName"):
                    return 409, _status(409, "Conflict", f"pod {m[2]} is already assigned "
                                        f"to node {pod['spec']['nodeName']}")
                node = body["target"]["name"]
                pod["spec"]["nodeName"] = node
                self._record("MODIFIED", pod)
                self.bindings.append((f"{m[1]}/{m[2]}", node))
                return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                             "code": 201, "metadata": {}}
            if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction", path):
                pod = self.pods.get((m[1], m[2]))
                if pod is None:
                    return 404, _status(404, "NotFound", "no such pod")
                if (m[1], m[2]) in self.protected:  # as a PodDisruptionBudget would refuse
                    return 429, _status(429, "TooManyRequests",
                                        "Cannot evict pod as it would violate the pod's "
                                        "disruption budget.")
                # Graceful: the pod is terminating (still on its node) until
                # ``finish_terminating``.
                pod["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
                self._record("MODIFIED", pod)
                self.evictions.append(f"{m[1]}/{m[2]}")
                return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                             "code": 201, "metadata": {}}
            if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/events", path):
                body.setdefault("metadata", {})["name"] = (
                    body["metadata"].get("generateName", "ev.") + str(len(self.events)))
                self.events.append(body)
                return 201, body
            if m := re.fullmatch(r"/apis/coordination.k8s.io/v1/namespaces/([^/]+)/leases", path):
                key = (m[1], body["metadata"]["name"])
                if key in self.leases:
                    return 409, _status(409, "AlreadyExists", "lease exists")
                body["metadata"]["resourceVersion"] = self._bump()
                self.leases[key] = body
                return 201, body
            return 404, _status(404, "NotFound", path)

    def patch(self, path: str, body: dict, content_type: str) -> tuple[int, dict]:
        """A strategic-merge patch of a pod's ``spec.tolerations`` (the list is replaced,
        as it has no merge key), refused as the API server does when it removes or
        changes an existing toleration (only additions are allowed)."""
        with self.lock:
            if st := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/status", path):
                return self._patch_status((st[1], st[2]), body, content_type)
            m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)", path)
            if not m or "strategic-merge-patch" not in content_type:
                return 415 if m else 404, _status(415 if m else 404, "Unsupported", path)
            pod = self.pods.get((m[1], m[2]))
            if pod is None:
                return 404, _status(404, "NotFound", "no such pod")
            if set(body) != {"spec"} or set(body["spec"]) != {"tolerations"}:
                return 422, _status(422, "Invalid", "pod updates may not change fields "
                                    "other than spec.tolerations (only additions)")
            old = pod["spec"].get("tolerations") or []
            new = body["spec"]["tolerations"]
            if any(t not in new for t in old):
                return 422, _status(422, "Invalid", "only additions to existing tolerations")
            pod["spec"]["tolerations"] = new
            self.patches.append(f"{m[1]}/{m[2]}")
            self._record("MODIFIED", pod)
            return 200, pod

    def _patch_status(self, key: tuple[str, str], body: dict, content_type: str
                      ) -> tuple[int, dict]:
        """A strategic-merge patch of a pod's status: ``conditions`` merged by ``type`` (the
        list's merge key), other fields replaced; recorded in ``status_patches``."""
        if "strategic-merge-patch" not in content_type:
            return 415, _status(415, "Unsupported", content_type)
        pod = self.pods.get(key)
        if pod is None:
            return 404, _status(404, "NotFound", "no such pod")
        if set(body) != {"status"}:
            return 422, _status(422, "Invalid", "the status subresource changes status only")
        status = pod.setdefault("status", {})
        for k, v in body["status"].items():
            if k != "conditions":
                status[k] = v
                continue
            have = {c["type"]: c for c in status.get("conditions") or []}
            for c in v:
                have[c["type"]] = {**have.get(c["type"], {}), **c}
            status["conditions"] = list(have.values())
        self.status_patches.append(("/".join(key), body["status"]))
        self._record("MODIFIED", pod)
        return 200, pod

    def put(self, path: str, body: dict) -> tuple[int, dict]:
        with self.lock:
            if m := re.fullmatch(r"/apis/coordination.k8s.io/v1/namespaces/([^/]+)/leases/([^/]+)",
                                 path):
                cur = self.leases.get((m[1], m[2]))
                if cur is None:
                    return 404, _status(404, "NotFound", "no lease")
                if body["metadata"].get("resourceVersion") != cur["metadata"]["resourceVersion"]:
                    return 409, _status(409, "Conflict", "the object has been modified")
                body["metadata"]["resourceVersion"] = self._bump()
                self.leases[(m[1], m[2])] = body
                return 200, body
            return 404, _status(404, "NotFound", path)
