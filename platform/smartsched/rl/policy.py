"""The trained policy as a scheduler: ``rl:<path>``.

Owns loading a policy exported by ``smartsched train`` (an RLModule
checkpoint plus ``smartsched_policy.json``) and deciding with it through the
same filters, features and binder as the training env. Loading needs only
torch and the RLModule class — no Algorithm and no Ray cluster. Accepts the
exported ``policy/`` folder, a training output folder, or an RLlib algorithm
checkpoint. Decisions are greedy (argmax of the masked logits).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from smartsched.model.errors import UnknownReferenceError
from smartsched.model.pod import Pod
from smartsched.objectives.reward import RewardWeights
from smartsched.rl.features import FeatureBuilder
from smartsched.scheduling.framework import ProfileScheduler
from smartsched.scheduling.plugins.gpu import FGD, FgdArgs
from smartsched.scheduling.registry import load_profile
from smartsched.twin.engine import Decision, can_defer
from smartsched.twin.state import ClusterState, PodRequest

POLICY_META = "smartsched_policy.json"
MODULE_SUBPATH = Path("learner_group") / "learner" / "rl_module" / "default_policy"


def resolve_policy_dir(path: str | Path) -> Path:
    p = Path(path).expanduser().resolve()  # RLlib's loader wants an absolute path
    for cand in (p, p / "policy", p / MODULE_SUBPATH):
        if (cand / "module_state.pkl").exists() or (cand / "module_state").exists():
            return cand
    raise UnknownReferenceError(
        "scheduler", f"no trained policy at {p} (expected an exported policy/ folder, a "
        "training output folder or an RLlib checkpoint)")


class RLScheduler:
    """Greedy decisions of a trained NodeScorerModule."""

    def __init__(self, path: str | Path, seed: int = 0) -> None:
        import torch
        from ray.rllib.core.rl_module.rl_module import RLModule

        self.dir = resolve_policy_dir(path)
        meta_path = self.dir / POLICY_META
        self.meta: dict[str, Any] = (
            json.loads(meta_path.read_text()) if meta_path.exists() else {"env": {}}
        )
        env = self.meta.get("env", {})
        self.name = f"rl:{path}"
        self.module = RLModule.from_checkpoint(str(self.dir))
        self.module.eval()
        # One decision is a batch of one: a single thread is faster than a pool.
        torch.set_num_threads(1)
        self.torch = torch
        self.filters = ProfileScheduler(load_profile(env.get("filters_profile", "k8s-default")),
                                        seed)
        self.weights = RewardWeights.from_mapping(env.get("reward_weights") or None).vector()
        self.heuristics = bool(env.get("heuristic_features", True))
        self.fgd: FGD | None = None
        self._features: FeatureBuilder | None = None
        self._state_id: int | None = None

    def prepare(self, pods: Sequence[Pod]) -> None:
        if self.heuristics:
            self.fgd = FGD(FgdArgs(warm=True))
            self.fgd.prepare(pods)

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        from ray.rllib.core.columns import Columns

        ok, ctx = self.filters.feasible(state, request)
        deferrable = can_defer(request.pod, state.now)
        if not ok.any():
            return Decision.reject(*self.filters.reasons(ctx))
        if self._features is None or self._state_id != id(state):
            self._features = FeatureBuilder(state.spec, state, self.fgd)
            self._state_id = id(state)
        now = state.now
        nodes = self._features.nodes(ctx, ok, now)
        pod = FeatureBuilder.pod(request, now, state.queue_length, float(ok.mean()))
        mask = np.zeros(state.num_nodes + 1, dtype=np.float32)
        mask[:-1] = ok
        mask[-1] = 1.0 if deferrable else 0.0
        t = self.torch
        batch = {Columns.OBS: {
            "nodes": t.from_numpy(nodes).unsqueeze(0),
            "pod": t.from_numpy(pod).unsqueeze(0),
            "action_mask": t.from_numpy(mask).unsqueeze(0),
            "weights": t.from_numpy(self.weights).unsqueeze(0),
        }}
        with t.no_grad():
            logits = self.module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS][0]
        a = int(t.argmax(logits))
        if a == state.num_nodes:
            return Decision(None, defer=True)
        devices = None
        if self.filters.profile.binder is not None:
            devices = self.filters.profile.binder.devices(ctx, a)
        return Decision(a, devices)


def make_rl_scheduler(path: str, seed: int) -> RLScheduler:
    """Entry point for the ``rl:`` prefix (see pyproject's smartsched.schedulers)."""
    return RLScheduler(path, seed)
