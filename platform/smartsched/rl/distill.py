"""Policy distillation: one network that decides as an ensemble of training seeds does.

Why: the ensemble of four training seeds beats the composite heuristic where no single
seed does (docs/benchmarks.md, issue 17), but it scores every decision four times, and
at 1,500 nodes its p99 per decision is over the 5 ms target. A student network of the
same architecture, trained to put the ensemble's probabilities on the same choices
(policy distillation: Rusu et al. 2016; soft targets: Hinton et al. 2015), decides at
one network's cost. Whether it keeps the ensemble's quality is measured, not assumed:
``smartsched bench heldout`` on seeds neither collected on nor used to choose it.

Owns three steps, each usable alone:

- ``collect``: run the twin with the teacher (an ``rl:`` scheduler, usually with
  ``ensemble=`` members) on seeds of its own and record, at every decision with a real
  choice (two or more allowed actions), the observation and the teacher's distribution
  over the allowed actions (the product of its members' distributions, normalized).
  With an ``actor`` (DAgger, Ross et al. 2011) another policy acts while the teacher
  labels, so the student also learns on the states its own choices lead to.
- ``fit``: train the student (started from a member's weights) to minimize the
  cross-entropy to the teacher's distribution; the epoch with the lowest loss on
  decisions held aside (whole seeds) is kept.
- ``export_student``: the student as an ordinary policy folder (spec JSON and tensor
  weights, the teacher's description, and a record of what it was distilled from),
  which ``rl:PATH`` loads like any trained policy.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from smartsched.model.errors import ValidationError

OBS_KEYS = ("nodes", "pod", "weights", "action_mask")


@dataclass
class Teaching:
    """Decisions with the teacher's answer: observations (``OBS_KEYS``, stacked), the
    teacher's probabilities over the actions (zero outside the allowed ones), and the
    seed each decision came from (to hold whole seeds aside)."""

    obs: dict[str, np.ndarray]
    target: np.ndarray
    seed: np.ndarray

    def __len__(self) -> int:
        return int(self.target.shape[0])

    def take(self, rows: np.ndarray) -> Teaching:
        return Teaching({k: v[rows] for k, v in self.obs.items()}, self.target[rows],
                        self.seed[rows])

    @staticmethod
    def concat(parts: Sequence[Teaching]) -> Teaching:
        parts = [p for p in parts if len(p)]
        if not parts:
            raise ValidationError("seeds", "the teacher made no decision with a choice on "
                                  "these seeds: nothing to learn from")
        shapes = {p.obs["nodes"].shape[1:] for p in parts}
        if len(shapes) > 1:
            raise ValidationError("cluster", f"decisions of clusters of different sizes "
                                  f"({sorted(shapes)}) cannot be stacked")
        return Teaching({k: np.concatenate([p.obs[k] for p in parts]) for k in OBS_KEYS},
                        np.concatenate([p.target for p in parts]),
                        np.concatenate([p.seed for p in parts]))


class Recorder:
    """Set as ``RLScheduler.recorder``: called at each decision with the observation,
    the allowed actions and the teacher's log-probabilities there; keeps the decisions
    with a choice and answers which action to take (the teacher's, or the actor's)."""

    def __init__(self, seed: int, actor: Any | None = None) -> None:
        self.seed = seed
        self.actor = actor  # a FastScorer, or None: the teacher acts
        self.rows: dict[str, list[np.ndarray]] = {k: [] for k in OBS_KEYS}
        self.targets: list[tuple[np.ndarray, np.ndarray]] = []
        self.agree = 0

    def __call__(self, obs: dict[str, np.ndarray], idx: np.ndarray,
                 logp: np.ndarray) -> int | None:
        if idx.size < 2:
            return None  # no choice to learn from: the teacher's answer
        mask = np.zeros_like(obs["action_mask"])
        mask[idx] = 1.0  # what the teacher chose among (a shortlist, or the choices)
        for k in ("nodes", "pod", "weights"):
            self.rows[k].append(np.array(obs[k], dtype=np.float32))
        self.rows["action_mask"].append(mask)
        p = np.exp(logp - logp.max())
        self.targets.append((idx.copy(), (p / p.sum()).astype(np.float32)))
        teacher = int(idx[int(np.argmax(logp))])
        if self.actor is None:
            return teacher
        mine = int(idx[int(np.argmax(self.actor.logits_at(obs, idx)))])
        self.agree += mine == teacher
        return mine

    def teaching(self) -> Teaching:
        n = len(self.targets)
        if not n:
            return Teaching({k: np.zeros((0, 1), np.float32) for k in OBS_KEYS},
                            np.zeros((0, 1), np.float32), np.zeros(0, np.int64))
        obs = {k: np.stack(v) for k, v in self.rows.items()}
        target = np.zeros((n, obs["action_mask"].shape[1]), dtype=np.float32)
        for i, (idx, p) in enumerate(self.targets):
            target[i, idx] = p
        return Teaching(obs, target, np.full(n, self.seed, dtype=np.int64))


# (teacher spec after ``rl:``, cluster, workload, seed, hours, warm-up, actor folder or "")
CollectJob = tuple[str, str, str, int, float, float, str]


def _collect_one(job: CollectJob) -> tuple[Teaching, dict[str, Any]]:
    teacher, cluster, workload, seed, hours, warmup, actor_dir = job
    from smartsched.rl.policy import make_rl_scheduler
    from smartsched.scheduling.run import build_run

    sched = make_rl_scheduler(teacher, seed)
    actor = None
    if actor_dir:
        from smartsched.rl.artifact import read_module
        from smartsched.rl.fast_scorer import FastScorer
        from smartsched.rl.policy import resolve_policy_dir

        module = read_module(resolve_policy_dir(actor_dir))
        module.eval()
        actor = FastScorer(module)
    rec = Recorder(seed, actor)
    sched.recorder = rec
    run = build_run(cluster, workload, sched, seed=seed, hours=hours, warmup_hours=warmup)
    run.drive()
    data = rec.teaching()
    return data, {"seed": seed, "decisions_with_choice": len(data),
                  "actor_agreement": (rec.agree / len(data)) if actor and len(data) else None}


def collect(teacher: str, seeds: Sequence[int], *, cluster: str = "medium",
            workload: str = "mixed", hours: float = 24.0, warmup_hours: float = 6.0,
            actor: str | None = None, workers: int | None = None
            ) -> tuple[Teaching, list[dict[str, Any]]]:
    """The teacher's decisions with a choice on each seed (see the module docstring).
    ``teacher``: an ``rl:`` scheduler name; ``actor``: a policy folder that acts instead
    (the teacher still labels)."""
    from smartsched.pool import map_jobs

    check_teacher(teacher)
    if not seeds:
        raise ValidationError("seeds", "need at least one seed to collect on")
    jobs: list[CollectJob] = [(teacher[3:], cluster, workload, int(s), hours, warmup_hours,
                               actor or "") for s in seeds]
    out = map_jobs(_collect_one, jobs, workers)
    return Teaching.concat([d for d, _ in out]), [s for _, s in out]


def _tensors(data: Teaching, rows: np.ndarray) -> tuple[dict[str, Any], Any]:
    import torch

    return ({k: torch.from_numpy(data.obs[k][rows]) for k in OBS_KEYS},
            torch.from_numpy(data.target[rows]))


def _loss_and_agreement(module: Any, data: Teaching, rows: np.ndarray
                        ) -> tuple[Any, int]:
    """Mean cross-entropy to the teacher's distribution, and how many argmaxes agree."""
    import torch
    from ray.rllib.core.columns import Columns

    obs, target = _tensors(data, rows)
    logits = module.forward_train({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
    logq = torch.log_softmax(logits, dim=-1)
    # The teacher's zeros outside the allowed actions weigh nothing (0 * finite).
    loss = -(target * logq.clamp(min=-1e4)).sum(-1).mean()
    agree = int((logits.argmax(-1) == target.argmax(-1)).sum())
    return loss, agree


def evaluate(module: Any, data: Teaching, batch_size: int = 512) -> dict[str, float]:
    """The student against the teacher on ``data``: cross-entropy minus the teacher's own
    entropy (the KL divergence, nats per decision) and the share of decisions where
    their argmaxes agree."""
    import torch

    if not len(data):
        return {"kl": float("nan"), "agreement": float("nan")}
    total, agree = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(data), batch_size):
            rows = np.arange(start, min(start + batch_size, len(data)))
            loss, a = _loss_and_agreement(module, data, rows)
            total += float(loss) * rows.size
            agree += a
    p = data.target
    entropy = float(-(p * np.log(np.where(p > 0, p, 1.0))).sum(-1).mean())
    return {"kl": total / len(data) - entropy, "agreement": agree / len(data)}


def fit(data: Teaching, init: str | Path | Any, *, val: Teaching | None = None,
        epochs: int = 8, batch_size: int = 128, lr: float = 3e-4, seed: int = 0,
        echo: Any = print) -> tuple[Any, list[dict[str, float]]]:
    """The student: ``init`` (a policy folder, or a module to train further) trained on
    ``data`` (see the module docstring); with ``val``, the epoch with its lowest KL is
    the one returned."""
    import torch

    from smartsched.rl.artifact import read_module
    from smartsched.rl.policy import resolve_policy_dir

    if not len(data):
        raise ValidationError("seeds", "no decisions to learn from")
    module = read_module(resolve_policy_dir(init)) if isinstance(init, str | Path) else init
    # The network scores any number of nodes; the columns must be the ones it reads.
    spaces = module.observation_space
    for key in ("nodes", "pod", "weights"):
        if data.obs[key].shape[-1] != spaces[key].shape[-1]:
            raise ValidationError("init", f"the student observes {spaces[key].shape[-1]} "
                                  f"{key} columns, the decisions carry "
                                  f"{data.obs[key].shape[-1]}")
    torch.manual_seed(seed)
    # A scheduler built in this process set one thread (one decision is a batch of one);
    # a fit's batches use every core, and the setting is given back after.
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        return _fit(module, data, val, epochs, batch_size, lr, seed, echo)
    finally:
        torch.set_num_threads(threads)


def _fit(module: Any, data: Teaching, val: Teaching | None, epochs: int, batch_size: int,
         lr: float, seed: int, echo: Any) -> tuple[Any, list[dict[str, float]]]:
    import copy

    import torch

    rng = np.random.default_rng(seed)  # the shuffling

    params = [p for n, p in module.named_parameters() if not n.startswith("value_head")]
    opt = torch.optim.Adam(params, lr=lr)
    history: list[dict[str, float]] = []
    best: tuple[float, dict[str, Any]] | None = None
    # The agreement on the training data, on a fixed sample (a whole pass costs a third
    # of an epoch), drawn apart from the shuffling so that it leaves the fit's bits alone.
    pick = np.random.default_rng([seed, 1])
    sample = data.take(np.sort(pick.choice(len(data), min(len(data), 10_000), replace=False)))
    for epoch in range(1, epochs + 1):
        module.train()
        order = rng.permutation(len(data))
        seen, total = 0, 0.0
        for start in range(0, order.size, batch_size):
            rows = np.sort(order[start:start + batch_size])
            loss, _ = _loss_and_agreement(module, data, rows)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            total += float(loss.detach()) * rows.size
            seen += rows.size
        module.eval()
        row: dict[str, float] = {"epoch": epoch, "train_loss": total / seen}
        row["train_agreement"] = evaluate(module, sample)["agreement"]
        if val is not None and len(val):
            v = evaluate(module, val)
            row.update({"val_kl": v["kl"], "val_agreement": v["agreement"]})
            if best is None or v["kl"] < best[0]:
                best = (v["kl"], copy.deepcopy(module.state_dict()))
        history.append(row)
        echo("  ".join(f"{k} {v:.5g}" if isinstance(v, float) else f"{k} {v}"
                       for k, v in row.items()))
    if best is not None:
        module.load_state_dict(best[1])
    module.eval()
    return module, history


def check_teacher(teacher: str) -> Path:
    """The teacher's own policy folder (the student's description is its). Options that
    change what it observes or decides (``weights``, ``base``, ``filters``, ...) are
    refused: the student is exported with the policy's own description, and would then
    be deployed without them. Only ``ensemble`` members may be given."""
    from smartsched.rl.policy import resolve_policy_dir, rl_options

    if not teacher.startswith("rl:") or not teacher[3:].partition("?")[0]:
        raise ValidationError("teacher", "must be a learned policy, rl:PATH[?ensemble=...]")
    path, _, query = teacher[3:].partition("?")
    other = sorted(set(rl_options(query)) - {"ensemble"})
    if other:
        raise ValidationError("teacher", f"option {other[0][:40]!r} is not distilled (the "
                              "student carries its policy's own description): only "
                              "ensemble= members may be given")
    try:
        return resolve_policy_dir(path)
    except ValidationError as e:
        raise ValidationError("teacher", e.message) from None


def check_init(init: str | Path, lead: Path) -> Path:
    """``init`` as a policy folder that observes and acts as the teacher's policy does
    (what an ensemble's members must share), else a ValidationError naming ``init``."""
    from smartsched.rl.artifact import read_module
    from smartsched.rl.policy import read_policy_meta, refuse_unlike, resolve_policy_dir

    try:
        folder = resolve_policy_dir(init)
        meta, comps = read_policy_meta(folder, "init")
    except ValidationError as e:
        raise ValidationError("init", e.message) from None
    mine, my_comps = read_policy_meta(lead, "teacher")
    refuse_unlike(meta, comps, mine, my_comps, folder, "init", "the teacher")
    try:  # its weights load now, not after the collection (hours at the defaults)
        read_module(folder)
    except ValidationError as e:
        raise ValidationError("init", e.message) from None
    except Exception as e:  # a damaged checkpoint
        raise ValidationError("init", f"cannot load the policy at {folder} "
                              f"({type(e).__name__})") from None
    return folder


def refuse_overwriting(out: str | Path, teacher: str, init: Path) -> None:
    """The output may not hold the teacher, one of its members or the starting policy:
    replacing it would lose the policy being learnt from."""
    from smartsched.rl.policy import resolve_policy_dir, rl_options

    out = Path(out).resolve()
    path, _, query = teacher[3:].partition("?")
    members = [path, *rl_options(query).get("ensemble", []),
               str(init)]
    for p in members:
        try:
            folder = resolve_policy_dir(p)
        except ValidationError:  # a member that does not load is the collection's error
            continue
        if folder == out or folder.is_relative_to(out):
            raise ValidationError("output_dir", f"{out} holds the teacher's policy {p}: "
                                  "write the student elsewhere")
        if out.is_relative_to(folder):  # the student written into a policy's own folder
            raise ValidationError("output_dir", f"{out} is inside the folder of the "
                                  f"teacher's policy {p}: write the student elsewhere")


def check_output_dir(out: str | Path) -> Path:
    """``out`` as a folder the student may be written to: absent, empty, or a policy
    folder (replaced whole). Anything else is refused, never deleted: ``--output-dir
    models`` would otherwise have replaced every shipped model with one policy."""
    from smartsched.rl.artifact import SPEC_FILE
    from smartsched.rl.policy import POLICY_META

    out = Path(out)
    if out.is_symlink():  # replacing it removed the link's target's files, or failed late
        raise ValidationError("output_dir", f"{out} is a link: give the folder itself")
    if out.exists() and (not out.is_dir() or (
            any(out.iterdir()) and not any((out / f).exists()
                                           for f in (SPEC_FILE, POLICY_META)))):
        raise ValidationError("output_dir", f"{out} holds other files: give a new or empty "
                              "folder, or a policy folder to replace")
    return out


def export_student(module: Any, like: str | Path, out: str | Path,
                   record: dict[str, Any]) -> Path:
    """Write ``module`` to ``out`` as a policy folder with ``like``'s description (what
    it observes and within which shortlist it acts) and ``record`` under ``distilled``;
    files ``like``'s description attaches (a forecaster, a telemetry projection) are
    copied along. Written beside and renamed, so a reader never sees half a policy."""
    from smartsched.paths import read_regular_file
    from smartsched.rl.artifact import MAX_SPEC_BYTES, export_module
    from smartsched.rl.policy import POLICY_META, resolve_policy_dir

    src = resolve_policy_dir(like)
    out = check_output_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))  # ours alone
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # a policy folder as any other (mkdtemp makes it 0700)
        meta = json.loads(read_regular_file(src / POLICY_META, MAX_SPEC_BYTES))
        for key in ("forecaster", "telemetry"):
            sub = meta.get("env", {}).get(key)
            if sub:
                folder = str(sub).partition("?")[0]
                shutil.copytree(src / folder, tmp / folder)
        meta["distilled"] = record
        meta.pop("iteration", None)
        (tmp / POLICY_META).write_text(json.dumps(meta, indent=2) + "\n")
        export_module(module, tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def distill_policy(teacher: str, out: str | Path, *, seeds: Sequence[int],
                   val_seeds: Sequence[int], init: str | None = None,
                   cluster: str = "medium", workload: str = "mixed", hours: float = 24.0,
                   warmup_hours: float = 6.0, epochs: int = 8, dagger_rounds: int = 0,
                   lr: float = 3e-4, batch_size: int = 128, seed: int = 0,
                   workers: int | None = None, echo: Any = print) -> dict[str, Any]:
    """``smartsched distill``: collect the teacher's decisions on ``seeds`` (and
    ``val_seeds``, held aside to pick the epoch and report agreement), fit the student,
    optionally ``dagger_rounds`` more rounds in which the student acts on the same seeds
    and the teacher labels (added to the data, the student refitted from where it is),
    and export it to ``out``. Returns the summary written beside it (``distill.json``)."""
    import copy
    import time

    if not seeds or not val_seeds:
        raise ValidationError("seeds" if not seeds else "val_seeds",
                              "need at least one seed")
    both = sorted(set(seeds) & set(val_seeds))
    if both:
        raise ValidationError("val_seeds", f"seed {both[0]} is also a training seed: "
                              "decisions held aside must come from other days")
    if dagger_rounds < 0:
        raise ValidationError("dagger_rounds", "must be 0 or more")
    if workload.split(":", 1)[0] in ("mixed", "finance") and hours + warmup_hours > 8784:
        # The generator's own limit, on the sum: it named "hours" with a value nobody typed.
        raise ValidationError("warmup_hours", f"hours + warmup_hours must be at most 8784 "
                              f"(a generated year), got {hours:g} + {warmup_hours:g}")
    lead = check_teacher(teacher)
    init_as_given = init if init is not None else teacher[3:].partition("?")[0]
    init = check_init(init, lead) if init is not None else lead
    check_output_dir(out)
    refuse_overwriting(out, teacher, init)
    sidecar = Path(out).parent / f"{Path(out).name}.distill.json"
    if sidecar.exists() and not sidecar.is_file():  # found only after the whole run
        raise ValidationError("output_dir", f"{sidecar} (where the summary goes) is not a "
                              "file")
    t0 = time.perf_counter()
    kw = {"cluster": cluster, "workload": workload, "hours": hours,
          "warmup_hours": warmup_hours, "workers": workers}
    echo(f"collecting the teacher's decisions on {len(seeds) + len(val_seeds)} seeds")
    data, stats = collect(teacher, [*seeds, *val_seeds], **kw)
    held = np.isin(data.seed, list(val_seeds))
    train, val = data.take(np.flatnonzero(~held)), data.take(np.flatnonzero(held))
    del data  # a copy of every observation: gigabytes at a day per seed
    if not len(val):
        raise ValidationError("val_seeds", "the teacher made no decision with a choice on "
                              "these seeds: nothing to measure the student on")
    if not len(train):
        raise ValidationError("seeds", "the teacher made no decision with a choice on "
                              "these seeds: nothing to learn from")
    rounds = [{"round": 0, "acted_by": "teacher", "collect": stats,
               "decisions": len(train)}]
    module, history = fit(train, init, val=val, epochs=epochs, lr=lr,
                          batch_size=batch_size, seed=seed, echo=echo)
    rounds[0]["history"] = history
    # The fit kept its epoch with the lowest held-aside KL: that epoch's row says how near
    # the round's student is (no second pass over the held-aside decisions).
    best = (_kept(history), 0, copy.deepcopy(module.state_dict()))
    student_dir = Path(out)
    for r in range(1, dagger_rounds + 1):
        # The student acts; its states are labelled by the teacher (DAgger).
        student_dir.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{student_dir.name}.round{r}.",
                                        dir=student_dir.parent))
        try:
            export_student(module, lead, scratch, {"round": r})
            echo(f"DAgger round {r}: the student acts, the teacher labels")
            more, stats = collect(teacher, seeds, actor=str(scratch), **kw)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        added = len(more)
        train = Teaching.concat([train, more])
        del more
        module, history = fit(train, module, val=val,
                              epochs=epochs, lr=lr, batch_size=batch_size, seed=seed + r,
                              echo=echo)
        rounds.append({"round": r, "acted_by": "student", "collect": stats,
                       "decisions": added, "history": history})
        if _kept(history)["val_kl"] < best[0]["val_kl"]:
            best = (_kept(history), r, copy.deepcopy(module.state_dict()))
    module.load_state_dict(best[2])  # the round whose student is nearest the teacher
    final = best[0]
    record = {"teacher": teacher, "init": str(init_as_given), "seeds": list(seeds),
              "val_seeds": list(val_seeds), "cluster": cluster, "workload": workload,
              "hours": hours, "warmup_hours": warmup_hours, "epochs": epochs,
              "dagger_rounds": dagger_rounds, "kept_round": best[1], "lr": lr,
              "batch_size": batch_size, "seed": seed,
              "val_agreement": final["val_agreement"], "val_kl": final["val_kl"]}
    path = export_student(module, lead, student_dir, record)
    summary = {**record, "policy": str(path), "rounds": rounds,
               "decisions": len(train), "val_decisions": len(val),
               "wall_seconds": time.perf_counter() - t0}
    (path.parent / f"{path.name}.distill.json").write_text(json.dumps(summary, indent=2)
                                                          + "\n")
    return summary


def _kept(history: list[dict[str, float]]) -> dict[str, float]:
    """The epoch ``fit`` kept: the first with the lowest held-aside KL."""
    return min(history, key=lambda h: h["val_kl"])
