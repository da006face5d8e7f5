"""A small typed client for the placement service (``smartsched place`` uses it).

Owns talking HTTP to ``/v1/...`` with the bearer tokens (the client token for
placements, the operator token for node updates and reloads), retries of
idempotent requests when the service is unreachable or unavailable (a
request id is generated when none is given, so a retried placement is never
booked twice; a 500 is a server fault and is not retried), and turning
error bodies into exceptions that name the field the server named.
``read_pod_file`` and ``pod_specs`` read and check a pod file (YAML: one pod
or a list) before anything is sent, naming the field.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import requests
from pydantic import ValidationError as PydanticValidationError

from smartsched.model.errors import SmartSchedError, ValidationError
from smartsched.serving.schemas import PlacementResponse, PodSpec, RegionSummary

log = logging.getLogger(__name__)


class ServiceUnreachable(SmartSchedError):
    """No answer from the service at all (refused, timed out, unresolvable), after the
    client's retries."""


class PlacementError(SmartSchedError):
    """The service refused a request (status and the fields it named)."""

    def __init__(self, status: int, detail: Any) -> None:
        self.status, self.detail = status, detail
        if isinstance(detail, list) and detail and isinstance(detail[0], dict):
            loc = [str(x) for x in detail[0].get("loc", [])]
            # the body's fields without the "body" step; the body itself named as it is
            where = ".".join(x for x in loc if x != "body") or ".".join(loc)
            msg = f"{where}: {detail[0].get('msg')}" if where else str(detail[0].get("msg"))
        else:
            msg = str(detail)
        super().__init__(f"HTTP {status}: {msg}")


# Worth a retry: the service (or a proxy before it) is restarting or overloaded, or asks
# this client to slow down (429). A 500 is a fault that the same request will hit again;
# retrying it only multiplies the load.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
# The longest this client waits for one retry whatever Retry-After asks (the service's
# own 503s ask 5-60 s; a caller that wants to wait longer retries itself).
MAX_RETRY_AFTER_S = 5.0


def retry_wait(response: Any, attempt: int) -> float:
    """How long to wait before the next try: a doubling backoff, or the answer's
    ``Retry-After`` in seconds when it asks for longer (at most MAX_RETRY_AFTER_S)."""
    backoff = 0.2 * 2**attempt
    raw = response.headers.get("Retry-After", "") if response is not None else ""
    if raw.isascii() and raw.isdigit():
        return max(backoff, min(float(raw), MAX_RETRY_AFTER_S))
    return backoff


def _token(given: str | None, field: str, env: str) -> str | None:
    """The token given, else the one in ``env``; checked to be one a header can carry."""
    from smartsched.model.configfile import check_token

    if given is not None:
        return check_token(given, field) if given else given
    token = os.environ.get(env)
    return check_token(token, env, f"${env}") if token else token


def shown_url(url: str) -> str:
    """``url`` with any credentials in it masked (``http://user:pass@host`` was echoed in
    errors whole; so was ``user:pass@host``, which has no scheme)."""
    import re

    return re.sub(r"^((?:[A-Za-z][A-Za-z0-9+.-]*://)?)[^/?#]*@", r"\1***@", url)


class PlacementClient:
    def __init__(self, url: str, token: str | None = None, *, operator_token: str | None = None,
                 timeout_s: float = 30.0, retries: int = 3) -> None:
        self.url = url.rstrip("/")
        self.token = _token(token, "token", "SMARTSCHED_API_TOKEN")
        self.operator_token = _token(operator_token, "operator_token",
                                     "SMARTSCHED_OPERATOR_TOKEN")
        self.timeout_s = timeout_s
        self.retries = retries
        self.shown_url = shown_url(self.url)
        self.session = requests.Session()

    def _call(self, method: str, path: str, body: Any = None, *,
              operator: bool = False, gone_on_retry: Any = None) -> Any:
        """``gone_on_retry``: the answer when a retried call finds nothing there (404),
        because an earlier try whose answer was lost already did it (a release)."""
        token = self.operator_token if operator else self.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        for attempt in range(self.retries + 1):
            try:
                r = self.session.request(method, self.url + path, json=body, headers=headers,
                                         timeout=self.timeout_s)
            except (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema,
                    requests.exceptions.InvalidSchema) as e:
                raise ValidationError("url", f"not a service URL: {self.shown_url!r} "
                                      f"({type(e).__name__})") from None
            except (requests.ConnectionError, requests.Timeout) as e:
                if attempt == self.retries:
                    raise ServiceUnreachable(
                        f"no answer from the placement service at {self.shown_url} after "
                        f"{self.retries + 1} tries: {type(e).__name__}") from None
                time.sleep(0.2 * 2**attempt)
                continue
            if r.status_code in RETRY_STATUSES and attempt < self.retries:
                time.sleep(retry_wait(r, attempt))
                continue
            if r.status_code == 404 and attempt > 0 and gone_on_retry is not None:
                return gone_on_retry
            if r.status_code >= 400:
                try:
                    doc = r.json()
                except ValueError:
                    doc = None
                detail = doc.get("detail") if isinstance(doc, dict) else r.text[:500]
                raise PlacementError(r.status_code, detail)
            try:
                return r.json()
            except ValueError:  # a proxy's page, say: not the service's answer
                raise PlacementError(r.status_code, "the answer is not JSON: "
                                     f"{r.text[:200]!r}") from None
        raise AssertionError("unreachable")

    def place(self, pod: PodSpec | Mapping[str, Any], *, request_id: str | None = None,
              ttl_s: float | None = None, validate: bool = False) -> PlacementResponse:
        """``validate``: have the site validate the placement in its sandbox first.
        ``ttl_s``: the reservation's lifetime (None: the service's ``default_ttl_s``)."""
        spec = pod if isinstance(pod, PodSpec) else PodSpec.model_validate(pod)
        body: dict[str, Any] = {"request_id": request_id or uuid.uuid4().hex,
                                "pod": spec.model_dump(by_alias=True, exclude_none=True)}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        if validate:
            body["validate"] = True
        return PlacementResponse.model_validate(self._call("POST", "/v1/placements", body))

    def place_batch(self, pods: Sequence[PodSpec | Mapping[str, Any]], *,
                    request_id: str | None = None, ttl_s: float | None = None,
                    validate: bool = False) -> PlacementResponse:
        specs = [p if isinstance(p, PodSpec) else PodSpec.model_validate(p) for p in pods]
        body: dict[str, Any] = {
            "request_id": request_id or uuid.uuid4().hex,
            "pods": [s.model_dump(by_alias=True, exclude_none=True) for s in specs]}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        if validate:
            body["validate"] = True
        return PlacementResponse.model_validate(
            self._call("POST", "/v1/placements:batch", body))

    def confirm(self, reservation_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/reservations/{reservation_id}:confirm")

    def release(self, reservation_id: str) -> dict[str, Any]:
        """Release a reservation. Retried after a lost answer, a 404 means the first try
        released it: answered as released, not raised."""
        return self._call("DELETE", f"/v1/reservations/{reservation_id}",
                          gone_on_retry={"reservation_id": reservation_id, "released": True,
                                         "pods": []})

    def summary(self, region: str) -> RegionSummary:
        return RegionSummary.model_validate(self._call("GET", f"/v1/clusters/{region}/summary"))

    def set_profile(self, site: str, profile: str) -> dict[str, Any]:
        """Reload a site's profile (operator token)."""
        return self._call("PUT", f"/v1/admin/sites/{site}/profile", {"profile": profile},
                          operator=True)

    def experience(self, limit: int = 2000) -> list[Any]:
        """The pods the service's sites were recently asked to place, ordered by arrival
        (operator token): continuous learning's experience."""
        from smartsched.serving.journal import pod_from_dict

        doc = self._call("GET", f"/v1/admin/experience?limit={int(limit)}", operator=True)
        if cut := doc.get("omitted"):  # a site's window past the service's 2 MiB a site
            log.warning("experience: the service left out the oldest pods of %s (its "
                        "answer is at most 2 MiB a site): those sites' windows are shorter",
                        ", ".join(f"{n} ({k})" for n, k in sorted(cut.items())))
        pods = [pod_from_dict(d) for site in doc["sites"].values() for d in site]
        return sorted(pods, key=lambda p: p.arrival)

    def put_nodes(self, nodes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Register or change nodes, or report their usage (operator token)."""
        return self._call("PUT", "/v1/nodes", {"nodes": list(nodes)}, operator=True)

    def healthy(self) -> bool:
        try:
            return self.session.get(self.url + "/healthz", timeout=self.timeout_s).ok
        except (requests.ConnectionError, requests.Timeout):
            return False


POD_FILE = "pod_file"


def read_pod_file(path: str | Path) -> list[dict[str, Any]]:
    """The pods in a YAML file holding one pod (a mapping) or a list of them.

    Unreadable or invalid YAML, an empty file and an entry that is not a mapping
    are ``ValidationError``s naming ``pod_file`` (with the entry's row).
    """
    from smartsched.model.configfile import read_yaml

    doc = read_yaml(path, POD_FILE, cite_source=False)
    if doc is None or doc == []:
        raise ValidationError(POD_FILE, "no pod: expected a pod (a mapping) or a list of pods")
    pods = doc if isinstance(doc, list) else [doc]
    for i, pod in enumerate(pods):
        if not isinstance(pod, dict):
            raise ValidationError(POD_FILE, f"expected a pod (a mapping), got "
                                  f"{type(pod).__name__}", row=i)
    return pods


def pod_specs(pods: Sequence[Mapping[str, Any]], source: str | None = None
              ) -> list[PodSpec]:
    """Each pod validated as a ``PodSpec``; the first error names its field (``cpu_milli``,
    ``node_selector.pool``), the pod's place in a list (its row) and ``source``. A
    Kubernetes manifest (``kind: Pod``) is not this format, and the error says so."""
    out = []
    for i, pod in enumerate(pods):
        if "apiVersion" in pod or "kind" in pod:
            raise ValidationError(POD_FILE, "a Kubernetes manifest, not a SmartSched pod: "
                                  "give id, cpu_milli, memory_mib, ... (see `smartsched "
                                  "place --help`), or schedule manifests with `smartsched "
                                  "k8s scheduler`", row=i if len(pods) > 1 else None,
                                  source=source)
        try:
            out.append(PodSpec.model_validate(pod))
        except PydanticValidationError as e:
            err = e.errors()[0]
            raise ValidationError(".".join(str(x) for x in err["loc"]) or POD_FILE,
                                  err["msg"], row=i if len(pods) > 1 else None,
                                  source=source) from None
    first: dict[str, int] = {}
    for i, spec in enumerate(out):  # as the service refuses them, before it is asked
        if spec.id in first:
            raise ValidationError("id", f"the id of row {first[spec.id]} again: give each "
                                  "pod its own", row=i, source=source)
        first[spec.id] = i
    return out
