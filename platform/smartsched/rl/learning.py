"""Continuous learning: fine-tune the incumbent on recent experience, gate, promote (issue 18).

Owns one round of the loop and the loop itself:

1. experience: the recent pods (a callable gives them, e.g. what the service was
   asked to place) become a twin workload (a pod file, arrivals rebased to 0);
   with too few of them, the configured workload is used instead;
2. the candidate: a policy staged in the store (``PolicyStore.stage``: trained
   elsewhere, e.g. by a ``smartsched train`` job), oldest first and taken out of
   the stage whatever the verdict; with none staged, a fine-tune: PPO starting
   from the incumbent's weights (``TrainConfig.init_policy``, read without
   pickle), with the incumbent's own env and model settings (from its
   ``smartsched_policy.json``), on that workload, for ``iterations`` (the budget);
3. gate: ``rl.gate.run_gate`` on paired episodes of the newer experience;
4. promote (add to the ``PolicyStore`` and make it current, then the
   ``on_promote`` hook, e.g. a live reload of the service's sites) or record the
   refusal. Every verdict, and every failure, goes to the store's log.

A round that fails (training crashes, the gate cannot run) changes nothing: the
incumbent stays current and keeps serving; the loop logs the error and tries
again at the next interval.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from smartsched.model.configfile import read_token_file, read_yaml, validate
from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod
from smartsched.rl.gate import GateConfig, GateResult, run_gate
from smartsched.rl.versions import PolicyStore

log = logging.getLogger(__name__)


class FineTune(BaseModel):
    """The bounded budget of one round's training (PPO knobs kept small on purpose)."""

    model_config = ConfigDict(extra="forbid")
    iterations: int = Field(2, ge=1, le=10_000)
    train_batch_size_per_learner: int = Field(256, ge=8, le=1_000_000)
    minibatch_size: int = Field(64, ge=1, le=1_000_000)
    num_epochs: int = Field(2, ge=1, le=100)
    lr: float = Field(1e-4, gt=0, le=1)
    num_env_runners: int = Field(0, ge=0, le=256)
    max_decisions: int = Field(200, ge=1, le=1_000_000)
    seed: int = Field(0, ge=0)  # round n trains with seed + n

    @model_validator(mode="after")
    def _minibatch_fits(self) -> FineTune:
        # as ``train --config`` refuses it: PPO cannot cut a larger minibatch from a batch
        if self.minibatch_size > self.train_batch_size_per_learner:
            raise ValueError("minibatch_size must be <= train_batch_size_per_learner")
        return self


class LearnConfig(BaseModel):
    """``smartsched learn`` settings (YAML; errors name ``learn.<field>``)."""

    model_config = ConfigDict(extra="forbid")
    store: str
    interval_s: float = Field(300.0, gt=0, le=7 * 86_400)
    work_dir: str = "runs/learn"
    workload: str = "mixed"  # used while there is too little experience
    min_pods: int = Field(100, ge=1, le=10_000_000)
    fine_tune: FineTune = Field(default_factory=FineTune)
    gate: GateConfig = Field(default_factory=GateConfig)
    keep_rounds: int = Field(3, ge=1, le=1000)

    @field_validator("store", "work_dir")
    @classmethod
    def _a_path(cls, v: str) -> str:
        # An empty path was the working directory ("store: .: no current policy version").
        if not v.strip():
            raise ValueError("is empty: give a folder")
        return v


def check_references(cfg: LearnConfig) -> None:
    """Every name the settings give -- the workloads, the gate's cluster and filter
    profile -- resolved now, errors named ``learn.<field>``: found inside the first round,
    they came after Ray had started (and, for the gate, after a fine-tune), and the
    command exited 0. A workload is drawn for a few minutes only."""
    from smartsched.model.presets import load_cluster
    from smartsched.scheduling.registry import load_profile
    from smartsched.workloads.resolve import load_workload

    def named(field: str, check: Any) -> Any:
        try:
            return check()
        except ValidationError as e:
            raise ValidationError(f"learn.{field}", e.message, source=e.source) from None

    cluster = named("gate.cluster", lambda: load_cluster(cfg.gate.cluster))
    for field, spec in (("workload", cfg.workload), ("gate.workload", cfg.gate.workload)):
        named(field, lambda spec=spec: load_workload(spec, cluster, 0.05, 0))
    named("gate.filters", lambda: load_profile(cfg.gate.filters))


def load_learn_config(path: Path | Any) -> LearnConfig:
    """The settings from a file (a ``Path``) or its parsed document; an empty file or a
    document that is not a mapping is named (``learn``), as is every field. A string is a
    document, never a path: a settings file holding only the text ``other.yaml`` was read
    as that file (or failed as "cannot read other.yaml")."""
    doc = read_yaml(path, "learn") if isinstance(path, Path) else path
    if not isinstance(doc, dict):
        raise ValidationError("learn", "the settings must be a mapping (store, interval_s, "
                              f"fine_tune, gate, workload), got {type(doc).__name__}")
    return validate(LearnConfig, doc, prefix="learn")


def experience_workload(pods: Sequence[Pod], path: Path) -> Path:
    """Write the recent pods as a twin workload: arrivals (and deadlines) from 0 in their
    order, pod and gang names made unique (a client may reuse them across requests)."""
    from smartsched.workloads.parquet_io import write_pods

    t0 = min(p.arrival for p in pods)
    seen: dict[str, int] = {}
    # A gang name reused by later requests is another gang: a new instance starts once
    # the previous one has all its members.
    gangs: dict[str, tuple[int, int]] = {}  # name -> (instance, members so far)
    out = []
    for p in pods:
        k = seen.get(p.id, 0)
        seen[p.id] = k + 1
        gang = p.gang_id
        if gang is not None:
            inst, n = gangs.get(gang, (0, 0))
            if n >= p.gang_size:
                inst, n = inst + 1, 0
            gangs[gang] = (inst, n + 1)
            gang = gang if inst == 0 else f"{gang}#{inst}"
        out.append(replace(p, id=p.id if k == 0 else f"{p.id}#{k}", arrival=p.arrival - t0,
                           gang_id=gang, deadline=None if p.deadline is None
                           else p.deadline - t0))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_pods(out, path)
    return path


class LearningLoop:
    """Rounds of fine-tune -> gate -> promote against a policy store."""

    def __init__(self, config: LearnConfig, *,
                 experience: Callable[[], Sequence[Pod]] | None = None,
                 on_promote: Callable[[str, Path], Any] | None = None,
                 fine_tune: Callable[[Path, str, Path], Path] | None = None,
                 gate: Callable[[str, str, GateConfig], GateResult] | None = None) -> None:
        self.cfg = config
        self.store = PolicyStore(config.store)
        self.store.path_of()  # a store with a current policy, or a clear error now
        self.experience = experience
        self.on_promote = on_promote
        self._fine_tune = fine_tune or self.fine_tune
        self._gate = gate or run_gate
        root = Path(config.work_dir)
        done = [int(p.name[6:]) for p in root.glob("round_*") if p.name[6:].isdigit()] \
            if root.is_dir() else []
        self.rounds = max(done, default=0)  # a restarted loop goes on numbering
        self.stopped = threading.Event()

    # ------------------------------------------------------------ one round
    def round(self) -> dict[str, Any]:
        """One round; returns what happened (``outcome``: promoted, refused or error)."""
        self.rounds += 1
        work = Path(self.cfg.work_dir) / f"round_{self.rounds:05d}"
        incumbent = self.store.current()
        t0 = time.perf_counter()
        try:
            train_on = gate_on = self.cfg.workload
            pods = sorted(self.experience(), key=lambda p: p.arrival) \
                if self.experience is not None else []
            if len(pods) >= self.cfg.min_pods:
                # Trained on the older half, judged on the newer: the gate's episodes are
                # not the ones the candidate was fitted to.
                half = len(pods) // 2
                train_on = str(experience_workload(pods[:half], work / "train.parquet"))
                # Each gate seed a block-bootstrap episode of it: the one recording
                # replayed under every seed would give identical paired gains, and a
                # zero-spread "lower bound" that is only that replay's gain.
                gate_on = "resample:" + str(experience_workload(pods[half:],
                                                                work / "gate.parquet"))
            inc_dir = self.store.path_of(incumbent)
            staged = self.store.staged()
            if staged:  # taken out of the stage first: a candidate that fails is not retried
                cand_dir = work / "staged" / staged[0].name
                cand_dir.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(staged[0]), str(cand_dir))
                origin: dict[str, Any] = {"candidate": f"staged:{staged[0].name}"}
            else:
                cand_dir = self._fine_tune(inc_dir, train_on, work / "train")
                origin = {"candidate": "fine-tune", "trained_on": train_on}
            gate_cfg = self.cfg.gate.model_copy(update={"workload": gate_on})
            res = self._gate(f"rl:{cand_dir}", f"rl:{inc_dir}", gate_cfg)
            figures = {**res.to_dict(), **origin, "gated_on": gate_on,
                       "experience_pods": len(pods), "incumbent": incumbent}
            if res.promoted:
                version = self.store.add(cand_dir)
                if self.on_promote is not None:  # serve it first: the store follows
                    try:
                        self.on_promote(version, self.store.path_of(version))
                    except Exception:
                        self._restore(incumbent)
                        raise
                self.store.promote(version, figures)
                outcome: dict[str, Any] = {"outcome": "promoted", "version": version}
            else:
                self.store.refuse(str(cand_dir), figures)
                outcome = {"outcome": "refused", "version": incumbent}
            outcome.update(gain_mean=res.gain_mean, gain_lower=res.gain_lower,
                           reasons=res.reasons, candidate=origin["candidate"])
        except Exception as e:  # the incumbent keeps serving; the next round tries again
            log.warning("learning round %d failed: %s", self.rounds, e)
            self.store.record({"event": "error", "round": self.rounds,
                                "error": f"{type(e).__name__}: {e}",
                                "trace": traceback.format_exc(limit=3)})
            outcome = {"outcome": "error", "version": incumbent,
                       "error": f"{type(e).__name__}: {e}"}
        outcome["seconds"] = time.perf_counter() - t0
        self._prune()
        return outcome

    def _restore(self, incumbent: str | None) -> None:
        """After a failed reload: put the incumbent back where it may have been replaced."""
        if self.on_promote is None or incumbent is None:
            return
        try:
            self.on_promote(incumbent, self.store.path_of(incumbent))
        except Exception as e:  # logged with the round's error
            log.warning("could not reload the incumbent %s: %s", incumbent, e)

    def fine_tune(self, incumbent: Path, workload: str, out: Path) -> Path:
        """PPO from the incumbent's weights with its env and model settings; the export."""
        from smartsched.paths import read_regular_file
        from smartsched.rl.artifact import MAX_SPEC_BYTES
        from smartsched.rl.config import TrainConfig
        from smartsched.rl.policy import POLICY_META
        from smartsched.rl.train import train

        meta = json.loads(read_regular_file(incumbent / POLICY_META, MAX_SPEC_BYTES))
        ft = self.cfg.fine_tune
        env = {**meta.get("env", {}), "workload": workload, "mode": "replay",
               "max_decisions": ft.max_decisions}
        env.pop("warmup_hours", None)
        env.pop("hours", None)
        cfg = TrainConfig(
            env=env, model=meta.get("model", {"hidden": 64}), iterations=ft.iterations,
            # A seed per round: rounds with no new experience (the configured workload)
            # still draw other samples, instead of training the same candidate again.
            checkpoint_every=ft.iterations, seed=ft.seed + self.rounds, output_dir=str(out),
            init_policy=str(incumbent),
            env_runners={"num_env_runners": ft.num_env_runners, "num_envs_per_env_runner": 1},
            training={"train_batch_size_per_learner": ft.train_batch_size_per_learner,
                      "minibatch_size": min(ft.minibatch_size,
                                            ft.train_batch_size_per_learner),
                      "num_epochs": ft.num_epochs, "lr": ft.lr})
        summary = train(cfg, echo=lambda _: None)
        if not summary.get("policy"):
            raise ValidationError("learn.fine_tune", "training exported no policy")
        return Path(summary["policy"])

    def _prune(self) -> None:
        """Keep the work folders of the last ``keep_rounds`` rounds (promoted policies are
        copied into the store, so nothing promoted is lost)."""
        root = Path(self.cfg.work_dir)
        if not root.is_dir():
            return
        rounds = sorted((p for p in root.iterdir()
                         if p.name.startswith("round_") and p.name[6:].isdigit()),
                        key=lambda p: int(p.name[6:]))
        for p in rounds[: -self.cfg.keep_rounds]:
            shutil.rmtree(p, ignore_errors=True)

    # ------------------------------------------------------------ the loop
    def run(self, rounds: int | None = None,
            report: Callable[[dict[str, Any]], Any] | None = None,
            wait_first: bool = False) -> None:
        """Round after round, ``interval_s`` apart (from the start of each), until
        ``rounds`` are done or ``stop()``; with ``wait_first``, the first round one
        interval from now (a service that has just started has no experience yet)."""
        done = 0
        if wait_first:
            self.stopped.wait(self.cfg.interval_s)
        while not self.stopped.is_set() and (rounds is None or done < rounds):
            start = time.monotonic()
            out = self.round()
            done += 1
            if report is not None:
                report(out)
            if rounds is not None and done >= rounds:
                break
            self.stopped.wait(max(0.0, self.cfg.interval_s - (time.monotonic() - start)))

    def stop(self) -> None:
        self.stopped.set()


def service_hooks(url: str, sites: Sequence[str], served_as: str, limit: int = 2000,
                  operator_token: str | None = None) -> tuple[Callable[[], Sequence[Pod]],
                                                             Callable[[str, Path], Any]]:
    """Experience from a running placement service, and a promotion hook that reloads its
    ``sites`` with the new version (``rl:<served_as>/versions/<v>``: the store as the
    service's ``models_dir`` names it, so answers show the version). The operator token
    is ``operator_token``, else ``SMARTSCHED_OPERATOR_TOKEN``, as for every operator
    command."""
    from smartsched.client import PlacementClient

    client = PlacementClient(url, operator_token=operator_token)

    def experience() -> Sequence[Pod]:
        return client.experience(limit)

    def reload(version: str, _: Path) -> None:
        for site in sites:
            client.set_profile(site, served_profile(served_as, version))

    return experience, reload


def served_profile(served_as: str, version: str) -> str:
    """The profile a site serves ``version`` of the store as: ``rl:<served_as>/versions/<v>``
    (the store as the service's ``models_dir`` names it, so answers show the version)."""
    return f"rl:{served_as.rstrip('/')}/versions/{version}"


class LearnerActor:
    """The loop as a Ray actor (threaded: ``status``/``stop`` answer while ``run`` runs)."""

    def __init__(self, config: dict[str, Any], service: dict[str, Any] | None = None) -> None:
        experience = on_promote = None
        if service:
            # A token file (mode 0600, read here) rather than the token in the actor's
            # arguments, which Ray keeps in its object store.
            tf = service.get("operator_token_file")
            token = read_token_file(tf, "operator_token_file") if tf else None
            experience, on_promote = service_hooks(service["url"], service["sites"],
                                                   service["served_as"],
                                                   operator_token=token)
        self.loop = LearningLoop(load_learn_config(config), experience=experience,
                                 on_promote=on_promote)
        self.outcomes: list[dict[str, Any]] = []

    def run(self, rounds: int | None = None, wait_first: bool = False) -> list[dict[str, Any]]:
        self.loop.run(rounds, report=self.outcomes.append, wait_first=wait_first)
        return self.outcomes

    def status(self, since: int = 0) -> dict[str, Any]:
        """The rounds' outcomes from number ``since`` on (0-based), and the total."""
        return {"rounds": self.loop.rounds, "current": self.loop.store.current(),
                "total": len(self.outcomes), "outcomes": list(self.outcomes[since:])}

    def stop(self) -> None:
        self.loop.stop()


def start_learner(config: dict[str, Any], service: dict[str, Any] | None = None) -> Any:
    """A ``LearnerActor`` on the connected Ray (no CPU of its own: its training asks for
    what it needs), restarted by nobody: a crash leaves the served policy as it is."""
    import ray

    actor = ray.remote(num_cpus=0, max_concurrency=4, max_restarts=0)(LearnerActor)
    return actor.remote(config, service)


def learning_plan(learn: str | Path, models_dir: str | None, sites: Sequence[str],
                  known_sites: Sequence[str]) -> dict[str, Any]:
    """Check ``serve --learn`` before anything starts: the learning settings, a store with
    a current policy inside the service's ``models_dir`` (a live reload reads nothing
    else), and the sites to reload. Returns the learner's config and its service part
    (without the URL). Raises ValidationError naming the field."""
    doc = read_yaml(learn, "learn") or {}
    cfg = load_learn_config(doc)
    PolicyStore(cfg.store).path_of()  # a current version, or an error naming the store
    if models_dir is None:
        raise ValidationError("models_dir", "serve --learn needs a models directory holding "
                              "the learning store (the service reloads only from there)")
    root, store = Path(models_dir).resolve(), Path(cfg.store).resolve()
    if not store.is_relative_to(root):
        raise ValidationError("learn.store", f"{cfg.store} is not inside the service's "
                              f"models_dir {models_dir}")
    unknown = [s for s in sites if s not in known_sites]
    if unknown:
        raise ValidationError("learn_sites", f"unknown site(s) {', '.join(unknown)}; "
                              f"known: {', '.join(known_sites)}")
    return {"config": doc, "sites": list(sites), "served_as": str(store.relative_to(root))}


def start_service_learner(plan: dict[str, Any], url: str, operator_token_file: str | None,
                          echo: Callable[[str], Any] = print) -> Any:
    """Serve the store's current version at the plan's sites, then start the learning loop
    (a Ray actor) against this service: its first round one interval from now."""
    from smartsched.client import PlacementClient

    token = (read_token_file(operator_token_file, "operator_token_file")
             if operator_token_file else None)
    store = PolicyStore(plan["config"]["store"])
    version = store.current()
    client = PlacementClient(url, operator_token=token)
    for site in plan["sites"]:
        client.set_profile(site, f"rl:{plan['served_as']}/versions/{version}")
    service = {"url": url, "sites": plan["sites"], "served_as": plan["served_as"],
               "operator_token_file": operator_token_file}
    actor = start_learner(plan["config"], service)
    actor.run.remote(None, True)
    echo(f"learning: {', '.join(plan['sites'])} serve {version} from {store.root}; a round "
         f"every {float(plan['config'].get('interval_s', 300.0)):.0f} s")
    return actor


class ServiceLearning:
    """``serve --learn``: the learning loop as the service's side loop (``SideLoop``)."""

    def __init__(self, learn: str | Path, sites: Sequence[str] | None = None,
                 echo: Callable[[str], Any] = print) -> None:
        self.learn, self.sites, self.echo = learn, list(sites or []), echo
        self.plan: dict[str, Any] | None = None
        self.actor: Any = None
        self.seen = 0

    def check(self, cfg: Any) -> None:
        from smartsched.serving.app import service_hierarchy

        h = service_hierarchy(cfg)
        self.plan = learning_plan(self.learn, cfg.models_dir, self.sites or list(h.regions),
                                  [*h.regions, *h.edges])

    def start(self, url: str, operator_token_file: str | None) -> None:
        assert self.plan is not None, "check() first"
        self.actor = start_service_learner(self.plan, url, operator_token_file, self.echo)

    def poll(self) -> bool:
        import ray

        try:
            st = ray.get(self.actor.status.remote(self.seen), timeout=30)
        except Exception as e:  # the loop died: the service goes on serving
            self.echo(f"learning stopped ({type(e).__name__}); the incumbent serves")
            return False
        for out in st["outcomes"]:
            self.echo(f"learning round: {out['outcome']} (current {out.get('version')}) "
                      f"{'; '.join(out.get('reasons', []))}{out.get('error', '')}")
        self.seen = int(st["total"])
        return True

    def stop(self) -> None:
        if self.actor is not None:
            self.actor.stop.remote()
