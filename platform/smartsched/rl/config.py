"""The training configuration file (YAML) and its validation.

Owns the schema of ``rllib_configs/*.yaml``: env settings (see
``rl.env.EnvConfig``), PPO knobs passed through to RLlib, model settings,
iterations, checkpoint cadence and the output directory. Errors name the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from smartsched.model.configfile import read_config, validate
from smartsched.model.errors import ValidationError

MAX_BATCH = 10_000_000  # environment steps per training iteration
MAX_CPUS = 100_000  # what Ray may be told this machine has


class EnvRunners(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_env_runners: int = Field(1, ge=0, le=256)
    num_envs_per_env_runner: int = Field(1, ge=1, le=256)
    rollout_fragment_length: Annotated[int, Field(ge=1, le=1_000_000)] | Literal["auto"] = "auto"
    sample_timeout_s: float = Field(300.0, gt=0, le=86_400, allow_inf_nan=False)


class Training(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Bounded like rollout_fragment_length: 10**30 steps per iteration passed validation
    # and sampled for ever.
    train_batch_size_per_learner: int = Field(2000, ge=8, le=MAX_BATCH)
    minibatch_size: int = Field(250, ge=1)
    num_epochs: int = Field(6, ge=1, le=100)
    lr: float = Field(3e-4, gt=0, le=1)
    gamma: float = Field(0.99, ge=0, le=1)
    lambda_: float = Field(0.95, ge=0, le=1)
    # Finite: an infinite coefficient makes every loss inf or NaN, and training then runs
    # to the end writing a policy of NaN weights.
    entropy_coeff: float = Field(0.01, ge=0, le=1e6, allow_inf_nan=False)
    vf_loss_coeff: float = Field(0.5, ge=0, le=1e6, allow_inf_nan=False)
    grad_clip: float | None = Field(0.5, gt=0, allow_inf_nan=False)


# The widest layer a policy may declare (training configs and exported specs alike).
MAX_WIDTH = 4096


class Model(BaseModel):
    """``NodeScorerModule``'s settings (``rl.module``): widths and switches."""

    model_config = ConfigDict(extra="forbid")
    hidden: int = Field(64, ge=1, le=MAX_WIDTH)
    topology: bool = True
    topology_dim: int = Field(32, ge=1, le=MAX_WIDTH)
    heuristic_prior: bool = False
    prior_scale: float = Field(10.0, gt=0, le=1e6, allow_inf_nan=False)
    vf_share_layers: bool = False


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    env: dict[str, Any] = Field(default_factory=dict)
    env_runners: EnvRunners = EnvRunners()
    training: Training = Training()
    model: dict[str, Any] = Field(default_factory=lambda: {"hidden": 64})
    iterations: int = Field(30, ge=1, le=1_000_000)
    checkpoint_every: int = Field(5, ge=1)
    seed: int = Field(0, ge=0)
    output_dir: str = Field("runs/ppo", min_length=1)  # "" was the working directory
    num_cpus: int | None = Field(None, ge=1, le=MAX_CPUS)
    # Start from this exported policy's weights (fine-tuning) instead of from scratch.
    init_policy: str | None = None


def load_train_config(path: str | Path) -> TrainConfig:
    path = Path(path)
    cfg = validate(TrainConfig, read_config(path, "config"), source=str(path),
                   drop=("constrained-int",))
    if cfg.training.minibatch_size > cfg.training.train_batch_size_per_learner:
        raise ValidationError("training.minibatch_size", "must be <= train_batch_size_per_learner",
                              source=str(path))
    check_train_config(cfg, str(path))
    return cfg


def check_train_config(cfg: TrainConfig, source: str | None = None) -> None:
    """What RLlib's env runners and learner would otherwise find in a remote process (a
    traceback from a Ray worker): the model's settings, and the env's, by building one
    env here and resetting it (a day on the first cluster's warm-up: a second or two)."""
    validate(Model, cfg.model, prefix="model", source=source)
    from smartsched.rl.env import SchedulingEnv

    try:
        SchedulingEnv(cfg.env).reset(seed=cfg.seed)
    except ValidationError as e:
        field = e.field if e.field.startswith("env.") else f"env.{e.field}"
        raise ValidationError(field, e.message, source=source) from None
