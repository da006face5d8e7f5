"""The deployable manifests: core objects against the Kubernetes OpenAPI schemas,
KubeRay and scheduler configs against the fields their APIs define, alert rules
against the metrics the service exports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
K8S_VERSION = "1.33.0"

# kube-scheduler's Extender type (k8s.io/kube-scheduler/config/v1), json field names.
EXTENDER_FIELDS = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight",
                   "bindVerb", "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable",
                   "managedResources", "ignorable"}


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_core_manifests_validate_against_the_openapi_schemas() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    docs = _docs(INFRA / "k8s" / "extender" / "extender.yaml")
    assert {d["kind"] for d in docs} == {"Namespace", "ServiceAccount", "Deployment", "Service",
                                         "NetworkPolicy"}
    for d in docs:
        kv.validate(d, K8S_VERSION, strict=True)  # raises on an unknown or mistyped field
    dep = next(d for d in docs if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False  # no API access needed
    assert pod["containers"][0]["command"][:3] == ["smartsched", "k8s", "extender"]
    # Off loopback only behind a policy that admits kube-scheduler's namespace alone.
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "kube-system"}}}]
    bad = {**dep, "spec": {**dep["spec"], "replicas": "two"}}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSION, strict=True)


def test_no_rbac_is_granted_to_the_extender() -> None:
    kinds = {d["kind"] for d in _docs(INFRA / "k8s" / "extender" / "extender.yaml")}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


# What the scheduler may do, and nothing more: (apiGroup, resource) -> verbs.
READ = {"get", "list", "watch"}
SCHEDULER_ALLOWED = {("", "pods"): READ, ("", "nodes"): READ,
                     ("", "pods/binding"): {"create"}, ("", "pods/status"): {"patch"},
                     ("", "events"): {"create"},
                     ("coordination.k8s.io", "leases"): {"get", "create", "update"}}


def test_scheduler_manifests_and_least_privilege_rbac() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    docs = _docs(INFRA / "k8s" / "scheduler" / "scheduler.yaml")
    for d in docs:
        kv.validate(d, K8S_VERSION, strict=True)
    granted: dict[tuple[str, str], set[str]] = {}
    for d in docs:
        if d["kind"] in ("ClusterRole", "Role"):
            for rule in d["rules"]:
                assert "*" not in rule["verbs"] and "*" not in rule["resources"]
                for g in rule["apiGroups"]:
                    for r in rule["resources"]:
                        granted.setdefault((g, r), set()).update(rule["verbs"])
    assert granted == SCHEDULER_ALLOWED
    dep = next(d for d in docs if d["kind"] == "Deployment")
    spec = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2 and spec["securityContext"]["runAsNonRoot"]
    cmd = spec["containers"][0]["command"]
    assert cmd[:3] == ["smartsched", "k8s", "scheduler"]
    # The lease namespace the command uses is the one the Role grants.
    role = next(d for d in docs if d["kind"] == "Role")
    assert cmd[cmd.index("--lease-namespace") + 1] == role["metadata"]["namespace"]
    from click.testing import CliRunner

    from smartsched.cli import main

    r = CliRunner().invoke(main, ["k8s", "scheduler", "--help"])
    assert all(opt in r.output for opt in cmd[3::2])  # every flag it passes exists


def test_kube_scheduler_extender_config() -> None:
    (cfg,) = _docs(INFRA / "k8s" / "extender" / "kube-scheduler-config.yaml")
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    (ext,) = cfg["extenders"]
    assert set(ext) <= EXTENDER_FIELDS
    assert ext["filterVerb"] == "filter" and ext["prioritizeVerb"] == "prioritize"
    assert ext["weight"] > 0 and ext["nodeCacheCapable"] is False
    svc = next(d for d in _docs(INFRA / "k8s" / "extender" / "extender.yaml")
               if d["kind"] == "Service")
    assert ext["urlPrefix"] == (f"http://{svc['metadata']['name']}."
                                f"{svc['metadata']['namespace']}.svc:{svc['spec']['ports'][0]['port']}")


def test_kuberay_manifests() -> None:
    from smartsched.rl.config import load_train_config
    from smartsched.serving.config import parse_service_config

    (job,) = _docs(INFRA / "kuberay" / "rayjob-train.yaml")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    assert spec["entrypoint"].startswith("smartsched train --config ")
    config = spec["entrypoint"].split("--config ")[1].split()[0]
    cfg = load_train_config(ROOT / config)  # the config it names exists and is valid
    # The head only schedules: the env runners (several) sample on the workers.
    assert spec["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert cfg.env_runners.num_env_runners >= 2 and "--seed " in spec["entrypoint"]
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]
    assert head and spec["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"]
    (svc,) = _docs(INFRA / "kuberay" / "rayservice-placement.yaml")
    assert (svc["apiVersion"], svc["kind"]) == ("ray.io/v1", "RayService")
    serve = yaml.safe_load(svc["spec"]["serveConfigV2"])
    (app,) = serve["applications"]
    assert app["import_path"] == "smartsched.serving.app:build_app"
    parse_service_config(app["args"])  # the service would accept its args
    mounts = {m["mountPath"] for m in
              svc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
              ["containers"][0]["volumeMounts"]}
    for key in ("token_file", "operator_token_file"):  # both credentials come from the Secret
        assert Path(app["args"]["auth"][key]).parent.as_posix() in mounts
    env = {e["name"]: e["value"] for e in svc["spec"]["rayClusterConfig"]["headGroupSpec"]
           ["template"]["spec"]["containers"][0]["env"]}
    from smartsched.listen import PROXY_BODY_LIMIT_ENV, SERVE_PROXY_CALLBACK

    assert env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] == SERVE_PROXY_CALLBACK
    assert env[PROXY_BODY_LIMIT_ENV] == str(app["args"]["max_body_bytes"])


def _check(obj: dict, typ: str, fields: dict, where: str) -> None:
    spec = fields[typ]
    unknown = set(obj) - set(spec["fields"])
    missing = set(spec["required"]) - set(obj)
    assert not unknown, f"{where}: fields {sorted(unknown)} are not in ray.io/v1 {typ}"
    assert not missing, f"{where}: {typ} requires {sorted(missing)}"


def test_kuberay_manifests_against_the_ray_io_v1_fields() -> None:
    """Field names and required fields of the ray.io/v1 types (tests/infra/kuberay_v1_fields.json,
    taken from the KubeRay Go types at the commits it names); pod templates are core objects
    and validate against the Kubernetes schema."""
    import json

    kv = pytest.importorskip("kubernetes_validate")
    fields = json.loads((Path(__file__).parent / "kuberay_v1_fields.json").read_text())
    (job,) = _docs(INFRA / "kuberay" / "rayjob-train.yaml")
    (svc,) = _docs(INFRA / "kuberay" / "rayservice-placement.yaml")
    _check(job["spec"], "RayJobSpec", fields, "RayJob.spec")
    _check(svc["spec"], "RayServiceSpec", fields, "RayService.spec")
    for where, cluster in (("RayJob", job["spec"]["rayClusterSpec"]),
                           ("RayService", svc["spec"]["rayClusterConfig"])):
        _check(cluster, "RayClusterSpec", fields, where)
        _check(cluster["headGroupSpec"], "HeadGroupSpec", fields, f"{where}.head")
        templates = [cluster["headGroupSpec"]["template"]]
        for g in cluster.get("workerGroupSpecs", []):
            _check(g, "WorkerGroupSpec", fields, f"{where}.{g.get('groupName')}")
            templates.append(g["template"])
        for t in templates:  # a PodTemplateSpec: validate as a core PodTemplate
            kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                         "template": t}, K8S_VERSION, strict=True)
    with pytest.raises(AssertionError):
        _check({"headGroupSpec": {}, "workerGroupSpec": []}, "RayClusterSpec", fields, "typo")


def test_alert_rules_use_exported_metrics() -> None:
    from prometheus_client import generate_latest

    from smartsched.serving.metrics import ServiceMetrics

    m = ServiceMetrics()
    m.request("POST", "/v1/placements", 200, 0.01)
    full = {"tier": "edge", "site": "e", "outcome": "escalated", "reason": "full"}
    m.observe_placements([
        {"placed": True, "profile": "fgd", "tier": "region", "reservation_id": "a~1",
         "reasons": [full, {"tier": "region", "site": "a", "outcome": "placed", "reason": ""}]},
        {"placed": False, "reasons": [{"tier": "region", "site": "a", "outcome": "full",
                                       "reason": "0/3 nodes are available: 3 Insufficient cpu"}]},
    ])
    m.set_reservations({"a": 2})
    m.reservation_event("confirmed")
    from smartsched.k8s.scheduler import SchedulerMetrics

    sm = SchedulerMetrics()
    sm.attempts.labels("scheduled").inc()
    text = generate_latest(m.registry).decode() + generate_latest(sm.registry).decode()
    exported = set(re.findall(r"^(smartsched_\w+?)(?:\{| )", text, re.M))
    rules = yaml.safe_load((INFRA / "prometheus" / "alerts.yml").read_text())
    used = {n for g in rules["groups"] for r in g["rules"]
            for n in re.findall(r"smartsched_\w+", r["expr"])}
    assert used and used <= exported, used - exported
    import json

    dash = json.loads((INFRA / "grafana" / "smartsched-placement.json").read_text())
    in_dash = {n for p in dash["panels"] for t in p["targets"]
               for n in re.findall(r"smartsched_\w+", t["expr"])}
    assert len(dash["panels"]) >= 5 and in_dash <= exported, in_dash - exported
    prom = yaml.safe_load((INFRA / "prometheus" / "prometheus.yml").read_text())
    assert prom["rule_files"] == ["alerts.yml", "telemetry-rules.yml"]
    assert prom["scrape_configs"][0]["metrics_path"] == "/metrics"


def _exported_telemetry_names() -> set[str]:
    """Every series name the twin's telemetry exporter serves (catalogue + twin gauges)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from smartsched.prometheus.exporter import LiveTwin

    twin = LiveTwin("small", "mixed", "k8s-default", hours=1, seed=0)
    twin.advance(1800.0)
    reg = CollectorRegistry()
    reg.register(twin.collector)
    names = set()
    for f in text_string_to_metric_families(generate_latest(reg).decode()):
        names |= {s.name for s in f.samples}
    return names


def test_telemetry_rules_and_cluster_dashboard_read_exported_series() -> None:
    exported = _exported_telemetry_names()
    rules = yaml.safe_load((INFRA / "prometheus" / "telemetry-rules.yml").read_text())
    recorded = set()
    metric = re.compile(r"\b((?:node|smartsched|DCGM)_\w+)")
    for g in rules["groups"]:
        for r in g["rules"]:
            used = set(metric.findall(r["expr"]))
            assert used and used <= exported, (r["record"], used - exported)
            assert re.fullmatch(r"\w+:\w+:\w+", r["record"])  # level:metric:operation
            recorded.add(r["record"])
    import json

    dash = json.loads((INFRA / "grafana" / "smartsched-cluster.json").read_text())
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for topic in ("by zone", "fragmentation", "queue by class", "slo", "energy", "carbon"):
        assert topic in titles, topic
    for p in dash["panels"]:
        for t in p["targets"]:
            names = set(re.findall(r"[\w:]+:[\w:]+|\b(?:node|smartsched|DCGM)_\w+", t["expr"]))
            assert names and names <= exported | recorded, (p["title"], names)


def test_promtool_accepts_the_prometheus_config_and_rules() -> None:
    import os
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        msg = "promtool (Debian's prometheus package) is not installed"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + ": `make test` installs it")
        pytest.skip(msg)
    r = subprocess.run([promtool, "check", "config", str(INFRA / "prometheus" / "prometheus.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    rules = yaml.safe_load((INFRA / "prometheus" / "telemetry-rules.yml").read_text())
    n = sum(len(g["rules"]) for g in rules["groups"])
    assert f"SUCCESS: {n} rules found" in r.stdout + r.stderr
