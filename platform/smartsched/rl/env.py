"""SchedulingEnv: a gymnasium env over the twin, one step per placement decision.

Owns the RL view of the twin's step-wise API. Each step offers one pod; the
action is a node index (or "defer" for deferrable work); the observation is
per-node features, pod features, the action mask from the scheduling
framework's filters (the policy can never pick an infeasible node) and the
reward-weight vector. Pods that fit nowhere are rejected by the env itself
(with the filters' reasons), so every observation offers a real choice.

The config is a plain dict (``EnvConfig`` documents its keys) so RLlib can
build the env in every env runner.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from smartsched.objectives.reward import COMPONENTS, RewardWeights, StepReward
from smartsched.rl.observation import POD_FEATURES, Observer, node_columns
from smartsched.rl.shortlist import Shortlist
from smartsched.scheduling.base import TwinNeeds
from smartsched.scheduling.framework import ProfileScheduler
from smartsched.scheduling.plugins.gpu import FGD
from smartsched.scheduling.profile_doc import parse_profile
from smartsched.scheduling.registry import build_profile, read_profile_doc
from smartsched.scheduling.run import build_run, cached_forecaster, cached_projection
from smartsched.twin.decision import Decision, DecisionRequest, can_defer
from smartsched.twin.engine import Engine

OBS_LOW, OBS_HIGH = -10.0, 10.0
SHORTLIST_FIELDS = ("env.base", "env.shortlist_k", "env.shortlist_classes")


@dataclass
class EnvConfig:
    """Settings of one SchedulingEnv.

    Attributes:
        cluster: preset name or cluster file, or a list of them: each episode then draws
            one (training across cluster sizes; observations are padded to the largest).
        workload: workload spec (``mixed``, ``openb:<variant>``, a file).
        mode: "replay" or "fill".
        hours: simulated hours per episode (replay).
        warmup_hours: simulated before decisions count (placed by ``warmup_scheduler``),
            or a list of them, one drawn per episode: the episode then starts at that hour
            of the workload's day (a diurnal workload's evening peak is in some episodes,
            the night in others).
        seed: base seed; episode k uses seed + k unless reset() gets a seed.
        max_nodes: observation size (padded); default the cluster's node count.
        max_decisions: truncate an episode after this many decisions.
        reward_weights: component -> weight (see objectives.reward), or the name of a
            scenario profile (objectives/profiles/scenarios.yaml).
        weight_sampling: "none", or "scenarios" to draw a scenario profile per episode
            (one policy learns every weighting; the weights are in the observation).
        dynamic_weights: move the weights with the cluster's condition during an
            episode (objectives.dynamic); every change is logged in ``weights_log``.
        filters_profile: profile whose filters give the action mask and binder.
        heuristic_features: include the FGD score as a node feature.
        inflate: fill-mode demand.
        forecaster: a load forecaster (``models/forecast``, optionally ``?plan=median``)
            attached to the twin in replay mode; its per-node predicted CPU and memory
            use become two extra node-feature columns (features.FORECAST_COLS), and a
            policy trained with it carries the same forecaster at inference.
        engine: other twin settings for every episode (``EngineConfig`` fields, e.g.
            ``{node_mtbf_hours: 3, repair_s: 1200}`` to train with node failures).
            ``report_metrics`` is false unless set here: the reward needs none of the
            run report's figures.
        telemetry: a telemetry projection folder (``smartsched telemetry reduce``); the
            twin synthesizes each node's wide telemetry at every tick and the projection's
            k components become k more node-feature columns (carried by the export too).
        base: train within a heuristic's shortlist (issue 17): this profile (a split
            such as ``composite`` too) runs the twin -- warm-up, routes, filters,
            preemption, gang reservations, descheduling -- and wherever it places a pod
            the policy picks among its ``shortlist_k`` best-scored nodes (the action mask;
            the base's own choice always in it); rejections, deferrals and preemptions
            stay the base's and are not steps. ``filters_profile`` is then unused.
        shortlist_k: nodes in the shortlist (with ``base``).
        shortlist_classes: pod classes the policy steers (None: all; others the base
            places alone).
        observed_components: how many reward weights the observation carries (the first
            n of ``objectives.reward.COMPONENTS``; None: all). Components are only ever
            appended, so a policy exported before the last ones were added observes a
            prefix; fine-tuning it sets this to its count (``rl.train``). The reward
            still weighs every component.
    """

    cluster: str | list[str] = "small"
    workload: str = "mixed"
    mode: str = "replay"
    hours: float = 6.0
    warmup_hours: float | list[float] = 0.0
    seed: int = 0
    max_nodes: int | None = None
    max_decisions: int | None = 2000
    reward_weights: dict[str, float] | str = field(default_factory=dict)
    weight_sampling: str = "none"
    dynamic_weights: bool = False
    filters_profile: str = "k8s-default"
    heuristic_features: bool = True
    inflate: float = 1.3
    forecaster: str | None = None
    telemetry: str | None = None
    engine: dict[str, Any] = field(default_factory=dict)
    base: str | None = None
    shortlist_k: int = 3
    shortlist_classes: list[str] | None = None
    observed_components: int | None = None

    @staticmethod
    def from_dict(d: dict[str, Any] | None) -> EnvConfig:
        d = dict(d or {})
        known = set(EnvConfig.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            from smartsched.model.errors import ValidationError

            raise ValidationError(f"env.{sorted(unknown)[0]}", "unknown field")
        if d.get("base") is None:
            # Without a base there is no shortlist: a k or classes given alone would train
            # the policy over every node while the config reads as a shortlist recipe.
            for key in ("shortlist_k", "shortlist_classes"):
                if d.get(key) is not None:
                    from smartsched.model.errors import ValidationError

                    raise ValidationError(f"env.{key}", "applies only with env.base (the "
                                          "heuristic profile whose shortlist the policy "
                                          "picks from); set env.base or remove it")
        return EnvConfig(**d)


# The largest observation an env pads to: a region of the `large` preset is ~2,000 nodes.
MAX_OBSERVED_NODES = 100_000


def _check_scalars(cfg: EnvConfig, nodes: int) -> None:
    """The env's plain settings, checked where the config is read: a string or a negative
    number here would otherwise fail inside every env runner (``'>=' not supported``) or
    cut each episode after one decision."""
    from smartsched.model.errors import ValidationError

    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if cfg.max_nodes is not None and (not whole(cfg.max_nodes)
                                      or not nodes <= cfg.max_nodes <= MAX_OBSERVED_NODES):
        raise ValidationError("env.max_nodes", f"must be a whole number in [{nodes} (the "
                              f"cluster's nodes), {MAX_OBSERVED_NODES:,}], got "
                              f"{cfg.max_nodes!r}")
    if cfg.max_decisions is not None and (not whole(cfg.max_decisions)
                                          or not 1 <= cfg.max_decisions <= 10**8):
        raise ValidationError("env.max_decisions", "must be a whole number in [1, 1e8] or "
                              f"null (no limit), got {cfg.max_decisions!r}")
    if not whole(cfg.seed) or not 0 <= cfg.seed <= 2**32 - 1:
        raise ValidationError("env.seed", f"must be a whole number in [0, 2**32 - 1], got "
                              f"{cfg.seed!r}")
    for name in ("heuristic_features", "dynamic_weights"):
        if not isinstance(getattr(cfg, name), bool):
            raise ValidationError(f"env.{name}", f"must be true or false, got "
                                  f"{getattr(cfg, name)!r}")
    if not isinstance(cfg.engine, dict):
        raise ValidationError("env.engine", f"must be a mapping of twin settings, got "
                              f"{cfg.engine!r}")
    # Names the env hands to loaders that take text (a workload spec, a profile, a folder):
    # a number or a list there was a TypeError or AttributeError traceback.
    for name, optional in (("workload", False), ("mode", False), ("filters_profile", False),
                           ("weight_sampling", False), ("forecaster", True),
                           ("telemetry", True), ("base", True)):
        v = getattr(cfg, name)
        if not (v is None and optional) and not (isinstance(v, str) and v):
            raise ValidationError(f"env.{name}", "must be a non-empty name"
                                  + (" or null" if optional else "") + f", got {v!r}")
    rw = cfg.reward_weights
    if not isinstance(rw, dict) and not (isinstance(rw, str) and rw):
        raise ValidationError("env.reward_weights", "must map reward components to weights, "
                              f"or name a scenario profile, got {rw!r}")


class SchedulingEnv(gym.Env):
    """One placement decision per step over a simulated cluster."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, config: dict[str, Any] | EnvConfig | None = None) -> None:
        super().__init__()
        from smartsched.model.presets import load_cluster

        self.cfg = config if isinstance(config, EnvConfig) else EnvConfig.from_dict(
            dict(config or {}))
        names = [self.cfg.cluster] if isinstance(self.cfg.cluster, str) else self.cfg.cluster
        if not isinstance(names, list) or not names or not all(
                isinstance(x, str) for x in names):
            from smartsched.model.errors import ValidationError

            raise ValidationError("env.cluster", "must be a cluster name or file, or a "
                                  "non-empty list of them")
        self.clusters = [load_cluster(x) for x in names]
        self.spec_cluster = self.clusters[0]
        n = max(len(c.nodes) for c in self.clusters)
        _check_scalars(self.cfg, n)
        self.max_nodes = self.cfg.max_nodes or n
        from smartsched.objectives.scenarios import load_scenarios, scenario

        rw = self.cfg.reward_weights
        self.weights = (scenario(rw) if isinstance(rw, str)
                        else RewardWeights.from_mapping(rw or None))
        if self.cfg.weight_sampling not in ("none", "scenarios"):
            from smartsched.model.errors import ValidationError

            raise ValidationError("env.weight_sampling", "must be none or scenarios")
        warm = self.cfg.warmup_hours
        self._warmups = [warm] if not isinstance(warm, list) else list(warm)
        if not self._warmups or not all(
                isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                and 0 <= x <= 24 * 14 for x in self._warmups):
            from smartsched.model.errors import ValidationError

            raise ValidationError("env.warmup_hours", "must be a number of hours in [0, 336] "
                                  "or a non-empty list of them")
        n_obs = self.cfg.observed_components
        if n_obs is not None and (isinstance(n_obs, bool) or not isinstance(n_obs, int)
                                  or not 1 <= n_obs <= len(COMPONENTS)):
            from smartsched.model.errors import ValidationError

            raise ValidationError("env.observed_components",
                                  f"must be an integer in [1, {len(COMPONENTS)}]")
        self.n_observed = len(COMPONENTS) if n_obs is None else n_obs
        self.scenarios = load_scenarios()
        # Cross-zone traffic costs the twin a little per tick: measured only when weighed.
        reachable = [self.weights]
        if self.cfg.weight_sampling == "scenarios" or self.cfg.dynamic_weights:
            reachable += list(self.scenarios.values())
        self._track_traffic = any(w.traffic > 0 for w in reachable)
        if self.cfg.base is not None:  # checked now: every env runner would fail later
            Shortlist.build(self.cfg.base, self.cfg.shortlist_k, self.cfg.shortlist_classes,
                            0, False, SHORTLIST_FIELDS)
        self.shortlist: Shortlist | None = None
        # The filters profile's document, read and validated once: each episode builds fresh
        # plugins from it (reading the YAML at every reset took a third of a reset).
        self._filters_doc = parse_profile(*read_profile_doc(self.cfg.filters_profile))
        self.base_weights = self.weights
        self.weights_log: list[dict[str, Any]] = []
        # Hooks the twin carries in every episode (loaded once here: errors surface now).
        self.needs = TwinNeeds(forecaster=self.cfg.forecaster, telemetry=self.cfg.telemetry)
        if self.cfg.forecaster is not None:
            cached_forecaster(self.cfg.forecaster)
        self._telemetry_k = cached_projection(self.cfg.telemetry).k if self.cfg.telemetry else 0
        self.node_width = len(node_columns(self.cfg.forecaster is not None, self._telemetry_k))
        self.observation_space = gym.spaces.Dict({
            "nodes": gym.spaces.Box(OBS_LOW, OBS_HIGH, (self.max_nodes, self.node_width),
                                    np.float32),
            "pod": gym.spaces.Box(OBS_LOW, OBS_HIGH, (POD_FEATURES,), np.float32),
            "action_mask": gym.spaces.Box(0.0, 1.0, (self.max_nodes + 1,), np.float32),
            "weights": gym.spaces.Box(0.0, 100.0, (self.n_observed,), np.float32),
        })
        self.action_space = gym.spaces.Discrete(self.max_nodes + 1)  # last = defer
        self.defer_action = self.max_nodes
        self._episode = 0
        self.engine: Engine | None = None
        self.last_components: dict[str, float] = {}

    # ------------------------------------------------------------------ API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        ep_seed = seed if seed is not None else self.cfg.seed + self._episode
        self._episode += 1
        cfg = self.cfg
        if cfg.weight_sampling == "scenarios":
            names = sorted(self.scenarios)
            self.base_weights = self.scenarios[names[int(self.np_random.integers(len(names)))]]
        self.weights = self.base_weights
        warmup = self._warmups[0]
        if len(self._warmups) > 1:  # one start hour per episode, drawn like the weights
            warmup = self._warmups[int(self.np_random.integers(len(self._warmups)))]
        if len(self.clusters) > 1:  # one cluster per episode, drawn like the weights
            self.spec_cluster = self.clusters[int(self.np_random.integers(len(self.clusters)))]
        # The filters profile gives the action mask and binder, and places warm-up pods;
        # with a shortlist's base, the base does all three.
        self.filters = ProfileScheduler(build_profile(self._filters_doc), ep_seed)
        runner: Any = self.filters
        if cfg.base is not None:  # the base profile runs the twin; the policy steers within
            self.shortlist = Shortlist.build(cfg.base, cfg.shortlist_k, cfg.shortlist_classes,
                                             ep_seed, False, SHORTLIST_FIELDS)
            runner = self.shortlist.base
        self.run = build_run(self.spec_cluster, cfg.workload, runner, mode=cfg.mode,
                             seed=ep_seed, hours=cfg.hours, warmup_hours=float(warmup),
                             inflate=cfg.inflate,
                             # The reward reads only the snapshot: skip the report's figures.
                             engine_overrides={"report_metrics": False,
                                               "track_traffic": self._track_traffic,
                                               **cfg.engine},
                             needs=self.needs)
        self.engine = self.run.engine
        fgd = None
        if cfg.heuristic_features:
            fgd = FGD()
            fgd.prepare(self.engine.source_pods)
        st = self.engine.state
        self.observer = Observer(self.spec_cluster, st, fgd,
                                 forecast=cfg.forecaster is not None,
                                 telemetry_k=self._telemetry_k, max_nodes=self.max_nodes)
        m = self.engine.metrics
        self.reward_fn = StepReward(
            self.weights, st.num_nodes, cost_per_hour=float(m.node_price_h.sum()),
            idle_watts=float(m.node_idle_w.sum()), fill_mode=cfg.mode == "fill",
        )
        self.decisions = 0
        self.weights_log = []
        self._dynamic = None
        if cfg.dynamic_weights:
            from smartsched.objectives.dynamic import DynamicRules, DynamicWeights
            from smartsched.twin.podtable import PENDING

            base = "custom"
            profiles = {**self.scenarios, base: self.base_weights}
            self._dynamic = DynamicWeights(DynamicRules(base=base), profiles)
            tb = self.engine.table
            online = tb.cls == 0  # PodClass.ONLINE is the first class
            self._online_arrivals = np.sort(tb.arrival[online])
            self._ai = tb.cls == 2  # PodClass.AI_TRAIN
            self._pending = PENDING
            self._last_rule_eval = -np.inf
        self._advance_warmup()
        self._rejected: list[dict[str, Any]] = []
        self._base_decision: Decision | None = None
        self._binder: Any = None
        obs = self._next_observation()
        self.reward_fn(self.engine.metrics.snapshot())  # baseline for the first step
        return obs, {"seed": ep_seed}

    def step(
        self, action: int
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        assert self.engine is not None and self._req is not None, "call reset() first"
        a = int(action)
        penalty = 0.0
        binder = self._binder
        if a == self.defer_action and self._mask[-1]:
            decision = Decision(None, defer=True)
        elif self._base_decision is not None and a == self._base_decision.node:
            decision = self._base_decision  # the base's own choice, its devices too
        elif 0 <= a < self.engine.state.num_nodes and self._mask[a]:
            devices = None
            if binder is not None:
                devices = binder.devices(self._ctx, a)
            decision = Decision(a, devices)
        else:  # a masked action: refuse it and teach the policy so
            decision = Decision.reject("policy chose an infeasible node")
            penalty = -1.0
        self._rejected = []
        self.engine.apply(decision)
        self.decisions += 1
        self._update_dynamic_weights()
        obs = self._next_observation()
        reward, comp = self.reward_fn(self.engine.metrics.snapshot())
        self.last_components = comp
        terminated = self._req is None
        limit = self.cfg.max_decisions
        truncated = not terminated and limit is not None and self.decisions >= limit
        # Pods the env itself rejected since the last step (none fit), and which plugins did.
        info = {"components": comp, "rejected": self._rejected}
        return obs, float(reward + penalty), terminated, truncated, info

    # ------------------------------------------------------------ internals
    def _update_dynamic_weights(self, every_s: float = 300.0) -> None:
        """Re-evaluate the dynamic rules every ``every_s`` simulated seconds."""
        if self._dynamic is None or self.engine is None:
            return
        e = self.engine
        if e.now - self._last_rule_eval < every_s:
            return
        self._last_rule_eval = e.now
        from smartsched.objectives.dynamic import ClusterCondition

        backlog = int(((e.table.status == self._pending) & self._ai).sum())
        self._dynamic.update(ClusterCondition.from_arrivals(
            e.now, self._online_arrivals, backlog, e.state.num_nodes, self._dynamic.rules))
        self.weights = self._dynamic.weights()
        self.reward_fn.w = self.weights
        self.weights_log = list(self._dynamic.log)

    def _advance_warmup(self) -> None:
        """Place warm-up pods with the filters profile itself (not the policy)."""
        warm = self.run.engine.config.warmup_s
        if warm > 0:
            self.run.drive(until_s=warm)

    def _next_observation(self) -> dict[str, np.ndarray]:
        """Advance to the next pod with a real choice; auto-reject pods that fit nowhere."""
        e = self.engine
        assert e is not None
        while True:
            req = e.next_decision()
            if req is None:
                self._req = None
                return self._terminal_observation()
            if self.shortlist is not None:
                obs = self._shortlist_observation(req)
                if obs is None:
                    continue
                return obs
            ok, ctx = self.filters.feasible(e.state, req.request)
            deferrable = e.config.mode == "replay" and can_defer(req.pod, req.time)
            if ok.any() or deferrable:
                self._req, self._ctx = req, ctx
                self._binder, self._base_decision = self.filters.profile.binder, None
                return self._observation(req, ok, deferrable)
            d = self.filters.rejection(ctx)
            self._rejected.append({"pod": req.pod.id, "plugins": list(d.rejected_by())})
            e.apply(d)

    def _shortlist_observation(self, req: DecisionRequest) -> dict[str, np.ndarray] | None:
        """The base profile decides ``req``; where it places the pod on a node with rivals,
        the observation offering its shortlist (None: the base's decision was applied)."""
        e, sl = self.engine, self.shortlist
        assert e is not None and sl is not None
        route = sl.route(req.request)
        ok, ctx = route.feasible(e.state, req.request)
        d = route.decide_feasible(ctx, ok)
        choices = sl.choices(route, ok, d) if sl.steers(req.request) else None
        if choices is None:
            if d.node is None and not d.defer:
                self._rejected.append({"pod": req.pod.id, "plugins": list(d.rejected_by())})
            e.apply(d)
            return None
        self._req, self._ctx = req, ctx
        self._binder, self._base_decision = route.profile.binder, d
        obs = self.observer.observe(ctx, ok, False, e.now, e.metrics.pending,
                                    self._observed_weights())
        obs["action_mask"] = self._mask = Shortlist.action_mask(choices, obs["action_mask"])
        return obs

    def _observation(
        self, req: DecisionRequest, ok: np.ndarray, deferrable: bool
    ) -> dict[str, np.ndarray]:
        e = self.engine
        assert e is not None
        obs = self.observer.observe(self._ctx, ok, deferrable, e.now, e.metrics.pending,
                                    self._observed_weights())
        self._mask = obs["action_mask"]
        return obs

    def _observed_weights(self) -> np.ndarray:
        return self.weights.vector()[:self.n_observed]

    def _terminal_observation(self) -> dict[str, np.ndarray]:
        obs = self.observer.terminal(self._observed_weights())
        self._mask = obs["action_mask"]
        return obs

    @property
    def offered(self) -> DecisionRequest | None:
        """The pod the current observation asks about (None once the episode is over)."""
        return self._req

    def config_dict(self) -> dict[str, Any]:
        return asdict(self.cfg)
