"""SchedulingEnv: gymnasium conformance, masks that admit only feasible nodes, honest reward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod
from smartsched.objectives.reward import COMPONENTS, RewardWeights, StepReward
from smartsched.rl.env import SchedulingEnv
from smartsched.twin.podtable import BOUND, RUNNING
from smartsched.workloads.parquet_io import write_pods


def test_check_env() -> None:
    env = SchedulingEnv({"cluster": "small", "hours": 1, "max_decisions": 50})
    check_env(env, skip_render_check=True)


# ------------------------------------------------------------------ the action mask
# A cluster that exercises every check of the filters profile (k8s-default:
# NodeUnschedulable, NodeResourcesFit, NodeAffinity, TaintToleration, RegionAllowed):
# a cordoned node, taints of every effect (untyped means NoSchedule), labels, two
# regions and an edge site, FPGAs, two GPU models.
CONSTRAINED = {
    "name": "constrained",
    "sites": [{"name": "r1"}, {"name": "r2"}, {"name": "edge-1", "kind": "edge"}],
    "zones": [{"name": "z1", "site": "r1"}, {"name": "z2", "site": "r2"},
              {"name": "ze", "site": "edge-1"}],
    "nodes": [
        {"name": "ssd", "zone": "z1", "cpu_milli": 16000, "memory_mib": 32768,
         "labels": {"disk": "ssd"}, "count": 3},
        {"name": "hdd", "zone": "z2", "cpu_milli": 16000, "memory_mib": 32768,
         "labels": {"disk": "hdd"}, "count": 2},
        {"name": "spot", "zone": "z2", "cpu_milli": 16000, "memory_mib": 32768,
         "taints": ["spot=true:NoExecute"]},
        {"name": "cordoned", "zone": "z1", "cpu_milli": 32000, "memory_mib": 65536,
         "unschedulable": True},
        {"name": "fpga", "zone": "z1", "cpu_milli": 16000, "memory_mib": 32768, "num_fpga": 2,
         "fpga_model": "VU9P", "taints": ["fpga=yes:NoSchedule"]},
        {"name": "a100", "zone": "z1", "cpu_milli": 32000, "memory_mib": 131072, "num_gpu": 4,
         "gpu_model": "A100", "labels": {"disk": "ssd"},
         "taints": ["nvidia.com/gpu=present:NoSchedule"]},
        {"name": "t4", "zone": "z2", "cpu_milli": 16000, "memory_mib": 65536, "num_gpu": 2,
         "gpu_model": "T4", "labels": {"disk": "hdd"},
         "taints": ["nvidia.com/gpu:NoSchedule", "maint=soon:PreferNoSchedule"]},
        {"name": "edge", "zone": "ze", "cpu_milli": 8000, "memory_mib": 16384,
         "labels": {"role": "edge"}, "taints": ["edge=only"]},
    ],
}
TOLERATIONS = ("fpga=yes", "spot", "edge", "maint", "*")
GPU_TOLERATIONS = ("nvidia.com/gpu", "nvidia.com/gpu=present:NoSchedule", "*")
SELECTORS = ((("disk", "ssd"),), (("disk", "hdd"),), (("role", "edge"),),
             (("disk", "nvme"),))  # the last names a label no node has
REGIONS = (("r1",), ("r2",), ("r1", "edge-1"))


def _constrained_pods(seed: int, hours: float) -> list[Pod]:
    """Pods that ask for everything the filters check, arriving over ``hours``."""
    rng = np.random.default_rng(seed)
    pods: list[Pod] = []
    for i in range(int(40 * hours)):
        t, dur = float(rng.uniform(0, hours * 3600)), float(rng.uniform(300, 3600))
        kind = rng.integers(5)  # cpu, GPU share, whole GPUs, a gang of two, FPGAs
        gpu: dict[str, Any] = {}
        if kind == 1:
            gpu = {"num_gpu": 1, "gpu_milli": int(rng.choice([200, 500, 700]))}
        elif kind == 2:
            gpu = {"num_gpu": int(rng.integers(1, 4)), "gpu_milli": 1000}
        if gpu and rng.random() < 0.3:
            gpu["gpu_models"] = (str(rng.choice(["A100", "T4"])),)
        tol = [str(x) for x in rng.choice(TOLERATIONS, rng.integers(0, 3), replace=False)]
        if gpu and rng.random() < 0.8:
            tol.append(str(rng.choice(GPU_TOLERATIONS)))
        selector = SELECTORS[rng.integers(len(SELECTORS))] if rng.random() < 0.4 else ()
        regions = REGIONS[rng.integers(len(REGIONS))] if rng.random() < 0.4 else ()
        size = 2 if kind == 3 else 1
        for m in range(size):
            pods.append(Pod(
                id=f"p{i}-{m}", cpu_milli=int(rng.choice([500, 2000, 6000, 12000])),
                memory_mib=int(rng.choice([512, 4096, 16384])),
                num_fpga=int(rng.integers(1, 3)) if kind == 4 else 0,
                tolerations=tuple(tol), node_selector=selector, allowed_regions=regions,
                best_effort=bool(not gpu and rng.random() < 0.3),
                deadline=t + dur + 1800 if rng.random() < 0.2 else None,
                gang_id=f"g{i}" if size > 1 else None, gang_size=size,
                arrival=t, duration=dur, **gpu))
    return pods


@pytest.fixture(scope="module")
def constrained_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("constrained")
    (d / "cluster.yaml").write_text(yaml.safe_dump(CONSTRAINED))
    return d


def _tolerates(taint: str, tolerations: tuple[str, ...]) -> bool:
    """Kubernetes' rule in the twin's notation: a toleration is ``*``, a key (Exists),
    ``key=value`` (Equal) or the whole taint."""
    kv = taint.rsplit(":", 1)[0] if ":" in taint else taint
    key = kv.split("=", 1)[0]
    return any(t in ("*", key, kv, taint) for t in tolerations)


def _oracle(env: SchedulingEnv) -> np.ndarray:
    """Which nodes can take the offered pod, from the specs and the engine's pod table
    (what is bound or running where, on which devices) -- not from ClusterState's sums."""
    e = env.engine
    pod, tb, spec = env.offered.pod, e.table, env.spec_cluster
    n = len(spec.nodes)
    on = np.flatnonzero((tb.status == BOUND) | (tb.status == RUNNING))
    where = list(zip(on.tolist(), tb.node[on].tolist(), strict=True))
    # Members of a gang being placed hold their nodes until the gang is whole or rolls back.
    where += [(p, node) for p, node, _ in e.tentative]
    alloc = np.zeros((n, 3), dtype=np.int64)  # cpu, mem of guaranteed pods; fpga of all
    be_alloc = np.zeros((n, 2), dtype=np.int64)
    dev_free = [[1000] * x.num_gpu for x in spec.nodes]
    gang_devices = {p: d for p, _, d in e.tentative}
    for p, node in where:
        q = tb.pods[p]
        if q.best_effort:
            be_alloc[node] += (q.cpu_milli, q.memory_mib)
        else:
            alloc[node, :2] += (q.cpu_milli, q.memory_mib)
        alloc[node, 2] += q.num_fpga
        for d in gang_devices.get(p, tb.devices[p]):
            dev_free[node][d] -= q.gpu_milli
    site = spec.zone_site()
    ok = np.zeros(n, dtype=bool)
    for j, x in enumerate(spec.nodes):
        cap = np.array([x.cpu_milli, x.memory_mib])
        assert min(dev_free[j], default=0) >= 0 and (alloc[j, :2] <= cap).all()  # never over
        # A best-effort pod draws on the pool: the twin's measured slack less BE requests.
        room = e.state.be_allocatable[j] - be_alloc[j] if pod.best_effort else cap - alloc[j, :2]
        hard = [t for t in x.taints if not t.endswith(":PreferNoSchedule")]
        ok[j] = (
            bool(e.state.up[j]) and not x.unschedulable
            and room[0] >= pod.cpu_milli and room[1] >= pod.memory_mib
            and x.num_fpga - alloc[j, 2] >= pod.num_fpga
            and sum(f >= pod.gpu_milli for f in dev_free[j]) >= pod.num_gpu
            and (not pod.gpu_models or not pod.num_gpu or x.gpu_model in pod.gpu_models)
            and all(_tolerates(t, pod.tolerations) for t in hard)
            and all(x.labels.get(k) == v for k, v in pod.node_selector)
            and (not pod.allowed_regions or site[x.zone] in pod.allowed_regions)
        )
    return ok


@pytest.mark.parametrize("cluster", ["small", "constrained"])
@pytest.mark.parametrize("mode", ["replay", "fill"])
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_mask_admits_only_feasible_nodes(constrained_files: Path, cluster: str, mode: str,
                                         seed: int) -> None:
    """At every step the mask is exactly the oracle's feasible set: no infeasible node
    admitted, no feasible node hidden; defer is offered exactly to deadline pods that can
    still wait (replay only)."""
    cfg: dict[str, Any] = {"cluster": "small", "hours": 2, "mode": mode, "max_decisions": 150,
                           "inflate": 0.6}
    if cluster == "constrained":
        work = constrained_files / f"pods-{seed}.parquet"
        write_pods(_constrained_pods(seed, 2), work)
        # Fill mode inflates the pods to 8x the GPUs (fewer would drop most of them).
        # Nodes fail (and recover) during the episode, so "up" is exercised too.
        cfg.update(cluster=str(constrained_files / "cluster.yaml"), workload=str(work),
                   inflate=8.0, engine={"node_mtbf_hours": 3.0, "repair_s": 1200.0})
    env = SchedulingEnv(cfg)
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    n = env.engine.state.num_nodes
    while env.offered is not None:  # None: the episode is over
        mask = obs["action_mask"]
        np.testing.assert_array_equal(mask[:n].astype(bool), _oracle(env))
        pod, now = env.offered.pod, env.engine.now
        defer = (mode == "replay" and pod.deadline is not None
                 and now + (pod.duration or 0.0) < pod.deadline)
        assert bool(mask[-1]) == defer
        a = int(rng.choice(np.flatnonzero(mask)))
        obs, r, term, trunc, _ = env.step(a)  # raises if the twin refuses
        assert np.isfinite(r)
        if term or trunc:
            break


def test_reward_is_the_weighted_twin_metrics() -> None:
    w = {"utilization": 1.0, "qos": 0.7, "cost": 0.3, "energy": 0.2, "fairness": 0.05,
         "carbon": 0.4, "contention": 2.0, "traffic": 0.5}
    env = SchedulingEnv({"cluster": "small", "hours": 2, "max_decisions": None,
                         "reward_weights": w})
    obs, _ = env.reset(seed=4)
    first = env.engine.metrics.snapshot()
    total, done = 0.0, False
    sums = dict.fromkeys(COMPONENTS, 0.0)
    while not done:
        obs, r, term, trunc, info = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
        total += r
        for k, v in info["components"].items():
            sums[k] += v
        done = term or trunc
    last = env.engine.metrics.snapshot()
    from smartsched.model.pod import POD_CLASSES

    per_class = sum(last[f"pending_s.{c}"] for c in POD_CLASSES)
    assert per_class == pytest.approx(last["pending_s"])
    # Telescoping: the episode's components are the twin's totals, normalized once.
    ref = StepReward(RewardWeights(**w), env.engine.state.num_nodes,
                     float(env.engine.metrics.node_price_h.sum()),
                     float(env.engine.metrics.node_idle_w.sum()), fill_mode=False)
    ref.last = dict(first)
    expected = ref.components(last)
    for k in COMPONENTS:
        if k != "fairness":  # fairness weighs each span by the Jain index at its end
            assert sums[k] == pytest.approx(expected[k], rel=1e-9, abs=1e-12)
    assert total == pytest.approx(sum(w[k] * sums[k] for k in COMPONENTS), rel=1e-9)
    assert sums["utilization"] > 0 and sums["cost"] < 0
    assert sums["traffic"] < 0  # weighed, so the twin measured it


def test_env_config_errors_name_the_field() -> None:
    with pytest.raises(ValidationError) as e:
        SchedulingEnv({"clusterr": "small"})
    assert e.value.field == "env.clusterr"
    with pytest.raises(ValidationError) as e:
        SchedulingEnv({"reward_weights": {"speed": 1}})
    assert e.value.field == "reward_weights.speed"
    for bad in ([], [1.0, -2.0], [float("nan")], "6", [True]):
        with pytest.raises(ValidationError) as e:
            SchedulingEnv({"warmup_hours": bad})
        assert e.value.field == "env.warmup_hours"
    for bad in (0, len(COMPONENTS) + 1, True, 2.5, "6"):
        with pytest.raises(ValidationError) as e:
            SchedulingEnv({"observed_components": bad})
        assert e.value.field == "env.observed_components"
    # A shortlist's size or classes without its base would be dropped silently: the
    # policy would train over every node while the recipe reads as a shortlist.
    for key, value in (("shortlist_k", 3), ("shortlist_classes", ["online"])):
        with pytest.raises(ValidationError, match=r"env\.base") as e:
            SchedulingEnv({key: value})
        assert e.value.field == f"env.{key}"
        with pytest.raises(ValidationError, match=r"env\.base"):
            SchedulingEnv({key: value, "base": None})


def test_a_policy_from_before_the_last_components_observes_their_prefix() -> None:
    """An export observing the first six weights is fine-tuned with six in its
    observation; the reward still weighs the seventh and eighth."""
    env = SchedulingEnv({"cluster": "small", "hours": 0.5, "max_decisions": 5,
                         "observed_components": 6,
                         "reward_weights": {"utilization": 1.0, "contention": 50.0}})
    obs, _ = env.reset(seed=0)
    assert env.observation_space["weights"].shape == (6,)
    assert obs["weights"].shape == (6,) and env.observation_space.contains(obs)
    assert obs["weights"][0] == 1.0
    assert env.reward_fn.w.contention == 50.0


def test_episodes_draw_their_start_hour_from_the_list() -> None:
    env = SchedulingEnv({"cluster": "small", "hours": 0.5, "warmup_hours": [1.0, 3.0],
                         "max_decisions": 5})
    starts = set()
    for ep in range(12):
        env.reset(seed=ep)
        starts.add(env.engine.config.warmup_s)
    assert starts == {3600.0, 3 * 3600.0}
    # A weighed traffic component turns the twin's traffic measurement on; else it is off.
    assert not env.engine.metrics.track_traffic
    env = SchedulingEnv({"cluster": "small", "hours": 0.5, "max_decisions": 5,
                         "reward_weights": {"traffic": 1.0}})
    env.reset(seed=0)
    assert env.engine.metrics.track_traffic and not env.engine.metrics.full


def test_padding_masks_extra_nodes() -> None:
    env = SchedulingEnv({"cluster": "small", "hours": 1, "max_nodes": 40})
    obs, _ = env.reset(seed=0)
    assert obs["nodes"].shape == (40, env.observation_space["nodes"].shape[1])
    assert not obs["action_mask"][16:40].any()


def test_clusters_drawn_per_episode_share_one_padded_space() -> None:
    """Training across cluster sizes: each episode draws one cluster of the list; the
    observation space is the largest one's, and the smaller ones' extra rows are masked."""
    env = SchedulingEnv({"cluster": ["small", "medium"], "hours": 1, "max_decisions": 5})
    big = len(env.clusters[1].nodes)
    assert env.observation_space["nodes"].shape[0] == big
    seen = set()
    for k in range(8):
        obs, _ = env.reset(seed=k)
        n = env.engine.state.num_nodes
        seen.add(n)
        assert obs["nodes"].shape[0] == big and env.observation_space.contains(obs)
        assert not obs["action_mask"][n:big].any()
        a = int(np.flatnonzero(obs["action_mask"][:n])[0])
        obs, *_ = env.step(a)
        assert env.observation_space.contains(obs)
    assert seen == {16, big}  # both drawn (seeded)
    for bad in ([], ["small", 3], 5):
        with pytest.raises(ValidationError) as e:
            SchedulingEnv({"cluster": bad})
        assert e.value.field == "env.cluster"


def test_scenario_weights_sampling_and_dynamic_rules() -> None:
    from smartsched.objectives.scenarios import load_scenarios

    green = load_scenarios()["green"].vector()
    env = SchedulingEnv({"cluster": "small", "hours": 1, "reward_weights": "green"})
    obs, _ = env.reset(seed=0)
    assert np.allclose(obs["weights"], green)
    env = SchedulingEnv({"cluster": "small", "hours": 1, "weight_sampling": "scenarios"})
    seen = {tuple(env.reset(seed=s)[0]["weights"].round(3)) for s in range(12)}
    assert len(seen) >= 3  # different episodes optimize different scenarios
    # Dynamic: starting at midnight the night rule switches to "green" at the first check.
    env = SchedulingEnv({"cluster": "small", "hours": 2, "dynamic_weights": True,
                         "max_decisions": 30})
    obs, _ = env.reset(seed=1)
    done = False
    while not done:
        obs, _, term, trunc, _ = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
        done = term or trunc
    assert env.weights_log and env.weights_log[0]["profile"] == "green"
    assert "night" in env.weights_log[0]["reason"]
    assert np.allclose(obs["weights"], green)
    with pytest.raises(ValidationError):
        SchedulingEnv({"weight_sampling": "sometimes"})


def test_forecast_columns_carry_the_forecasters_prediction(tiny_forecaster) -> None:
    """With a forecaster the node features gain two columns: predicted cpu and memory use
    as fractions of capacity (current usage until the forecaster has a full lookback)."""
    from smartsched.model.resources import CPU, MEM
    from smartsched.rl.features import FORECAST_COLS, NODE_FEATURES

    plain = SchedulingEnv({"cluster": "small", "hours": 3, "max_decisions": 400})
    env = SchedulingEnv({"cluster": "small", "hours": 3, "max_decisions": 400,
                         "forecaster": f"{tiny_forecaster}?plan=median"})
    assert env.observation_space["nodes"].shape[1] == NODE_FEATURES + FORECAST_COLS
    assert plain.observation_space["nodes"].shape[1] == NODE_FEATURES
    obs, _ = env.reset(seed=3)
    plain_obs, _ = plain.reset(seed=3)
    st = env.engine.state
    assert env.engine.usage_predictor.plan == "median"
    n = st.num_nodes
    cap = st.capacity[:, [CPU, MEM]]
    cols = slice(NODE_FEATURES, NODE_FEATURES + FORECAST_COLS)
    np.testing.assert_allclose(obs["nodes"][:n, cols], st.usage[:, :2] / cap, atol=1e-6)
    # The fixed columns are the same as without a forecaster.
    np.testing.assert_array_equal(obs["nodes"][:, :NODE_FEATURES], plain_obs["nodes"])
    seen_prediction = False
    done = False
    while not done:
        obs, _, term, trunc, _ = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
        done = term or trunc
        if not done and st.predicted_usage is not None:
            seen_prediction = True
            np.testing.assert_allclose(obs["nodes"][:n, cols],
                                       np.clip(st.predicted_usage / cap, -10, 10), atol=1e-5)
    assert seen_prediction
    with pytest.raises(ValidationError, match="plan"):
        SchedulingEnv({"cluster": "small", "forecaster": f"{tiny_forecaster}?plan=mean"})
