"""The cached greedy scorer computes the module's own logits, decision after decision."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns

import smartsched.rl.fast_scorer as fs
from smartsched.model.pod import Pod, PodClass
from smartsched.model.presets import load_cluster
from smartsched.rl.fast_scorer import FastScorer
from smartsched.rl.policy import RLScheduler
from smartsched.serving.site import SitePlacer, site_subspec

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "ppo_mixed_small"


def _pods(n: int, seed: int) -> list[Pod]:
    """A batch that cycles through a few shapes (as replicas do), GPU pods and apps included."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = rng.integers(4)
        if kind == 0:
            out.append(Pod(id=f"g{i}", cpu_milli=4000, memory_mib=8192, num_gpu=1,
                           gpu_milli=int(rng.choice([250, 500, 1000])),
                           pod_class=PodClass.AI_INFER,
                           tolerations=("nvidia.com/gpu=present:NoSchedule",)))
        elif kind == 1:
            out.append(Pod(id=f"w{i}", cpu_milli=500, memory_mib=1024, app="web",
                           pod_class=PodClass.ONLINE))
        else:
            out.append(Pod(id=f"b{i}", cpu_milli=int(rng.choice([250, 1000, 2000])),
                           memory_mib=512, pod_class=PodClass.BATCH))
    return out


def test_cached_logits_equal_the_module_forward_at_every_decision() -> None:
    spec = load_cluster("medium")
    # A stopped clock: the pod features (hour of day) stay the same across requests, so
    # cached rows are reused across them too -- across a node update included.
    site = SitePlacer(site_subspec(spec, ["region-a"]), f"rl:{SHIPPED}", clock=lambda: 1000.0)
    sched: RLScheduler = site.scheduler
    seen = {"decisions": 0, "reused": 0, "pruned": 0}
    fast, best = sched.scorer.logits, sched.scorer.best
    n = len(site.spec.nodes)

    def checked(obs: dict) -> int:
        rows_before = {k: r.nodes.copy() for k, r in sched.scorer._rows.items()}
        scored = sched.scorer.nodes_scored
        chosen = best(obs)  # first: it brings the cached rows up to date itself
        if sched.scorer.nodes_scored - scored < n:
            seen["pruned"] += 1  # decided with some nodes left unscored
        got_np = fast(obs)
        # A few entries alone (an ensemble's shortlist, defer included) are the same bits.
        some = np.r_[np.flatnonzero(obs["action_mask"][:n] > 0)[:3], 0, n]
        assert np.array_equal(sched.scorer.logits_at(obs, some), got_np[some])
        assert np.array_equal(sched.scorer.logits_at(obs, some[:1]), got_np[some[:1]])
        for bad in (np.array([-1]), np.array([n + 1]), obs["action_mask"] > 0):
            with pytest.raises(ValueError, match="action indices"):
                sched.scorer.logits_at(obs, bad)
        got = torch.from_numpy(got_np)
        batch = {Columns.OBS: {k: torch.from_numpy(v).unsqueeze(0) for k, v in obs.items()}}
        with torch.no_grad():
            want = sched.module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS][0]
        ok = want > -1e30
        assert torch.equal(got > -1e30, ok)
        assert torch.allclose(got[ok], want[ok], rtol=1e-4, atol=1e-4)
        assert int(torch.argmax(got)) == int(torch.argmax(want)) == chosen
        seen["decisions"] += 1
        key = np.concatenate([obs["pod"], obs["weights"]]).astype(np.float32).tobytes()
        if key in rows_before:
            changed = (obs["nodes"] != rows_before[key]).any(axis=1).sum()
            seen["reused"] += int(changed < len(obs["nodes"]))
        return chosen

    sched.scorer.best = checked
    results = site.place(_pods(120, 0), ttl_s=600)
    results += site.place(_pods(60, 1), ttl_s=600)  # later: the state moved on
    # A node moved to another rack: the topology embedding of its old and new rack-mates
    # changes too, though their own feature rows do not.
    moved = site.spec.nodes[0]
    site.apply_node_updates([(0, moved.name, {"rack": moved.rack + "-moved"})])
    results += site.place(_pods(30, 2), ttl_s=600)
    assert sum(r.placed for r in results) > 150
    # The cache was used (rows kept between decisions), and it still matched every time.
    assert seen["decisions"] >= 150 and seen["reused"] > seen["decisions"] / 2, seen
    assert seen["pruned"] > seen["decisions"] / 3, seen  # ``best`` skipped nodes, and agreed
    assert n > 16


def test_the_cache_notices_a_change_it_did_not_make() -> None:
    """Rows are compared, not assumed: usage reported between decisions (as PUT /v1/nodes
    does) changes the features and the logits follow."""
    spec = load_cluster("medium")
    site = SitePlacer(site_subspec(spec, ["region-a"]), f"rl:{SHIPPED}")
    pod = [Pod(id=f"p{i}", cpu_milli=1000, memory_mib=1024) for i in range(3)]
    site.place(pod[:1], ttl_s=600)
    first = site.place(pod[1:2], ttl_s=600)[0].node
    node = site.state.node_index(first)
    cap = site.state.capacity[node]
    site.state.usage[node] = (0.99 * cap[0], 0.99 * cap[1], 0.0)  # it is busy now
    sched: RLScheduler = site.scheduler
    req = site.state.compile(pod[2])
    ok, ctx = sched.filters.feasible(site.state, req)
    obs = sched._observer.observe(ctx, ok, False, site.state.now, 0, sched.weights)
    batch = {Columns.OBS: {k: torch.from_numpy(v).unsqueeze(0) for k, v in obs.items()}}
    with torch.no_grad():
        want = sched.module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS][0]
    got = torch.from_numpy(sched.scorer.logits(obs))
    assert torch.allclose(got[ok.nonzero()], want[ok.nonzero()], rtol=1e-4, atol=1e-4)


def test_rows_that_differ_are_found_by_their_bits() -> None:
    from smartsched.rl.fast_scorer import _rows_differ

    for width in (47, 48):  # odd widths compare 4-byte words, even ones 8-byte words
        a = np.random.default_rng(width).random((40, width)).astype(np.float32)
        b = a.copy()
        b[3, width - 1] = np.nextafter(b[3, width - 1], np.float32(2))  # one ulp
        b[17, 0] = -0.0 if a[17, 0] == 0 else -a[17, 0]
        b[29, 5] = np.nan
        assert np.flatnonzero(_rows_differ(a, b)).tolist() == [3, 17, 29]
        assert not _rows_differ(a, a.copy()).any()


def test_alike_rows_are_computed_once_and_get_the_same_bits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes alike (empty nodes of a kind in a rack) are computed once per update; the
    cached terms equal a computation of every row on its own."""
    spec = load_cluster("medium")
    site = SitePlacer(site_subspec(spec, ["region-a"]), f"rl:{SHIPPED}", clock=lambda: 1000.0)
    sched: RLScheduler = site.scheduler
    site.place(_pods(200, 3), ttl_s=600)
    fast = sched.scorer
    assert fast.rows_computed < fast.rows_updated / 2, (fast.rows_computed,
                                                        fast.rows_updated)
    # A fresh scorer that computes every row of each shape in one pass, merging none.
    plain = FastScorer(sched.module)
    for rows in fast._rows.values():
        topo = plain._topology(rows.nodes, None)
        mine = fs._Rows(rows.nodes.copy(), np.zeros_like(rows.emb), np.zeros_like(rows.a),
                        None if rows.prior is None else np.zeros_like(rows.prior),
                        rows.pod_term, rows.gate)
        with monkeypatch.context() as m:
            m.setattr(fs, "_distinct", lambda x, sid: None)
            plain._update(mine, None, rows.nodes, topo)
        assert plain.rows_computed == plain.rows_updated  # nothing merged
        assert np.array_equal(mine.emb, rows.emb) and np.array_equal(mine.a, rows.a)
        assert rows.prior is None or np.array_equal(mine.prior, rows.prior)


def test_rows_merged_only_when_their_bits_and_topology_agree(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    kinds = rng.random((3, 48)).astype(np.float32)
    x = kinds[[0, 1, 0, 2, 1, 0, 0, 2]]
    first, inv = fs._distinct(x, None)
    assert np.array_equal(x[first][inv], x) and sorted(first.tolist()) == [0, 1, 3]
    # The same features under different topology embeddings are different rows.
    sid = np.array([0, 0, 1, 0, 0, 0, 1, 0])
    first, inv = fs._distinct(x, sid)
    assert np.array_equal(x[first][inv], x) and np.array_equal(sid[first][inv], sid)
    assert sorted(first.tolist()) == [0, 1, 2, 3]
    assert fs._distinct(kinds, None) is None  # nothing alike
    # -0.0 and 0.0 are different bits: not merged (the module may treat them alike, but
    # merging is exact or not done).
    z = np.zeros((2, 48), np.float32)
    z[1, 4] = -0.0
    assert fs._distinct(z, None) is None
    # A hash that collides for every row: compared bit for bit, nothing merged wrongly.
    monkeypatch.setattr(fs, "_hash_mults", lambda width: np.zeros(width, np.uint64))
    assert fs._distinct(x, None) is None
    same = kinds[[1, 1, 1]]
    first, inv = fs._distinct(same, None)
    assert first.tolist() == [0] and inv.tolist() == [0, 0, 0]


def test_more_than_eight_pod_shapes_keep_their_rows() -> None:
    """A batch of 12 shapes over an unchanged cluster: on its second round every shape finds
    its rows (with 8 kept, each decision recomputed every node's rows), within the memory
    bound, and decides as the module does."""
    spec = load_cluster("medium")
    site = SitePlacer(site_subspec(spec, ["region-a"]), f"rl:{SHIPPED}", clock=lambda: 1000.0)
    sched: RLScheduler = site.scheduler
    scorer = sched.scorer
    site.place([Pod(id="first", cpu_milli=100, memory_mib=64)], ttl_s=600)  # observer built
    shapes = [Pod(id=f"s{i}", cpu_milli=250 * (i + 1), memory_mib=512 + 256 * (i % 3))
              for i in range(12)]
    observed = []
    for pod in shapes:
        req = site.state.compile(pod)
        ok, ctx = sched.filters.feasible(site.state, req)
        observed.append(sched._observer.observe(ctx, ok, False, site.state.now, 0,
                                                sched.weights))
    for obs in observed:
        scorer.best(obs)
    computed = scorer.rows_computed
    for obs in observed:  # the same observations again: nothing to recompute
        chosen = scorer.best(obs)
        batch = {Columns.OBS: {k: torch.from_numpy(v).unsqueeze(0) for k, v in obs.items()}}
        with torch.no_grad():
            want = sched.module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS][0]
        assert chosen == int(torch.argmax(want))
    assert scorer.rows_computed == computed and len(scorer._rows) == 13
    # The bound: a cluster so large that few shapes fit keeps MIN_KEEP of them.
    rows = next(iter(scorer._rows.values()))
    assert FastScorer._keep(rows) == fs.KEEP_SHAPES
    big = fs._Rows(np.zeros((400_000, rows.nodes.shape[1]), np.float32),
                   np.zeros((400_000, rows.emb.shape[1]), np.float32),
                   np.zeros((400_000, rows.a.shape[1]), np.float32), None, rows.pod_term, None)
    assert FastScorer._keep(big) == fs.MIN_KEEP
