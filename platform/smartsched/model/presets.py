"""Named cluster presets and loading clusters from YAML.

Owns the preset catalogue (`small`, `medium`, `large`, `openb-gpu`,
`openb-all`) and the YAML schema for user clusters. Synthetic presets are
built deterministically (no randomness) so every run of a preset is the same
cluster; the openb presets read the public trace's node lists.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from smartsched.model.carbon import MAX_G_PER_KWH, PUBLIC_SERIES, CarbonSeries, load_series
from smartsched.model.cluster import ClusterSpec, NodeSpec, Site, Zone
from smartsched.model.errors import UnknownReferenceError, ValidationError
from smartsched.paths import data_dir

GPU_NODE_TAINT = "nvidia.com/gpu=present:NoSchedule"
# Nodes one cluster file may describe in all (``count`` summed over its entries).
MAX_CLUSTER_NODES = 1_000_000


def _pool(
    prefix: str,
    count: int,
    zones: list[str],
    rack_size: int,
    **node: Any,
) -> list[NodeSpec]:
    """``count`` identical nodes spread round-robin over ``zones``, ``rack_size`` per rack."""
    out = []
    for i in range(count):
        zone = zones[i % len(zones)]
        rack = f"{zone}-{prefix}-r{(i // len(zones)) // rack_size}"
        out.append(NodeSpec(name=f"{prefix}-{i:05d}", zone=zone, rack=rack, **node))
    return out


def _edge_sites(n: int, center: tuple[float, float], radius_km: float) -> list[Site]:
    import math

    sites = []
    for i in range(n):
        ang = 2 * math.pi * i / max(1, n)
        coords = (center[0] + radius_km * math.cos(ang), center[1] + radius_km * math.sin(ang))
        sites.append(
            Site(
                name=f"mec-{i}",
                kind="edge",
                coords_km=coords,
                access_latency_ms=1.0,
                pue=1.6,
                price_core_hour=0.06,
                price_gpu_hour=1.2,
                carbon=CarbonSeries.diurnal(380.0, 60.0),
            )
        )
    return sites


def small() -> ClusterSpec:
    """16 nodes: one region with 2 zones (10 CPU nodes, 4 GPU nodes) and one MEC site (2 nodes)."""
    region = Site(
        "region-a", "cloud", (0.0, 0.0), 5.0, 1.3, 0.04, 2.0, CarbonSeries.diurnal(300, 80)
    )
    edge = _edge_sites(1, (0.0, 0.0), 400.0)
    zones = [
        Zone("region-a-1", "region-a"), Zone("region-a-2", "region-a"), Zone("mec-0-1", "mec-0")
    ]
    cloud_zones = ["region-a-1", "region-a-2"]
    nodes = _pool("cpu", 10, cloud_zones, 8, cpu_milli=32_000, memory_mib=131_072)
    nodes += _pool(
        "gpu", 2, cloud_zones, 8, cpu_milli=64_000, memory_mib=262_144, num_gpu=8,
        gpu_model="A100", taints=(GPU_NODE_TAINT,),
    )
    nodes += _pool(
        "t4", 2, cloud_zones, 8, cpu_milli=32_000, memory_mib=131_072, num_gpu=4,
        gpu_model="T4", taints=(GPU_NODE_TAINT,),
    )
    nodes += _pool(
        "edge0", 2, ["mec-0-1"], 8, cpu_milli=16_000, memory_mib=65_536, num_gpu=1,
        gpu_model="T4", labels={"node-role/edge": "true"},
    )
    return ClusterSpec("small", tuple([region, *edge]), tuple(zones), tuple(nodes))


def _regions(n: int) -> list[Site]:
    # Three regions ~1,000 km apart with different grids and prices.
    specs = [
        ("region-a", (0.0, 0.0), 1.25, 0.040, 2.2, CarbonSeries.diurnal(250, 90)),
        ("region-b", (900.0, 300.0), 1.35, 0.034, 1.9, CarbonSeries.diurnal(420, 50)),
        ("region-c", (300.0, 1100.0), 1.15, 0.046, 2.5, CarbonSeries.diurnal(120, 40)),
    ]
    return [
        Site(name, "cloud", xy, 5.0, pue, pc, pg, ci) for name, xy, pue, pc, pg, ci in specs[:n]
    ]


def medium() -> ClusterSpec:
    """200 nodes: 2 regions x 2 zones (160 CPU nodes, 32 GPU nodes) plus 2 MEC sites (8 nodes)."""
    regions = _regions(2)
    edges = _edge_sites(2, (400.0, 150.0), 500.0)
    zones = [Zone(f"{r.name}-{z}", r.name) for r in regions for z in (1, 2)]
    zones += [Zone(f"{e.name}-1", e.name) for e in edges]
    cloud_zones = [z.name for z in zones if z.site.startswith("region")]
    nodes = _pool("cpu", 160, cloud_zones, 20, cpu_milli=64_000, memory_mib=262_144)
    nodes += _pool(
        "a100", 16, cloud_zones, 8, cpu_milli=96_000, memory_mib=786_432, num_gpu=8,
        gpu_model="A100", taints=(GPU_NODE_TAINT,),
    )
    nodes += _pool(
        "t4", 16, cloud_zones, 8, cpu_milli=48_000, memory_mib=196_608, num_gpu=4,
        gpu_model="T4", taints=(GPU_NODE_TAINT,),
    )
    for e in edges:
        nodes += _pool(
            f"{e.name}-n", 4, [f"{e.name}-1"], 4, cpu_milli=16_000, memory_mib=65_536,
            num_gpu=1, gpu_model="T4", labels={"node-role/edge": "true"},
        )
    return ClusterSpec("medium", tuple(regions + edges), tuple(zones), tuple(nodes))


def large() -> ClusterSpec:
    """The seed's case: 3 regions, 6 zones, >=100,000 cores and >=5,000 GPUs, plus 4 MEC sites.

    1,000 CPU nodes x 64 cores, 400 x 8 A100 and 240 x 8 V100M32 GPU nodes
    (64 cores each), 160 T4 inference nodes (4 GPUs, 32 cores), and 4 MEC
    sites of 12 nodes: 110,848 cores and 5,808 GPUs.
    """
    regions = _regions(3)
    edges = _edge_sites(4, (400.0, 450.0), 700.0)
    zones = [Zone(f"{r.name}-{z}", r.name) for r in regions for z in (1, 2)]
    zones += [Zone(f"{e.name}-1", e.name) for e in edges]
    cloud_zones = [z.name for z in zones if z.site.startswith("region")]
    nodes = _pool("cpu", 1000, cloud_zones, 40, cpu_milli=64_000, memory_mib=262_144)
    nodes += _pool(
        "a100", 400, cloud_zones, 16, cpu_milli=64_000, memory_mib=1_048_576, num_gpu=8,
        gpu_model="A100", taints=(GPU_NODE_TAINT,),
    )
    nodes += _pool(
        "v100", 240, cloud_zones, 16, cpu_milli=64_000, memory_mib=524_288, num_gpu=8,
        gpu_model="V100M32", taints=(GPU_NODE_TAINT,),
    )
    nodes += _pool(
        "t4", 160, cloud_zones, 16, cpu_milli=32_000, memory_mib=196_608, num_gpu=4,
        gpu_model="T4", taints=(GPU_NODE_TAINT,),
    )
    for e in edges:
        nodes += _pool(
            f"{e.name}-n", 12, [f"{e.name}-1"], 12, cpu_milli=16_000, memory_mib=65_536,
            num_gpu=1, gpu_model="T4", labels={"node-role/edge": "true"},
        )
    return ClusterSpec("large", tuple(regions + edges), tuple(zones), tuple(nodes))


def openb(variant: str = "gpu_node", root: Path | None = None) -> ClusterSpec:
    """The openb trace's node list: one site, one zone, racks of 32 nodes in file order."""
    from smartsched.model.cluster_io import load_openb_nodes

    path = (root or data_dir()) / "alibaba-openb-gpu-2023" / f"openb_node_list_{variant}.csv"
    site = Site("openb", "cloud", (0.0, 0.0), 5.0, 1.3, 0.04, 2.0, CarbonSeries.constant(400.0))
    nodes = load_openb_nodes(path, zone="openb-1", rack_size=32)
    return ClusterSpec(f"openb-{variant}", (site,), (Zone("openb-1", "openb"),), tuple(nodes))


def regional(nodes_per_region: int, regions: int = 2, edge_sites: int = 2,
             nodes_per_edge: int = 8) -> ClusterSpec:
    """A cluster of ``regions`` x ``nodes_per_region`` (80 % CPU nodes, 20 % 8-GPU A100
    nodes, two zones each) plus ``edge_sites`` MEC sites: the service benchmark's shape."""
    if not 1 <= regions <= 3:
        raise ValidationError("regions", f"must be 1..3, got {regions}")
    if nodes_per_region < 2 or edge_sites < 0 or nodes_per_edge < 1:
        raise ValidationError("nodes_per_region", "needs >= 2 nodes per region, >= 1 per edge")
    cloud = _regions(regions)
    edges = _edge_sites(edge_sites, (400.0, 150.0), 500.0)
    zones = [Zone(f"{r.name}-{z}", r.name) for r in cloud for z in (1, 2)]
    zones += [Zone(f"{e.name}-1", e.name) for e in edges]
    nodes: list[NodeSpec] = []
    for r in cloud:
        rz = [f"{r.name}-1", f"{r.name}-2"]
        gpu = nodes_per_region // 5
        nodes += _pool(f"{r.name}-cpu", nodes_per_region - gpu, rz, 40, cpu_milli=64_000,
                       memory_mib=262_144)
        nodes += _pool(f"{r.name}-a100", gpu, rz, 16, cpu_milli=96_000, memory_mib=786_432,
                       num_gpu=8, gpu_model="A100", taints=(GPU_NODE_TAINT,))
    for e in edges:
        nodes += _pool(f"{e.name}-n", nodes_per_edge, [f"{e.name}-1"], nodes_per_edge,
                       cpu_milli=16_000, memory_mib=65_536, num_gpu=1, gpu_model="T4",
                       labels={"node-role/edge": "true"})
    return ClusterSpec(f"regional-{nodes_per_region}", tuple(cloud + edges), tuple(zones),
                       tuple(nodes))


def finance() -> ClusterSpec:
    """The finance case (issue 19): one region, 3 zones; an online core pool of 24 nodes
    (32 cores, 128 GiB, ``pool=core``) and a dedicated batch pool of 16 nodes (64 cores,
    256 GiB, ``pool=batch``)."""
    region = Site(
        "region-fin", "cloud", (0.0, 0.0), 5.0, 1.3, 0.04, 2.0, CarbonSeries.diurnal(300, 80)
    )
    zones = [Zone(f"region-fin-{z}", region.name) for z in (1, 2, 3)]
    names = [z.name for z in zones]
    nodes = _pool("core", 24, names, 8, cpu_milli=32_000, memory_mib=131_072,
                  labels={"pool": "core"})
    nodes += _pool("batch", 16, names, 8, cpu_milli=64_000, memory_mib=262_144,
                   labels={"pool": "batch"})
    return ClusterSpec("finance", (region,), tuple(zones), tuple(nodes))


PRESETS: dict[str, Callable[[], ClusterSpec]] = {
    "small": small,
    "medium": medium,
    "large": large,
    "finance": finance,
    "openb-gpu": lambda: openb("gpu_node"),
    "openb-all": lambda: openb("all_node"),
}


def load_cluster(spec: str) -> ClusterSpec:
    """Resolve a preset name or a path to a cluster file (.yaml/.yml or .parquet)."""
    if spec in PRESETS:
        return PRESETS[spec]()
    path = Path(spec)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return cluster_from_yaml(path)
    if path.suffix == ".parquet" and path.is_file():
        from smartsched.model.cluster_io import read_cluster

        return read_cluster(path)
    known = ", ".join(PRESETS)
    raise UnknownReferenceError(
        "cluster",
        f"{spec[:200]!r} is neither a preset ({known}) nor an existing .yaml/.parquet file"
    )


def cluster_from_yaml(path: Path) -> ClusterSpec:
    """Load a cluster file.

    Schema (all lists)::

        name: my-cluster
        sites:  [{name, kind, coords_km: [x, y], access_latency_ms, pue,
                  price_core_hour, price_gpu_hour, carbon: <number|public-series-name>,
                  fossil_g_per_kwh}]   # the grid's fossil intensity (renewable estimate)
        zones:  [{name, site}]
        nodes:  [{name, zone, cpu_milli, memory_mib, num_gpu, gpu_model, rack,
                  labels: {k: v}, taints: [..], count: N}]   # count expands a pool
    """
    from smartsched.model.configfile import read_yaml

    doc = read_yaml(path, "cluster")
    if not isinstance(doc, dict):
        raise ValidationError("cluster", "top level must be a mapping", source=str(path))
    return cluster_from_dict(doc, source=str(path), base=path.parent)


def cluster_from_dict(doc: dict[str, Any], source: str = "cluster",
                      base: Path | None = None) -> ClusterSpec:
    """Build a ``ClusterSpec`` from plain data (the YAML schema of :func:`cluster_from_yaml`).
    ``base``: the folder a site's relative series file is read from (a cluster file's
    own; None: the working directory)."""
    unknown = sorted(map(str, set(doc) - _CLUSTER_KEYS))
    if unknown:  # a typo (``sitez:``) was dropped without a word
        raise ValidationError(unknown[0][:64], "unknown field (a cluster has: "
                              f"{', '.join(sorted(_CLUSTER_KEYS))})", source=source)
    try:
        sites = [_site(s, base, source) for s in _list(doc, "sites", source)]
        zones = [Zone(_name(z, "name", f"zones[{i}]"), _name(z, "site", f"zones[{i}]"))
                 for i, z in enumerate(_list(doc, "zones", source))]
        entries = _list(doc, "nodes", source)
        total = sum(n.get("count", 1) for n in entries if isinstance(n.get("count", 1), int))
        if total > MAX_CLUSTER_NODES:
            raise ValidationError("nodes", f"{total:,} nodes in all (counts summed), more than "
                                  f"{MAX_CLUSTER_NODES:,}", source=source)
        nodes: list[NodeSpec] = []
        for i, n in enumerate(entries):
            nodes.extend(_nodes(n, i))
    except KeyError as e:
        raise ValidationError(str(e.args[0]), "missing field", source=source) from None
    except TypeError as e:
        raise ValidationError("cluster", f"wrong type: {e}", source=source) from None
    name = _name(doc, "name", "cluster") if "name" in doc else source
    return ClusterSpec(name, tuple(sites), tuple(zones), tuple(nodes))


_CLUSTER_KEYS = {"name", "sites", "zones", "nodes"}
# What every node entry must give (NodeSpec has no default for them).
_NODE_REQUIRED = ("name", "zone", "cpu_milli", "memory_mib")


def _name(doc: dict[str, Any], key: str, where: str) -> str:
    """``doc[key]`` as a name: a string or a number, never null or a list (which ``str``
    would have turned into a node called 'None')."""
    v = doc[key]
    if isinstance(v, bool) or not isinstance(v, str | int | float | datetime.date):
        raise ValidationError(f"{where}.{key}", f"must be a name, got {v!r}")
    return str(v)


def _list(doc: dict[str, Any], key: str, source: str) -> list[dict[str, Any]]:
    v = doc.get(key)
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise ValidationError(key, "must be a list of mappings", source=source)
    return v


_SITE_KEYS = {
    "name", "kind", "coords_km", "access_latency_ms", "pue", "price_core_hour",
    "price_gpu_hour", "carbon", "fossil_g_per_kwh",
}
# Upper ends no real site reaches, so a typo (an extra digit, a unit slip) is refused
# rather than carried into every cost and carbon figure of a run.
_SITE_BOUNDS = {
    "access_latency_ms": 10_000.0,  # 10 s to reach a node: not a site
    "price_core_hour": 1_000.0,  # USD per core-hour
    "price_gpu_hour": 10_000.0,  # USD per GPU-hour
    "carbon": MAX_G_PER_KWH,  # g/kWh (model.carbon's bound for every series)
    "coords_km": 100_000.0,  # beyond twice the Earth's circumference
}


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _site_number(s: dict[str, Any], key: str, default: float, where: str) -> float:
    """``s[key]`` as a finite number within its bound (``_SITE_BOUNDS``), or ``default``."""
    v = s.get(key, default)
    if not _is_number(v) or not math.isfinite(v):
        raise ValidationError(f"{where}.{key}", f"must be a number, got {v!r}")
    high = _SITE_BOUNDS.get(key)
    if v < 0:
        raise ValidationError(f"{where}.{key}", f"must be >= 0, got {v!r}")
    if high is not None and v > high:
        raise ValidationError(f"{where}.{key}", f"must be within 0..{high:g}, got {v!r}")
    return float(v)


def _site(s: dict[str, Any], base: Path | None = None, source: str | None = None) -> Site:
    where = f"sites.{s.get('name')}"
    unknown = set(s) - _SITE_KEYS
    if unknown:
        raise ValidationError(f"{where}.{sorted(map(str, unknown))[0]}", "unknown field")
    carbon = s.get("carbon", 400.0)
    if isinstance(carbon, str):  # a public series' name, or a CSV file of one's own
        # A relative file is the cluster file's neighbour, as any file a file names (it
        # was read from the working directory: another file of the same name there was
        # used without a word).
        spec = carbon
        if base is not None and carbon not in PUBLIC_SERIES and not Path(carbon).is_absolute():
            spec = str(base / carbon)
        try:
            series = load_series(spec, data_dir())
        except ValidationError as e:
            if e.field != "carbon":
                raise  # the file's own problem, naming its column and row
            raise ValidationError(f"{where}.carbon", e.message, source=source) from None
    else:
        series = CarbonSeries.constant(_site_number(s, "carbon", 400.0, where))
    if "fossil_g_per_kwh" in s:
        f = s["fossil_g_per_kwh"]
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0 < f <= MAX_G_PER_KWH:
            raise ValidationError(f"{where}.fossil_g_per_kwh",
                                  f"must be a number in (0, {MAX_G_PER_KWH:g}] g/kWh, got {f!r}")
        series = dataclasses.replace(series, fossil_g_per_kwh=float(f))
    xy = s.get("coords_km", [0.0, 0.0])
    if not isinstance(xy, list | tuple) or len(xy) != 2:
        raise ValidationError(f"{where}.coords_km", f"must be [x, y] in km, got {xy!r}")
    coords = []
    for c in xy:  # the bound holds for |x| and |y|
        _site_number({"coords_km": abs(c) if _is_number(c) else c}, "coords_km", 0.0, where)
        coords.append(float(c))
    name = _name(s, "name", where)
    kind = s.get("kind", "cloud")
    return Site(
        name=name,
        kind=str(kind),
        coords_km=(coords[0], coords[1]),
        access_latency_ms=_site_number(s, "access_latency_ms", 5.0, where),
        pue=_site_number(s, "pue", 1.3, where),
        price_core_hour=_site_number(s, "price_core_hour", 0.04, where),
        price_gpu_hour=_site_number(s, "price_gpu_hour", 2.0, where),
        carbon=series,
    )


_NODE_KEYS = {
    "name", "zone", "cpu_milli", "memory_mib", "num_gpu", "gpu_model", "num_fpga",
    "fpga_model", "rack", "labels", "taints", "unschedulable", "sockets", "count",
    "idle_watts", "max_watts", "max_pods",
}


def _nodes(n: dict[str, Any], i: int) -> Iterable[NodeSpec]:
    unknown = set(n) - _NODE_KEYS
    if unknown:
        raise ValidationError(f"nodes[{i}].{sorted(unknown)[0]}", "unknown field")
    missing = [k for k in _NODE_REQUIRED if k not in n]
    if missing:  # (was "wrong type: NodeSpec.__init__() missing 1 required ... argument")
        raise ValidationError(f"nodes[{i}].{missing[0]}", "missing field")
    count = n.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_CLUSTER_NODES:
        raise ValidationError(f"nodes[{i}].count", f"must be a positive integer, got {count!r}")
    base = {k: v for k, v in n.items() if k not in ("count", "name")}
    taints, labels = base.get("taints", ()), base.get("labels", {})
    if not isinstance(taints, list | tuple):
        raise ValidationError(f"nodes[{i}].taints", f"must be a list, got {taints!r}")
    if not isinstance(labels, dict):
        raise ValidationError(f"nodes[{i}].labels", f"must be a mapping, got {labels!r}")
    base["taints"] = tuple(taints)
    base["labels"] = dict(labels)
    name = _name(n, "name", f"nodes[{i}]")
    for key in ("zone", "rack"):  # a list here reached the twin as a traceback
        if key in base:
            base[key] = _name(n, key, f"nodes[{i}]")
    for j in range(count):
        yield NodeSpec(name=name if count == 1 else f"{name}-{j:05d}", **base)
