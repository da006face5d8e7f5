"""``smartsched bench serve``: the placement service under a bounded load on loopback.

Owns the service benchmark. It starts an embedded Ray and Serve, deploys a
bare echo deployment (same proxy, same FastAPI stack, no work) and the
placement service on a ``regional`` cluster, and in the same run sends:

* sequential single requests, interleaved echo / placement, so the placement
  latency is reported as a ratio to the echo latency measured under the same
  noise;
* placements by tier: cloud -> region (a plain pod), cloud -> edge (an
  ``edge-rt`` pod from an MEC site) and cloud -> edge -> region (an edge pod too
  big for the site's nodes, escalated) -- the hierarchy's added hops;
* the same edge pod through mec-0's own entry (``service.edge_entry``), interleaved
  with the above and then alone (requests back to back, nothing else running: what a
  site on its own machine sees);
* batches on ``/v1/placements:batch`` for placements per second;
* in process, the edge tier's decision compute per pod (no HTTP, no Ray).

Every site journals its reservations (fsynced before each answer), as ``smartsched
serve`` runs it; ``journal=False`` measures without (what the first versions of this
benchmark did).

Every request count is fixed, so the run stops by itself. Reservations are
taken with a short TTL and the pods are small, so the cluster never fills.
"""

from __future__ import annotations

import shutil
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

TOKEN = "bench-token-" + "0" * 16


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _echo_app() -> Any:
    from fastapi import FastAPI
    from ray import serve

    api = FastAPI()

    @api.post("/echo")
    async def echo(body: dict[str, Any]) -> dict[str, Any]:  # parsed like a placement body
        return body

    @serve.deployment(ray_actor_options={"num_cpus": 0.1})
    @serve.ingress(api)
    class Echo:
        pass

    return Echo.bind()


def _wait(s: Any, url: str, timeout_s: float = 60.0) -> None:
    """Until ``url``/healthz answers (an edge entry starts with its site's replica)."""
    deadline = time.time() + timeout_s
    while True:
        try:
            if s.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except OSError:
            pass
        if time.time() > deadline:
            raise RuntimeError(f"{url} did not answer within {timeout_s:g} s")
        time.sleep(0.2)


def _pod(kind: str, i: int) -> dict[str, Any]:
    pid = f"{kind}-{i}-{uuid.uuid4().hex[:6]}"
    if kind == "region":
        return {"id": pid, "cpu_milli": 250 + 250 * (i % 4), "memory_mib": 512, "class": "batch"}
    if kind == "edge":
        return {"id": pid, "cpu_milli": 100, "memory_mib": 128, "class": "edge-rt",
                "origin_site": "mec-0", "latency_slo_ms": 50}
    # escalated: more cores than any edge node has
    return {"id": pid, "cpu_milli": 24_000, "memory_mib": 1024, "class": "edge-rt",
            "origin_site": "mec-0", "latency_slo_ms": 50}


def _edge_compute(nodes_per_edge: int, n: int) -> dict[str, float]:
    """The edge tier's own decision time per pod, in process (filter, score, bind)."""
    from smartsched.model.pod import Pod, PodClass
    from smartsched.model.presets import regional
    from smartsched.serving.site import SitePlacer, site_subspec

    spec = site_subspec(regional(2, regions=1, edge_sites=1, nodes_per_edge=nodes_per_edge),
                        ["mec-0"])
    site = SitePlacer(spec, "k8s-default")
    times = []
    for i in range(n):
        pod = Pod(id=f"e{i}", cpu_milli=10, memory_mib=16, pod_class=PodClass.EDGE_RT)
        t0 = time.perf_counter()
        r = site.place([pod], ttl_s=3600)[0]
        times.append(time.perf_counter() - t0)
        if r.placed and r.reservation_id:
            site.release(r.reservation_id)
    return {"p50_ms": 1e3 * _pct(times[10:], 50), "p99_ms": 1e3 * _pct(times[10:], 99)}


def run_serve_bench(*, nodes_per_region: int = 1500, profiles: tuple[str, ...] = (
        "k8s-default",), requests_per_kind: int = 200, batches: int = 4, batch_size: int = 500,
        state_dir: str | Path = "runs/bench_serve", journal: bool = True,
        division: str = "by_capacity", topology: str = "distributed",
        echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """``division``: the service's ``ranking.division`` (how a batch shares the regions);
    ``topology``: the service's (``single_process`` has no edge entry, so its rows are
    left out)."""
    import ray
    import requests
    from ray import serve

    from smartsched.bench.workdir import bench_dir
    from smartsched.model.presets import regional
    from smartsched.serving.app import build_app
    from smartsched.workloads.parquet_io import write_cluster

    state = bench_dir(state_dir, "serve", "--state-dir")  # never a service's own state
    cluster_file = state / f"regional-{nodes_per_region}.parquet"
    write_cluster(regional(nodes_per_region), cluster_file)
    (state / "token").write_text(TOKEN)
    if not ray.is_initialized():
        from smartsched.ray_local import start_embedded_ray

        start_embedded_ray(state)  # as `smartsched serve` runs it: loopback, token auth
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url = f"http://127.0.0.1:{port}"
    s = requests.Session()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    serve.run(_echo_app(), name="echo", route_prefix="/bench-echo")
    results: dict[str, Any] = {"nodes_per_region": nodes_per_region, "journal": journal,
                               "division": division, "topology": topology, "profiles": {}}
    try:
        for profile in profiles:
            echo(f"deploying the service ({profile}, {nodes_per_region} nodes per region) ...")
            entry_port = _free_port()  # mec-0's own entry (a fresh port per deployment)
            with_entry = topology == "distributed"
            args = {"cluster": str(cluster_file), "region_profile": profile,
                    "edge_profile": profile, "auth": {"token_file": str(state / "token")},
                    "edge_entry": {"ports": {"mec-0": entry_port} if with_entry else {}},
                    "ranking": {"division": division}, "topology": topology}
            if journal:  # a fresh one per deployment: nothing replayed from the last
                args["journal_dir"] = str(state / "journal" / uuid.uuid4().hex[:12])
            serve.run(build_app(args), name="placement", route_prefix="/")
            entry = f"http://127.0.0.1:{entry_port}"
            if with_entry:
                _wait(s, entry)

            def post(path: str, body: dict[str, Any], base: str = url,
                     keep: list[Any] | None = None) -> float:
                t0 = time.perf_counter()
                r = s.post(base + path, json=body, headers=auth, timeout=60)
                dt = time.perf_counter() - t0
                if r.status_code != 200:
                    raise RuntimeError(f"{path}: HTTP {r.status_code}: {r.text[:200]}")
                if keep is not None:  # read after the timed phase
                    keep.append(r)
                return dt

            for i in range(20):  # warm-up: connections, caches, first policy call
                post("/bench-echo/echo", {"pod": _pod("region", i)})
                post("/v1/placements", {"pod": _pod("region", i), "ttl_s": 30})
                if with_entry:
                    post("/v1/placements", {"pod": _pod("edge", i), "ttl_s": 30}, entry)
            lat: dict[str, list[float]] = {"echo": [], "region": [], "edge": [], "escalated": []}
            if with_entry:
                lat.update(edge_entry=[], edge_entry_alone=[])
            for i in range(requests_per_kind):
                for kind in ("region", "edge", "escalated"):
                    lat["echo"].append(post("/bench-echo/echo", {"pod": _pod(kind, i)}))
                    lat[kind].append(post("/v1/placements", {"pod": _pod(kind, i),
                                                             "ttl_s": 30}))
                # The same edge pod through mec-0's own entry: no proxy, no cloud hop.
                if with_entry:
                    lat["edge_entry"].append(post(
                        "/v1/placements", {"pod": _pod("edge", i), "ttl_s": 30}, entry))
            # The entry again with nothing between its requests: an MEC site runs on its own
            # machine, while above every tier shares this one's cores (a region's
            # 1,500-node decision just before leaves the edge replica's caches cold).
            for i in range(requests_per_kind if with_entry else 0):
                lat["edge_entry_alone"].append(post(
                    "/v1/placements", {"pod": _pod("edge", requests_per_kind + i),
                                       "ttl_s": 30}, entry))
            answers: list[Any] = []
            t0 = time.perf_counter()
            for b in range(batches):
                post("/v1/placements:batch", {"pods": [_pod("region", b * batch_size + j)
                                                       for j in range(batch_size)],
                                              "ttl_s": 30}, keep=answers)
            batch_s = time.perf_counter() - t0
            row = {k: {"p50_ms": 1e3 * _pct(v, 50), "p99_ms": 1e3 * _pct(v, 99)}
                   for k, v in lat.items()}
            e50, e99 = row["echo"]["p50_ms"], row["echo"]["p99_ms"]
            row["ratio_to_echo"] = {k: {"p50": row[k]["p50_ms"] / e50,
                                        "p99": row[k]["p99_ms"] / e99}
                                    for k in lat if k != "echo"}
            row["hops_added_ms_p50"] = {
                "edge_minus_echo": row["edge"]["p50_ms"] - e50,
                "region_minus_echo": row["region"]["p50_ms"] - e50,
                "escalated_minus_edge": row["escalated"]["p50_ms"] - row["edge"]["p50_ms"]}
            row["batch_placements_per_s"] = batches * batch_size / batch_s
            where: dict[str, int] = {}
            for r in answers:
                for p in r.json()["placements"]:
                    key = p["region"] if p["placed"] else "unplaced"
                    where[key] = where.get(key, 0) + 1
            row["batch_pods_by_region"] = dict(sorted(where.items()))
            results["profiles"][profile] = row
            serve.delete("placement")
        results["edge_compute"] = _edge_compute(8, 2000)
    finally:
        serve.shutdown()
        shutil.rmtree(state / "journal", ignore_errors=True)  # bench reservations only
    return results


def format_serve_bench(res: dict[str, Any]) -> str:
    journal = "journaled" if res.get("journal", True) else "no journal"
    division = res.get("division", "aggregated")
    lines = [f"placement service, {res['nodes_per_region']} nodes per region (2 regions, "
             f"2 MEC sites; {journal}; batches {division}; sites "
             f"{res.get('topology', 'distributed')}), sequential requests on loopback",
             "| profile | path | p50 ms | p99 ms | p50 / echo | p99 / echo |",
             "|---|---|---:|---:|---:|---:|"]
    for prof, row in res["profiles"].items():
        lines.append(f"| {prof} | echo | {row['echo']['p50_ms']:.2f} | "
                     f"{row['echo']['p99_ms']:.2f} | 1.00 | 1.00 |")
        for k, label in (("region", "cloud -> region"), ("edge", "cloud -> edge"),
                         ("escalated", "cloud -> edge -> region"),
                         ("edge_entry", "edge entry (mec-0's own port), interleaved"),
                         ("edge_entry_alone", "edge entry, nothing between requests")):
            if k not in row:
                continue
            r, q = row[k], row["ratio_to_echo"][k]
            lines.append(f"| {prof} | {label} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                         f"{q['p50']:.2f} | {q['p99']:.2f} |")
    lines.append("")
    for prof, row in res["profiles"].items():
        h = row["hops_added_ms_p50"]
        split = ", ".join(f"{k} {v}" for k, v in row.get("batch_pods_by_region", {}).items())
        lines.append(f"{prof}: batch {row['batch_placements_per_s']:,.0f} placements/s "
                     f"({split}); "
                     f"p50 over echo: cloud->region +{h['region_minus_echo']:.2f} ms, "
                     f"cloud->edge +{h['edge_minus_echo']:.2f} ms, escalation adds "
                     f"{h['escalated_minus_edge']:.2f} ms")
    ec = res["edge_compute"]
    lines.append(f"edge-tier decision compute in process: p50 {ec['p50_ms']:.3f} ms, "
                 f"p99 {ec['p99_ms']:.3f} ms per pod")
    return "\n".join(lines)
