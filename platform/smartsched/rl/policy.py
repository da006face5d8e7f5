"""The trained policy as a scheduler: ``rl:<path>``.

Owns loading a policy exported by ``smartsched train`` (an RLModule
checkpoint plus ``smartsched_policy.json``) and deciding with it through the
same filters, features and binder as the training env. Loading needs only
torch and the RLModule class — no Algorithm and no Ray cluster. Accepts the
exported ``policy/`` folder, a training output folder, or an RLlib algorithm
checkpoint. Decisions are greedy (argmax of the masked logits).

Options after ``?`` choose the weight vector the policy is asked to optimize
(it is part of the observation, so one checkpoint serves every profile):
``rl:PATH?weights=green`` uses a scenario profile, ``&dynamic=true`` moves the
weights with the cluster's condition (objectives.dynamic) starting from that
profile; every move is kept in ``weights_log`` for the report. ``defer=false``
masks the defer action: deadline pods are placed as soon as they fit.
``filters=<profile>`` masks the policy's choices with another profile's filters
than the one it was trained with (a packaged name or a YAML file): hard
constraints added at deployment -- a latency-SLO filter, compliance -- narrow
what it may choose; its scores and post-filters are not used.

``base=<profile>&k=<n>`` lets the policy choose within another profile's shortlist
instead (issue 17's "policy over a heuristic's top-k"): the base profile (a packaged
name, a YAML file or a split such as ``composite``) runs as it would alone -- its routes,
filters, post-filters (preemption, gang reservations), deferrers, descheduling pass,
queue order -- and wherever it places a pod, the policy picks among the base's ``k``
best-scored feasible nodes (the base's own choice first). ``k=1`` is the base exactly;
``classes=batch,ai-train`` (or ``classes=batch&classes=ai-train``) steers only those pod
classes (the base decides the rest). A policy trained without a shortlist observes
the decision as in its training (every node the base's filters pass in its context,
only the shortlist in its reach); one trained within a shortlist (the env's ``base:``)
has the shortlist as its action mask, as in its training, and deploys within the base
its export records with no option.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from smartsched.model.errors import UnknownReferenceError, ValidationError
from smartsched.model.pod import POD_CLASS_IDS, Pod, PodClass
from smartsched.objectives.reward import COMPONENTS, RewardWeights
from smartsched.paths import read_regular_file, user_path
from smartsched.rl.artifact import MAX_SPEC_BYTES, SPEC_FILE, read_module
from smartsched.rl.observation import POD_COLUMNS, Observer, node_columns
from smartsched.rl.shortlist import Shortlist
from smartsched.scheduling.base import TwinNeeds, refuse_repeated_options
from smartsched.scheduling.framework import ProfileScheduler
from smartsched.scheduling.plugins.gpu import FGD, FgdArgs
from smartsched.scheduling.registry import load_profile
from smartsched.twin.decision import Decision, Migration, can_defer
from smartsched.twin.state import ClusterState, PodRequest
from smartsched.twin.telemetry.reduction import PROJECTION_FILE, PROJECTION_META

log = logging.getLogger(__name__)

POLICY_META = "smartsched_policy.json"
MODULE_SUBPATH = Path("learner_group") / "learner" / "rl_module" / "default_policy"


def resolve_policy_dir(path: str | Path) -> Path:
    p = user_path(path).resolve()  # RLlib's loader wants an absolute path
    for cand in (p, p / "policy", p / MODULE_SUBPATH):
        if any((cand / f).exists() for f in (SPEC_FILE, "module_state.pkl", "module_state")):
            return cand
    raise UnknownReferenceError(
        "scheduler", f"no trained policy at {p} (expected an exported policy/ folder, a "
        "training output folder or an RLlib checkpoint)")


def read_policy_meta(policy_dir: Path, field: str) -> tuple[dict[str, Any], list[str]]:
    """An export's description and the reward components its observation carries.

    Exports before the carbon component carry no list and observe the first five; a
    folder without a description (an RLlib checkpoint) observes today's. Components are
    only ever appended, so anything else must be a prefix of today's. Errors name
    ``field`` (``scheduler`` for a loader, ``init_policy`` for fine-tuning)."""
    meta_path = policy_dir / POLICY_META
    try:
        meta: dict[str, Any] = (
            json.loads(read_regular_file(meta_path, MAX_SPEC_BYTES)) if meta_path.exists()
            else {"env": {}})
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise ValidationError(field, f"{meta_path}: not a readable policy "
                              f"description ({why})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("env", {}), dict):
        raise ValidationError(field, f"{meta_path}: not a policy description")
    _check_meta(meta, policy_dir, meta_path, field)
    legacy = list(COMPONENTS[:5]) if meta_path.exists() else list(COMPONENTS)
    trained = meta.get("reward_components", legacy)
    if not isinstance(trained, list) or not trained or (
            trained != list(COMPONENTS[:len(trained)])):
        raise ValidationError(
            field, f"policy at {policy_dir} observes reward components {trained}, "
            f"this version has {list(COMPONENTS)}: retrain it with `smartsched train`")
    return meta, trained


# What a loader reads from a policy description, and the type each must have: a value of
# another type was a traceback (a number as the filters profile) or a silent wrong answer
# (``"defer": "false"`` read as true).
_META_TYPES: dict[tuple[str, ...], tuple[type, ...]] = {
    ("env", "filters_profile"): (str,), ("env", "base"): (str,),
    ("env", "shortlist_k"): (int,), ("env", "shortlist_classes"): (list,),
    ("env", "forecaster"): (str,), ("env", "telemetry"): (str,),
    ("env", "heuristic_features"): (bool,), ("env", "reward_weights"): (str, dict),
    ("inference",): (dict,), ("inference", "defer"): (bool,),
    ("node_columns",): (list,), ("pod_columns",): (list,),
}


# What an ensemble's members must have been trained with alike (``RLScheduler._pick``):
# what they observe, and within which shortlist they act.
ENSEMBLE_SAME = ("filters_profile", "base", "shortlist_k", "shortlist_classes",
                 "forecaster", "telemetry", "heuristic_features")


def _as_loaded(env: dict[str, Any], key: str) -> Any:
    """A description's ``env.key`` as the loader reads it (an absent key is its default)."""
    v = env.get(key)
    if v is None:
        v = {"filters_profile": "k8s-default", "heuristic_features": True}.get(key)
        if key == "shortlist_k" and env.get("base") is not None:
            v = 3
    return v


def _check_meta(meta: dict[str, Any], policy_dir: Path, meta_path: Path, field: str) -> None:
    """ValidationError naming the first key of the description that has the wrong type, or
    a file it names (the forecaster, the telemetry projection) outside the policy folder."""
    for keys, types in _META_TYPES.items():
        v: Any = meta
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        if v is None:
            continue
        ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
        if ok and keys[-1] == "shortlist_k":
            ok = v >= 1
        if ok and keys[-1] in ("node_columns", "pod_columns", "shortlist_classes"):
            ok = all(isinstance(c, str) for c in v)
        if not ok:
            kinds = {str: "a string", int: "an integer >= 1", bool: "true or false",
                     dict: "a mapping", list: "a list of names"}
            raise ValidationError(field, f"{meta_path}: {'.'.join(keys)} must be "
                                  f"{' or '.join(kinds[t] for t in types)}, got "
                                  f"{str(v)[:60]!r}")
    env = meta.get("env", {})
    for key in ("forecaster", "telemetry"):
        if env.get(key):  # shipped inside the export (train.export_policy copies it there)
            inside = policy_dir / str(env[key]).partition("?")[0]
            if not inside.resolve().is_relative_to(policy_dir.resolve()):
                raise ValidationError(field, f"{meta_path}: env.{key} must name a folder "
                                      f"inside the policy folder, got {env[key][:80]!r}")
            _check_attached_files(policy_dir, inside, key, field)


# The files a policy's attached forecaster and telemetry projection are read from, and the
# largest each may be (the shipped ones: under 100 KB; a bound stops a huge file being read).
_ATTACHED_FILES: dict[str, tuple[tuple[str, int], ...]] = {
    "forecaster": (("forecaster.json", 1 << 20), ("forecaster.pt", 256 << 20)),
    "telemetry": ((PROJECTION_META, 16 << 20), (PROJECTION_FILE, 256 << 20)),
}


def _check_attached_files(policy_dir: Path, folder: Path, key: str, field: str) -> None:
    """Each file the attached ``key`` is read from, where it exists, is a plain file that
    stays inside the policy folder once links are followed, and of a bounded size: the
    folder itself being inside is not enough, since a link inside it could read any file
    the service can (a service reads policies only from its models_dir). A missing file
    is left to the loader, whose error names it."""
    root = policy_dir.resolve()
    for name, max_bytes in _ATTACHED_FILES[key]:
        path = folder / name
        if not (path.exists() or path.is_symlink()):
            continue
        real = path.resolve()
        if not real.is_relative_to(root):
            raise ValidationError(field, f"env.{key}: {name} links outside the policy "
                                  "folder; an exported policy's files are its own")
        if not real.is_file():
            raise ValidationError(field, f"env.{key}: {name} is not a file")
        size = real.stat().st_size
        if size > max_bytes:
            raise ValidationError(field, f"env.{key}: {name} is {size:,} bytes, more than "
                                  f"a policy's {key} can be ({max_bytes:,})")


def refuse_unlike(meta: dict[str, Any], comps: list[str], mine: dict[str, Any],
                  my_comps: list[str], folder: Path, field: str, me: str) -> None:
    """ValidationError of ``field`` unless the policy at ``folder`` (its description
    ``meta``, its reward components ``comps``) observes and acts as ``me`` does (``mine``,
    ``my_comps``): what an ensemble's members, or a student and its teacher, must share
    (``ENSEMBLE_SAME``, the observation's columns, the reward components)."""
    env, my_env = meta.get("env", {}), mine.get("env", {})
    for key in ENSEMBLE_SAME:
        theirs_v, mine_v = _as_loaded(env, key), _as_loaded(my_env, key)
        if theirs_v != mine_v:
            raise ValidationError(field, f"policy at {folder} was trained with env.{key} "
                                  f"{theirs_v!r}, {me} with {mine_v!r}: they must observe "
                                  "and act alike")
    for key in ("node_columns", "pod_columns"):
        if meta.get(key) != mine.get(key):
            raise ValidationError(field, f"policy at {folder} observes other {key} than "
                                  f"{me}: they must observe alike")
    if comps != my_comps:
        raise ValidationError(field, f"policy at {folder} observes reward components "
                              f"{comps}, {me} {my_comps}")


class RLScheduler:
    """Greedy decisions of a trained NodeScorerModule."""

    def __init__(self, path: str | Path, seed: int = 0, weights: str | None = None,
                 dynamic: bool = False, defer: bool | None = None,
                 filters: str | None = None, base: str | None = None, k: int | None = None,
                 classes: Sequence[str] | None = None, ensemble: Sequence[str] = ()) -> None:
        import torch

        self.dir = resolve_policy_dir(path)
        self.meta, trained = read_policy_meta(self.dir, "scheduler")
        self._n_weights = len(trained)
        env = self.meta.get("env", {})
        self.name = f"rl:{path}"
        try:
            self.module = read_module(self.dir)  # an export reads no pickle
        except ValidationError:
            raise
        except Exception as e:  # a damaged checkpoint: name it, no traceback
            raise ValidationError("scheduler", f"cannot load the policy checkpoint at "
                                  f"{self.dir} ({type(e).__name__}): re-export or retrain "
                                  "it") from None
        self.module.eval()
        # One decision is a batch of one: a single thread is faster than a pool.
        torch.set_num_threads(1)
        self.torch = torch
        from smartsched.rl.fast_scorer import DistinctMemo, FastScorer

        self.scorer = FastScorer(self.module)
        # Other training seeds of the same recipe: each scores the same observation, and
        # their log-probabilities are summed (``_pick``).
        self.members = [FastScorer(m) for m in self._ensemble_members(ensemble, trained)]
        self._memo: DistinctMemo | None = None
        if self.members:  # the members find alike rows once per decision between them
            self._memo = DistinctMemo()
            for s in (self.scorer, *self.members):
                s.memo = self._memo
        # Distillation (rl.distill.Recorder): sees each decision's allowed actions and the
        # summed log-probabilities there; may answer another action (an actor's).
        self.recorder: Callable[[dict[str, np.ndarray], np.ndarray, np.ndarray],
                                int | None] | None = None
        self.filters = ProfileScheduler(
            load_profile(filters or env.get("filters_profile", "k8s-default")), seed)
        # A policy trained within a shortlist (env.base) decides within one by default.
        self.trained_on_shortlist = env.get("base") is not None
        if base is None and self.trained_on_shortlist:
            base = str(env["base"])
            k = int(env.get("shortlist_k", 3)) if k is None else k
            classes = env.get("shortlist_classes") if classes is None else classes
        if base is None and (k is not None or classes is not None):
            raise ValidationError("scheduler.k" if k is not None else "scheduler.classes",
                                  "needs base=<profile> (the shortlist's source)")
        self.shortlist = (None if base is None
                          else Shortlist.build(base, 3 if k is None else k, classes, seed,
                                               filters is not None))
        initial = self._initial_weights(env, weights)
        self.weights = initial.vector()[:self._n_weights]  # what the policy observes
        self._dynamic = self._dynamic_rules(weights, initial) if dynamic else None
        # The export may set inference defaults (e.g. a policy shipped with defer off).
        inference = self.meta.get("inference", {})
        self.allow_defer = bool(inference.get("defer", True)) if defer is None else defer
        self.weights_log: list[dict[str, Any]] = []
        self._online_arrivals: list[float] = []
        self._last_rule_eval = -np.inf
        self.heuristics = bool(env.get("heuristic_features", True))
        # A policy trained on forecast features needs the same forecaster attached to the
        # twin (the run builder attaches what ``twin_needs`` names); where none runs (the
        # service, Kubernetes) those columns fall back to current usage.
        self.forecaster: str | None = None
        if env.get("forecaster"):
            self.forecaster = str(self.dir / env["forecaster"])
        # Likewise a telemetry projection: the run builder attaches it; elsewhere the caller
        # must fill state.telemetry_features (prometheus.features.features_from_prometheus);
        # without it the columns are zeros -- "every node is average" -- and the scheduler
        # says so once.
        self.telemetry: str | None = None
        self._telemetry_k = 0
        self._warned = False
        if env.get("telemetry"):
            from smartsched.twin.telemetry.reduction import TelemetryProjection

            self.telemetry = str(self.dir / env["telemetry"])
            self._telemetry_k = TelemetryProjection.load(self.telemetry).k
        # Exports record their observation's columns by name; older ones are this layout.
        cols = node_columns(self.forecaster is not None, self._telemetry_k)
        for key, mine in (("node_columns", list(cols)), ("pod_columns", list(POD_COLUMNS))):
            if key in self.meta and list(self.meta[key]) != mine:
                raise ValidationError(
                    "scheduler", f"policy at {self.dir} observes {key} {self.meta[key]}, this "
                    f"version builds {mine}: retrain it with `smartsched train`")
        # Older exports record no columns: their spec's widths must still be what this
        # version observes (a mismatch failed at the first decision, with a traceback).
        spaces = self.module.observation_space
        for key, width in (("nodes", len(cols)), ("pod", len(POD_COLUMNS)),
                           ("weights", self._n_weights)):
            if spaces[key].shape[-1] != width:
                raise ValidationError(
                    "scheduler", f"policy at {self.dir} observes {spaces[key].shape[-1]} "
                    f"{key} columns (module_spec.json), this version builds {width}: retrain "
                    "it with `smartsched train`")
        self.fgd: FGD | None = None
        self._observer: Observer | None = None
        self._state_id: int | None = None

    def _ensemble_members(self, paths: Sequence[str], trained: list[str]) -> list[Any]:
        """The modules of ``paths``, each checked to observe and act as this policy does:
        the same recipe's other training seeds (what their description records about the
        observation and the shortlist must be this one's)."""
        modules = []
        seen = {Path(self.dir).resolve(): "the policy itself"}
        for i, path in enumerate(paths):
            field = f"scheduler.ensemble[{i}]"
            folder = resolve_policy_dir(path)
            # A member named twice (or the policy itself) would count its vote twice.
            if (same := seen.setdefault(Path(folder).resolve(), f"ensemble[{i}]")) \
                    != f"ensemble[{i}]":
                raise ValidationError(field, f"the same policy folder as {same}: each "
                                      "member must be another training seed")
            meta, theirs = read_policy_meta(folder, field)
            refuse_unlike(meta, theirs, self.meta, trained, folder, field, "this one")
            module = read_module(folder)
            spaces, own = module.observation_space, self.module.observation_space
            if any(spaces[k].shape != own[k].shape for k in own):
                raise ValidationError(field, f"policy at {folder} observes other widths "
                                      "(module_spec.json) than this one")
            module.eval()
            modules.append(module)
        return modules

    def _pick(self, obs: dict[str, np.ndarray], choices: np.ndarray | None = None) -> int:
        """The action: the policy's argmax (``FastScorer.best``), or with ensemble members
        the argmax of their summed log-probabilities over the allowed actions (the mask,
        and ``choices`` among nodes): a product of the members' distributions, so an
        action any member thinks unlikely loses, and one seed's quirk is outvoted."""
        if not self.members and self.recorder is None:
            return self.scorer.best(obs) if choices is None else self.scorer.best(obs, choices)
        allowed = obs["action_mask"] > 0
        if choices is not None:
            allowed = allowed.copy()
            allowed[: choices.size] &= choices
        if not allowed.any():
            return self.scorer.best(obs, choices)  # nothing to weigh: the policy's answer
        from scipy.special import log_softmax

        idx = np.flatnonzero(allowed)  # the members' logits there only (a shortlist: few)
        total = np.full(allowed.size, -np.inf)
        try:
            total[idx] = sum(log_softmax(s.logits_at(obs, idx).astype(np.float64))
                             for s in (self.scorer, *self.members))
        finally:
            if self._memo is not None:
                self._memo.clear()  # this observation's rows only
        if self.recorder is not None:  # distillation: record, and maybe another acts
            a = self.recorder(obs, idx, total[idx])
            if a is not None:
                return a
        return int(np.argmax(total))

    @staticmethod
    def _initial_weights(env: dict[str, Any], name: str | None) -> RewardWeights:
        from smartsched.objectives.scenarios import scenario

        if name is not None:
            return scenario(name)
        rw = env.get("reward_weights")
        return scenario(rw) if isinstance(rw, str) else RewardWeights.from_mapping(rw or None)

    def _dynamic_rules(self, base: str | None, initial: RewardWeights) -> Any:
        from smartsched.objectives.dynamic import DynamicRules, DynamicWeights
        from smartsched.objectives.scenarios import load_scenarios

        profiles = load_scenarios()
        start = base or "custom"
        profiles.setdefault(start, initial)
        return DynamicWeights(DynamicRules(base=start), profiles)

    def _update_weights(self, state: ClusterState, request: PodRequest,
                        every_s: float = 300.0) -> None:
        """The dynamic rules over what this scheduler sees: arrivals and the queue."""
        from smartsched.objectives.dynamic import ClusterCondition

        pod = request.pod
        if pod.pod_class == PodClass.ONLINE and (
                not self._online_arrivals or pod.arrival > self._online_arrivals[-1]):
            self._online_arrivals.append(pod.arrival)
        now = state.now
        if now - self._last_rule_eval < every_s:
            return
        self._last_rule_eval = now
        backlog = int(state.queue_by_class[POD_CLASS_IDS[PodClass.AI_TRAIN]])
        self._dynamic.update(ClusterCondition.from_arrivals(
            now, self._online_arrivals, backlog, state.num_nodes, self._dynamic.rules))
        self.weights = self._dynamic.current.astype(np.float32)[:self._n_weights]
        self.weights_log = list(self._dynamic.log)

    @property
    def observed_components(self) -> int:
        """How many reward weights the policy observes (the first of today's components)."""
        return self._n_weights

    def twin_needs(self) -> TwinNeeds:
        """The forecaster and telemetry projection the policy was trained to observe (and
        what a shortlist's base profile needs)."""
        own = TwinNeeds(forecaster=self.forecaster, telemetry=self.telemetry)
        if self.shortlist is not None:
            own = own.merge(self.shortlist.base.twin_needs(), "scheduler.base")
        return own

    def prepare(self, pods: Sequence[Pod]) -> None:
        if self.heuristics:
            self.fgd = FGD(FgdArgs(warm=True))
            self.fgd.prepare(pods)
        if self.shortlist is not None:
            self.shortlist.base.prepare(pods)

    # A shortlist's base profile runs the twin as it would alone: its queue order, how long
    # pods tolerate a failed node, and its descheduling pass.
    @property
    def queue_sort(self) -> str:
        return "priority" if self.shortlist is None else self.shortlist.base.queue_sort

    @property
    def failure_toleration_s(self) -> float | None:
        return None if self.shortlist is None else self.shortlist.base.failure_toleration_s

    @property
    def deschedule_interval_s(self) -> float | None:
        return None if self.shortlist is None else self.shortlist.base.deschedule_interval_s

    def deschedule(self, state: ClusterState,
                   waiting: Sequence[PodRequest]) -> tuple[Migration, ...]:
        return () if self.shortlist is None else self.shortlist.base.deschedule(state, waiting)

    def decide(self, state: ClusterState, request: PodRequest) -> Decision:
        if self.shortlist is not None:
            return self._decide_in_shortlist(state, request)
        if self._dynamic is not None:
            self._update_weights(state, request)
        ok, ctx = self.filters.feasible(state, request)
        deferrable = self.allow_defer and can_defer(request.pod, state.now)
        if not ok.any():  # as in training: deferring is then the only choice, if allowed
            if deferrable:
                return Decision(None, defer=True)
            return self.filters.rejection(ctx)
        # The module's forward pass with the rows of untouched nodes reused (rl.fast_scorer).
        a = self._pick(self._observe(state, ctx, ok, deferrable))
        if a == state.num_nodes:
            return Decision(None, defer=True)
        devices = None
        if self.filters.profile.binder is not None:
            devices = self.filters.profile.binder.devices(ctx, a)
        return Decision(a, devices)

    def _decide_in_shortlist(self, state: ClusterState, request: PodRequest) -> Decision:
        """The base profile's decision, with the node swapped for the policy's pick among
        the base's ``k`` best where the base places the pod (see the module docstring)."""
        sl = self.shortlist
        assert sl is not None
        route = sl.route(request)
        ok, ctx = route.feasible(state, request)
        base = route.decide_feasible(ctx, ok)
        choices = sl.choices(route, ok, base) if sl.steers(request) else None
        if choices is None:
            return base  # rejected, deferred, reserving, preempting, or no rival node
        if self._dynamic is not None:
            self._update_weights(state, request)
        obs = self._observe(state, ctx, ok, False)
        if self.trained_on_shortlist:  # as in training: the shortlist is the action mask
            mask = Shortlist.action_mask(choices, obs["action_mask"])
            a = self._pick({**obs, "action_mask": mask})
        else:  # every feasible node in the policy's context, the shortlist in its reach
            a = self._pick(obs, choices)
        sl.decisions += 1
        if a == base.node:
            return base
        sl.changed += 1
        binder = route.profile.binder
        return Decision(a, binder.devices(ctx, a) if binder is not None else None)

    def _observe(self, state: ClusterState, ctx: Any, ok: np.ndarray,
                 deferrable: bool) -> dict[str, np.ndarray]:
        """The policy's observation of this decision."""
        if self._observer is None or self._state_id != id(state):
            self._observer = Observer(state.spec, state, self.fgd,
                                      forecast=self.forecaster is not None,
                                      telemetry_k=self._telemetry_k)
            self._state_id = id(state)
        if self._telemetry_k and not self._warned and state.telemetry_features is None:
            self._warned = True
            log.warning("policy %s observes %d telemetry components but the state carries "
                        "none: they read as zeros (fill state.telemetry_features from "
                        "prometheus.features.features_from_prometheus)", self.dir,
                        self._telemetry_k)
        return self._observer.observe(ctx, ok, deferrable, state.now, state.queue_length,
                                      self.weights)

    def ranked(self, state: ClusterState, request: PodRequest, k: int
               ) -> list[tuple[int, tuple[int, ...] | None]]:
        """The policy's ``k`` highest-scored feasible nodes, best first, with devices (the
        candidates a lookahead compares); empty when no node passes the filters."""
        ok, ctx = self.filters.feasible(state, request)
        if not ok.any():
            return []
        if self._dynamic is not None:
            self._update_weights(state, request)
        logits = self.scorer.logits(self._observe(state, ctx, ok, False))[: state.num_nodes]
        top = np.argsort(-logits, kind="stable")[:k]
        top = top[ok[top]]
        binder = self.filters.profile.binder
        return [(int(n), binder.devices(ctx, int(n)) if binder else None) for n in top]


MAX_ENSEMBLE = 16  # members besides the policy itself (each scores every decision)


def rl_options(query: str) -> dict[str, list[str]]:
    """An ``rl:`` spec's options (what follows '?'), each key's values in order. A '+' is
    itself (a folder's name may hold one, as the path before '?' may), not the space a
    form encoding would make of it."""
    from urllib.parse import parse_qs

    return parse_qs(query.replace("+", "%2B"), keep_blank_values=True) if query else {}


# The options of ``rl:PATH?...`` (a wrapper's spec asks for them: base.split_wrapper_spec).
RL_OPTION_NAMES = ("weights", "dynamic", "defer", "filters", "base", "k", "classes",
                   "ensemble")


def make_rl_scheduler(spec: str, seed: int) -> RLScheduler:
    """Entry point for the ``rl:`` prefix (see pyproject's smartsched.schedulers):
    ``PATH`` or ``PATH?weights=<scenario>&dynamic=true&defer=false&filters=<profile>``,
    ``&base=<profile>&k=N&classes=C`` (a shortlist), ``&ensemble=PATH2`` (repeatable:
    other training seeds of the same recipe, their log-probabilities summed)."""
    path, _, query = spec.partition("?")
    opts = rl_options(query)
    refuse_repeated_options(opts, lists=("classes", "ensemble"))
    known = RL_OPTION_NAMES
    unknown = set(opts) - set(known)
    if unknown:
        first = sorted(unknown)[0][:64]
        raise ValidationError(f"scheduler.{first}" if first else "scheduler",
                              f"unknown rl: option {first!r} (known: {', '.join(known)}; "
                              "a '?' in rl:PATH starts the options, so a policy folder's "
                              "name cannot hold one)")

    def flag(name: str, default: str) -> bool:
        v = opts.get(name, [default])[-1].lower()
        if v not in ("true", "false", "1", "0", "yes", "no"):
            raise ValidationError(f"scheduler.{name}", f"must be true or false, got {v!r}")
        return v in ("true", "1", "yes")

    weights = opts["weights"][-1] if "weights" in opts else None
    filters = opts["filters"][-1] if "filters" in opts else None
    if filters is not None and not filters:
        raise ValidationError("scheduler.filters", "must name a profile")
    base = opts["base"][-1] if "base" in opts else None
    if base is not None and not base:
        raise ValidationError("scheduler.base", "must name a profile")
    k = None
    if "k" in opts:
        raw = opts["k"][-1]
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 4) or not 1 <= int(raw) <= 1000:
            raise ValidationError("scheduler.k", f"must be an integer in 1..1000, got {raw!r}")
        k = int(raw)
    # Repeated or comma-separated (``classes=batch&classes=ai-train`` fits in a
    # comma-separated list of schedulers).
    classes = ([c for v in opts["classes"] for c in v.split(",") if c] if "classes" in opts
               else None)
    if classes is not None and not classes:  # ``classes=`` read as every class
        raise ValidationError("scheduler.classes", "names no pod class")
    ensemble = opts.get("ensemble", [])
    if any(not p for p in ensemble):
        raise ValidationError("scheduler.ensemble", "must name a policy folder")
    if len(ensemble) > MAX_ENSEMBLE:
        raise ValidationError("scheduler.ensemble", f"at most {MAX_ENSEMBLE} members, got "
                              f"{len(ensemble)}")
    return RLScheduler(path, seed, weights=weights, dynamic=flag("dynamic", "false"),
                       defer=flag("defer", "true") if "defer" in opts else None,
                       filters=filters, base=base, k=k, classes=classes, ensemble=ensemble)


make_rl_scheduler.option_names = RL_OPTION_NAMES  # type: ignore[attr-defined]
