"""The sweep file (``tune_sweeps/*.yaml``) of ``smartsched tune`` and its validation.

Owns the schema of a reward-weight search: which PPO config each trial trains
(and what it overrides), which reward weights are searched and over what
ranges, how a trained policy is evaluated on held-out twin seeds, which
evaluated metrics are the objectives of the Pareto front, the searcher, ASHA
early stopping and the budget. Errors name the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from smartsched.model.configfile import read_yaml, validate
from smartsched.model.errors import ValidationError
from smartsched.objectives.reward import COMPONENTS, RewardWeights

MAX_SEED = 2**32 - 1  # Optuna's TPESampler (numpy) takes seeds in 0..2**32-1


class Range(BaseModel):
    """A searched weight: uniform (or log-uniform) on [low, high]."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    low: float = Field(ge=0, le=100)
    high: float = Field(gt=0, le=100)
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.high <= self.low:
            raise ValueError("high must be > low")
        if self.log and self.low <= 0:
            raise ValueError("log ranges need low > 0")
        return self


class Objective(BaseModel):
    """An evaluated metric of the policy: a dotted path into the simulate report's
    ``metrics`` (a list of paths is averaged), whether more is better, and the
    reward component it measures (used to pick each scenario's weights)."""

    model_config = ConfigDict(extra="forbid")
    metric: str | list[str]
    mode: Literal["max", "min"]
    component: str

    @field_validator("component")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in COMPONENTS:
            raise ValueError(f"unknown component {v!r} (known: {', '.join(COMPONENTS)})")
        return v

    @field_validator("metric")
    @classmethod
    def _paths(cls, v: str | list[str]) -> str | list[str]:
        # Checked here, not after the baseline's runs: an empty list would average nothing
        # (a division by zero) and an empty path segment names no metric.
        paths = [v] if isinstance(v, str) else v
        if not paths:
            raise ValueError("give at least one metric path (a list is averaged)")
        for p in paths:
            if not p or any(not part for part in p.split(".")):
                raise ValueError(f"not a dotted metric path: {p!r} (e.g. pods.waiting_pod_hours)")
        return v

    def paths(self) -> list[str]:
        return [self.metric] if isinstance(self.metric, str) else list(self.metric)


class Evaluation(BaseModel):
    """Held-out twin runs each trained policy (and the baseline) is measured on."""

    model_config = ConfigDict(extra="forbid")
    cluster: str = "small"
    workload: str = "mixed"
    hours: float = Field(12.0, gt=0, le=24 * 14)
    warmup_hours: float = Field(2.0, ge=0, le=48)
    seeds: list[int] = Field(default_factory=lambda: [20000, 20001], min_length=1)
    baseline: str = "k8s-default"
    # Options of the trained policy as a scheduler (rl:PATH?<options>), e.g. "defer=false".
    policy_options: str = ""


def _weight_kind(v: Any) -> str:
    """Which member of a searched weight ``v`` is: a mapping is a ``Range``, anything else a
    fixed number -- so a bad range reports why (``high must be > low``) rather than the
    fixed member's "Input should be a valid number"."""
    return "Range" if isinstance(v, dict | Range) else "float"


SearchedWeight = Annotated[Annotated[float, Tag("float")] | Annotated[Range, Tag("Range")],
                           Discriminator(_weight_kind)]


class Asha(BaseModel):
    model_config = ConfigDict(extra="forbid")
    grace_period: int = Field(1, ge=1)
    reduction_factor: float = Field(2.0, gt=1)


class SweepConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    train_config: str = "rllib_configs/ppo_default.yaml"
    train_overrides: dict[str, Any] = Field(default_factory=dict)
    init_policy: str | None = None
    search_space: dict[str, SearchedWeight]
    objectives: dict[str, Objective] = Field(min_length=2)
    evaluation: Evaluation = Evaluation()
    num_samples: int = Field(8, ge=1, le=100_000)
    max_concurrent: int = Field(2, ge=1, le=10_000)
    reports: int = Field(2, ge=1, le=1000)  # evaluation rounds per trial (ASHA rungs)
    iterations_per_report: int = Field(5, ge=1, le=100_000)
    searcher: Literal["optuna", "random"] = "optuna"
    asha: Asha | None = Asha()
    trial_cpus: float = Field(1.0, gt=0, le=1024)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    output_dir: str = "runs/tune"

    @field_validator("search_space")
    @classmethod
    def _components(cls, v: dict[str, float | Range]) -> dict[str, float | Range]:
        for name, spec in v.items():
            if name not in COMPONENTS:
                raise ValueError(f"unknown component {name!r} (known: {', '.join(COMPONENTS)})")
            if isinstance(spec, float | int) and not 0 <= spec <= 100:
                raise ValueError(f"{name}: a fixed weight must be within [0, 100]")
        if not any(isinstance(s, Range) for s in v.values()):
            raise ValueError("nothing to search: give at least one component a {low, high} range")
        return v

    def searched(self) -> dict[str, Range]:
        return {k: v for k, v in self.search_space.items() if isinstance(v, Range)}

    def weights_of(self, params: dict[str, float]) -> dict[str, float]:
        """The full weight vector of a trial: searched values, fixed values, else defaults."""
        default = RewardWeights()
        out = {}
        for c in COMPONENTS:
            spec = self.search_space.get(c)
            if isinstance(spec, Range):
                out[c] = float(params[c])
            elif spec is not None:
                out[c] = float(spec)
            else:
                out[c] = float(getattr(default, c))
        return out


def load_sweep(path: str | Path) -> SweepConfig:
    path = Path(path)
    # A searched weight is `float | Range`: pydantic puts the member type in the path.
    sweep = validate(SweepConfig, read_yaml(path, "sweep"), prefix="sweep", source=str(path),
                     drop=("float", "Range"))
    check_policy_options(sweep.evaluation.policy_options, str(path))
    return sweep


def check_policy_options(options: str, source: str | None = None) -> None:
    """``evaluation.policy_options`` read as the ``rl:`` loader reads them, before the
    baseline runs and Ray starts: otherwise a typo fails in every trial, after its training.

    There is no trained policy yet, so the loader is handed an empty folder: it reads the
    options first (an error names ``scheduler.<option>``) and only then looks for the
    policy (an error naming ``scheduler``: the options were fine). The values the loader
    checks only once a policy is loaded -- the ``weights`` scenario and the ``filters`` /
    ``base`` profiles -- are built here too."""
    if not options:
        return
    import tempfile
    from urllib.parse import parse_qs

    from smartsched.objectives.scenarios import scenario
    from smartsched.rl.policy import make_rl_scheduler
    from smartsched.scheduling.registry import load_profile

    field = "sweep.evaluation.policy_options"
    with tempfile.TemporaryDirectory() as empty:
        try:
            make_rl_scheduler(f"{empty}?{options}", 0)
        except ValidationError as e:
            if e.field != "scheduler":
                raise ValidationError(field, f"{e.field.removeprefix('scheduler.')}: "
                                      f"{e.message}", source=source) from None
    opts = parse_qs(options, keep_blank_values=True)
    for name, check in (("weights", scenario), ("filters", load_profile),
                        ("base", load_profile)):
        if name in opts:
            try:
                check(opts[name][-1])
            except ValidationError as e:
                raise ValidationError(field, f"{name}: {e.message}", source=source) from None


