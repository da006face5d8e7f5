"""A live reload of a policy the service cannot use, over real Serve HTTP: a 422 naming the
profile (in the operator's words, never the server's paths), and the site keeps deciding
with the policy it had."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
import requests
import torch

from tests.rl.test_policy_artifact_bad_input import _export_with_width

pytestmark = pytest.mark.slow

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "ppo_mixed_small"


def _site(url: str, site: str) -> dict:
    for region in ("region-a", "region-b"):
        for e in requests.get(f"{url}/v1/clusters/{region}/summary", timeout=10
                              ).json()["edge_sites"]:
            if e["site"] == site:
                return e
    raise AssertionError(f"no site {site}")


def test_a_refused_policy_reload_is_a_422_and_the_site_keeps_its_policy(
        service: str, auth: dict, operator: dict, serve_args: dict, tmp_path: Path) -> None:
    url = f"{service}/v1/admin/sites/mec-1/profile"
    models = Path(serve_args["models_dir"])
    shutil.copytree(SHIPPED, models / "ppo-ok", dirs_exist_ok=True)
    r = requests.put(url, json={"profile": "rl:ppo-ok"}, headers=operator, timeout=120)
    assert r.status_code == 200, r.text
    # Taken before: a policy of another observation width (its first placement then failed
    # with a 500) and one of NaN weights; a profile file outside the models_dir named as
    # an option.
    from smartsched.rl.observation import node_columns

    width = len(node_columns(False, 0)) + 2
    _export_with_width(models, "nodes", width)
    nan = models / "ppo-nan"
    shutil.copytree(SHIPPED, nan, dirs_exist_ok=True)
    state = torch.load(nan / "module_weights.pt", weights_only=True)
    state["gate.1.bias"] = torch.full_like(state["gate.1.bias"], float("nan"))
    torch.save(state, nan / "module_weights.pt")
    outside = tmp_path / "filters.yaml"
    shutil.copy(Path(__file__).resolve().parents[2] / "platform" / "smartsched" / "scheduling"
                / "profiles" / "fgd.yaml", outside)
    for bad, says in (("rl:width_nodes", f"observes {width} nodes columns"),
                      ("rl:ppo-nan", "NaN"),
                      (f"rl:ppo-ok?filters={outside}", "models_dir")):
        r = requests.put(url, json={"profile": bad}, headers=operator, timeout=120)
        assert r.status_code == 422, (bad, r.status_code, r.text[:300])
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["profile"] and says in detail["msg"], r.text[:300]
        assert str(models.resolve()) not in r.text, r.text[:300]
    assert _site(service, "mec-1")["profile"] == "rl:ppo-ok"
    pod = {"id": f"p-{uuid.uuid4().hex[:8]}", "cpu_milli": 500, "memory_mib": 512,
           "class": "edge-rt", "origin_site": "mec-1", "latency_slo_ms": 20}
    r = requests.post(f"{service}/v1/placements", json={"pod": pod}, headers=auth, timeout=30)
    assert r.status_code == 200, r.text
    p = r.json()["placements"][0]
    assert p["placed"] and p["site"] == "mec-1" and p["profile"] == "rl:ppo-ok", p
    requests.delete(f"{service}/v1/reservations/{p['reservation_id']}", headers=auth,
                    timeout=30)
    r = requests.put(url, json={"profile": "k8s-default"}, headers=operator, timeout=30)
    assert r.status_code == 200
