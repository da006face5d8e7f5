"""GreenScore of a cluster state's sites and nodes now (``carbon.greenscore`` over the
twin's power model).

Owns how a ``ClusterState`` feeds the formula: each node's use weighted by the
watts its parts add (host, accelerators) from the twin's one power model, from
allocation (what a scheduler knows: requests) or from sampled usage (what the
node does), the site's PUE and its grid's renewable share at time ``t``. The
score plugin and the service's summaries and metrics read it here; the twin's
report integrates the same formula over the run (``twin.metrics``, from the
same power model and use).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from smartsched.carbon.greenscore import GreenWeights, efficiency, green_score, pue_share
from smartsched.carbon.greenscore import site_efficiency as _site_efficiency
from smartsched.model.cluster import ClusterSpec
from smartsched.model.resources import CPU, GPU
from smartsched.twin.power import PowerModel
from smartsched.twin.state import POWER_OFF, ClusterState

# id(spec) -> (the spec, its power model): kept beside its model so the id is not reused.
_MODELS: dict[int, tuple[ClusterSpec, PowerModel]] = {}


def power_model(state: ClusterState) -> PowerModel:
    """The power model of ``state``'s nodes (built once per cluster spec)."""
    hit = _MODELS.get(id(state.spec))
    if hit is not None and hit[0] is state.spec:
        return hit[1]
    if len(_MODELS) > 32:
        _MODELS.clear()
    pm = PowerModel.of(state.spec, state.gpu_model, state.gpu_count)
    _MODELS[id(state.spec)] = (state.spec, pm)
    return pm


def node_use(state: ClusterState, source: Literal["allocation", "usage"] = "allocation",
             extra: np.ndarray | None = None) -> np.ndarray:
    """[N] each node's use in [0, 1], its CPU and GPU use weighted by the watts each adds.
    ``extra``: an [R] request counted on every node (the use after placing that pod)."""
    pm = power_model(state)
    cap = state.capacity.astype(np.float64)
    if source == "usage":
        cpu_used, gpu_used = state.usage[:, 0].copy(), state.usage[:, 2].copy()
    else:
        cpu_used = state.allocated[:, CPU].astype(np.float64)
        gpu_used = state.allocated[:, GPU].astype(np.float64)
    if extra is not None:
        cpu_used += float(extra[CPU])
        gpu_used += float(extra[GPU])
    cpu = np.zeros(len(cap))
    gpu = np.zeros(len(cap))
    np.divide(cpu_used, cap[:, CPU], out=cpu, where=cap[:, CPU] > 0)
    np.divide(gpu_used, cap[:, GPU], out=gpu, where=cap[:, GPU] > 0)
    host, acc = pm.host_dyn_w, pm.gpu_dyn_w
    dyn = host + acc
    out = cpu.copy()
    np.divide(host * cpu + acc * gpu, dyn, out=out, where=dyn > 0)
    return np.clip(out, 0.0, 1.0)


def _site_grid(state: ClusterState, t: float, renewable: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """[S] each site's PUE share and its grid's renewable share at time ``t`` (or
    ``renewable`` when given)."""
    sites = state.spec.sites
    if renewable is None:
        renewable = np.array([float(s.carbon.renewable_at(t)) for s in sites])
    return pue_share(np.array([s.pue for s in sites])), renewable


def site_terms(state: ClusterState, t: float, weights: GreenWeights | None = None,
               source: Literal["allocation", "usage"] = "allocation") -> dict[str, np.ndarray]:
    """[S] per site of ``state.spec``: ``pue``, ``renewable``, ``efficiency`` (its powered-on
    nodes) and ``score``, at simulation time ``t``."""
    pm = power_model(state)
    pue, ren = _site_grid(state, t)
    on = (state.power != POWER_OFF) & state.up
    eff = _site_efficiency(node_use(state, source), pm.idle_w, pm.max_w, on,
                           state.site_id, pue.size)
    return {"pue": pue, "renewable": ren, "efficiency": eff,
            "score": np.asarray(green_score(pue, ren, eff, weights))}


def node_scores(state: ClusterState, t: float, use: np.ndarray,
                weights: GreenWeights | None = None,
                renewable: np.ndarray | None = None) -> np.ndarray:
    """[N] GreenScore of each node at use ``use`` (``node_use``), its site's PUE and grid at
    time ``t`` (``renewable``: [S] each site's share to use instead of the grid's now, e.g.
    the share expected over a pod's run)."""
    pm = power_model(state)
    pue, ren = _site_grid(state, t, renewable)
    return np.asarray(green_score(pue[state.site_id], ren[state.site_id],
                                  efficiency(use, pm.idle_w, pm.max_w), weights))
