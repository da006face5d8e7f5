"""Tenants' tokens over real HTTP, and the service's audit log (issue 19): a tenant places
only its own pods and reaches only its own reservations; every decision lands in the
signed log with the principal that asked, and the log verifies with the public key."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pyarrow as pa
import requests

from smartsched.audit.keys import load_public_key
from smartsched.audit.store import read_segment, segment_files
from smartsched.audit.verify import verify_log
from tests.serving.conftest import TENANT_TOKENS
from tests.serving.test_http import _place


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


BANK, RETAIL = _h(TENANT_TOKENS["bank"]), _h(TENANT_TOKENS["retail"])


def _pod(**kw) -> dict:
    return {"id": f"t-{uuid.uuid4().hex[:8]}", "cpu_milli": 500, "memory_mib": 512, **kw}


def test_a_tenant_reaches_only_its_own_pods_and_reservations(service: str, auth: dict) -> None:
    r = _place(service, BANK, _pod())
    assert r.status_code == 200, r.text
    rid = r.json()["placements"][0]["reservation_id"]
    # Another tenant can neither confirm nor release it: 404, as for an unknown id.
    for method, path in (("post", f"/v1/reservations/{rid}:confirm"),
                         ("delete", f"/v1/reservations/{rid}")):
        got = requests.request(method, f"{service}{path}", headers=RETAIL, timeout=30)
        assert got.status_code == 404, got.text
    # A tenant cannot place pods in another tenant's name.
    r = _place(service, RETAIL, _pod(tenant="bank"))  # the single route's body says "pod"
    assert r.status_code == 403 and r.json()["detail"][0]["loc"] == ["pod", "tenant"]
    r = requests.post(f"{service}/v1/placements:batch", headers=RETAIL, timeout=30,
                      json={"pods": [_pod(), _pod(tenant="bank")]})
    assert r.status_code == 403 and r.json()["detail"][0]["loc"] == ["pods", "1", "tenant"]
    # Its own: confirmed and released.
    ok = requests.post(f"{service}/v1/reservations/{rid}:confirm", headers=BANK, timeout=30)
    assert ok.status_code == 200, ok.text
    ok = requests.delete(f"{service}/v1/reservations/{rid}", headers=BANK, timeout=30)
    assert ok.status_code == 200, ok.text
    # The shared client token and the operator act for everyone (as before tenants).
    r = _place(service, BANK, _pod())
    rid = r.json()["placements"][0]["reservation_id"]
    assert requests.delete(f"{service}/v1/reservations/{rid}", headers=auth,
                           timeout=30).status_code == 200
    # A tenant token is not an operator token.
    r = requests.put(f"{service}/v1/nodes", headers=BANK, timeout=30, json={"nodes": []})
    assert r.status_code == 403


def test_one_tenants_request_id_never_answers_another(service: str) -> None:
    """Idempotency keys are per tenant: the same request_id from two tenants gets two
    answers (each its own pod), never the other's reservation."""
    key = f"same-{uuid.uuid4().hex[:6]}"
    a = _place(service, BANK, _pod(id="bank-pod"), request_id=key).json()["placements"][0]
    b = _place(service, RETAIL, _pod(id="retail-pod"), request_id=key)
    assert b.status_code == 200, b.text
    b = b.json()["placements"][0]
    assert (a["pod_id"], b["pod_id"]) == ("bank-pod", "retail-pod")
    assert a["reservation_id"] != b["reservation_id"]
    again = _place(service, BANK, _pod(id="bank-pod"), request_id=key).json()["placements"][0]
    assert again["reservation_id"] == a["reservation_id"]  # the replay is still a replay
    for rid, h in ((a["reservation_id"], BANK), (b["reservation_id"], RETAIL)):
        requests.delete(f"{service}/v1/reservations/{rid}", headers=h, timeout=30)


def _records(log_dir: Path) -> dict[str, list]:
    tables = [read_segment(p) for p in segment_files(log_dir)]
    return pa.concat_tables(tables).to_pydict() if tables else {"seq": []}


def test_every_decision_is_in_the_signed_log_with_who_asked(service: str, auth: dict,
                                                            operator: dict,
                                                            serve_args: dict) -> None:
    cfg = serve_args["audit"]
    pid = f"audited-{uuid.uuid4().hex[:6]}"
    r = _place(service, BANK, _pod(id=pid))
    rid = r.json()["placements"][0]["reservation_id"]
    requests.delete(f"{service}/v1/reservations/{rid}", headers=BANK, timeout=30)
    huge = f"rejected-{uuid.uuid4().hex[:6]}"  # fits nowhere: no node has the label
    r = _place(service, RETAIL, _pod(id=huge, node_selector={"no-such-label": "x"}))
    assert r.status_code == 200, r.text
    assert _place(service, {"Authorization": "Bearer not-a-token-at-all-xx"},
                  _pod()).status_code == 403
    requests.put(f"{service}/v1/admin/sites/region-a/profile", headers=operator,
                 json={"profile": "k8s-default"}, timeout=30).raise_for_status()

    pub = load_public_key(Path(cfg["key_file"]).with_suffix(".pub"))
    deadline = time.monotonic() + 30
    while True:  # sealed and signed within block_seconds (0.2 s here)
        rep = verify_log(cfg["dir"], cfg["heads"], pub, live=True)  # being written
        assert rep.ok, rep.problem
        rows = _records(Path(cfg["dir"]))
        signed = rows["seq"][:rep.records] if rows["seq"] else []
        payloads = [json.loads(p) for p in rows.get("payload", [])[:len(signed)]]
        kinds = {(k, pr, d.get("pod_id") or d.get("profile") or d.get("path"))
                 for k, pr, d in zip(rows.get("kind", []), rows.get("principal", []),
                                     payloads, strict=False)}
        want = {("placement", "tenant:bank", pid), ("rejection", "tenant:retail", huge),
                ("auth.refused", "unauthenticated", "/v1/placements"),
                ("policy.reload", "operator", "k8s-default")}
        if want <= kinds and any(k == "reservation.released" and pr == "tenant:bank"
                                 for k, pr, _ in kinds):
            break
        assert time.monotonic() < deadline, want - kinds
        time.sleep(0.3)
    rejected = next(d for d in payloads if d.get("pod_id") == huge)
    assert rejected["placed"] is False and rejected["reasons"]  # the statuses are kept
    tenants = {t for t, pr in zip(rows["tenant"], rows["principal"], strict=True)
               if pr.startswith("tenant:")}
    assert tenants <= {"bank", "retail"}


def test_the_compliance_policy_binds_every_site(service: str, serve_args: dict,
                                                tmp_path: Path) -> None:
    """The service's policy: bank's pods only in region-a (asking for region-b: refused,
    naming the Compliance filter), and never on a node with retail's pods."""
    placed = {}
    for who, h in (("bank", BANK), ("retail", RETAIL)):
        r = requests.post(f"{service}/v1/placements:batch", headers=h, timeout=60,
                          json={"pods": [_pod(cpu_milli=4000) for _ in range(30)]})
        assert r.status_code == 200, r.text
        placed[who] = [p for p in r.json()["placements"] if p["placed"]]
    assert placed["bank"] and placed["retail"]
    assert {p["region"] for p in placed["bank"]} == {"region-a"}
    assert not {p["node"] for p in placed["bank"]} & {p["node"] for p in placed["retail"]}
    r = _place(service, BANK, _pod(allowed_regions=["region-b"])).json()["placements"][0]
    assert not r["placed"]
    for who, h in (("bank", BANK), ("retail", RETAIL)):
        for p in placed[who]:
            requests.delete(f"{service}/v1/reservations/{p['reservation_id']}", headers=h,
                            timeout=30)
    from smartsched.model.errors import ValidationError
    from smartsched.serving.app import build_app

    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants: [bank]\nresidency: {bank: [region-z]}\n")
    try:
        build_app({**serve_args, "compliance": str(bad)})
    except ValidationError as e:
        assert e.field == "compliance.residency.bank[0]" and "region-z" in str(e)
    else:
        raise AssertionError("a policy naming an unknown region was accepted")
