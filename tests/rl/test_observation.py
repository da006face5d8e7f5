"""The observation's named columns: one layout for the env and the policy, checked on load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from smartsched.model.errors import ValidationError
from smartsched.rl.env import SchedulingEnv
from smartsched.rl.observation import (
    HEURISTIC_COLS,
    HEURISTIC_NAMES,
    NODE_COL,
    NODE_COLUMNS,
    NODE_FEATURES,
    POD_COL,
    POD_COLUMNS,
    POD_FEATURES,
    STATIC_COLS,
    node_columns,
)

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "ppo_mixed_small"


def test_columns_are_named_once_and_keep_the_trained_layout() -> None:
    assert len(set(NODE_COLUMNS)) == NODE_FEATURES == 48
    assert len(set(POD_COLUMNS)) == POD_FEATURES == 19
    # Positions a trained checkpoint depends on (changing them needs a retrain).
    assert [NODE_COL[n] for n in ("free_cpu", "use_cpu", "score_fgd", "zone_0", "rack")] == \
        [3, 16, 35, 37, 47]
    assert [POD_COL[n] for n in ("cpu", "class_online", "gang_size", "feasible_share")] == \
        [0, 4, 9, 18]
    assert tuple(NODE_COL[n] for n in HEURISTIC_NAMES) == HEURISTIC_COLS
    assert set(STATIC_COLS) >= {NODE_COL["cap_cpu"], NODE_COL["sockets"], NODE_COL["rack"]}
    assert node_columns(True, 2)[-4:] == ("forecast_cpu", "forecast_mem", "telemetry_0",
                                          "telemetry_1")


def test_named_columns_carry_what_their_names_say() -> None:
    env = SchedulingEnv({"cluster": "small", "hours": 2, "max_decisions": 30})
    obs, _ = env.reset(seed=3)
    st, req = env.engine.state, env._req.request
    nodes = obs["nodes"]
    n = st.num_nodes
    np.testing.assert_allclose(nodes[:n, NODE_COL["free_cpu"]],
                               st.free_res[:, 0] / st.capacity[:, 0], rtol=1e-6)
    assert (nodes[:n, NODE_COL["gpu_count"]] * 8 == st.gpu_count).all()
    cls = f"class_{req.pod.pod_class.value}"
    assert obs["pod"][POD_COL[cls]] == 1.0
    assert obs["pod"][[POD_COL[c] for c in POD_COLUMNS if c.startswith("class_")]].sum() == 1.0


@pytest.mark.skipif(not SHIPPED.is_dir(), reason="no shipped policy in this checkout")
def test_a_policy_that_observes_other_columns_is_refused(tmp_path: Path) -> None:
    from smartsched.rl.policy import RLScheduler

    policy = tmp_path / "policy"
    shutil.copytree(SHIPPED, policy)
    RLScheduler(policy)  # exports before named columns are the current layout
    meta_path = policy / "smartsched_policy.json"
    meta = json.loads(meta_path.read_text())
    meta["node_columns"] = list(reversed(NODE_COLUMNS))
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValidationError, match="node_columns"):
        RLScheduler(policy)


def test_allocation_columns_kept_between_decisions_equal_a_full_rebuild() -> None:
    """Only nodes stamped since the last call are recomputed; after allocations and
    releases of GPU and cpu pods the features are, bit for bit, those a builder that has
    seen nothing before computes."""
    from smartsched.model.pod import Pod, PodClass
    from smartsched.model.presets import load_cluster
    from smartsched.rl.observation import FeatureBuilder
    from smartsched.scheduling.framework import CycleContext
    from smartsched.twin.state import ClusterState

    spec = load_cluster("small")
    st = ClusterState(spec)
    kept = FeatureBuilder(spec, st, None)
    rng = np.random.default_rng(5)
    placed: list[tuple[int, object, tuple[int, ...]]] = []
    for i in range(60):
        for j in range(int(rng.integers(1, 4))):  # several nodes stamped between calls
            if placed and rng.random() < 0.3:
                node, req, devices = placed.pop(int(rng.integers(len(placed))))
                st.release(node, req, devices)
            else:
                gpu = rng.random() < 0.5
                pod = Pod(id=f"p{i}-{j}", cpu_milli=int(rng.choice([250, 1000, 4000])),
                          memory_mib=1024, num_gpu=1 if gpu else 0,
                          gpu_milli=int(rng.choice([250, 500, 1000])) if gpu else 0,
                          pod_class=PodClass.AI_INFER if gpu else PodClass.BATCH)
                req = st.compile(pod)
                fits = np.flatnonzero(np.all(st.free_res[:, :3] >= req.vector[:3], axis=1)
                                      & (st.gpu_max_free >= req.gpu_milli))
                if fits.size:
                    node = int(rng.choice(fits))
                    devices = st.pick_devices(node, req)
                    st.allocate(node, req, devices)
                    placed.append((node, req, devices))
        probe = st.compile(Pod(id="probe", cpu_milli=500, memory_mib=512))
        ctx = CycleContext(st, probe)
        ok = np.ones(st.num_nodes, dtype=bool)
        got = kept.nodes(ctx, ok, 0.0)
        want = FeatureBuilder(spec, st, None).nodes(ctx, ok, 0.0)
        assert np.array_equal(got.view(np.int32), want.view(np.int32)), f"after step {i}"
    assert placed and st.gpu_free.min() < 1000  # GPU devices were shared and released
