"""kube-scheduler's extender protocol: ``filter`` and ``prioritize`` answered by a profile.

Owns the wire format of ``k8s.io/kube-scheduler/extender/v1`` -- its Go
structs have no JSON tags, so keys are the capitalized field names:

  ExtenderArgs          {Pod, Nodes (a v1 NodeList) | NodeNames ([]string)}
  ExtenderFilterResult  {Nodes | NodeNames, FailedNodes, FailedAndUnresolvableNodes, Error}
  HostPriorityList      [{Host, Score}], Score in 0..MaxExtenderPriority (10)

With ``nodeCacheCapable: false`` kube-scheduler sends whole Node objects and
the extender builds its view from them; with ``true`` it sends names only
and the extender decides on its own cache (``set_cache``: nodes and the pods
bound to them). Filter keeps the nodes the profile's filters admit and names
each rejected node's first failing check; prioritize maps the profile's
weighted score over the admitted candidates linearly onto 0..10 (rejected
candidates get 0). A malformed payload is a ``BadRequest`` with a message.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import deque
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from fastapi import FastAPI, Request  # module level: FastAPI resolves route annotations here
from fastapi.responses import JSONResponse

from smartsched.k8s.snapshot import (
    NoUsableNode,
    Snapshot,
    build_snapshot,
    object_name,
    pod_model,
)
from smartsched.listen import StrictFraming, utf16_or_32
from smartsched.model.errors import SmartSchedError, unechoed
from smartsched.scheduling.base import WorkloadAware, make_scheduler
from smartsched.scheduling.framework import ProfileScheduler
from smartsched.scheduling.status import Code

MAX_EXTENDER_PRIORITY = 10
# kube-scheduler sends whole NodeLists with nodeCacheCapable: false (~10 KiB a node), so the
# default admits ~6,000 nodes; anything larger is refused before it is parsed.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
_SURROGATE = re.compile("[\ud800-\udfff]")
# Kubernetes objects nest about a dozen levels (managedFields' paths the most); a filter's
# answer echoes the Nodes it was sent, and FastAPI's encoder of that answer recursed out of
# stack on a node ~300 levels deep (a 500). Deeper input is refused before anything else.
MAX_JSON_DEPTH = 100
REPREPARE_EVERY = 200  # pods between refreshes of a workload-aware profile's view (FGD)


class BadRequest(SmartSchedError):
    """The payload is not a valid ExtenderArgs (answered with HTTP 400)."""


class Extender:
    def __init__(self, profile: str = "k8s-default", seed: int = 0,
                 compliance: str | None = None) -> None:
        sched = make_scheduler(profile, seed)
        # Hard constraints on every request's nodes (scheduling.compliance), matched
        # leniently: each request brings its own node list.
        self.compliance = None
        if compliance is not None:
            from smartsched.model.errors import ValidationError
            from smartsched.scheduling.compliance import load_policy

            self.compliance = load_policy(compliance)
            if self.compliance.policy.isolation:
                # The extender is sent nodes, not the pods on them: it cannot see who a
                # node runs. Enforcing isolation here would pass everything; refuse instead.
                raise ValidationError("compliance.isolation", "the extender cannot enforce "
                                      "isolation (kube-scheduler sends it nodes, not their "
                                      "pods); use `smartsched k8s scheduler` for this policy")
        if not isinstance(sched, ProfileScheduler):
            raise SmartSchedError(f"the extender needs a filter/score profile, not {profile!r}")
        self.sched = sched
        self.cache: Snapshot | None = None
        # A workload-aware profile (FGD) plans on the pods it expects: the recent ones.
        self._recent: deque[Any] = deque(maxlen=2000)
        self._since_prepare: int | None = None

    def set_cache(self, nodes: Iterable[Any], pods: Iterable[Any] = ()) -> Snapshot:
        """The node cache used when kube-scheduler sends node names only."""
        self.cache = build_snapshot(nodes, pods)
        self._recent.extend(self.cache.pending)
        return self.cache

    def _seen(self, pod: Any) -> None:
        """Count ``pod`` into the workload a workload-aware profile plans on."""
        if not isinstance(self.sched, WorkloadAware):
            return
        self._recent.append(pod)
        if self._since_prepare is None or self._since_prepare >= REPREPARE_EVERY:
            self.sched.prepare(list(self._recent))
            self._since_prepare = 0
        self._since_prepare += 1

    # ---------------------------------------------------------------- parsing
    def _parse(self, args: Any) -> tuple[Any, Snapshot | None, list[str], bool, dict[str, str]]:
        """(pod, snapshot, candidate names, names-only?, unresolvable failures); the
        snapshot is None for an empty NodeList."""
        if not isinstance(args, dict):
            raise BadRequest("ExtenderArgs must be a JSON object")
        if not isinstance(args.get("Pod"), dict):
            raise BadRequest("ExtenderArgs.Pod: missing or not an object")
        try:
            pod = pod_model(args["Pod"])
        except (ValueError, SmartSchedError) as e:
            raise BadRequest(f"ExtenderArgs.Pod: {e}") from None
        unresolvable: dict[str, str] = {}
        if args.get("Nodes") is not None:
            items = args["Nodes"].get("items") if isinstance(args["Nodes"], dict) else None
            if not isinstance(items, list):
                raise BadRequest("ExtenderArgs.Nodes: expected a NodeList with items")
            if not items:  # nothing to filter: answered as NodeNames [] is (it was a 400
                return pod, None, [], False, {}  # "no usable node in the snapshot: ")
            try:
                snap = build_snapshot(items)
            except NoUsableNode as e:  # every node unreadable: each fails, as one alone does
                return pod, None, [], False, {
                    name: f"node not understood: {unechoed(why)}" for _, name, why in e.skipped}
            except SmartSchedError as e:
                raise BadRequest(f"ExtenderArgs.Nodes: {e}") from None
            for _, name, reason in snap.skipped:
                unresolvable[name] = f"node not understood: {unechoed(reason)}"
            names = [n.name for n in snap.spec.nodes]
            return pod, snap, names, False, unresolvable
        if args.get("NodeNames") is not None:
            names = args["NodeNames"]
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise BadRequest("ExtenderArgs.NodeNames: expected a list of strings")
            if self.cache is None:
                raise BadRequest("NodeNames given but this extender has no node cache "
                                 "(configure nodeCacheCapable: false, or give it --nodes)")
            known = [n for n in names if n in self.cache.state.index]
            for n in names:
                if n not in self.cache.state.index:
                    unresolvable[n] = "node unknown to the extender's cache"
            return pod, self.cache, known, True, unresolvable
        raise BadRequest("ExtenderArgs: needs Nodes or NodeNames")

    def _feasible(self, pod: Any, snap: Snapshot, names: list[str]) -> tuple[Any, ...]:
        self._seen(pod)
        st = snap.state
        st.compliance = self.compliance
        req = st.compile(pod)
        ok, ctx = self.sched.feasible(st, req)
        cand = np.zeros(st.num_nodes, dtype=bool)
        cand[[st.index[n] for n in names]] = True
        return ok & cand, ctx, cand

    # ---------------------------------------------------------------- verbs
    def filter(self, args: Any) -> dict[str, Any]:
        pod, snap, names, names_only, unresolvable = self._parse(args)
        if snap is None:  # an empty NodeList, or none readable: no node passes
            return {"Nodes": {**args["Nodes"], "items": []}, "FailedNodes": {},
                    "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
        ok, ctx, cand = self._feasible(pod, snap, names)
        why = self.sched.node_reasons(ctx)
        st = snap.state
        passing = [st.names[i] for i in np.flatnonzero(ok)]
        failed: dict[str, str] = {}
        for i in np.flatnonzero(cand & ~ok).tolist():
            r = why.get(i)
            if r is not None and r.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE:
                # No eviction would help there: kube's preemption skips these nodes.
                unresolvable[st.names[i]] = r.reason
            else:
                failed[st.names[i]] = r.reason if r is not None else "rejected"
        out: dict[str, Any] = {"FailedNodes": failed,
                               "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
        if names_only:
            out["NodeNames"] = passing
        else:
            keep = set(passing)
            items = [n for n in args["Nodes"]["items"] if object_name(n) in keep]
            out["Nodes"] = {**{k: v for k, v in args["Nodes"].items() if k != "items"},
                            "items": items}
        return out

    def prioritize(self, args: Any) -> list[dict[str, Any]]:
        pod, snap, names, _, _ = self._parse(args)
        if snap is None:  # an empty NodeList
            return []
        ok, ctx, _ = self._feasible(pod, snap, names)
        total = self.sched.weighted_scores(ctx, ok)
        st = snap.state
        vals = total[ok]
        lo, hi = (float(vals.min()), float(vals.max())) if vals.size else (0.0, 0.0)
        out = []
        for n in dict.fromkeys(names):  # one score per host, as /filter keeps one of each
            i = st.index[n]
            if not ok[i]:
                score = 0
            elif hi > lo:
                score = round(MAX_EXTENDER_PRIORITY * (total[i] - lo) / (hi - lo))
            else:
                score = MAX_EXTENDER_PRIORITY
            out.append({"Host": n, "Score": int(score)})
        return out


class TooLarge(SmartSchedError):
    """The body is over the limit (answered with HTTP 413, before it is parsed)."""


class Stalled(SmartSchedError):
    """The body stopped arriving, or took too long (answered with HTTP 408)."""


class NotJson(SmartSchedError):
    """A body declared as something other than JSON, or encoded (HTTP 415)."""


# A body may pause this long between its parts, and take this long in all (as the
# placement service's BodyLimit): a client 10 bytes short of its Content-Length held its
# request for good.
BODY_IDLE_TIMEOUT_S = 15.0
BODY_DEADLINE_S = 60.0
# Bodies up to this size are parsed on the event loop (well under a millisecond); larger
# ones on a worker thread.
INLINE_PARSE_BYTES = 256 * 1024


def _is_json(ctype: str) -> bool:
    """A Content-Type naming JSON (``application/json`` or ``application/<x>+json``)."""
    main = ctype.split(";", 1)[0].strip().lower()
    return main == "application/json" or (main.startswith("application/")
                                          and main.endswith("+json"))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once (``{"name": "a", "name": "b"}`` was
    read as node b: which one counts depends on the reader)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            shown = k if k.isascii() and k.isprintable() and len(k) <= 64 else "<key>"
            raise BadRequest(f"not valid JSON: the key {shown!r} is given twice in one object")
        out[k] = v
    return out


_ESCAPE = re.compile(rb"\\.", re.DOTALL)  # a JSON escape: a backslash and the next byte
_KEEP_QUOTES_AND_BRACKETS = bytes(b for b in range(256) if b not in b'"[]{}')


def _too_deep(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether valid JSON text ``raw`` nests arrays and objects more than ``limit`` levels.

    Read from the text, not the parsed value: walking a 26 MB NodeList's objects in Python
    took as long as parsing it (2.5 s), on every filter call. Escapes are dropped, then
    every byte but quotes and brackets (both in C); a bracket after an odd number of
    quotes is inside a string; the running count of the others is the depth."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    if b"\\" in raw:
        raw = _ESCAPE.sub(b"", raw)
    c = np.frombuffer(raw.translate(None, _KEEP_QUOTES_AND_BRACKETS), np.uint8)
    quote = c == ord('"')
    outside = ~quote & (np.cumsum(quote, dtype=np.int32) % 2 == 0)
    opens = (c == ord("[")) | (c == ord("{"))
    depth = np.cumsum(np.where(opens, 1, -1)[outside], dtype=np.int32)
    return bool(depth.size) and int(depth.max()) > limit


def _not_json_constant(name: str) -> Any:
    """``json.loads``' hook for ``NaN``, ``Infinity`` and ``-Infinity``: not JSON (RFC 8259,
    and Go's encoder never writes them); Python read them as floats, and a filter's answer
    echoed them back as null."""
    raise BadRequest(f"not valid JSON: {name} is not a JSON number")


def _has_lone_surrogate(value: Any) -> bool:
    """Whether any string (key or value) inside parsed JSON holds a lone surrogate (json
    joins valid pairs into one character, so any surrogate left is unpaired)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def parse_args_json(raw: bytes) -> Any:
    """ExtenderArgs from a request body: JSON (RFC 8259: no NaN or Infinity, each key once,
    no lone surrogates, at most MAX_JSON_DEPTH levels), else ``BadRequest`` saying why."""
    try:
        args = json.loads(raw, parse_constant=_not_json_constant,
                          object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise BadRequest(f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
                         ) from None
    except UnicodeDecodeError:
        raise BadRequest("not valid JSON: not UTF-8") from None
    except RecursionError:
        raise BadRequest("not valid JSON: nested too deeply") from None
    except ValueError:  # e.g. an integer of more than 4,300 digits
        raise BadRequest("not valid JSON: a number too long to read") from None
    # A lone UTF-16 surrogate (an unpaired \ud800 escape) cannot be written back as
    # UTF-8: answers echo node names, so refuse it here, not in the response.
    if b"\\u" in raw and _has_lone_surrogate(args):
        raise BadRequest("not valid JSON: a string holds a lone UTF-16 surrogate")
    if _too_deep(raw):
        raise BadRequest(f"not valid JSON: nested more than {MAX_JSON_DEPTH} levels")
    return args


def make_app(extender: Extender, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Any:
    """The HTTP server kube-scheduler calls (``urlPrefix`` + ``/filter``, ``/prioritize``).
    Bodies over ``max_body_bytes`` (declared or, chunked, as they arrive) get 413; errors
    never echo the input."""
    # redirect_slashes=False: ``POST /filter/`` was a 307 to a Location built from the Host
    # header; a path that is not a route is a 404.
    # No /docs, /redoc or /openapi.json: kube-scheduler speaks the extender protocol, not
    # this document, and the pages load scripts from a public CDN.
    app = FastAPI(title="SmartSched scheduler extender", redirect_slashes=False,
                  docs_url=None, redoc_url=None, openapi_url=None)

    async def body(request: Request) -> Any:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            raise TooLarge(f"request body over {max_body_bytes} bytes")
        ctype = request.headers.get("content-type")
        if ctype is not None and not _is_json(ctype):
            raise NotJson("Content-Type: send the ExtenderArgs as application/json")
        coding = request.headers.get("content-encoding", "").strip().lower()
        if coding not in ("", "identity"):
            raise NotJson("Content-Encoding: the body is read as it is; send it unencoded")
        chunks, size = [], 0
        stream = request.stream().__aiter__()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BODY_DEADLINE_S
        while True:
            left = deadline - loop.time()
            try:
                chunk = await asyncio.wait_for(stream.__anext__(),
                                               min(BODY_IDLE_TIMEOUT_S, left))
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise Stalled("the body stopped arriving, or took over "
                              f"{BODY_DEADLINE_S:.0f} s: send it whole") from None
            size += len(chunk)
            if size > max_body_bytes:
                raise TooLarge(f"request body over {max_body_bytes} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if utf16_or_32(raw):
            raise BadRequest("body: JSON must be UTF-8 (this body is UTF-16 or UTF-32)")
        if len(raw) <= INLINE_PARSE_BYTES:
            return parse_args_json(raw)
        # A large list parses off the event loop, so /healthz and other requests' bodies
        # keep being answered and read meanwhile (a 4 MB body held them 0.1-0.3 s).
        return await asyncio.get_running_loop().run_in_executor(None, parse_args_json, raw)

    def answer(status: int) -> Any:
        async def handler(_: Request, e: Exception) -> JSONResponse:
            # The field and the rule, never the input (a quantity, a class, an annotation
            # was quoted back: probe round 5).
            return JSONResponse({"Error": unechoed(str(e))}, status_code=status)
        return handler

    for cls, status in ((BadRequest, 400), (TooLarge, 413), (Stalled, 408), (NotJson, 415)):
        app.add_exception_handler(cls, answer(status))

    # The verbs run on one worker thread, one at a time as before (the extender's state
    # is not shared between threads), so the event loop keeps answering: a 100,000-node
    # list held /healthz for 3 s.
    work = ThreadPoolExecutor(1, thread_name_prefix="extender")

    async def run(verb: Any, request: Request) -> Any:
        args = await body(request)
        return await asyncio.get_running_loop().run_in_executor(work, verb, args)

    @app.post("/filter")
    async def filter_(request: Request) -> Any:
        return await run(extender.filter, request)

    @app.post("/prioritize")
    async def prioritize(request: Request) -> Any:
        return await run(extender.prioritize, request)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.head("/healthz", include_in_schema=False)  # a probe's HEAD was a 405
    async def healthz_head() -> None:
        return None

    app.add_middleware(StrictFraming, extender=True)
    return app
