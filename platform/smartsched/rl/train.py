"""PPO training over many simulated clusters, locally or under ``ray job submit``.

Owns the training entry point behind ``smartsched train``: builds a
``PPOConfig`` from the YAML (env runners each running several twins), trains
with a progress line per iteration, writes TensorBoard scalars, checkpoints
every K iterations and at the end, exports the policy (the RLModule plus the
env settings it was trained with) for ``rl:PATH``, and resumes from the latest
checkpoint. Everything Ray writes goes under the output directory.

Layout of ``output_dir``::

    checkpoints/iter_000005/   RLlib algorithm checkpoints
    latest                     name of the newest checkpoint folder
    policy/                    module checkpoint + smartsched_policy.json (rl:PATH)
    tensorboard/               event files for `tensorboard --logdir`
    progress.jsonl             one line of headline metrics per iteration
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from smartsched.model.errors import ValidationError
from smartsched.rl.config import TrainConfig

MODULE_SUBPATH = Path("learner_group") / "learner" / "rl_module" / "default_policy"
POLICY_META = "smartsched_policy.json"
FORECASTER_SUBDIR = "forecaster"  # inside an exported policy; env.forecaster is relative to it
TELEMETRY_SUBDIR = "telemetry"  # likewise env.telemetry


def init_ray(out: Path, num_cpus: int | None = None) -> None:
    """Connect to RAY_ADDRESS, or start the embedded locked-down Ray (results under
    ``out``), unless Ray is up already: what ``train``, ``learn`` and friends share."""
    _init_ray(out, num_cpus)


def _init_ray(out: Path, num_cpus: int | None) -> None:
    import ray

    if ray.is_initialized():
        return
    # Keep RLlib's per-algorithm result folder out of the user's home.
    import ray.tune.trainable.trainable as trainable

    trainable.DEFAULT_STORAGE_PATH = str(out / "ray_results")
    # Make the package importable in remote workers when running from a checkout.
    pkg_root = str(Path(__file__).resolve().parents[2])
    if pkg_root not in sys.path:
        sys.path.insert(0, pkg_root)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [pkg_root, *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    else:
        # Embedded: loopback only, Ray's token auth with a token of this run's own
        # (never ~/.ray); a cluster reached through RAY_ADDRESS keeps its own setting.
        from smartsched.ray_local import start_embedded_ray

        tmp = os.environ.get("SMARTSCHED_RAY_TMP")
        start_embedded_ray(out, Path(tmp) if tmp else None,
                           num_cpus=num_cpus or os.cpu_count())


def require_cpus(asked: float, field: str, what: str, num_cpus: int | None = None,
                  echo: Callable[[str], Any] = print) -> None:
    """Refuse work that asks Ray for more CPUs than it has, naming ``field``.

    Ray queues an actor that no node can host and waits for the cluster to grow: on the
    embedded Ray, which never grows, training would hang with no error. Before Ray is up
    the embedded one's size is known (``num_cpus``, else this machine's cores), so the
    check runs before anything slow starts; a cluster reached through RAY_ADDRESS is
    checked once connected, and only warned about, since it may autoscale."""
    import ray

    remote = bool(os.environ.get("RAY_ADDRESS"))
    if ray.is_initialized():
        have = float(ray.cluster_resources().get("CPU", 0.0))
    elif remote:
        return  # checked again once connected
    else:
        have = float(num_cpus or os.cpu_count() or 1)
    if asked <= have:
        return
    msg = f"asks for {asked:g} CPUs ({what}) but the Ray cluster has {have:g}"
    if remote:
        echo(f"warning: {field} {msg}; it waits until the cluster grows")
        return
    raise ValidationError(field, f"{msg}; lower it, or give Ray more CPUs (num_cpus)")


def build_ppo_config(cfg: TrainConfig) -> Any:
    """The RLlib PPOConfig for ``cfg`` (new API stack)."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from smartsched.rl.env import SchedulingEnv
    from smartsched.rl.module import NodeScorerModule

    env_cfg = {**cfg.env, "seed": cfg.env.get("seed", cfg.seed)}
    t = cfg.training
    r = cfg.env_runners
    return (
        PPOConfig()
        .environment(env=SchedulingEnv, env_config=env_cfg)
        .env_runners(
            num_env_runners=r.num_env_runners,
            num_envs_per_env_runner=r.num_envs_per_env_runner,
            rollout_fragment_length=r.rollout_fragment_length,
            sample_timeout_s=r.sample_timeout_s,
        )
        .learners(num_learners=0)
        .training(
            train_batch_size_per_learner=t.train_batch_size_per_learner,
            minibatch_size=t.minibatch_size,
            num_epochs=t.num_epochs,
            lr=t.lr,
            gamma=t.gamma,
            lambda_=t.lambda_,
            entropy_coeff=t.entropy_coeff,
            vf_loss_coeff=t.vf_loss_coeff,
            grad_clip=t.grad_clip,
        )
        .rl_module(rl_module_spec=RLModuleSpec(module_class=NodeScorerModule,
                                               model_config=dict(cfg.model)))
        .fault_tolerance(restart_failed_env_runners=True, max_num_env_runner_restarts=100,
                         delay_between_env_runner_restarts_s=5.0)
        .debugging(seed=cfg.seed, log_level="WARN")
    )


def observing_as_init(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with the env observing as many reward weights as ``init_policy`` does.

    Reward components are only ever appended; a policy exported before the last ones
    observes a prefix of them, and its first layer is that wide. Fine-tuning it keeps
    its observation (``env.observed_components``) so its weights load; the reward still
    weighs every component. An explicit ``observed_components`` is left as set."""
    if cfg.init_policy is None or cfg.env.get("observed_components") is not None:
        return cfg
    from smartsched.objectives.reward import COMPONENTS
    from smartsched.rl.policy import read_policy_meta, resolve_policy_dir

    _, trained = read_policy_meta(resolve_policy_dir(cfg.init_policy), "init_policy")
    if len(trained) == len(COMPONENTS):
        return cfg
    return cfg.model_copy(update={"env": {**cfg.env, "observed_components": len(trained)}})


def build_algo(cfg: TrainConfig) -> Any:
    """The PPO algorithm of ``cfg``, starting from ``init_policy``'s weights when set.

    The initial policy is read as every policy is (``rl.artifact.read_module``: JSON spec
    plus tensors, never pickle -- RLlib's own ``load_state_path`` would unpickle), then
    set on the learner, which syncs the env runners."""
    cfg = observing_as_init(cfg)
    algo = build_ppo_config(cfg).build_algo()
    if cfg.init_policy is None:
        return algo
    from ray.rllib.core import (
        COMPONENT_LEARNER,
        COMPONENT_LEARNER_GROUP,
        COMPONENT_RL_MODULE,
        DEFAULT_MODULE_ID,
    )

    from smartsched.rl.artifact import read_module
    from smartsched.rl.policy import resolve_policy_dir

    try:
        init = read_module(resolve_policy_dir(cfg.init_policy)).get_state()
        mine = algo.get_module().get_state()
        if set(init) != set(mine) or any(np.shape(init[k]) != np.shape(mine[k]) for k in mine):
            raise ValidationError(
                "init_policy", f"{cfg.init_policy} has another network shape than this "
                "config's model (set model: as the policy was trained)")
        algo.set_state({COMPONENT_LEARNER_GROUP: {COMPONENT_LEARNER: {COMPONENT_RL_MODULE: {
            DEFAULT_MODULE_ID: init}}}})
    except Exception:
        algo.stop()
        raise
    return algo


def env_runner_placement(algo: Any) -> dict[str, Any]:
    """Which Ray node each remote env runner (and the learner, in this driver) runs on:
    the evidence that sampling spreads over a multi-node cluster."""
    import ray

    runners = algo.env_runner_group.foreach_env_runner(
        lambda r: {"node_id": ray.get_runtime_context().get_node_id(),
                   "pid": os.getpid()},
        local_env_runner=False)
    return {"learner_node": ray.get_runtime_context().get_node_id(),
            "env_runners": runners, "nodes": len({r["node_id"] for r in runners}),
            "cluster_nodes": sum(1 for n in ray.nodes() if n.get("Alive"))}


def latest_checkpoint(out: Path) -> Path | None:
    marker = out / "latest"
    if marker.is_file():
        path = out / "checkpoints" / marker.read_text().strip()
        if (path / "rllib_checkpoint.json").is_file():
            return path
    return None


def refuse_earlier_run(out: Path) -> None:
    """A fresh training into a folder that holds one would overwrite its checkpoints and its
    exported policy and mix the two runs' progress lines: refused, naming --output-dir."""
    latest = latest_checkpoint(out)
    if latest is not None or (out / "policy" / POLICY_META).is_file():
        held = f"checkpoint {latest.name}" if latest else "an exported policy"
        raise ValidationError("--output-dir", f"{out} holds a training run ({held}); "
                              "--resume continues it, another folder starts a new one")


def export_policy(checkpoint: Path, out: Path, cfg: TrainConfig, iteration: int) -> Path:
    """Copy the RLModule out of an algorithm checkpoint, with the env settings it needs."""
    dest = out / "policy"
    tmp = out / "policy.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(checkpoint / MODULE_SUBPATH, tmp)
    from smartsched.objectives.reward import COMPONENTS

    env = dict(cfg.env)
    if env.get("forecaster"):  # the policy carries the forecaster its features came from
        folder, sep, query = str(env["forecaster"]).partition("?")
        shutil.copytree(folder, tmp / FORECASTER_SUBDIR)
        env["forecaster"] = FORECASTER_SUBDIR + sep + query
    if env.get("telemetry"):  # and the telemetry projection its features came from
        shutil.copytree(env["telemetry"], tmp / TELEMETRY_SUBDIR)
        env["telemetry"] = TELEMETRY_SUBDIR
    from smartsched.rl.observation import POD_COLUMNS, node_columns

    k = 0
    if env.get("telemetry"):
        from smartsched.twin.telemetry.reduction import TelemetryProjection

        k = TelemetryProjection.load(tmp / TELEMETRY_SUBDIR).k
    meta = {"env": env, "model": cfg.model, "iteration": iteration,
            "module_class": "smartsched.rl.module.NodeScorerModule",
            "reward_components": list(COMPONENTS[:env.get("observed_components")
                                                  or len(COMPONENTS)]),
            # What each observation column means: a loader refuses a mismatch.
            "node_columns": list(node_columns(bool(env.get("forecaster")), k)),
            "pod_columns": list(POD_COLUMNS)}
    (tmp / POLICY_META).write_text(json.dumps(meta, indent=2) + "\n")
    from smartsched.rl.artifact import write_module

    write_module(tmp)  # spec as JSON, weights as tensors: the export holds no pickle
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)  # readers never see a half-written policy
    return dest


def _scalars(result: dict[str, Any]) -> dict[str, float]:
    from ray.tune.utils import flatten_dict

    out = {}
    for k, v in flatten_dict(result, delimiter="/").items():
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = float(v)
    return out


def train(
    cfg: TrainConfig,
    iterations: int | None = None,
    resume: bool = False,
    output_dir: str | None = None,
    echo: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Train PPO; return a summary (iterations run, last return, checkpoint and policy paths)."""
    cfg = observing_as_init(cfg)  # the export then records what the policy observes
    out = Path(output_dir or cfg.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    runners = cfg.env_runners.num_env_runners
    require_cpus(runners, "env_runners.num_env_runners", "one per env runner", cfg.num_cpus,
                 echo)
    _init_ray(out, cfg.num_cpus)
    require_cpus(runners, "env_runners.num_env_runners", "one per env runner", echo=echo)
    from tensorboardX import SummaryWriter

    algo = build_algo(cfg)
    placement = env_runner_placement(algo)
    (out / "placement.json").write_text(json.dumps(placement, indent=2) + "\n")
    echo(f"{len(placement['env_runners'])} env runner(s) on {placement['nodes']} node(s); "
         f"learner on {placement['learner_node'][:12]}")
    start = 0
    latest = latest_checkpoint(out) if resume else None
    if resume and latest is None:
        echo(f"no checkpoint under {out}; starting from scratch")
    if latest is not None:
        algo.restore_from_path(str(latest))
        start = int(algo.iteration)
        echo(f"resumed from {latest} at iteration {start}")
    total = iterations if iterations is not None else cfg.iterations
    writer = SummaryWriter(str(out / "tensorboard"))
    last: dict[str, float] = {}
    ckpt: Path | None = latest
    try:
        for _ in range(total):
            t0 = time.perf_counter()
            result = algo.train()
            it = int(result.get("training_iteration", algo.iteration))
            sc = _scalars(result)
            for k, v in sc.items():
                writer.add_scalar(k, v, it)
            ret = sc.get("env_runners/episode_return_mean", float("nan"))
            steps = sc.get("num_env_steps_sampled_lifetime", float("nan"))
            last = {"iteration": it, "episode_return_mean": ret, "env_steps": steps,
                    "seconds": time.perf_counter() - t0}
            with open(out / "progress.jsonl", "a") as f:
                f.write(json.dumps(last) + "\n")
            echo(f"iter {it:4d}  return {ret:9.4f}  env steps {steps:9.0f}  "
                 f"{last['seconds']:6.1f} s")
            if it % cfg.checkpoint_every == 0 or _ == total - 1:
                ckpt = out / "checkpoints" / f"iter_{it:06d}"
                algo.save_to_path(str(ckpt))
                (out / "latest").write_text(ckpt.name + "\n")
                export_policy(ckpt, out, cfg, it)
    finally:
        writer.close()
        algo.stop()
    return {"output_dir": str(out), "iterations": last.get("iteration", start),
            "env_runner_nodes": placement["nodes"],
            "last": last, "checkpoint": str(ckpt) if ckpt else None,
            "policy": str(out / "policy") if (out / "policy").exists() else None}
