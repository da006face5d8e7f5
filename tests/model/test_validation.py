"""Model validation: bad values raise a typed error naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from smartsched.model.errors import UnknownReferenceError, ValidationError
from smartsched.model.pod import Pod, UsageProfile
from smartsched.model.presets import cluster_from_yaml, load_cluster
from tests.builders import cluster, node, pod


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cpu_milli": -1}, "cpu_milli"),
        ({"memory_mib": -5}, "memory_mib"),
        ({"cpu_milli": 10**12}, "cpu_milli"),
        ({"cpu_milli": 1.5}, "cpu_milli"),
        ({"num_gpu": 1, "gpu_milli": 0}, "gpu_milli"),
        ({"num_gpu": 0, "gpu_milli": 500}, "num_gpu"),
        ({"num_gpu": 2, "gpu_milli": 500}, "gpu_milli"),
        ({"num_gpu": 1, "gpu_milli": 1500}, "gpu_milli"),
        ({"num_gpu": 99, "gpu_milli": 1000}, "num_gpu"),
        ({"num_gpu": 1, "gpu_milli": 500, "gpu_models": ("B9000",)}, "gpu_models"),
        ({"gang_size": 3}, "gang_id"),
        ({"arrival": -1.0}, "arrival"),
        ({"arrival": float("nan")}, "arrival"),
        ({"arrival": 10.0, "deadline": 5.0}, "deadline"),
        ({"pod_class": "gaming"}, "class"),
        # control characters split log lines, CSV rows and metric labels
        ({"id": "p\x00q"}, "id"),
        ({"tenant": "a\nb"}, "tenant"),
        ({"app": "web\x7f"}, "app"),
        ({"gang_id": "g\t1", "gang_size": 2}, "gang_id"),
    ],
)
def test_bad_pod_fields_are_named(kwargs: dict, field: str) -> None:
    base = {"id": "p", "cpu_milli": 1000, "memory_mib": 1024}
    with pytest.raises(ValidationError) as e:
        Pod(**{**base, **kwargs})
    assert e.value.field == field


def test_empty_pod_is_rejected() -> None:
    with pytest.raises(ValidationError, match="must request"):
        Pod(id="p", cpu_milli=0, memory_mib=0)


def test_usage_profile_bounds() -> None:
    with pytest.raises(ValidationError) as e:
        UsageProfile(mean=-0.1)
    assert e.value.field == "usage.mean"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cpu": 0}, "nodes.n.cpu_milli"),
        ({"mem": -1}, "nodes.n.memory_mib"),
        ({"gpus": 2, "model": "Voodoo"}, "nodes.n.gpu_model"),
        ({"gpus": 100}, "nodes.n.num_gpu"),
    ],
)
def test_bad_node_fields_are_named(kwargs: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        node("n", **kwargs)
    assert e.value.field == field


def test_unknown_gpu_model_is_unknown_reference() -> None:
    with pytest.raises(UnknownReferenceError):
        node("n", gpus=1, model="Voodoo")


def test_a_missing_device_model_is_named_as_required() -> None:
    """Before: "unknown GPU model ''" -- as if the empty name had been given."""
    from smartsched.model.cluster import NodeSpec

    with pytest.raises(ValidationError, match="required when num_gpu > 0") as e:
        node("n", gpus=1, model="")
    assert e.value.field == "nodes.n.gpu_model" and type(e.value) is ValidationError
    with pytest.raises(ValidationError, match="required when num_fpga > 0") as e:
        NodeSpec(name="f", cpu_milli=1000, memory_mib=1024, zone="z", num_fpga=1)
    assert e.value.field == "nodes.f.fpga_model"


def test_cluster_rejects_unknown_zone_and_duplicates() -> None:
    with pytest.raises(UnknownReferenceError, match="zone"):
        cluster(node("a", zone="nowhere"))
    with pytest.raises(ValidationError, match="duplicate"):
        cluster(node("a"), node("a"))


def test_gang_larger_than_cluster_is_rejected() -> None:
    c = cluster(node("g0", gpus=2, cpu=64000, mem=262144))
    gang = [
        pod(f"m{i}", num_gpu=2, gpu_milli=1000, gang_id="g", gang_size=2) for i in range(2)
    ]
    with pytest.raises(ValidationError) as e:
        c.validate_pods(gang)
    assert e.value.field == "gang_size"


def test_pod_larger_than_any_node_is_rejected_with_row() -> None:
    c = cluster(node("a", cpu=4000))
    with pytest.raises(ValidationError) as e:
        c.validate_pods([pod("ok"), pod("big", cpu=8000)])
    assert e.value.field == "cpu_milli" and e.value.row == 1


def test_unknown_region_in_pod() -> None:
    c = cluster(node("a"))
    with pytest.raises(UnknownReferenceError) as e:
        c.validate_pods([pod("p", allowed_regions=("mars",))])
    assert e.value.field == "allowed_regions"


def test_presets_sizes() -> None:
    small = load_cluster("small")
    assert len(small.nodes) == 16
    medium = load_cluster("medium")
    assert 180 <= len(medium.nodes) <= 220
    large = load_cluster("large")
    cloud = [s for s in large.sites if s.kind == "cloud"]
    edge = [s for s in large.sites if s.kind == "edge"]
    assert len(cloud) == 3 and len(edge) == 4
    assert len([z for z in large.zones if z.site.startswith("region")]) == 6
    assert large.total_cpu_milli >= 100_000_000 and large.total_gpus >= 5000


def test_unknown_preset() -> None:
    with pytest.raises(UnknownReferenceError) as e:
        load_cluster("gigantic")
    assert e.value.field == "cluster"


def test_cluster_yaml_round_trip_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "c.yaml"
    good.write_text(
        "name: mine\n"
        "sites: [{name: r1, pue: 1.2, carbon: 300}]\n"
        "zones: [{name: z1, site: r1}]\n"
        "nodes:\n"
        "  - {name: cpu, zone: z1, cpu_milli: 16000, memory_mib: 65536, count: 3}\n"
        "  - {name: gpu, zone: z1, cpu_milli: 32000, memory_mib: 131072, num_gpu: 4,"
        " gpu_model: T4}\n"
    )
    spec = cluster_from_yaml(good)
    assert [n.name for n in spec.nodes] == ["cpu-00000", "cpu-00001", "cpu-00002", "gpu"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("cpu_milli: 16000", "cpu_milli: -3"))
    with pytest.raises(ValidationError, match="cpu_milli"):
        cluster_from_yaml(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text(good.read_text().replace("memory_mib: 65536", "memroy_mib: 65536"))
    with pytest.raises(ValidationError, match="memroy_mib"):
        cluster_from_yaml(typo)
    broken = tmp_path / "broken.yaml"
    broken.write_text("nodes: [unclosed")
    with pytest.raises(ValidationError, match="YAML"):
        cluster_from_yaml(broken)


@pytest.mark.parametrize(
    ("site", "field"),
    [
        ("{name: r1, pue: abc}", "sites.r1.pue"),  # was a ValueError traceback
        ("{name: r1, coords_km: [a, b]}", "sites.r1.coords_km"),
        ("{name: r1, coords_km: 5}", "sites.r1.coords_km"),
        ("{name: r1, price_core_hr: 0.05}", "sites.r1.price_core_hr"),  # a typo, ignored before
        ("{name: r1, price_gpu_hour: 1.0e+300}", "sites.r1.price_gpu_hour"),
        ("{name: r1, carbon: 1.0e+300}", "sites.r1.carbon"),
        ("{name: r1, carbon: -5}", "sites.r1.carbon"),
        ("{name: r1, access_latency_ms: .nan}", "sites.r1.access_latency_ms"),
        ("{name: r1, pue: -3}", "sites.r1.pue"),
    ],
)
def test_cluster_yaml_site_fields_are_typed_and_bounded(
    tmp_path: Path, site: str, field: str
) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(f"sites: [{site}]\nzones: [{{name: z1, site: r1}}]\n"
                 "nodes: [{name: n, zone: z1, cpu_milli: 1000, memory_mib: 1024}]\n")
    with pytest.raises(ValidationError) as e:
        cluster_from_yaml(f)
    assert e.value.field == field


@pytest.mark.parametrize(
    ("node", "field"),
    [("count: true", "nodes[0].count"), ("labels: 5", "nodes[0].labels"),
     ("taints: 5", "nodes[0].taints"),
     # each of these was taken without a word: a cordon written as text ('false' is
     # truthy), a label no selector can match, a node called 'None' or "{'a': 1}"
     ("unschedulable: 'false'", "nodes.n.unschedulable"),
     ("labels: {edge: true}", "nodes.n.labels"), ("labels: {x: {y: 1}}", "nodes.n.labels"),
     ("name: null", "nodes[0].name"), ("name: {a: 1}", "nodes[0].name"),
     # a rack given as a list reached the twin as a traceback (unhashable); null made
     # every such node one rack called None
     ("rack: [1, 2]", "nodes[0].rack"), ("rack: null", "nodes[0].rack")],
)
def test_cluster_yaml_node_pool_fields_are_typed(tmp_path: Path, node: str, field: str) -> None:
    f = tmp_path / "c.yaml"
    name = "" if node.startswith("name:") else "name: n, "
    f.write_text("sites: [{name: r1}]\nzones: [{name: z1, site: r1}]\n"
                 f"nodes: [{{{name}zone: z1, cpu_milli: 1000, memory_mib: 1024, {node}}}]\n")
    with pytest.raises(ValidationError) as e:
        cluster_from_yaml(f)
    assert e.value.field == field


def test_cluster_yaml_pools_are_bounded_in_all(tmp_path: Path) -> None:
    """Each pool's count was bounded but not their sum: five pools of a million built five
    million nodes (and gigabytes) before anything ran."""
    pools = ", ".join(f"{{name: p{i}, zone: z1, cpu_milli: 1000, memory_mib: 1024, "
                      "count: 1000000}" for i in range(5))
    f = tmp_path / "c.yaml"
    f.write_text(f"sites: [{{name: r1}}]\nzones: [{{name: z1, site: r1}}]\nnodes: [{pools}]\n")
    with pytest.raises(ValidationError) as e:
        cluster_from_yaml(f)
    assert e.value.field == "nodes" and "5,000,000" in e.value.message


def test_node_topology_graph() -> None:
    n = node("g", gpus=8, cpu=64000, mem=262144)
    topo = n.topology()
    kinds = [c.kind for c in topo.components]
    assert kinds.count("gpu") == 8 and kinds.count("socket") == 2 and kinds.count("switch") == 4
    assert any(link.kind == "nvlink" for link in topo.links)  # A100
    assert set(topo.gpu_socket()) == {0, 1}


def test_errors_survive_pickling() -> None:
    """They cross process pools (bench quality --workers) and Ray workers intact."""
    import pickle

    from smartsched.model.errors import UnknownReferenceError, ValidationError

    e = pickle.loads(pickle.dumps(UnknownReferenceError("pods.gpu_model", "unknown", row=3,
                                                        source="t.csv")))
    assert type(e) is UnknownReferenceError and e.field == "pods.gpu_model" and e.row == 3
    assert str(e) == str(ValidationError("pods.gpu_model", "unknown", row=3, source="t.csv"))


def test_cluster_yaml_name_must_be_a_name(tmp_path: Path) -> None:
    """A list as the cluster's name was printed as "[1, 2]" in every report."""
    f = tmp_path / "c.yaml"
    f.write_text("name: [1, 2]\nsites: [{name: r1}]\nzones: [{name: z1, site: r1}]\n"
                 "nodes: [{name: n, zone: z1, cpu_milli: 1000, memory_mib: 1024, rack: 7}]\n")
    with pytest.raises(ValidationError) as e:
        cluster_from_yaml(f)
    assert e.value.field == "cluster.name"
    f.write_text(f.read_text().replace("[1, 2]", "lab"))
    spec = cluster_from_yaml(f)
    assert (spec.name, spec.nodes[0].rack) == ("lab", "7")
