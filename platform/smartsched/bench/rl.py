"""``smartsched bench rl``: sampling throughput and inference latency of the policy.

Owns three measurements, printed and returned as a dict:
  1. In-process env + module: env steps/s with the policy acting, and the share
     of time spent in the twin (env.step: engine, filters, features) versus the
     model (forward pass).
  2. RLlib sampling: env steps/s across remote env runners (no learning).
  3. Inference: p50/p99 per decision of ``RLScheduler.decide`` on clusters of
     1,500 and 5,000 nodes (the openb-all nodes, replicated), openb fill. A policy
     steering within a heuristic's shortlist (``base=``) decides only for its classes
     (online pods), which the openb trace has none of: it is timed on the ``mixed``
     workload over ``medium``'s nodes replicated to that size, and only the decisions
     it was asked to make count (each one whole: the base's filters and scores, the
     observation, every ensemble member).
Without ``--policy`` an untrained module of the same architecture is used for
1 and 3 (latency does not depend on the weights), and the report says so.
``--policy`` takes what ``rl:`` takes (``PATH?ensemble=...&base=...``); options are
measured by 3 alone (``latency_only``), since 1 and 2 run the module in an env of
their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _module_for(env: Any, policy: str | None) -> Any:
    if policy:
        from smartsched.rl.artifact import read_module
        from smartsched.rl.policy import resolve_policy_dir

        return read_module(resolve_policy_dir(policy))
    from smartsched.rl.module import NodeScorerModule

    return NodeScorerModule(observation_space=env.observation_space,
                            action_space=env.action_space, model_config={"hidden": 64})


def env_and_model_split(policy: str | None, steps: int = 1000) -> dict[str, Any]:
    import torch
    from ray.rllib.core.columns import Columns

    from smartsched.rl.env import SchedulingEnv

    env_cfg: dict[str, Any] = {"cluster": "small", "hours": 24, "max_decisions": None}
    module = None
    if policy:  # loaded and checked as every loader does; the env observes as it does
        from smartsched.rl.policy import RLScheduler

        sched = RLScheduler(policy)
        module = sched.module
        env_cfg.update(observed_components=sched.observed_components,
                       heuristic_features=sched.heuristics, forecaster=sched.forecaster,
                       telemetry=sched.telemetry)
    env = SchedulingEnv(env_cfg)
    if module is None:
        module = _module_for(env, None)
    obs, _ = env.reset(seed=123)
    t_env = t_model = 0.0
    done_steps = 0
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = {Columns.OBS: {k: torch.from_numpy(v).unsqueeze(0) for k, v in obs.items()}}
        with torch.no_grad():
            logits = module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS][0]
        a = int(torch.argmax(logits))
        t1 = time.perf_counter()
        obs, _, term, trunc, _ = env.step(a)
        t2 = time.perf_counter()
        t_model += t1 - t0
        t_env += t2 - t1
        done_steps += 1
        if term or trunc:
            obs, _ = env.reset()
    total = t_env + t_model
    return {"steps": done_steps, "steps_per_second": done_steps / total,
            "twin_share": t_env / total, "model_share": t_model / total}


SAMPLING_TARGET = 2000.0  # env steps/s on a 2-core machine (issue 17)


def rllib_sampling(num_env_runners: int = 2, rounds: int = 5,
                   num_envs_per_env_runner: int = 1) -> dict[str, Any]:
    """Env steps/s sampled by remote env runners (random initial policy, no learning): the
    whole span, and each round's rate (the spread a noisy machine gives)."""
    from smartsched.rl.config import TrainConfig
    from smartsched.rl.train import _init_ray, build_ppo_config

    cfg = TrainConfig.model_validate({
        "env": {"cluster": "small", "hours": 6, "max_decisions": 400},
        "env_runners": {"num_env_runners": num_env_runners,
                        "num_envs_per_env_runner": num_envs_per_env_runner},
        "training": {"train_batch_size_per_learner": 400, "minibatch_size": 100},
    })
    import tempfile

    import ray

    with tempfile.TemporaryDirectory() as tmp:
        started = not ray.is_initialized()
        _init_ray(Path(tmp), None)
        try:
            algo = build_ppo_config(cfg).build_algo()
        except BaseException:
            if started:
                ray.shutdown()
            raise
        try:
            group = algo.env_runner_group
            group.foreach_env_runner(lambda r: r.sample(num_timesteps=200),
                                     local_env_runner=False)  # warm up
            steps, t0, per_round = 0, time.perf_counter(), []
            for _ in range(rounds):
                t1 = time.perf_counter()
                res = group.foreach_env_runner(
                    lambda r: sum(len(e) for e in r.sample(num_timesteps=1000)),
                    local_env_runner=False,
                )
                steps += int(sum(res))
                per_round.append(int(sum(res)) / (time.perf_counter() - t1))
            wall = time.perf_counter() - t0
        finally:
            algo.stop()
            if started:  # Ray's files live in tmp: never leave a Ray whose dir is gone
                ray.shutdown()
    return {"env_runners": num_env_runners, "envs_per_runner": num_envs_per_env_runner,
            "steps": steps, "steps_per_second": steps / wall,
            "rounds_steps_per_second": per_round}


def inference_latency(policy: str | None, nodes: int, decisions: int = 400) -> dict[str, Any]:
    from smartsched.bench.speed import replicated_cluster
    from smartsched.model.errors import ValidationError
    from smartsched.rl.policy import make_rl_scheduler
    from smartsched.scheduling.run import build_run

    sched: Any = make_rl_scheduler(policy, 42) if policy else _UntrainedScheduler()
    if sched.shortlist is not None:
        return _steered_latency(sched, replicated_cluster("medium", nodes), decisions)
    spec = replicated_cluster("openb-all", nodes)
    try:
        run = build_run(spec, "openb:default", sched, mode="fill", seed=42)
    except ValidationError as e:  # the first nodes lack the trace's largest (a pod too big)
        raise ValidationError("sizes", f"{nodes} nodes (the first of openb-all) cannot host "
                              f"the openb trace ({e.field}: {e.message}); give more") from None
    run.drive(max_decisions=decisions)
    times = run.engine.metrics.decision_seconds  # decide + apply, per decision
    arr = np.array(times[1:]) * 1000  # the first call builds and caches the topology graph
    return {"nodes": nodes, "decisions": len(arr), "first_ms": times[0] * 1000,
            "p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99))}


def _steered_latency(sched: Any, spec: Any, decisions: int,
                     hours: tuple[float, ...] = (4.0, 24.0)) -> dict[str, Any]:
    """Seconds of each decision in which a shortlist policy chose (decide and apply, as
    the openb path times them; the base's own work included), on the ``mixed`` workload
    over ``spec`` from an empty cluster, until ``decisions + 1`` such decisions were timed.
    The first span of ``hours`` that holds that many is used (generating a day of pods
    for a large cluster costs more than the decisions timed)."""
    from smartsched.model.errors import ValidationError
    from smartsched.scheduling.run import build_run

    sl = sched.shortlist
    times: list[float] = []
    for span in hours:
        times.clear()
        run = build_run(spec, "mixed", sched, mode="replay", seed=42, hours=span)
        while len(times) <= decisions and (req := run.next_decision()) is not None:
            before = sl.decisions
            t0 = time.perf_counter()
            run.decide(req)
            if sl.decisions > before:
                times.append(time.perf_counter() - t0)
        if len(times) > decisions:
            break
    if len(times) < 2:
        raise ValidationError("sizes", f"the policy chose in {len(times)} decisions over "
                              f"{hours[-1]:g} h of the mixed workload on {len(spec.nodes)} "
                              "nodes: nothing to time (too few nodes to choose among?)")
    arr = np.array(times[1:]) * 1000  # the first builds the observer's and scorers' caches
    return {"nodes": len(spec.nodes), "workload": "mixed", "decisions": len(arr),
            "first_ms": times[0] * 1000, "p50_ms": float(np.percentile(arr, 50)),
            "p99_ms": float(np.percentile(arr, 99))}


class _UntrainedScheduler:
    """RLScheduler with a freshly initialised module (for latency when no policy is given)."""

    def __new__(cls) -> Any:
        import tempfile

        from smartsched.rl.env import SchedulingEnv
        from smartsched.rl.policy import RLScheduler

        env = SchedulingEnv({"cluster": "small", "hours": 1})
        module = _module_for(env, None)
        from smartsched.rl.artifact import export_module

        tmp = tempfile.mkdtemp(prefix="smartsched_untrained_")
        export_module(module, Path(tmp))
        return RLScheduler(tmp)


def run_rl_bench(policy: str | None, echo: Callable[[str], Any] = print,
                 skip_sampling: bool = False,
                 envs_per_runner: tuple[int, ...] = (1, 8, 32, 64),
                 rounds: int = 5, latency_only: bool = False,
                 sizes: tuple[int, ...] = (1500, 5000)) -> dict[str, Any]:
    from smartsched.model.errors import ValidationError

    res: dict[str, Any] = {"policy": policy or "untrained module (same architecture)"}
    if policy and not latency_only:
        from smartsched.rl.policy import make_rl_scheduler

        if "?" in policy:
            raise ValidationError("policy", "options (after '?') are measured by the "
                                  "latency part alone: add --latency-only")
        if make_rl_scheduler(policy, 42).shortlist is not None:
            raise ValidationError("policy", "a policy trained within a shortlist (base=) "
                                  "is measured by the latency part alone: add "
                                  "--latency-only")
    if not latency_only:
        split = env_and_model_split(policy)
        res["in_process"] = split
        echo(f"in-process env+policy: {split['steps_per_second']:.0f} steps/s; time in the "
             f"twin {100 * split['twin_share']:.0f} %, in the model "
             f"{100 * split['model_share']:.0f} %")
    if not skip_sampling and not latency_only:
        res["rllib_sampling"] = []
        for envs in envs_per_runner:  # 1: one twin per runner; more: batched forward passes
            samp = rllib_sampling(num_envs_per_env_runner=envs, rounds=rounds)
            res["rllib_sampling"].append(samp)
            r = samp["rounds_steps_per_second"]
            echo(f"RLlib sampling with {samp['env_runners']} env runners x {envs} env(s): "
                 f"{samp['steps_per_second']:.0f} env steps/s (rounds {min(r):.0f}-{max(r):.0f})")
        best = max(res["rllib_sampling"], key=lambda x: x["steps_per_second"])
        res["sampling_target"] = {"steps_per_second": SAMPLING_TARGET,
                                  "best": best["steps_per_second"],
                                  "envs_per_runner": best["envs_per_runner"],
                                  "met": best["steps_per_second"] >= SAMPLING_TARGET}
        echo(f"best: {best['steps_per_second']:.0f} env steps/s with {best['envs_per_runner']} "
             f"env(s) per runner (target {SAMPLING_TARGET:.0f}: "
             f"{'met' if res['sampling_target']['met'] else 'not met'})")
    for n in dict.fromkeys(sizes):  # each size once
        lat = inference_latency(policy, n)
        res[f"inference_{n}"] = lat
        where = (f" ({lat['decisions']} decisions the policy chose in, {lat['workload']} "
                 "workload)" if "workload" in lat else "")
        echo(f"inference at {n} nodes: p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms "
             f"per decision{where} (first call {lat['first_ms']:.0f} ms builds the policy's "
             "caches)")
    return res
