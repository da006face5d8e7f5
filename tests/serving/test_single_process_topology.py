"""``service.topology: single_process``: the cloud ingress's replica holds every site, so
cloud -> region is a call in one process. Over real Serve HTTP (a second application
beside the session's service, on its own route prefix): the same answers, idempotency,
node updates and refusals as the distributed service, and a redeploy with another
profile keeps the reservations (each site replays its journal)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import requests

from smartsched.model.errors import ValidationError
from smartsched.serving.config import parse_service_config
from tests.serving.conftest import OPERATOR_TOKEN, TOKEN

PREFIX = "/single"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


def _args(root: Path, region_profile: str) -> dict:
    (root / "token").write_text(TOKEN + "\n")
    (root / "operator_token").write_text(OPERATOR_TOKEN + "\n")
    return {"cluster": "medium", "topology": "single_process",
            "region_profile": region_profile, "journal_dir": str(root / "journal"),
            "auth": {"token_file": str(root / "token"),
                     "operator_token_file": str(root / "operator_token")}}


def _deploy(args: dict) -> None:
    from ray import serve

    from smartsched.serving.app import build_app

    serve.run(build_app(args), name="single", route_prefix=PREFIX)


@pytest.fixture(scope="module")
def single(service: str, tmp_path_factory: pytest.TempPathFactory):
    """URL of the single-process service (the session's Serve instance, another app)."""
    from ray import serve

    root = tmp_path_factory.mktemp("single")
    _deploy(_args(root, "bestfit"))
    yield f"{service}{PREFIX}", root
    serve.delete("single")


def _pod(**kw) -> dict:
    return {"id": f"s-{uuid.uuid4().hex[:8]}", "cpu_milli": 1000, "memory_mib": 1024, **kw}


def _place(url: str, pod: dict, **kw) -> dict:
    r = requests.post(f"{url}/v1/placements", json={"pod": pod, **kw}, timeout=30,
                      headers=AUTH)
    assert r.status_code == 200, r.text
    return r.json()


def test_an_edge_entry_needs_distributed_sites() -> None:
    with pytest.raises(ValidationError) as e:
        parse_service_config({"topology": "single_process",
                              "edge_entry": {"ports": {"mec-0": 18123}}})
    assert e.value.field == "service.edge_entry.ports"
    with pytest.raises(ValidationError) as e:
        parse_service_config({"topology": "one_box"})
    assert e.value.field == "service.topology"


@pytest.mark.slow
def test_tiers_profiles_batches_and_retries_answer_as_distributed(single) -> None:
    url, _ = single
    p = _place(url, _pod())["placements"][0]
    assert p["placed"] and p["tier"] == "region" and p["profile"] == "bestfit"
    assert p["reasons"][0]["tier"] == "cloud" and p["reasons"][-1]["outcome"] == "placed"
    e = _place(url, _pod(**{"class": "edge-rt"}, origin_site="mec-0",
                         latency_slo_ms=20))["placements"][0]
    assert e["placed"] and e["tier"] == "edge" and e["site"] == "mec-0"
    assert e["profile"] == "k8s-default"
    # A full edge site escalates to its region (the edge object calls the region object).
    edge = {"class": "edge-rt", "origin_site": "mec-1", "latency_slo_ms": 50}
    r = requests.post(f"{url}/v1/placements:batch", headers=AUTH, timeout=60,
                      json={"pods": [_pod(cpu_milli=16000, **edge) for _ in range(12)]})
    tiers = {x["tier"] for x in r.json()["placements"]}
    assert r.status_code == 200 and tiers == {"edge", "region"}, r.text
    # One GPU each, more than fit: no device booked twice.
    gpu = [_pod(cpu_milli=500, memory_mib=512, num_gpu=1, gpu_milli=1000,
                tolerations=["nvidia.com/gpu=present:NoSchedule"]) for _ in range(60)]
    rid = uuid.uuid4().hex
    first = requests.post(f"{url}/v1/placements:batch", headers=AUTH, timeout=60,
                          json={"pods": gpu, "request_id": rid, "ttl_s": 600})
    assert first.status_code == 200, first.text
    ok = [x for x in first.json()["placements"] if x["placed"]]
    devices = [(x["node"], d) for x in ok for d in x["devices"]]
    assert ok and len(devices) == len(set(devices)) == len(ok)
    # The retry gets the first answer as it was: the cloud tier's stages were added to a
    # copy, not to the answer the site keeps.
    again = requests.post(f"{url}/v1/placements:batch", headers=AUTH, timeout=60,
                          json={"pods": gpu, "request_id": rid, "ttl_s": 600})
    assert again.json() == first.json()
    other = requests.post(f"{url}/v1/placements:batch", headers=AUTH, timeout=60,
                          json={"pods": gpu[:5], "request_id": rid, "ttl_s": 600})
    assert other.status_code == 409
    for x in ok:
        assert requests.delete(f"{url}/v1/reservations/{x['reservation_id']}", headers=AUTH,
                               timeout=10).status_code == 200
    assert requests.delete(f"{url}/v1/reservations/{ok[0]['reservation_id']}", headers=AUTH,
                           timeout=10).status_code == 404


@pytest.mark.slow
def test_node_updates_and_refusals_carry_no_internals(single) -> None:
    url, _ = single
    node = {"name": "mec-1-single-0", "site": "mec-1", "cpu_milli": 32000,
            "memory_mib": 131072, "labels": {"pool": "single"}}
    assert requests.put(f"{url}/v1/nodes", json={"nodes": [node]}, headers=AUTH,
                        timeout=30).status_code == 403
    r = requests.put(f"{url}/v1/nodes", json={"nodes": [node]}, headers=OPERATOR, timeout=30)
    assert r.status_code == 200, r.text
    p = _place(url, _pod(node_selector={"pool": "single"}, **{"class": "edge-rt"},
                         origin_site="mec-1", latency_slo_ms=50))["placements"][0]
    assert p["placed"] and p["node"] == "mec-1-single-0", p
    r = requests.put(f"{url}/v1/nodes", json={"nodes": [{**node, "cpu_milli": 500}]},
                     headers=OPERATOR, timeout=30)
    assert r.status_code == 409 and "mec-1-single-0" in r.text, r.text
    for leak in ("Traceback", 'File "', ".py"):
        assert leak not in r.text
    r = requests.delete(f"{url}/v1/reservations/nowhere~x", headers=AUTH, timeout=10)
    assert r.status_code == 404 and "reservation" in r.text


@pytest.mark.slow
def test_a_redeploy_with_another_profile_keeps_reservations(single) -> None:
    url, root = single
    p = _place(url, _pod(cpu_milli=3000, allowed_regions=["region-a"]),
               ttl_s=600)["placements"][0]
    res = f"{url}/v1/reservations/{p['reservation_id']}"
    assert requests.post(f"{res}:confirm", headers=AUTH, timeout=10).status_code == 200
    _deploy(_args(root, "k8s-default"))  # a new ingress replica: every site replays
    q = _place(url, _pod(allowed_regions=["region-a"]))["placements"][0]
    assert q["placed"] and q["profile"] == "k8s-default"
    r = requests.delete(res, headers=AUTH, timeout=10)
    assert r.status_code == 200 and r.json()["pods"] == [p["pod_id"]]
