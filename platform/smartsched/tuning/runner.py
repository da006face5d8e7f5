"""``smartsched tune``: a Ray Tune search over reward weights, ending in a Pareto front.

Owns the experiment. Each trial trains PPO (``rl.train.build_ppo_config``,
optionally starting from a shared policy) with one weight vector; every
``iterations_per_report`` iterations it exports the policy and evaluates it
as the scheduler ``rl:<policy>`` on held-out twin seeds through
``scheduling.run.build_run`` -- the same runs and metrics every scheduler is
judged by -- and
reports each objective, the training return and a scalar ``score`` (the mean
signed relative change against the baseline scheduler) that only ASHA uses
to stop trials that lag. The searcher is Optuna's multi-objective TPE (via
Tune's OptunaSearch) over the objectives themselves, or random search.

Layout of ``output_dir``::

    tune/                   Tune's experiment: one folder per trial with its
                            TensorBoard event files, results and policy checkpoints
    baseline.json           the baseline scheduler's objectives on the same seeds
    pareto.md, pareto.csv   every trial, Pareto trials first
    pareto.png              the front, one panel per pair of objectives
    recommended_weights.yaml  the chosen weights per scenario profile
    summary.json            all of the above as data
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smartsched.model.configfile import deep_merge
from smartsched.model.errors import ValidationError
from smartsched.objectives.reward import COMPONENTS
from smartsched.outputs import json_text
from smartsched.tuning.sweep import Evaluation, Objective, SweepConfig


def _metric(metrics: dict[str, Any], dotted: str, field: str = "sweep.objectives") -> float:
    """The value at ``dotted`` in a run's report; a missing key is an error named ``field``
    that lists what the report has at that level. (The report's keys depend on the run --
    a class's section exists only when its pods arrived -- so paths cannot be checked
    before the first run; the baseline's first run is the earliest, before Ray starts.)"""
    from smartsched.model.errors import ValidationError

    cur: Any = metrics
    for i, k in enumerate(dotted.split(".")):
        if not isinstance(cur, dict) or k not in cur:
            at = ".".join(dotted.split(".")[:i]) or "the report"
            has = (f"; {at} has: {', '.join(sorted(map(str, cur))) or 'nothing'}"
                   if isinstance(cur, dict) else f"; {at} is a value, not a section")
            raise ValidationError(field, f"no metric {dotted!r} in the report{has}")
        cur = cur[k]
    if isinstance(cur, dict):
        raise ValidationError(field, f"{dotted!r} is a section of the report, not a number "
                              f"(has: {', '.join(sorted(map(str, cur)))})")
    if not isinstance(cur, int | float | None):
        raise ValidationError(field, f"{dotted!r} is not a number in the report")
    return float("nan") if cur is None else float(cur)


def evaluate(scheduler: str, ev: Evaluation, objectives: dict[str, Objective]) -> dict[str, float]:
    """Median over the evaluation seeds of each objective for ``scheduler``."""
    from smartsched.scheduling.run import build_run

    per_seed: dict[str, list[float]] = {k: [] for k in objectives}
    for seed in ev.seeds:
        run = build_run(ev.cluster, ev.workload, scheduler, seed=seed, hours=ev.hours,
                        warmup_hours=ev.warmup_hours)
        run.drive()
        metrics = run.report()
        for name, o in objectives.items():
            vals = [_metric(metrics, p, f"sweep.objectives.{name}.metric")
                    for p in o.paths()]
            per_seed[name].append(sum(vals) / len(vals))
    return {k: float(statistics.median(v)) for k, v in per_seed.items()}


def check_merged_train_config(cfg: Any) -> None:
    """What ``load_train_config`` checks of a training file, on the train config merged with
    the sweep's ``train_overrides`` (which the file's own check never saw): the minibatch
    fits the batch, then the model's and env's settings."""
    from smartsched.model.errors import ValidationError
    from smartsched.rl.config import check_train_config

    if cfg.training.minibatch_size > cfg.training.train_batch_size_per_learner:
        raise ValidationError("training.minibatch_size",
                              f"must be <= train_batch_size_per_learner "
                              f"({cfg.training.minibatch_size} > "
                              f"{cfg.training.train_batch_size_per_learner}, with "
                              "sweep.train_overrides)")
    check_train_config(cfg)


def trial_resources(trial_cpus: float, train_doc: dict[str, Any]) -> Any:
    """What one trial reserves: ``trial_cpus`` for its own process (the learner, and the
    sampling when there are no env runners), plus one CPU per remote env runner, as one
    placement group -- Tune starts the runners inside it, so a trial never waits for CPUs
    that other trials hold (the way RLlib's own Algorithm trials reserve)."""
    from ray import tune

    runners = int(train_doc.get("env_runners", {}).get("num_env_runners", 0) or 0)
    if runners == 0:
        return {"cpu": trial_cpus}
    return tune.PlacementGroupFactory([{"CPU": trial_cpus}] + [{"CPU": 1.0}] * runners)


def _trial(config: dict[str, Any], sweep_doc: dict[str, Any], train_doc: dict[str, Any],
           base: dict[str, float]) -> None:
    """One Tune trial: train with this weight vector, evaluate, report (function trainable)."""
    import math

    import torch
    from ray import tune

    from smartsched.rl.config import TrainConfig
    from smartsched.rl.train import build_algo, export_policy, observing_as_init
    from smartsched.tuning.pareto import relative

    torch.set_num_threads(1)  # trials share the machine's cores
    sweep = SweepConfig.model_validate(sweep_doc)
    trial_dir = Path(tune.get_context().get_trial_dir()) / "work"
    weights = sweep.weights_of(config)
    doc = deep_merge(train_doc, {"env": {"reward_weights": weights, "weight_sampling": "none",
                                         "dynamic_weights": False}})
    if sweep.init_policy:
        doc["init_policy"] = sweep.init_policy
    cfg = observing_as_init(TrainConfig.model_validate(doc))  # the export records it too
    algo = build_algo(cfg)
    try:
        for _ in range(sweep.reports):
            ret = float("nan")
            for _ in range(sweep.iterations_per_report):
                result = algo.train()
                r = result.get("env_runners", {}).get("episode_return_mean")
                ret = float(r) if r is not None else ret
            it = int(algo.iteration)
            ckpt = trial_dir / "algo"
            algo.save_to_path(str(ckpt))
            policy = export_policy(ckpt, trial_dir, cfg, it)
            opts = sweep.evaluation.policy_options
            values = evaluate(f"rl:{policy}{'?' + opts if opts else ''}", sweep.evaluation,
                              sweep.objectives)
            rel = relative(values, base, sweep.objectives)
            finite = [v for v in rel.values() if math.isfinite(v)]
            metrics = {**values, "score": sum(finite) / max(len(finite), 1),
                       "episode_return_mean": ret, "ppo_iterations": it,
                       **{f"weight_{c}": w for c, w in weights.items()}}
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(str(policy)))
    finally:
        algo.stop()


def _searcher(sweep: SweepConfig) -> Any:
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter

    names = list(sweep.objectives)
    modes = [o.mode for o in sweep.objectives.values()]
    if sweep.searcher == "random":
        return None
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    space = {k: (tune.loguniform(r.low, r.high) if r.log else tune.uniform(r.low, r.high))
             for k, r in sweep.searched().items()}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    search = OptunaSearch(space=space, metric=names, mode=modes,
                          sampler=optuna.samplers.TPESampler(seed=sweep.seed))
    return ConcurrencyLimiter(search, max_concurrent=sweep.max_concurrent)


# What a sweep writes into its output folder: a folder holding any of them holds an
# earlier sweep's results, replaced only when asked (``overwrite``).
SWEEP_FILES = ("summary.json", "baseline.json", "pareto.md", "pareto.csv",
               "recommended_weights.yaml")


def run_sweep(sweep_path: str | Path, *, num_samples: int | None = None,
              output_dir: str | None = None, overwrite: bool = False,
              echo: Callable[[str], Any] = print) -> dict[str, Any]:
    """Run the sweep; write the Pareto table, plot and recommended weights; return a summary.
    An output folder holding an earlier sweep's results is refused unless ``overwrite``."""
    from smartsched.objectives.scenarios import load_scenarios
    from smartsched.rl.config import load_train_config
    from smartsched.rl.train import _init_ray, require_cpus
    from smartsched.tuning import pareto
    from smartsched.tuning.sweep import load_sweep

    sweep = load_sweep(sweep_path)
    if num_samples is not None:
        sweep = sweep.model_copy(update={"num_samples": num_samples})
    train_cfg = load_train_config(sweep.train_config)
    train_doc = deep_merge(train_cfg.model_dump(), sweep.train_overrides)
    # Trials run in their own working directories: make local paths absolute here.
    if sweep.init_policy:
        from smartsched.rl.policy import resolve_policy_dir

        sweep = sweep.model_copy(update={"init_policy": str(resolve_policy_dir(
            sweep.init_policy))})
    def local(c: Any) -> Any:  # a cluster file here -> its absolute path; presets stay
        return str(Path(c).resolve()) if isinstance(c, str) and Path(c).exists() else c

    ev = sweep.evaluation
    sweep = sweep.model_copy(update={"evaluation": ev.model_copy(update={
        "cluster": local(ev.cluster)})})
    env = train_doc.get("env", {})
    if "cluster" in env:  # one, or a list drawn per episode
        c = env["cluster"]
        env["cluster"] = [local(x) for x in c] if isinstance(c, list) else local(c)
    from smartsched.model.configfile import validate
    from smartsched.rl.config import TrainConfig

    # A bad override fails here, named, not as a traceback in every trial.
    check_merged_train_config(validate(TrainConfig, train_doc))
    runners = int(train_doc.get("env_runners", {}).get("num_env_runners", 0) or 0)
    trial_cpus = (sweep.trial_cpus + runners, "sweep.trial_cpus", f"each trial: "
                  f"{sweep.trial_cpus:g} of its own and 1 for each of its {runners} env "
                  "runners")
    require_cpus(*trial_cpus, num_cpus=train_cfg.num_cpus, echo=echo)  # before the baseline
    out = Path(output_dir or sweep.output_dir).resolve()
    held = [f for f in SWEEP_FILES if (out / f).exists()]
    if held and not overwrite:  # baseline.json was replaced before the first trial ran
        raise ValidationError("output_dir", f"{out} holds an earlier sweep's results "
                              f"({held[0]}): pass --overwrite to replace them, or give "
                              "another --output-dir")
    out.mkdir(parents=True, exist_ok=True)

    echo(f"baseline {sweep.evaluation.baseline} on {sweep.evaluation.cluster}, "
         f"seeds {sweep.evaluation.seeds} ...")
    base = evaluate(sweep.evaluation.baseline, sweep.evaluation, sweep.objectives)
    (out / "baseline.json").write_text(json_text(base))  # strict JSON: NaN is null

    _init_ray(out, train_cfg.num_cpus)
    require_cpus(*trial_cpus, echo=echo)
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    searched = sweep.searched()
    param_space = ({} if sweep.searcher == "optuna" else
                   {k: (tune.loguniform(r.low, r.high) if r.log else tune.uniform(r.low, r.high))
                    for k, r in searched.items()})
    scheduler = None
    if sweep.asha is not None:
        scheduler = ASHAScheduler(time_attr="training_iteration", metric="score", mode="max",
                                  max_t=sweep.reports, grace_period=sweep.asha.grace_period,
                                  reduction_factor=sweep.asha.reduction_factor)
    trainable = tune.with_resources(
        tune.with_parameters(_trial, sweep_doc=sweep.model_dump(), train_doc=train_doc,
                             base=base),
        trial_resources(sweep.trial_cpus, train_doc))
    tuner = tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(search_alg=_searcher(sweep), scheduler=scheduler,
                                    num_samples=sweep.num_samples,
                                    max_concurrent_trials=sweep.max_concurrent),
        run_config=tune.RunConfig(storage_path=str(out), name="tune", verbose=1),
    )
    echo(f"{sweep.num_samples} trials x up to {sweep.reports * sweep.iterations_per_report} "
         f"PPO iterations, {sweep.max_concurrent} at a time; Tune logs under {out / 'tune'}")
    grid = tuner.fit()

    rows: list[dict[str, Any]] = []
    for res in grid:
        m = res.metrics or {}
        if res.error is not None or not all(k in m for k in sweep.objectives):
            echo(f"trial {getattr(res, 'path', '?')} reported nothing usable: {res.error}")
            continue
        values = {k: float(m[k]) for k in sweep.objectives}
        rows.append({
            "trial": str(m.get("trial_id", Path(res.path).name)),
            "weights": {c: float(m[f"weight_{c}"]) for c in COMPONENTS},
            "values": values,
            "relative": pareto.relative(values, base, sweep.objectives),
            "base": base,
            "iterations": int(m.get("ppo_iterations", 0)),
            "checkpoint": res.checkpoint.path if res.checkpoint else None,
        })
    if not rows:
        from smartsched.model.errors import SmartSchedError

        raise SmartSchedError(f"no trial finished; see the Tune logs under {out / 'tune'}")
    import numpy as np

    mask = pareto.pareto_mask(np.array([[r["values"][k] for k in sweep.objectives]
                                        for r in rows]),
                              [o.mode for o in sweep.objectives.values()])
    for r, p in zip(rows, mask, strict=True):
        r["pareto"] = bool(p)
    baseline = sweep.evaluation.baseline
    table = pareto.markdown_table(rows, sweep.objectives, base, baseline)
    (out / "pareto.md").write_text(table)
    pareto.write_csv(out / "pareto.csv", rows, sweep.objectives)
    pareto.plot_front(out / "pareto.png", rows, sweep.objectives, base, baseline)
    recs = pareto.recommend(rows, sweep.objectives, load_scenarios())
    (out / "recommended_weights.yaml").write_text(
        pareto.recommendations_yaml(recs, sweep.objectives, baseline))
    summary = {"output_dir": str(out), "baseline": {"scheduler": baseline, **base},
               "trials": rows,
               "recommended": {k: {"trial": v["trial"], "score": v["score"],
                                   "weights": v["row"]["weights"]} for k, v in recs.items()}}
    (out / "summary.json").write_text(json_text(summary))
    echo(table)
    echo("recommended per scenario: " + ", ".join(f"{k} -> {v['trial']}"
                                                  for k, v in recs.items()))
    echo(f"wrote {out / 'pareto.md'}, pareto.png, recommended_weights.yaml; "
         f"tensorboard --logdir {out / 'tune'}")
    return summary
