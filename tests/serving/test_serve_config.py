"""`smartsched serve`'s reading of a Serve config file and its checks before Ray starts.

The command takes the first application's args and the file's http_options; everything a
replica would otherwise find only once it runs (an unknown cluster or profile) is checked
before Ray is started, and what the command would ignore is refused, naming it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from smartsched.model.errors import ValidationError
from smartsched.serving.app import checked_service
from smartsched.serving.local import http_address, service_args

REPO = Path(__file__).resolve().parents[2]
PACKAGED = REPO / "serve_apps" / "placement.yaml"


def _edited(tmp_path: Path, edit) -> Path:
    doc = yaml.safe_load(PACKAGED.read_text())
    edit(doc)
    f = tmp_path / "serve.yaml"
    f.write_text(yaml.safe_dump(doc))
    return f


def test_the_packaged_config_reads_and_its_port_is_used(tmp_path: Path) -> None:
    assert service_args(PACKAGED, {})["cluster"] == "medium"
    assert http_address(PACKAGED, None, None) == ("127.0.0.1", 8000)
    moved = _edited(tmp_path, lambda d: d["http_options"].update(port=9123))
    assert http_address(moved, None, None) == ("127.0.0.1", 9123)  # was ignored for 8000
    assert http_address(moved, "0.0.0.0", 9000) == ("0.0.0.0", 9000)  # the command line wins
    assert http_address(None, None, None) == ("127.0.0.1", 8000)


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d: d.update(proxy_locaton="HeadOnly"), "config.proxy_locaton"),
    (lambda d: d["applications"][0].update(argz={}), "config.applications[0].argz"),
    (lambda d: d["applications"][0].update(args="x"), "config.applications[0].args"),
    (lambda d: d["applications"][0].update(import_path="os:system"),
     "config.applications[0].import_path"),
    (lambda d: d["http_options"].update(port="eighty"), "config.http_options.port"),
    (lambda d: d.update(applications=[]), "config.applications"),
    # what `serve run` applies and `smartsched serve` would not: refused, not dropped
    (lambda d: d["applications"][0].update(route_prefix="/v2"),
     "config.applications[0].route_prefix"),
    (lambda d: d["applications"][0].update(deployments=[{"name": "region-a",
                                                         "num_replicas": 2}]),
     "config.applications[0].deployments[0].num_replicas"),
    (lambda d: d["applications"][0].update(deployments=[{"name": "region-a", "user_config":
                                                         {"profile": "fgd", "x": 1}}]),
     "config.applications[0].deployments[0].user_config"),
    (lambda d: d["applications"][0].update(deployments={"region-a": "fgd"}),
     "config.applications[0].deployments"),
])
def test_what_the_command_would_ignore_or_choke_on_is_named(tmp_path: Path, edit,
                                                             field: str) -> None:
    """`args: x` was a ValueError traceback; the others were silently dropped."""
    with pytest.raises(ValidationError) as e:
        service_args(_edited(tmp_path, edit), {})
    assert e.value.field == field


def test_a_sites_profile_in_the_deployments_section_is_applied(tmp_path: Path) -> None:
    """`serve run` applies a deployment's user_config over the args; `smartsched serve
    --config` ignored it, so the same file ran another profile at that site."""
    def pin(d: dict) -> None:
        d["applications"][0]["args"]["profiles"] = {"region-b": "bestfit"}
        d["applications"][0]["deployments"] = [
            {"name": "region-a", "user_config": {"profile": "fgd"}},
            {"name": "region-b", "user_config": {"profile": "k8s-default"}}]

    args = service_args(_edited(tmp_path, pin), {"region_profile": "bestfit"})
    assert args["profiles"] == {"region-a": "fgd", "region-b": "k8s-default"}
    cfg, _ = checked_service({**args, "auth": {"disabled": True}})
    assert [cfg.profile_of(s, "region") for s in ("region-a", "region-b")] == [
        "fgd", "k8s-default"]
    assert not service_args(PACKAGED, {}).get("profiles")  # the shipped file pins no site


@pytest.mark.parametrize(("args", "field"), [
    ({"cluster": "bogus"}, "service.cluster"),
    ({"cluster": "small", "region_profile": "bogus"}, "service.region_profile"),
    ({"cluster": "small", "edge_profile": "rl:/nowhere"}, "service.edge_profile"),
    ({"cluster": "small", "profiles": {"region-a": "bogus"}}, "service.profiles.region-a"),
])
def test_a_site_profile_or_cluster_a_replica_would_reject_is_named_first(
        args: dict, field: str) -> None:
    """These were found after Ray and Serve had started (the cluster), or only by the
    replicas themselves (the profiles)."""
    with pytest.raises(ValidationError) as e:
        checked_service({**args, "auth": {"disabled": True}})
    assert e.value.field == field


def test_a_compliance_tenant_no_pod_could_carry_is_refused_at_start(tmp_path) -> None:
    """Pods name tenants in lowercase; a policy for ``Finance`` bound nothing, silently."""
    policy = tmp_path / "c.yaml"
    policy.write_text("compliance:\n  tenants: [Finance]\n  residency: {Finance: [region-a]}\n")
    with pytest.raises(ValidationError, match="no pod could carry") as e:
        checked_service({"cluster": "medium", "compliance": str(policy),
                         "auth": {"disabled": True}})
    assert e.value.field == "service.compliance.tenants"
