"""The training configuration file (YAML) and its validation.

Owns the schema of ``rllib_configs/*.yaml``: env settings (see
``rl.env.EnvConfig``), PPO knobs passed through to RLlib, model settings,
iterations, checkpoint cadence and the output directory. Errors name the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from smartsched.model.configfile import read_yaml, validate
from smartsched.model.errors import ValidationError


class EnvRunners(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_env_runners: int = Field(1, ge=0, le=256)
    num_envs_per_env_runner: int = Field(1, ge=1, le=256)
    rollout_fragment_length: int | Literal["auto"] = "auto"
    sample_timeout_s: float = Field(300.0, gt=0)


class Training(BaseModel):
    model_config = ConfigDict(extra="forbid")
    train_batch_size_per_learner: int = Field(2000, ge=8)
    minibatch_size: int = Field(250, ge=1)
    num_epochs: int = Field(6, ge=1, le=100)
    lr: float = Field(3e-4, gt=0, le=1)
    gamma: float = Field(0.99, ge=0, le=1)
    lambda_: float = Field(0.95, ge=0, le=1)
    entropy_coeff: float = Field(0.01, ge=0)
    vf_loss_coeff: float = Field(0.5, ge=0)
    grad_clip: float | None = Field(0.5, gt=0)


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    env: dict[str, Any] = Field(default_factory=dict)
    env_runners: EnvRunners = EnvRunners()
    training: Training = Training()
    model: dict[str, Any] = Field(default_factory=lambda: {"hidden": 64})
    iterations: int = Field(30, ge=1, le=1_000_000)
    checkpoint_every: int = Field(5, ge=1)
    seed: int = Field(0, ge=0)
    output_dir: str = "runs/ppo"
    num_cpus: int | None = Field(None, ge=1)
    # Start from this exported policy's weights (fine-tuning) instead of from scratch.
    init_policy: str | None = None


def load_train_config(path: str | Path) -> TrainConfig:
    path = Path(path)
    cfg = validate(TrainConfig, read_yaml(path, "config"), source=str(path))
    if cfg.training.minibatch_size > cfg.training.train_batch_size_per_learner:
        raise ValidationError("training.minibatch_size", "must be <= train_batch_size_per_learner",
                              source=str(path))
    from smartsched.rl.env import EnvConfig

    EnvConfig.from_dict(cfg.env)  # validate env keys now, not in a remote runner
    return cfg
