"""``smartsched bench federation``: the federated edge forecaster beside central and local.

Owns issue 22's learning figures. The MEC sites of a cluster preset (``large``:
four) each hold the usage series of a share of the fleet's machines
(``federation.partition``: by load level, non-IID, or at random), and each is a
Ray actor that trains on its own windows (``federation.site``); the cloud runs
FedAvg or FedProx rounds (``federation.rounds``). Beside it, two references on
exactly the same splits and test windows:

* central -- one model trained on every site's training windows pooled (what
  federation avoids: the records leave the sites), with the central trainer's
  early stopping and as many epochs as federation has rounds x local epochs;
* local -- each site alone on its own windows, tested on its own test windows.

The objective is the forecast error the scheduler plans on: MAE in utilization
points at the last horizon step (15 minutes ahead), CPU first, pooled over
every site's test windows. Figures: the federated model's objective per round,
the gap to the central model's, the round at which it first comes within the
target, bytes per round (down and up) and round time.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from smartsched.model.errors import UnknownReferenceError, ValidationError

REFERENCES = ("central", "local")


def edge_sites(cluster: str, names: Sequence[str] | None = None) -> list[str]:
    """The MEC sites of a cluster preset (or ``names``, each checked against it)."""
    from smartsched.model.presets import load_cluster

    spec = load_cluster(cluster)
    edges = [s.name for s in spec.sites if s.kind == "edge"]
    if names is None or not list(names):
        if not edges:
            raise ValidationError("cluster", f"{cluster!r} has no MEC (edge) site")
        return edges
    for n in names:
        if n not in edges:
            raise UnknownReferenceError("sites", f"unknown edge site {n!r} (cluster "
                                        f"{cluster!r} has {', '.join(edges) or 'none'})")
    if len(set(names)) != len(names):
        raise ValidationError("sites", f"names repeat: {list(names)}")
    return list(names)


def run_federation(data: str | Path, *, cluster: str = "large",
                   sites: Sequence[str] | None = None, partition: str = "level",
                   rounds: int = 20, local_epochs: int = 1, mu: float = 0.0,
                   server_momentum: float = 0.0, lookback: int = 36, horizon: int = 3,
                   hidden: int = 64, seed: int = 0,
                   split_seed: int = 0, references: Sequence[str] = REFERENCES,
                   out: str | Path | None = None, max_series: int | None = None,
                   echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """Federate across the sites as Ray actors (an embedded Ray is started if none is up),
    then train the references; returns every figure (and saves the model to ``out``)."""
    import ray

    from smartsched.federation.partition import partition_series
    from smartsched.federation.rounds import federate
    from smartsched.federation.site import site_actor
    from smartsched.forecast.lstm import LSTMSettings
    from smartsched.forecast.run import load_any

    names = edge_sites(cluster, sites)
    for r in references:
        if r not in REFERENCES:
            raise ValidationError("references", f"must be among {REFERENCES}, got {r!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValidationError("rounds", f"must be an integer >= 1, got {rounds!r}")
    series = load_any(data)
    if max_series is not None:  # the first jobs' series only (tests, quick looks)
        series = series[:max_series]
    held = partition_series(series, names, partition, seed=split_seed)
    _check_windows(series, held, lookback, horizon, split_seed)
    settings = LSTMSettings(lookback=lookback, horizon=horizon, hidden=hidden, seed=seed)
    echo(f"{len(names)} sites ({partition} partition): " + ", ".join(
        f"{n} {len(ids)} series" for n, ids in held.items()))
    if not ray.is_initialized():
        from smartsched.ray_local import start_embedded_ray

        start_embedded_ray(Path(tempfile.mkdtemp(prefix="smartsched-fed-")))
    actor = site_actor(num_cpus=min(0.5, 2.0 / len(names)))
    handles = {n: actor.remote(n, str(data), held[n], _fields(settings), split_seed=split_seed,
                               seed=seed, threads=1) for n in names}
    t0 = time.perf_counter()
    run = federate(handles, settings, rounds=rounds, local_epochs=local_epochs, mu=mu,
                   server_momentum=server_momentum, echo=lambda line: echo("  " + line))
    wall = time.perf_counter() - t0
    from smartsched.federation.wire import encode_weights

    final = encode_weights({k: v.detach().numpy() for k, v in
                            run.forecaster.net.state_dict().items()})
    fed_sites = {n: r for n, r in zip(names, ray.get(
        [h.errors.remote(final, "test") for h in handles.values()]), strict=True)}
    for h in handles.values():
        ray.kill(h)
    res: dict[str, Any] = {
        "data": str(data), "cluster": cluster, "partition": partition,
        "settings": {"lookback": lookback, "horizon": horizon, "hidden": hidden,
                     "seed": seed, "split_seed": split_seed},
        "federated": {**run.summary(), "wall_seconds": wall,
                      "test_mae": _pool(fed_sites.values()),
                      "per_site": {n: _mae(r) for n, r in fed_sites.items()}},
    }
    ups = [r["bytes_up"] for r in run.rounds]
    res["per_round"] = {"bytes_down": run.rounds[0]["bytes_down"], "bytes_up": ups[0],
                        "seconds_median": statistics.median(r["seconds"] for r in run.rounds),
                        "seconds_max": max(r["seconds"] for r in run.rounds)}
    if out is not None:
        _save(run, out, res)
        res["model"] = str(out)
    site_of = {i: n for n, ids in held.items() for i in ids}
    by_site: dict[str, list[Any]] = {n: [] for n in names}
    for s in series:
        by_site[site_of[s.id]].append(s)
    epochs = rounds * local_epochs
    if "central" in references:
        echo(f"central reference: one model on every site's training windows, up to "
             f"{epochs} epochs")
        res["central"] = _central(by_site, settings, epochs, split_seed)
    if "local" in references:
        echo(f"local reference: each site alone, up to {epochs} epochs")
        res["local"] = _local(by_site, settings, epochs, split_seed, seed)
    if "central" in res:
        res["versus_central"] = _versus(run.rounds, res["central"]["test_mae"])
    return res


def _check_windows(series: Sequence[Any], held: dict[str, Sequence[str]], lookback: int,
                   horizon: int, split_seed: int) -> None:
    """Every site has a training window, checked here as its actor will (same split): a
    site without one failed inside Ray, and its error came out as a traceback of the
    actor's death after the cluster had started."""
    from smartsched.forecast.data import split_by_series

    by_id = {s.id: s for s in series}
    for site, ids in held.items():
        mine = [by_id[i] for i in ids if i in by_id]
        if not mine:
            raise ValidationError(f"sites.{site}", "holds no series")
        train = split_by_series(mine, seed=split_seed).train
        if not any(len(s) >= lookback + horizon for s in train):
            raise ValidationError(f"sites.{site}", f"no training window of {lookback} + "
                                  f"{horizon} steps (its training series are shorter; lower "
                                  "--lookback or give longer series)")


def _fields(settings: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return {k: v for k, v in asdict(settings).items() if k not in ("history",)}


def _mae(r: dict[str, Any]) -> list[float]:
    return [e / r["count"] for e in r["abs_err"]] if r["count"] else []


def _pool(reports: Any) -> list[float]:
    reports = list(reports)
    n = sum(r["count"] for r in reports)
    if not n:
        return []
    k = len(reports[0]["abs_err"])
    return [sum(r["abs_err"][i] for r in reports) / n for i in range(k)]


def _site_learner(name: str, series: list[Any], settings: Any, split_seed: int,
                  seed: int) -> Any:
    from smartsched.federation.site import SiteLearner

    return SiteLearner(name, series, None, _fields(settings), split_seed=split_seed, seed=seed)


def _central(by_site: dict[str, list[Any]], settings: Any, epochs: int,
             split_seed: int) -> dict[str, Any]:
    """One model on the pooled training windows; scored on each site's own test windows."""
    import numpy as np

    from smartsched.federation.site import error_sums
    from smartsched.forecast.lstm import LSTMForecaster, LSTMSettings

    learners = {n: _site_learner(n, s, settings, split_seed, settings.seed)
                for n, s in by_site.items()}
    train = _concat([sl.windows["train"] for sl in learners.values()])
    val = _concat([sl.windows["val"] for sl in learners.values()])
    fc = LSTMForecaster(LSTMSettings(**{**_fields(settings), "epochs": epochs}))
    t0 = time.perf_counter()
    fc.fit(train, val if len(val) else None)
    per = {n: error_sums(fc, sl.windows["test"]) for n, sl in learners.items()}
    return {"test_mae": _pool(per.values()), "per_site": {n: _mae(r) for n, r in per.items()},
            "epochs_run": len(fc.s.history), "seconds": time.perf_counter() - t0,
            "train_windows": len(train), "interval_scale": fc.s.interval_scale,
            "best_val_mae": float(np.min([h.get("val_mae", np.inf) for h in fc.s.history]))}


def _local(by_site: dict[str, list[Any]], settings: Any, epochs: int, split_seed: int,
           seed: int) -> dict[str, Any]:
    """Each site's own model on its own windows (no sharing at all)."""
    from smartsched.federation.site import error_sums
    from smartsched.forecast.lstm import LSTMForecaster, LSTMSettings

    per = {}
    t0 = time.perf_counter()
    for n, s in by_site.items():
        sl = _site_learner(n, s, settings, split_seed, seed)
        fc = LSTMForecaster(LSTMSettings(**{**_fields(settings), "epochs": epochs}))
        val = sl.windows["val"]
        fc.fit(sl.windows["train"], val if len(val) else None)
        per[n] = error_sums(fc, sl.windows["test"])
    return {"test_mae": _pool(per.values()), "per_site": {n: _mae(r) for n, r in per.items()},
            "seconds": time.perf_counter() - t0}


def _concat(parts: list[Any]) -> Any:
    import numpy as np

    from smartsched.forecast.windows import Windows

    parts = [p for p in parts if len(p)] or parts[:1]
    return Windows(np.concatenate([p.past for p in parts]),
                   np.concatenate([p.future for p in parts]),
                   np.concatenate([p.origin_s for p in parts]),
                   np.concatenate([p.series for p in parts]), parts[0].step_s,
                   parts[0].targets)


def _versus(rounds: list[dict[str, Any]], central: list[float]) -> dict[str, Any]:
    """Per round, the federated test MAE (CPU) minus the central one: in points and in
    per cent of the central one; the first round within 1 point and within 1 %."""
    if not central:
        return {}
    gaps = [r["test_mae"][0] - central[0] for r in rounds]
    first = {name: next((r["round"] for r, g in zip(rounds, gaps, strict=True)
                         if g <= bound), None)
             for name, bound in (("within_1_point", 1.0),
                                 ("within_1_pct", 0.01 * central[0]),
                                 ("within_5_pct", 0.05 * central[0]))}
    return {"gap_points_by_round": gaps,
            "gap_pct_by_round": [100 * g / central[0] for g in gaps], "first_round": first}


def _save(run: Any, out: str | Path, res: dict[str, Any]) -> None:
    import json

    folder = run.forecaster.save(out)
    meta = json.loads((folder / "forecaster.json").read_text())
    meta["federated"] = {"data": res["data"], "cluster": res["cluster"],
                         "partition": res["partition"], "config": run.config,
                         "best_round": run.best_round}
    (folder / "forecaster.json").write_text(json.dumps(meta, indent=2) + "\n")


def format_federation(res: dict[str, Any]) -> str:
    """The per-site table and the headline figures, as Markdown."""
    fed = res["federated"]
    cols = [("federated", fed)] + [(k, res[k]) for k in REFERENCES if k in res]
    lines = ["| site | " + " | ".join(f"{c} MAE cpu / mem" for c, _ in cols) + " |",
             "|---|" + "---:|" * len(cols)]

    def cell(v: list[float]) -> str:
        return " / ".join(f"{x:.3f}" for x in v) if v else "-"

    for n in fed["per_site"]:
        lines.append(f"| {n} | " + " | ".join(cell(c["per_site"][n]) for _, c in cols) + " |")
    lines.append("| **all sites** | " + " | ".join(f"**{cell(c['test_mae'])}**"
                                                   for _, c in cols) + " |")
    pr = res["per_round"]
    lines.append("")
    lines.append(f"rounds {fed['config']['rounds']} ({fed['config']['algorithm']}, "
                 f"{fed['config']['local_epochs']} local epoch(s)), best round "
                 f"{fed['best_round']}; {fed['config']['parameters']:,} parameters; per round "
                 f"over {len(fed['per_site'])} sites {pr['bytes_down'] / 1e3:.0f} kB down, "
                 f"{pr['bytes_up'] / 1e3:.0f} kB up, "
                 f"{pr['seconds_median']:.1f} s median ({pr['seconds_max']:.1f} s max)")
    vs = res.get("versus_central")
    if vs:
        f = vs["first_round"]
        lines.append(f"gap to central (CPU MAE) at the best round: "
                     f"{fed['test_mae'][0] - res['central']['test_mae'][0]:+.3f} points "
                     f"({100 * (fed['test_mae'][0] / res['central']['test_mae'][0] - 1):+.1f} %);"
                     f" first round within 1 point: {f['within_1_point']}, within 5 %: "
                     f"{f['within_5_pct']}, within 1 %: {f['within_1_pct']}")
    return "\n".join(lines)
