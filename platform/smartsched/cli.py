"""The ``smartsched`` command.

Owns argument parsing and the mapping of errors to one-line messages with
exit status 2. Heavy libraries (ray, torch, matplotlib) are imported inside
the commands that need them, so ``smartsched simulate`` starts fast.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError as PydanticError

from smartsched.bench.demo import SHIPPED_POLICY
from smartsched.model.errors import SmartSchedError, ValidationError

__all__ = ["EXIT_BAD_INPUT", "SHIPPED_POLICY", "main"]

EXIT_BAD_INPUT = 2


class FiniteRange(click.FloatRange):
    """A float range that also refuses NaN (click's range lets it through: every comparison
    with NaN is false) and, where it has no upper bound, infinity (``--interval inf`` was
    an OverflowError from time.sleep), so the option, not a setting deep inside, is
    named."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> Any:
        out = super().convert(value, param, ctx)
        if isinstance(out, float) and out != out:
            self.fail("NaN is not a number here", param, ctx)
        if isinstance(out, float) and out in (float("inf"), float("-inf")):
            self.fail(f"{out} is not a finite number", param, ctx)
        return out


class _Command(click.Command):
    """A command whose output files (``_out_file``, ``_image_out``) may not be any of its
    input files: checked once every option is read, before the work."""

    def invoke(self, ctx: click.Context) -> Any:
        from smartsched.outputs import input_paths, same_file

        outs = ctx.meta.get(OUTPUTS_META, set()) & set(ctx.params)
        for name in sorted(outs):
            out = ctx.params[name]
            if not out:
                continue
            for k, v in ctx.params.items():
                if k != name and any(same_file(out, p) for p in input_paths([v])):
                    raise click.BadParameter(f"is the file given to {self._opt(k)}: writing "
                                             "it would replace that input",
                                             param_hint=f"'{self._opt(name)}'")
        return super().invoke(ctx)

    def _opt(self, name: str) -> str:
        return next((p.opts[0] for p in self.params if p.name == name), name)


class _Group(click.Group):
    """Turn SmartSchedError anywhere below into one line on stderr and exit 2. Its
    commands are ``_Command``s and its groups ``_Group``s."""

    command_class = _Command
    group_class = type

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SmartSchedError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except PydanticError as e:  # a settings model built from options (e.g. NaN hours)
            from smartsched.model.configfile import first_error

            field, msg = first_error(e, "", ())
            click.echo(f"error: {field}: {msg}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except OSError as e:  # a path the user gave that cannot be read or written
            where = f": {e.filename}" if e.filename else ""
            click.echo(f"error: {e.strerror or type(e).__name__}{where}", err=True)
            sys.exit(EXIT_BAD_INPUT)


@click.group(cls=_Group)
@click.version_option(package_name="smartsched")
def main() -> None:
    """SmartSched: learned placement for cloud and edge clusters, on a digital twin."""


def _write_json(path: str | None, doc: Any) -> None:
    """A report as strict JSON (NaN is null: ``outputs.json_text``)."""
    if path:
        from smartsched.outputs import json_text

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json_text(doc))


MAX_PROOF_BYTES = 16 << 20  # an inclusion proof or one record: a few KiB
MAX_SEEDS = 10_000  # runs one benchmark may ask for (each is a whole simulation)
MAX_SEED = 2**32 - 1  # numpy's seed range
# Processes a benchmark may run side by side (the promotion gate's own bound): each is a
# whole Python with the twin loaded, and --workers 100000 forked thousands of them.
MAX_WORKERS = 256


def _seed_list(_ctx: click.Context, _param: click.Parameter, value: str | None
               ) -> list[int] | None:
    """A seed-list option parsed as the command line is read: a bad list is an error
    naming its option before any part of a benchmark runs."""
    return None if value is None else _seeds(value)


def _name_list(_ctx: click.Context, _param: click.Parameter, value: str | None
               ) -> str | None:
    """A comma-separated list option that names nothing (``,``) is refused: a benchmark
    over no variants printed an empty table and exited 0; so is one naming something
    twice (``--variants k8s-default,k8s-default`` merged both runs into one row: twice
    the failures and downtime under a header saying one night)."""
    if _names_paired(_ctx, _param, value) is not None:
        _refuse_twice([x.strip() for x in value.split(",") if x.strip()])
    return value


def _openb_variants(names: Sequence[str], option: str = "--variants") -> None:
    """Each openb trace variant named has its file under the data folder: checked before
    a benchmark runs (``bench anneal`` found a typo only after its gap part's minutes)."""
    from smartsched.workloads.openb import openb_pod_path

    for name in names:
        if not openb_pod_path(name).is_file():
            raise click.BadParameter(f"no openb variant {name[:64]!r} (no "
                                     f"{openb_pod_path(name).name} in the data folder)",
                                     param_hint=f"'{option}'")


def _names_paired(_ctx: click.Context, _param: click.Parameter, value: str | None
                  ) -> str | None:
    """A list option paired by position with another (``bench quality``'s workloads and
    clusters): it must name something; a name may repeat (the command refuses a pair
    given twice)."""
    if value is not None and not [x for x in value.split(",") if x.strip()]:
        raise click.BadParameter("names nothing (a comma-separated list of names)")
    return value


def _refuse_twice(items: Sequence[Any], param: str | None = None) -> None:
    """A list option naming an item twice is refused (it would count that item twice)."""
    seen: set[Any] = set()
    for x in items:
        if x in seen:
            raise click.BadParameter(f"gives {str(x)[:64]!r} twice: give each once",
                                     param_hint=param)
        seen.add(x)


def _scheduler_names(_ctx: click.Context, param: click.Parameter, value: str | None
                     ) -> str | None:
    """A comma-separated scheduler option checked as the command line is read: each name
    must build (a packaged profile, a profile file, ``rl:PATH``, ...), so a typo is an
    error naming the option before a benchmark spends minutes on the others."""
    from smartsched.scheduling.base import make_scheduler

    _name_list(_ctx, param, value)
    for name in (value or "").split(","):
        if not name.strip():
            continue
        try:
            make_scheduler(name.strip())
        except ValidationError as e:
            raise click.BadParameter(f"{name.strip()!r}: {e}") from None
    return value


def _heldout_schedulers(ctx: click.Context, param: click.Parameter, value: str | None
                        ) -> str | None:
    """``bench heldout --schedulers``, checked unless ``--merge`` (eager) makes it unused:
    its default names a policy folder relative to the repository, and building it from
    another folder refused a merge that runs nothing."""
    if ctx.params.get("merge"):
        return value
    return _scheduler_names(ctx, param, value)


def _nonempty(_ctx: click.Context, _param: click.Parameter, value: str | None
              ) -> str | None:
    """A path option given as ``''`` is refused: an empty output path silently wrote
    nothing (``--json ''``), or was the working directory (``--state-dir ''`` put the
    service's tokens there, ``--output-dir ''`` fell back to the config's)."""
    if value is not None and not value.strip():
        raise click.BadParameter("is empty (give a path)")
    return value


def _host(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """A ``--host`` a service cannot listen on is refused as an option, before anything
    starts (``listen.check_listen_host``: empty, unresolvable, or not this machine's)."""
    if value is None:
        return value
    from smartsched.listen import check_listen_host

    try:
        return check_listen_host(value, "--host")
    except ValidationError as e:
        raise click.BadParameter(e.message) from None


def _out_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A JSON report's option (``--json``): checked as the command line is read, so a bad
    path fails before the work, not after it -- its folder is made and must be writable,
    holds no trained model, and a file already there must be an earlier report
    (``outputs.report_path_problem``); it may not be one of the command's inputs either
    (``_Command``)."""
    from smartsched.outputs import report_path_problem

    _output_path(ctx, param, value)
    if value and (why := report_path_problem(value)) is not None:
        raise click.BadParameter(why)
    return value


def _image_out(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A figure's option (``--plot``): as ``_out_file``, and its suffix must name an image
    format (``outputs.image_path_problem``)."""
    from smartsched.outputs import image_path_problem

    _output_path(ctx, param, value)
    if value and (why := image_path_problem(value)) is not None:
        raise click.BadParameter(why)
    return value


OUTPUTS_META = "smartsched.outputs"  # ctx.meta: the output options read so far


def _output_path(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """An output file's folder made and writable; the option noted for ``_Command``."""
    import os

    _nonempty(ctx, param, value)
    if value:
        ctx.meta.setdefault(OUTPUTS_META, set()).add(param.name)
        parent = Path(value).parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise click.BadParameter(f"cannot create its folder {str(parent)!r}: "
                                     f"{e.strerror or e}") from None
        if not os.access(parent, os.W_OK):
            raise click.BadParameter(f"its folder {str(parent)!r} is not writable")


def _out_folder(_ctx: click.Context, _param: click.Parameter, value: str | None
                ) -> str | None:
    """An output folder option: made, and checked writable, as the command line is read,
    so a bad path fails before the training, not after every round of it."""
    import os

    _nonempty(_ctx, _param, value)
    if value:
        folder = Path(value)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise click.BadParameter(f"cannot create the folder {value!r}: "
                                     f"{e.strerror or e}") from None
        if not os.access(folder, os.W_OK | os.X_OK):
            raise click.BadParameter(f"the folder {value!r} is not writable")
    return value


def _model_out(*artifacts: str) -> Callable[[click.Context, click.Parameter, str | None],
                                            str | None]:
    """An output folder option for a trained model (``_out_folder``) that refuses a folder
    already holding one of ``artifacts`` unless ``--overwrite`` (eager) was given: the
    defaults are the shipped models' folders, and retraining replaced them unasked."""
    def callback(ctx: click.Context, param: click.Parameter, value: str | None
                 ) -> str | None:
        from smartsched.outputs import model_folder_problem

        _out_folder(ctx, param, value)
        # another kind of model, a policy store or an audit log: never, --overwrite or not
        # (a forecaster trained into a policy's folder mixed the two)
        if value and (why := model_folder_problem(Path(value) / "x", artifacts)) is not None:
            raise click.BadParameter(why)
        _refuse_held(ctx, param, value, artifacts, "a trained model")
        return value
    return callback


def _refuse_held(ctx: click.Context, param: click.Parameter, value: str | None,
                 artifacts: Sequence[str], what: str) -> None:
    """A folder option holding one of ``artifacts`` is refused, naming ``what`` it holds,
    unless ``--overwrite`` (eager) was given."""
    if value and not ctx.params.get("overwrite"):
        held = [a for a in artifacts if (Path(value) / a).exists()]
        if held:
            raise click.BadParameter(
                f"the folder {value!r} holds {what} ({held[0]}): pass --overwrite to "
                f"replace it, or give another {param.opts[0]}")


_overwrite_option = click.option(
    "--overwrite", is_flag=True, is_eager=True,
    help="Replace the model the --out folder already holds.")


def _report_out(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``simulate --out``: a folder already holding a run's report is refused unless
    ``--overwrite`` (eager) was given: a second run into it replaced the first report
    unasked, and one without plots left the first run's plots beside the new figures."""
    from smartsched.bench.report import REPORT_FILES, report_folder_problem
    from smartsched.outputs import model_folder_problem

    _nonempty(ctx, param, value)
    if value and Path(value).exists() and not Path(value).is_dir():  # /dev/null, a FIFO:
        raise click.BadParameter(f"{value[:200]!r} is not a folder")  # found after the run
    # A trained model's, a policy store's or an audit log's folder takes no report (one
    # written into a policy folder was copied into the store by a later ``policy stage``).
    if value and ((why := model_folder_problem(Path(value) / "report.json")) is not None
                  or (why := report_folder_problem(Path(value))) is not None):
        raise click.BadParameter(why)
    _refuse_held(ctx, param, value, REPORT_FILES, "an earlier report")
    return value


def _seeds(text: str) -> list[int]:
    """"42-51" or "42,43" -> a list of seeds (at most MAX_SEEDS, each within 0..MAX_SEED;
    a range is checked before it is expanded)."""
    import re

    out: list[int] = []
    hint = f"not a seed list: {text[:80]!r} (use 42-51 or 1,2,3)"
    for part in text.split(","):
        if not part.strip():
            continue
        # Plain ASCII digits only: int() also read "1_000" and other scripts' digits.
        m = re.fullmatch(r"\s*([0-9]{1,12})\s*(?:-\s*([0-9]{1,12})\s*)?", part)
        if m is None:
            raise click.BadParameter(hint)
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if not 0 <= lo <= hi <= MAX_SEED or hi - lo + 1 + len(out) > MAX_SEEDS:
            raise click.BadParameter(f"{hint}: a range must run upwards within "
                                     f"0..{MAX_SEED}, {MAX_SEEDS:,} seeds at most")
        out.extend(range(lo, hi + 1))
    if not out:
        raise click.BadParameter(f"{hint}: each within 0..{MAX_SEED}, {MAX_SEEDS:,} at most")
    if len(set(out)) < len(out):  # a seed twice counts its run twice in every median
        seen: set[int] = set()
        dup = next(x for x in out if x in seen or seen.add(x))
        raise click.BadParameter(f"{hint}: seed {dup} is given twice")
    return out


@main.command()
@click.option("--cluster", default="small", show_default=True,
              help="Preset (small, medium, large, finance, openb-gpu, openb-all) or a "
              ".yaml/.parquet file.")
@click.option("--workload", default="mixed", show_default=True,
              help="openb:<variant>, mixed[:profile.yaml], finance[:profile.yaml], a "
              ".csv/.parquet pod file, or resample:<any of these> (a block-bootstrap "
              "draw per seed).")
@click.option("--scheduler", default="k8s-default", show_default=True,
              help="A packaged profile (see docs), a profile .yaml, or a split profile.")
@click.option("--mode", type=click.Choice(["replay", "fill"]), default="replay", show_default=True)
@click.option("--inflate", type=float, default=1.3, show_default=True,
              help="fill mode: GPU demand as a multiple of cluster GPU capacity.")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True)
@click.option("--hours", type=float, default=None,
              help="Simulated hours (default: 24 for generators, the whole trace for files).")
@click.option("--warmup-hours", type=float, default=0.0, show_default=True,
              help="replay: simulate this long first and measure only after it.")
@click.option("--start-hours", type=float, default=None,
              help="replay a trace from this hour (pods running then start at 0).")
@click.option("--out", type=click.Path(file_okay=False), default=None, callback=_report_out,
              help="Report folder (report.json, timeseries.parquet, PNG plots).")
@click.option("--overwrite", is_flag=True, is_eager=True,
              help="Replace the report the --out folder already holds (all of its files).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file, help="Also write the report as JSON here.")
@click.option("--plots/--no-plots", default=True, show_default=True)
@click.option("--compliance", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Compliance policy (YAML: residency, dedicated pools, isolation) that "
              "binds every decision.")
@click.option("--node-mtbf-hours", type=FiniteRange(min=0, max=1e6, min_open=True),
              default=None,
              help="Inject node failures: mean time between failures per node.")
@click.option("--repair-hours", type=FiniteRange(min=0, max=1e6, min_open=True), default=1.0,
              show_default=True, help="How long a failed node stays down.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar (default: when stderr is a terminal).")
def simulate(
    cluster: str, workload: str, scheduler: str, mode: str, inflate: float, seed: int,
    hours: float | None, warmup_hours: float, start_hours: float | None, out: str | None,
    overwrite: bool, json_path: str | None, plots: bool, compliance: str | None,
    node_mtbf_hours: float | None, repair_hours: float, progress: bool | None,
) -> None:
    """Simulate one scheduler on one cluster and workload; print the headline metrics."""
    from smartsched.bench.compare import comparison_table
    from smartsched.bench.simulate import simulate as run_sim

    # Options of the other mode would be dropped without a word.
    ctx = click.get_current_context()
    given = {name for name in ("warmup_hours", "start_hours", "inflate")
             if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT}
    for name in sorted(given & ({"warmup_hours", "start_hours"} if mode == "fill"
                                else {"inflate"})):
        raise click.BadParameter(f"applies to {'replay' if mode == 'fill' else 'fill'} mode "
                                 f"only, not --mode {mode}",
                                 param_hint=f"'--{name.replace('_', '-')}'")
    if node_mtbf_hours is None and ctx.get_parameter_source(
            "repair_hours") is not click.core.ParameterSource.DEFAULT:  # (no failures to repair)
        raise click.BadParameter("applies only with --node-mtbf-hours (node failures)",
                                 param_hint="'--repair-hours'")
    if progress is None:
        progress = sys.stderr.isatty()
    report = run_sim(
        cluster, workload, scheduler, mode=mode, inflate=inflate, seed=seed, hours=hours,
        warmup_hours=warmup_hours, start_hours=start_hours, out=Path(out) if out else None,
        plots=plots, progress=progress, compliance=compliance,
        engine_overrides=None if node_mtbf_hours is None else {
            "node_mtbf_hours": node_mtbf_hours, "repair_s": repair_hours * 3600.0},
    )
    for why in report.get("compliance_unbound") or ():
        click.echo(f"warning: {why}", err=True)
    click.echo(comparison_table([report]))
    click.echo(f"\n{report['decisions']} decisions in {report['wall_seconds']:.2f} s wall"
               + (f"; report in {out}" if out else ""))
    _write_json(json_path, report)


def _demo_out(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``demo --out``: a folder holding an earlier demo's comparison is refused unless
    ``--overwrite`` (eager) was given."""
    from smartsched.outputs import model_folder_problem

    _nonempty(ctx, param, value)
    if value and (why := model_folder_problem(Path(value) / "comparison.json")) is not None:
        raise click.BadParameter(why)  # a policy folder or a store took the demo's files
    _refuse_held(ctx, param, value, ("comparison.txt", "comparison.json"), "an earlier demo")
    return value


@main.command()
@click.option("--out", type=click.Path(file_okay=False), default="reports/demo", show_default=True,
              callback=_demo_out)
@click.option("--overwrite", is_flag=True, is_eager=True,
              help="Replace the demo the --out folder already holds.")
@click.option("--cluster", default="small", show_default=True)
@click.option("--hours", type=float, default=24.0, show_default=True)
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True)
@click.option("--warmup-hours", type=float, default=6.0, show_default=True)
@click.option("--schedulers", callback=_scheduler_names, default=None,
              help="Comma-separated (default: k8s-default, fgd and the shipped policy "
              "rl:models/ppo_mixed_small when present).")
def demo(out: str, overwrite: bool, cluster: str, hours: float, seed: int,
         warmup_hours: float, schedulers: str | None) -> None:
    """End-to-end demo: the mixed workload for a simulated day, schedulers side by side."""
    from smartsched.bench.demo import run_demo

    names = None if schedulers is None else [s.strip() for s in schedulers.split(",")
                                             if s.strip()]
    res = run_demo(out, cluster=cluster, hours=hours, seed=seed, warmup_hours=warmup_hours,
                   schedulers=names, progress=sys.stderr.isatty(), echo=click.echo)
    click.echo("\n" + res.table)
    click.echo(f"\nreports, time series and plots in {out}/")


@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True),
              default="rllib_configs/ppo_default.yaml", show_default=True)
@click.option("--iterations", type=click.IntRange(1, 1_000_000), default=None,  # as the config's
              help="Override the config's iterations.")
@click.option("--resume", is_flag=True, help="Continue from the latest checkpoint.")
@click.option("--output-dir", default=None, callback=_nonempty,
              help="Override the config's output_dir (one holding a run needs --resume).")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=None,
              help="Override the config's seed (training seeds: run several, report spread).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def train(config_path: str, iterations: int | None, resume: bool, output_dir: str | None,
          seed: int | None, json_path: str | None) -> None:
    """Train the PPO placement policy on the twin (locally or under `ray job submit`)."""
    from smartsched.rl.config import load_train_config
    from smartsched.rl.train import train as run_train

    cfg = load_train_config(config_path)
    if seed is not None:
        cfg = cfg.model_copy(update={"seed": seed})
    if not resume:
        from smartsched.rl.train import refuse_earlier_run

        refuse_earlier_run(Path(output_dir or cfg.output_dir))
    summary = run_train(cfg, iterations=iterations, resume=resume, output_dir=output_dir,
                        echo=click.echo)
    click.echo(f"policy: {summary['policy']}  (use --scheduler rl:{summary['policy']})")
    _write_json(json_path, summary)


def _teacher(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """The teacher of ``distill``: a learned policy (``rl:PATH``, usually with
    ``ensemble=`` members) that builds, checked before any day is simulated."""
    from smartsched.rl.distill import check_teacher
    from smartsched.scheduling.base import make_scheduler

    try:
        check_teacher(value)
        make_scheduler(value)  # every member loads, and they were trained alike
    except ValidationError as e:
        raise click.BadParameter(e.message) from None
    return value


@main.command()
@click.option("--teacher", required=True, callback=_teacher,
              help="The policy to imitate: rl:PATH?ensemble=PATH2&ensemble=PATH3...")
@click.option("--output-dir", required=True,
              callback=_model_out("smartsched_policy.json", "module_spec.json"),
              help="Where the student policy is written (a policy folder).")
@click.option("--overwrite", is_flag=True, is_eager=True,
              help="Replace the policy the --output-dir folder already holds.")
@click.option("--init", default=None, type=click.Path(file_okay=False, exists=True),
              help="The student's starting weights (default: the teacher's first policy).")
@click.option("--seeds", default="20000-20005", show_default=True, callback=_seed_list,
              help="Workload seeds whose days the teacher decides (the training data).")
@click.option("--val-seeds", default="20006", show_default=True, callback=_seed_list,
              help="Seeds held aside: they pick the epoch and measure the agreement.")
@click.option("--cluster", default="medium", show_default=True)
@click.option("--workload", default="mixed", show_default=True)
@click.option("--hours", type=FiniteRange(min=0, max=24 * 365, min_open=True), default=24.0,
              show_default=True)
@click.option("--warmup-hours", type=FiniteRange(min=0, max=24 * 365), default=6.0,
              show_default=True)
@click.option("--epochs", type=click.IntRange(1, 10_000), default=8, show_default=True)
@click.option("--dagger-rounds", type=click.IntRange(0, 100), default=0, show_default=True,
              help="Rounds in which the student acts and the teacher labels (DAgger).")
@click.option("--lr", type=FiniteRange(min=0, max=1, min_open=True), default=3e-4,
              show_default=True)
@click.option("--batch-size", type=click.IntRange(1, 65_536), default=128, show_default=True)
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True,
              help="The fit's seed (shuffling).")
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=None)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def distill(teacher: str, output_dir: str, overwrite: bool, init: str | None,
            seeds: list[int], val_seeds: list[int], cluster: str, workload: str,
            hours: float, warmup_hours: float, epochs: int, dagger_rounds: int, lr: float,
            batch_size: int, seed: int, workers: int | None, json_path: str | None) -> None:
    """Train one policy to decide as a teacher (an ensemble) does, at one network's cost."""
    from smartsched.rl.distill import distill_policy

    summary = distill_policy(teacher, output_dir, seeds=seeds, val_seeds=val_seeds,
                             init=init, cluster=cluster, workload=workload, hours=hours,
                             warmup_hours=warmup_hours, epochs=epochs,
                             dagger_rounds=dagger_rounds, lr=lr, batch_size=batch_size,
                             seed=seed, workers=workers, echo=click.echo)
    click.echo(f"student: {summary['policy']}  agreement with the teacher on the held-aside "
               f"seeds {100 * summary['val_agreement']:.2f} % over "
               f"{summary['val_decisions']} decisions  (use --scheduler "
               f"rl:{summary['policy']})")
    _write_json(json_path, summary)


@main.command()
@click.option("--sweep", "sweep_path", type=click.Path(dir_okay=False, exists=True),
              default="tune_sweeps/reward_weights.yaml", show_default=True)
@click.option("--num-samples", type=click.IntRange(1, 100_000), default=None,  # as the sweep's
              help="Override the sweep's number of trials.")
@click.option("--output-dir", default=None, callback=_nonempty,
              help="Override the sweep's output_dir.")
@click.option("--overwrite", is_flag=True,
              help="Replace an earlier sweep's results in the output folder.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def tune(sweep_path: str, num_samples: int | None, output_dir: str | None, overwrite: bool,
         json_path: str | None) -> None:
    """Search reward weights with Ray Tune; write the Pareto front and recommended weights."""
    from smartsched.tuning.runner import run_sweep

    summary = run_sweep(sweep_path, num_samples=num_samples, output_dir=output_dir,
                        overwrite=overwrite, echo=click.echo)
    _write_json(json_path, summary)


def _models_dir(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``serve --models-dir``: a missing folder is allowed (reloads then take packaged
    names only), but a path that exists and is no folder is refused: it was silently
    treated as missing and the service started without the models asked for."""
    _nonempty(ctx, param, value)
    if Path(value).exists() and not Path(value).is_dir():
        raise click.BadParameter(f"{value!r} is not a folder")
    return value


@main.group(invoke_without_command=True)
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True),
              default=None, help="Serve config YAML [default: serve_apps/placement.yaml when "
              "it is here, else the built-in defaults]")
@click.option("--cluster", default=None, help="Override the config's cluster.")
@click.option("--region-profile", default=None, help="Profile of every region (or rl:PATH).")
@click.option("--edge-profile", default=None, help="Profile of every MEC edge site.")
@click.option("--host", default=None, callback=_host,
              help="[default: the config's http_options.host, else 127.0.0.1]")
@click.option("--port", default=None, type=click.IntRange(1, 65535),
              help="[default: the config's http_options.port, else 8000]")
@click.option("--state-dir", default="runs/serve", show_default=True, callback=_nonempty,
              help="This instance's tokens, journal and Ray files (created private).")
@click.option("--models-dir", default="models", show_default=True, callback=_models_dir,
              help="Where live reloads may load policies and profile files from "
                   "(ignored when missing: reloads then take packaged profile names only).")
@click.option("--ray-address", default=None,
              help="Use this Ray cluster (its own auth settings) instead of an embedded one "
                   "bound to loopback with token auth.")
@click.option("--learn", "learn_path", type=click.Path(dir_okay=False, exists=True),
              default=None, help="Also run continuous learning (settings YAML as for "
              "`smartsched learn`; its store inside --models-dir): the sites serve the "
              "store's current version, and each promotion reloads them.")
@click.option("--learn-sites", default="", help="Sites the learning loop reloads "
              "(comma-separated) [default: every region]")
@click.pass_context
def serve(ctx: click.Context, config_path: str | None, cluster: str | None,
          region_profile: str | None, edge_profile: str | None, host: str | None,
          port: int | None, state_dir: str, models_dir: str, ray_address: str | None,
          learn_path: str | None, learn_sites: str) -> None:
    """Run the placement service on a local Ray (Ctrl-C stops it)."""
    if ctx.invoked_subcommand is not None:
        return
    learn_names = [s.strip() for s in learn_sites.split(",") if s.strip()]
    if learn_sites and not learn_path:  # ignored without a word
        raise click.UsageError("--learn-sites applies only with --learn")
    if learn_sites and not learn_names:  # read as "every region"
        raise click.BadParameter("names no site (leave it out for every region)",
                                 param_hint="'--learn-sites'")
    from pathlib import Path

    from smartsched.rl.learning import ServiceLearning
    from smartsched.serving.local import run_local

    models = Path(models_dir).resolve() if Path(models_dir).is_dir() else None
    run_local(config_path, {"cluster": cluster, "region_profile": region_profile,
                            "edge_profile": edge_profile,
                            "models_dir": str(models) if models else None},
              host, port, state_dir, echo=click.echo, ray_address=ray_address,
              beside=ServiceLearning(learn_path, learn_names,
                                     echo=click.echo) if learn_path else None)


def _nonempty_name(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """A name option given as ``''`` is refused here, not sent to the service (which
    answered with its own error, retried as if the network had failed)."""
    if not value.strip():
        raise click.BadParameter("is empty")
    return value


@serve.command("reload")
@click.option("--url", default="http://127.0.0.1:8000", show_default=True)
@click.option("--site", required=True, callback=_nonempty_name,
              help="Region or MEC site whose profile changes.")
@click.option("--profile", required=True, callback=_nonempty_name,
              help="Packaged profile name, or a profile YAML / rl:PATH inside the service's "
                   "models_dir.")
@click.option("--operator-token-file", type=click.Path(dir_okay=False, exists=True),
              default=None, help="The operator token [default: $SMARTSCHED_OPERATOR_TOKEN]")
def serve_reload(url: str, site: str, profile: str, operator_token_file: str | None) -> None:
    """Swap a site's profile (or policy) live; reservations stay. Needs the operator token."""
    from smartsched.client import PlacementClient
    from smartsched.model.configfile import read_token_file

    token = (read_token_file(operator_token_file, "operator_token_file")
             if operator_token_file else None)
    out = PlacementClient(url, operator_token=token).set_profile(site, profile)
    click.echo(f"{out['site']}: now deciding with {out['profile']}")


@main.command()
@click.argument("pod_file", type=click.Path(dir_okay=False, exists=True))
@click.option("--url", default="http://127.0.0.1:8000", show_default=True)
@click.option("--request-id", default=None, help="Idempotency key (default: generated).")
# --ttl within the service's bounds (an infinite one failed as "error: InvalidJSONError")
@click.option("--ttl", "ttl_s", default=None, type=FiniteRange(0.001, 86_400),
              help="Reservation lifetime in seconds (default: the service's default_ttl_s).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def place(pod_file: str, url: str, request_id: str | None, ttl_s: float | None,
          json_path: str | None) -> None:
    """Ask the placement service where to run the pod(s) in POD_FILE (YAML: one or a list)."""
    from smartsched.client import PlacementClient, pod_specs, read_pod_file

    pods = pod_specs(read_pod_file(pod_file))
    client = PlacementClient(url)
    resp = (client.place(pods[0], request_id=request_id, ttl_s=ttl_s) if len(pods) == 1
            else client.place_batch(pods, request_id=request_id, ttl_s=ttl_s))
    for p in resp.placements:
        if p.placed:
            click.echo(f"{p.pod_id}: {p.region}/{p.zone}/{p.node} devices {p.devices} "
                       f"[{p.tier}, {p.profile}] reservation {p.reservation_id}")
        else:
            click.echo(f"{p.pod_id}: not placed: {p.reasons[-1].reason if p.reasons else '?'}")
    _write_json(json_path, resp.model_dump())


@main.group()
def k8s() -> None:
    """Kubernetes integration (the scheduler extender; more to come)."""


@k8s.command("extender")
@click.option("--profile", default="k8s-default", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, callback=_host,
              help="Loopback by default: kube-scheduler's extender calls carry no credential, "
                   "so run it beside kube-scheduler (same pod or host); widen only behind a "
                   "network policy.")
@click.option("--port", default=8888, show_default=True, type=click.IntRange(1, 65535))
@click.option("--nodes", "nodes_file", default=None, type=click.Path(dir_okay=False, exists=True),
              help="NodeList (JSON or YAML) for nodeCacheCapable: true.")
@click.option("--max-body-bytes", default=64 * 1024 * 1024, show_default=True,
              type=click.IntRange(1024, 1024**3), help="Larger requests get 413 unread.")
@click.option("--compliance", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Compliance policy (YAML: residency, dedicated pools, isolation) that "
              "binds every decision.")
def k8s_extender(profile: str, host: str, port: int, nodes_file: str | None,
                 max_body_bytes: int, compliance: str | None) -> None:
    """Serve kube-scheduler's extender protocol (POST /filter, /prioritize)."""
    import uvicorn

    from smartsched.k8s.extender import Extender, make_app
    from smartsched.k8s.nodelist import read_node_list

    ext = Extender(profile, compliance=compliance)
    if nodes_file:
        snap = ext.set_cache(read_node_list(nodes_file))
        click.echo(f"node cache: {len(snap.spec.nodes)} nodes, {len(snap.skipped)} skipped")
        for kind, name, why in snap.skipped[:20]:  # the operator's own file: say which, why
            click.echo(f"  skipped {kind} {name[:64]!r}: {why}")
        if len(snap.skipped) > 20:
            click.echo(f"  ... and {len(snap.skipped) - 20} more")
    from smartsched.listen import guarded_server_config

    # Bounded request heads, a deadline for them, a cap on connections (listen.py).
    uvicorn.Server(guarded_server_config(make_app(ext, max_body_bytes), host=host, port=port,
                                         log_level="warning", server_header=False)).run()


def _k8s_name(kind: str) -> Any:
    """A callback checking an option as a Kubernetes name of ``kind`` (see
    ``k8s.names.check_name``) as the command line is read."""

    def check(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        from smartsched.k8s.names import check_name
        from smartsched.model.errors import ValidationError

        if value is None:
            return None
        try:
            return check_name(param.opts[0], value, kind)
        except ValidationError as e:
            raise click.BadParameter(e.message) from None

    return check


def _regular_file(_ctx: click.Context, _param: click.Parameter, value: str | None
                  ) -> str | None:
    """An input file option that must be a regular file: a FIFO (which click's
    ``exists=True`` lets through) was waited on for ever."""
    if value is not None and not Path(value).is_file():
        raise click.BadParameter(f"{value[:200]!r} is not a regular file")
    return value


@k8s.command("scheduler")
@click.option("--kubeconfig", default=None, type=click.Path(dir_okay=False, exists=True),
              callback=_regular_file,
              help="Default: in-cluster config, else ~/.kube/config.")
@click.option("--allow-exec-auth", is_flag=True,
              help="Allow a kubeconfig whose user runs a command for its credentials (exec, "
                   "auth-provider): the client runs it, as this user, while loading.")
@click.option("--scheduler-name", default="smartsched", show_default=True,
              callback=_k8s_name("subdomain"),
              help="Pods' schedulerName this scheduler takes, and its Lease's name.")
@click.option("--profile", default="k8s-default", show_default=True,
              help="Any profile name, profile YAML or rl:PATH.")
@click.option("--interval", default=2.0, show_default=True, type=FiniteRange(0.1, 3600))
@click.option("--lease-namespace", default="kube-system", show_default=True,
              callback=_k8s_name("label"))
@click.option("--identity", default=None, callback=_k8s_name("identity"),
              help="Leader-election identity (default: hostname).")
@click.option("--once", is_flag=True, help="One pass (if leader), then exit.")
@click.option("--metrics-port", default=None, type=click.IntRange(1, 65535),
              help="Serve Prometheus metrics on this port.")
@click.option("--metrics-host", default="0.0.0.0", show_default=True, callback=_host,
              help="Where the metrics listen (every interface, for an in-cluster scrape; "
                   "127.0.0.1 for this machine only).")
@click.option("--prometheus", default=None,
              help="Read nodes' actual usage from this Prometheus (e.g. http://prometheus:9090) "
                   "at every pass, for load-aware profiles and telemetry-observing policies.")
@click.option("--preemption/--no-preemption", default=False, show_default=True,
              help="Evict lower-priority pods (Eviction API) when the profile preempts "
                   "(DefaultPreemption); the pod binds once they have terminated.")
@click.option("--gang-reservations/--no-gang-reservations", default=False, show_default=True,
              help="A pod group that cannot start holds the room that frees soonest (pods' "
                   "smartsched.io/expected-duration-seconds) and others backfill around it; "
                   "for profiles with GangReservation (composite, composite-accelerators).")
@click.option("--compliance", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Compliance policy (YAML: residency, dedicated pools, isolation) that "
              "binds every decision.")
@click.option("--audit-log", default=None, type=click.Path(file_okay=False),
              help="Write every decision to this signed audit log (needs --audit-heads and "
              "--audit-key).")
@click.option("--audit-heads", default=None, type=click.Path(dir_okay=False))
@click.option("--audit-key", default=None, type=click.Path(dir_okay=False, exists=True))
def k8s_scheduler(kubeconfig: str | None, allow_exec_auth: bool, scheduler_name: str,
                  profile: str, interval: float,
                  lease_namespace: str, identity: str | None, once: bool,
                  metrics_port: int | None, metrics_host: str, prometheus: str | None,
                  preemption: bool, gang_reservations: bool, compliance: str | None,
                  audit_log: str | None, audit_heads: str | None, audit_key: str | None
                  ) -> None:
    """Schedule pods with schedulerName SCHEDULER_NAME: decide with the profile, bind."""
    import socket

    from smartsched.k8s.daemon import api_failure, kube_clients, run_scheduler_daemon
    from smartsched.k8s.scheduler import LeaseLock, SchedulerLoop

    if (audit_log or audit_heads or audit_key) and not (audit_log and audit_heads and audit_key):
        raise click.UsageError("--audit-log, --audit-heads and --audit-key go together")
    # A bad kubeconfig fails before the log opens.
    core, coord = kube_clients(kubeconfig, allow_exec_auth)
    # ... and so does a bad profile or policy: the log opened first left its id, lock and
    # a segment in whatever folder --audit-log named (a model folder, say).
    loop = SchedulerLoop(core, scheduler_name, profile, prometheus_url=prometheus,
                         preemption=preemption, compliance=compliance,
                         gang_reservations=gang_reservations)
    trail = None
    if audit_log and audit_heads and audit_key:
        from smartsched.audit.keys import load_private_key
        from smartsched.audit.log import AuditLog

        trail = loop.audit = AuditLog(audit_log, audit_heads, load_private_key(audit_key))
    if metrics_port:
        from smartsched.prometheus.http import serve_registry

        try:
            serve_registry(loop.metrics.registry, metrics_port, metrics_host)
        except OSError as e:  # a port taken: the bare errno named neither option nor port
            if trail is not None:
                trail.close()
            raise click.BadParameter(f"cannot listen on {metrics_host}:{metrics_port}: "
                                     f"{e.strerror or e}", param_hint="'--metrics-port'"
                                     ) from None
    lock = LeaseLock(coord, scheduler_name, lease_namespace, identity or socket.gethostname())
    try:
        run_scheduler_daemon(loop, lock, interval=interval, once=once, echo=click.echo,
                             warn=lambda m: click.echo(m, err=True))
    except Exception as e:  # an API server down or refusing: one line, exit 1 (not input)
        message = api_failure(e, core.api_client.configuration.host)
        if message is None:
            raise
        click.echo(f"error: {message}", err=True)
        sys.exit(1)
    finally:
        if trail is not None:
            trail.close()  # seal and sign what is buffered


@main.group()
def forecast() -> None:
    """Load forecasting: train the LSTM, evaluate it against the baselines."""


DEFAULT_FORECAST_DATA = "google2011"


def _forecast_data(data: str) -> str:
    if data == DEFAULT_FORECAST_DATA:
        from smartsched.forecast.data import GOOGLE_FILE
        from smartsched.paths import data_dir

        return str(data_dir() / GOOGLE_FILE)
    return data


@forecast.command("train")
@click.option("--data", default=DEFAULT_FORECAST_DATA, show_default=True,
              help="Long-format CSV/Parquet (series_id, timestamp, values) or google2011.")
@click.option("--out", default="models/forecast", show_default=True,
              callback=_model_out("forecaster.pt", "forecaster.json"))
@_overwrite_option
@click.option("--epochs", default=30, show_default=True, type=click.IntRange(1, 1000))
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True)
@click.option("--lookback", default=72, show_default=True, type=click.IntRange(2, 10_000))
@click.option("--horizon", default=3, show_default=True, type=click.IntRange(1, 1000))
@click.option("--hidden", default=96, show_default=True, type=click.IntRange(4, 4096))
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def forecast_train(data: str, out: str, overwrite: bool, epochs: int, seed: int, lookback: int,
                   horizon: int, hidden: int, json_path: str | None) -> None:
    """Train the LSTM (early stopping on validation, interval calibrated there)."""
    from smartsched.forecast.run import train_forecaster

    _write_json(json_path, train_forecaster(_forecast_data(data), out, epochs=epochs, seed=seed,
                                            lookback=lookback, horizon=horizon, hidden=hidden,
                                            echo=click.echo))


@forecast.command("evaluate")
@click.option("--model", default=None, help="A trained forecaster folder (omit: baselines only).")
@click.option("--data", default=DEFAULT_FORECAST_DATA, show_default=True)
@click.option("--plot", callback=_image_out, default=None, type=click.Path(dir_okay=False),
              help="PNG of actual vs predicted for a few test series.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def forecast_evaluate(model: str | None, data: str, plot: str | None,
                      json_path: str | None) -> None:
    """MAE, MAPE, sMAPE, MASE and interval coverage per model, per machine and aggregate."""
    from smartsched.forecast.evaluate import format_table
    from smartsched.forecast.run import evaluate_forecaster

    if plot is not None and model is None:  # baselines only: no plot was drawn, exit 0
        raise click.BadParameter("needs --model (the plot shows the LSTM's forecasts)",
                                 param_hint="'--plot'")
    res = evaluate_forecaster(model, _forecast_data(data), plot=plot)
    click.echo(format_table(res))
    for t, best in res["best_baseline"].items():
        if "LSTM" in res["models"]:
            r = res["models"]["LSTM"][t]["machine"]["MASE_vs_best"]
            click.echo(f"{t}: LSTM MAE / best baseline ({best}) MAE = {r:.3f}")
    _write_json(json_path, res)


@forecast.command("crossfit")
@click.option("--data", default=DEFAULT_FORECAST_DATA, show_default=True)
@click.option("--folds", default=3, show_default=True, type=click.IntRange(2, 20))
@click.option("--epochs", default=30, show_default=True, type=click.IntRange(1, 1000))
@click.option("--lookback", default=72, show_default=True, type=click.IntRange(2, 10_000))
@click.option("--hidden", default=96, show_default=True, type=click.IntRange(4, 4096))
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def forecast_crossfit(data: str, folds: int, epochs: int, lookback: int, hidden: int, seed: int,
                      json_path: str | None) -> None:
    """Every series forecast by models that never saw its job: the whole-fleet aggregate."""
    from smartsched.forecast.crossfit import crossfit
    from smartsched.forecast.evaluate import format_table
    from smartsched.forecast.run import load_any

    res = crossfit(load_any(_forecast_data(data)), folds=folds, seed=seed, lookback=lookback,
                   hidden=hidden, epochs=epochs, echo=click.echo)
    click.echo(format_table(res))
    for t, best in res["best_baseline"].items():
        r = res["models"]["LSTM"][t]["machine"]["MASE_vs_best"]
        click.echo(f"{t}: LSTM MAE / best baseline ({best}) MAE = {r:.3f}")
    _write_json(json_path, res)


def _service_sites(service: str | None, sites: str, served_as: str | None) -> list[str]:
    """The sites a ``--service`` reloads, checked before anything changes: ``--sites`` that
    names none (``,``) reloaded nothing, and ``--sites`` / ``--served-as`` without
    ``--service`` were ignored without a word."""
    names = [x.strip() for x in sites.split(",") if x.strip()]
    if service is None:
        if sites or served_as is not None:
            raise click.UsageError("--sites and --served-as apply only with --service")
        return names
    if not names:
        raise click.UsageError("--service needs --sites (the sites to reload)")
    return names


def _site_names(_ctx: click.Context, _param: click.Parameter, value: str | None
                ) -> str | None:
    """``--sites``: a list that names no site (``,,,``) is refused, not read as "all"."""
    if value is not None and not [x for x in value.split(",") if x.strip()]:
        raise click.BadParameter("names no site (leave it out for all of the cluster's)")
    return value


def _federation_options(fn: Any) -> Any:
    from smartsched.federation import MAX_LOCAL_EPOCHS, MAX_ROUNDS

    opts = [
        click.option("--data", default=DEFAULT_FORECAST_DATA, show_default=True,
                     help="The usage series shared out across the sites (long CSV/Parquet "
                     "or google2011)."),
        click.option("--cluster", default="large", show_default=True,
                     help="Preset whose MEC sites learn (large: four)."),
        click.option("--sites", default=None, callback=_site_names,
                     help="Comma-separated MEC sites of the cluster (default: all)."),
        click.option("--partition", type=click.Choice(["level", "iid"]), default="level",
                     show_default=True, help="level: non-IID by load level; iid: at random."),
        # The ranges federation.rounds checks, here so a bad value fails before Ray starts.
        click.option("--rounds", default=20, show_default=True,
                     type=click.IntRange(1, MAX_ROUNDS)),
        click.option("--local-epochs", default=3, show_default=True,
                     type=click.IntRange(1, MAX_LOCAL_EPOCHS),
                     help="Epochs each site trains per round on its own windows."),
        click.option("--mu", default=0.0, show_default=True, type=FiniteRange(min=0, max=1e6),
                     help="FedProx's proximal weight (0: FedAvg)."),
        click.option("--server-momentum", default=0.3, show_default=True,
                     type=FiniteRange(0, 1, max_open=True),
                     help="FedAvgM: the cloud's momentum over rounds (0: plain averaging; "
                          "0.3 beat it on each of three seeds, docs/benchmarks.md)."),
        click.option("--lookback", default=36, show_default=True, type=click.IntRange(2, 10_000)),
        click.option("--hidden", default=64, show_default=True, type=click.IntRange(4, 4096)),
        click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True),
        click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
                     callback=_out_file),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _run_federation(data: str, cluster: str, sites: str | None, partition: str, rounds: int,
                    local_epochs: int, mu: float, server_momentum: float, lookback: int,
                    hidden: int, seed: int, json_path: str | None, out: str | None,
                    references: tuple[str, ...]) -> None:
    from smartsched.bench.federation import format_federation, run_federation

    names = None if sites is None else [x.strip() for x in sites.split(",") if x.strip()]
    res = run_federation(_forecast_data(data), cluster=cluster, sites=names,
                         partition=partition, rounds=rounds, local_epochs=local_epochs, mu=mu,
                         server_momentum=server_momentum, lookback=lookback, hidden=hidden,
                         seed=seed, references=references,
                         out=out, echo=click.echo)
    click.echo(format_federation(res))
    if out is not None:
        click.echo(f"saved the federated forecaster to {out} (use it as forecaster={out})")
    _write_json(json_path, res)


@main.command()
@_federation_options
@click.option("--out", default="models/forecast-federated", show_default=True,
              callback=_model_out("forecaster.pt", "forecaster.json"))
@_overwrite_option
def federate(data: str, cluster: str, sites: str | None, partition: str, rounds: int,
             local_epochs: int, mu: float, server_momentum: float, lookback: int, hidden: int,
             seed: int, json_path: str | None, out: str, overwrite: bool) -> None:
    """Federated training of the edge sites' load forecaster: each MEC site a Ray actor
    that trains on its own nodes' usage; only weights leave a site."""
    _run_federation(data, cluster, sites, partition, rounds, local_epochs, mu, server_momentum,
                    lookback, hidden, seed, json_path, out, ())


@main.group()
def telemetry() -> None:
    """The twin's per-node telemetry: the metric catalogue and a live /metrics exporter."""


@telemetry.command("serve")
@click.option("--cluster", default="small", show_default=True)
@click.option("--workload", default="mixed", show_default=True)
@click.option("--scheduler", default="k8s-default", show_default=True)
# --speed 1e308 (or anything past what the twin can simulate) was accepted and served an
# unpaced twin under a "1e+308x clock" banner: refused above a simulated day per second.
@click.option("--speed", default=60.0, show_default=True,
              type=FiniteRange(min=0, min_open=True, max=86_400),
              help="Simulated seconds per wall-clock second (at most 86400: a simulated "
                   "day per second).")
@click.option("--hours", default=24.0, show_default=True,
              type=FiniteRange(min=0, min_open=True, max=10 * 365 * 24),
              help="Workload span; the twin restarts with the next seed after it (at "
                   "least a wall-clock second at --speed).")
# A warm-up of NaN or -1 was skipped without a word, and a duration of NaN, -1 or 0
# served nothing and exited 0: each is refused, naming the option.
@click.option("--warm-hours", default=1.0, show_default=True, type=FiniteRange(min=0),
              help="Simulated before serving, so the cluster is not empty.")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, callback=_host)
@click.option("--port", default=9500, show_default=True, type=click.IntRange(0, 65535),
              help="0 picks a free port.")
@click.option("--duration", default=None, type=FiniteRange(min=0, min_open=True),
              help="Stop after this many wall-clock seconds (default: until interrupted).")
def telemetry_serve(cluster: str, workload: str, scheduler: str, speed: float, hours: float,
                    warm_hours: float, seed: int, host: str, port: int,
                    duration: float | None) -> None:
    """Run the twin live on an accelerated clock and expose its telemetry at /metrics."""
    if warm_hours >= hours:  # the warm-up was cut to the span: the twin restarted empty
        raise click.BadParameter(f"{warm_hours:g} h is not shorter than --hours ({hours:g} h, "
                                 "the span the twin restarts after)",
                                 param_hint="'--warm-hours'")
    from smartsched.prometheus.exporter import LiveTwin
    from smartsched.prometheus.serve import TwinStopped, serve_live_twin

    twin = LiveTwin(cluster, workload, scheduler, speed=speed, hours=hours, seed=seed)
    try:
        serve_live_twin(twin, host=host, port=port, warm_hours=warm_hours, duration=duration,
                        echo=click.echo)
    except TwinStopped as e:
        raise click.ClickException(str(e)) from e


@telemetry.command("reduce")
@click.option("--cluster", default="medium", show_default=True)
@click.option("--workload", default="mixed", show_default=True)
@click.option("--scheduler", default="k8s-default", show_default=True)
@click.option("--hours", default=24.0, show_default=True)
@click.option("--seeds", callback=_seed_list, default="0-1", show_default=True,
              help="Training seeds.")
@click.option("--test-seed", default=100, show_default=True,
              type=click.IntRange(0, MAX_SEED), help="Held out: not one of --seeds.")
@click.option("--components", "k", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--out", default="models/telemetry", show_default=True,
              type=click.Path(file_okay=False),
              callback=_model_out("projection.json", "projection.npz"))
@_overwrite_option
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def telemetry_reduce(cluster: str, workload: str, scheduler: str, hours: float, seeds: list[int],
                     test_seed: int, k: int, out: str, overwrite: bool,
                     json_path: str | None) -> None:
    """Fit the PCA projection of the node telemetry on twin runs; ablate the families."""
    from smartsched.bench.telemetry_study import format_study, study

    if test_seed in seeds:  # checked here too: before the first recording's minutes
        raise click.BadParameter(f"{test_seed} is also one of --seeds; give a held-out "
                                 "seed", param_hint="'--test-seed'")
    proj, res = study(cluster, workload, scheduler, hours, seeds, test_seed, k,
                      echo=click.echo)
    proj.save(out)
    click.echo(format_study(res))
    click.echo(f"saved the projection ({len(proj.columns)} -> {proj.k}) to {out}")
    _write_json(json_path, res)


@telemetry.command("panel")
@click.option("--prometheus", "url", required=True, help="e.g. http://127.0.0.1:9090")
@click.option("--dashboard", default=None,
              help="a Grafana dashboard JSON  [default: the shipped "
                   "infra/grafana/smartsched-cluster.json]")
@click.option("--title", default="CPU utilization by zone", show_default=True)
@click.option("--minutes", default=10.0, show_default=True,
              type=FiniteRange(min=0.01, max=366 * 24 * 60))  # 1e308 sent a start of -inf
@click.option("--step", "step_s", default=5.0, show_default=True,
              type=FiniteRange(min=0.001))
@click.option("--out", required=True, type=click.Path(dir_okay=False), callback=_image_out)
def telemetry_panel(url: str, dashboard: str | None, title: str, minutes: float,
                    step_s: float, out: str) -> None:
    """Render one dashboard panel's data from Prometheus to a PNG (no Grafana needed)."""
    from smartsched.prometheus.panel import default_dashboard, render_panel

    res = render_panel(url, dashboard or default_dashboard(), title, out, minutes=minutes,
                       step_s=step_s)
    click.echo(f"{res['panel']}: {res['series']} series, {res['points']} points -> {out}")


@main.command()
@click.option("--config", "config_path", required=True,
              type=click.Path(dir_okay=False, exists=True),
              help="Learning settings (YAML): store, interval_s, fine_tune, gate, workload.")
@click.option("--rounds", type=click.IntRange(min=1), default=None,
              help="Stop after this many rounds (default: run until interrupted).")
@click.option("--service", default=None, help="Placement service URL: experience from its "
              "sites, and each promotion reloaded into --sites (operator token from "
              "SMARTSCHED_OPERATOR_TOKEN).")
@click.option("--sites", default="", help="Sites to reload on promotion (comma-separated).")
@click.option("--served-as", default=None, callback=_nonempty,
              help="The store's path as the service's models_dir names it (default: the "
              "store path).")
def learn(config_path: str, rounds: int | None, service: str | None, sites: str,
          served_as: str | None) -> None:
    """Continuous learning: every interval, fine-tune the current policy on recent
    experience, gate it against the incumbent, promote it only if it is surely better.
    Runs as a Ray actor on the local Ray (or RAY_ADDRESS)."""
    import ray

    from smartsched.model.configfile import read_config
    from smartsched.rl.learning import check_references, load_learn_config, start_learner
    from smartsched.rl.versions import PolicyStore

    doc = read_config(config_path, "learn")
    cfg = load_learn_config(doc)
    PolicyStore(cfg.store).path_of()  # a current version, or an error naming the store,
    # before Ray starts (the learner actor found it only once it was up)
    check_references(cfg)  # ... and so every workload, cluster and profile it names
    names = _service_sites(service, sites, served_as)
    svc = ({"url": service, "sites": names,
            "served_as": served_as or cfg.store} if service else None)
    from smartsched.rl.train import init_ray, require_cpus

    cpus = (cfg.fine_tune.num_env_runners, "learn.fine_tune.num_env_runners",
            "one per env runner of each round's training")
    require_cpus(*cpus, echo=click.echo)  # the embedded Ray's size is known before it starts
    init_ray(Path(cfg.work_dir).resolve())
    require_cpus(*cpus, echo=click.echo)
    actor = start_learner(doc, svc)
    ref = actor.run.remote(rounds)
    seen = 0
    errors = 0
    try:
        while True:
            done, _ = ray.wait([ref], timeout=5.0)
            st = ray.get(actor.status.remote(seen))
            for out in st["outcomes"]:
                click.echo(f"round: {out['outcome']} (current {out.get('version')}, "
                           f"gain {out.get('gain_mean', float('nan')):+.3f}, lower "
                           f"{out.get('gain_lower', float('nan')):+.3f}, "
                           f"{out['seconds']:.0f} s) {'; '.join(out.get('reasons', []))}"
                           f"{out.get('error', '')}")
                errors += out["outcome"] == "error"
            seen = st["total"]
            if done:
                break
    except KeyboardInterrupt:
        actor.stop.remote()
        click.echo("stopping after the current round")
        ray.get(ref)
    if rounds is not None and seen and errors == seen:  # nothing ran to its end
        raise click.exceptions.Exit(1)


@main.group()
def policy() -> None:
    """Policy versions: the promotion gate, promote, roll back (a store folder each)."""


@policy.command("gate")
@click.option("--candidate", required=True, help="Scheduler name, e.g. rl:models/new.")
@click.option("--incumbent", required=True, help="Scheduler name, e.g. rl:models/current.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True),
              default=None, help="Gate settings (YAML: cluster, workload, seeds, hours, ...).")
@click.option("--seeds", type=click.IntRange(min=2), default=None)
@click.option("--store", type=click.Path(file_okay=False), default=None, callback=_nonempty,
              help="With a candidate rl:PATH: add and promote it here if the gate passes, "
              "log the refusal if not.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def policy_gate(candidate: str, incumbent: str, config_path: str | None, seeds: int | None,
                store: str | None, json_path: str | None) -> None:
    """Run the promotion gate: paired twin episodes, bootstrap lower bound of the gain."""
    from smartsched.model.configfile import read_config
    from smartsched.rl.gate import parse_gate_config, run_gate

    if store is not None and not candidate.startswith("rl:"):  # before the gate's runs
        raise click.BadParameter("needs a candidate rl:PATH (a trained policy to store)",
                                 param_hint="'--store'")
    if store is not None and "?" in candidate:
        # The store keeps a policy folder: the options (ensemble members, a shortlist,
        # weights) would be dropped, and a policy the gate never measured promoted.
        raise click.BadParameter("needs a candidate rl:PATH without options: the store "
                                 "keeps the policy folder, not the options the gate "
                                 "measured with it", param_hint="'--store'")
    if store is not None:
        from smartsched.rl.versions import PolicyStore

        PolicyStore(store).check()
    doc = read_config(config_path, "gate") if config_path else {}
    if seeds is not None and (doc is None or isinstance(doc, dict)):
        # (a list or scalar file is left for the validation to name: merging into it was a
        # TypeError traceback, and ``doc or {}`` read a file holding 0 as every default)
        doc = {**(doc or {}), "seeds": seeds}
    cfg = parse_gate_config(doc)
    res = run_gate(candidate, incumbent, cfg)
    verdict = "PROMOTE" if res.promoted else "REFUSE"
    click.echo(f"{verdict}: gain {res.gain_mean:+.3f} (mean of {len(res.gains)} paired "
               f"episodes), {100 * cfg.confidence:.0f} % lower bound {res.gain_lower:+.3f}; "
               f"hard-constraint violations {res.violations}; {res.seconds:.1f} s")
    for why in res.reasons:
        click.echo(f"  {why}")
    if store is not None:
        from smartsched.rl.versions import PolicyStore

        st = PolicyStore(store)
        if res.promoted:
            v = st.promote(st.add(candidate[3:].split("?", 1)[0]), res.to_dict())
            click.echo(f"promoted as {v} in {store}")
        else:
            st.refuse(candidate, res.to_dict())
    _write_json(json_path, res.to_dict())


@policy.command("rollback")
@click.option("--store", required=True, type=click.Path(file_okay=False, exists=True))
@click.option("--service", default=None, help="Also reload --sites of this service with it "
              "(operator token from SMARTSCHED_OPERATOR_TOKEN).")
@click.option("--sites", default="", help="Sites to reload (comma-separated).")
@click.option("--served-as", default=None, callback=_nonempty,
              help="The store's path as the service's models_dir names it (default: the "
              "store path).")
def policy_rollback(store: str, service: str | None, sites: str,
                    served_as: str | None) -> None:
    """Make the previous promoted version current again (and serve it, with --service)."""
    from smartsched.rl.versions import PolicyStore

    names = _service_sites(service, sites, served_as)  # before the store changes
    st = PolicyStore(store)
    client = _operator_client(service) if service else None  # before the store changes
    before = st.current()
    v = st.rollback()
    click.echo(f"current: {v} ({st.path_of(v)})")
    if client is not None and before is not None:
        _reload_or_undo(client, st, names, served_as or store, v, before)
        click.echo(f"reloaded {', '.join(names)} with {v}")


def _operator_client(service: str) -> Any:
    """A client of ``service`` with the operator token, checked to be there and the service
    to answer before a command changes anything (a rollback that then failed to reach the
    service had moved the store already, and its retry moved it again)."""
    import os

    from smartsched.client import PlacementClient

    if not os.environ.get("SMARTSCHED_OPERATOR_TOKEN"):
        raise click.UsageError("--service needs the operator token in "
                               "SMARTSCHED_OPERATOR_TOKEN; nothing was changed")
    client = PlacementClient(service)
    if not client.healthy():
        raise click.UsageError(f"no answer from the placement service at {client.shown_url}; "
                               "nothing was changed")
    return client


def _reload_or_undo(client: Any, st: Any, names: Sequence[str], served_as: str,
                    version: str, before: str) -> None:
    """Reload ``names`` with ``version``; when one fails, put the store and the sites
    reloaded so far back on ``before`` and raise, saying what holds now."""
    import contextlib

    from smartsched.rl.learning import served_profile

    done: list[str] = []
    for site in names:
        try:
            client.set_profile(site, served_profile(served_as, version))
        except SmartSchedError as e:
            why = f"reloading site {site} with {version} failed ({e})"
            try:
                st.promote(before)
                for s in done:
                    client.set_profile(s, served_profile(served_as, before))
                # the failed site too, as far as it answers: its reload may have applied
                # before the answer was lost (a timeout on every retry)
                with contextlib.suppress(SmartSchedError):
                    client.set_profile(site, served_profile(served_as, before))
            except SmartSchedError as undo:
                raise ValidationError("service", f"{why}, and putting it back failed too "
                                      f"({undo}): the store is at {st.current()}; check what "
                                      f"{', '.join(names)} serve") from None
            raise ValidationError("service", f"{why}; put back: the store is at {before} "
                                  "again" + (f" and {', '.join(done)} serve it again"
                                             if done else "")) from None
        done.append(site)


@policy.command("stage")
@click.option("--store", required=True, type=click.Path(file_okay=False, exists=True))
@click.argument("policy_dir", type=click.Path(file_okay=False))
def policy_stage(store: str, policy_dir: str) -> None:
    """Stage an exported policy as a candidate: the learning loop's next round gates it
    against the current version and promotes it only if it passes."""
    from smartsched.rl.versions import PolicyStore

    name = PolicyStore(store).stage(policy_dir)
    click.echo(f"staged as {name} in {store}; the next learning round gates it")


@policy.command("versions")
@click.option("--store", required=True, type=click.Path(file_okay=False, exists=True))
def policy_versions(store: str) -> None:
    """List the versions, the current one marked, and the log's last events."""
    from smartsched.rl.versions import PolicyStore

    st = PolicyStore(store)
    st.require()  # an empty or unrelated folder would list as an empty store
    cur = st.current()
    log = st.log()  # read before printing: a damaged log is an error, not half a listing
    for v in st.versions():
        click.echo(f"{'*' if v == cur else ' '} {v}")
    for c in st.staged():
        click.echo(f"  staged: {c.name}")
    for e in log[-10:]:
        click.echo(f"  {e['event']}: {e.get('version') or e.get('candidate') or e.get('source')}")


@main.group()
def audit() -> None:
    """The tamper-evident audit log: keys, verification, inclusion proofs."""


@audit.command("keygen")
@click.option("--out", required=True, type=click.Path(dir_okay=False), callback=_nonempty,
              help="Private key file (created 0600; the public key beside it, .pub).")
def audit_keygen(out: str) -> None:
    """Make the Ed25519 key pair that signs the log's heads."""
    from smartsched.audit.keys import generate_key

    if Path(out).suffix == ".pub":  # refused before its folder is made
        raise click.BadParameter(f"{out} would hold both keys: give the private key a name "
                                 "not ending in .pub (the public key is written beside it "
                                 "as <name>.pub)", param_hint="'--out'")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    kid = generate_key(out)
    click.echo(f"key {kid}: private {out}, public {Path(out).with_suffix('.pub')}")


_LOG_OPTS = [
    click.option("--log", "log_dir", required=True, type=click.Path(file_okay=False,
                                                                    exists=True)),
    click.option("--heads", required=True, type=click.Path(dir_okay=False, exists=True),
                 help="The signed heads file (kept apart from the log)."),
]


def _log_options(fn: Any) -> Any:
    for opt in reversed(_LOG_OPTS):
        fn = opt(fn)
    return fn


@audit.command("verify")
@_log_options
@click.option("--public-key", required=True, callback=_nonempty,
              help="The public key: a PEM file, or its 64 hex digits.")
@click.option("--live", is_flag=True, help="The log is being written: its last block may "
              "be unsigned yet (reported, not trusted).")
@click.option("--log-id", default=None, help="Pin the log's id (32 hex digits, printed by "
              "verify): heads of another log signed with the same key then fail.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def audit_verify(log_dir: str, heads: str, public_key: str, live: bool, log_id: str | None,
                 json_path: str | None) -> None:
    """Check the chain, the Merkle roots and the signatures; name the first bad record.
    Exits 1 when anything fails."""
    from smartsched.audit.keys import load_public_key
    from smartsched.audit.verify import verify_log

    rep = verify_log(log_dir, heads, load_public_key(public_key), live=live, log_id=log_id)
    _write_json(json_path, rep.to_dict())
    if rep.ok:
        tail = (f"; {rep.unsigned_tail} records at the end not signed yet"
                if rep.unsigned_tail else "")
        click.echo(f"OK: {rep.records:,} records in {rep.blocks:,} signed blocks of log "
                   f"{rep.log_id} ({rep.seconds:.1f} s){tail}")
        return
    click.echo(f"FAILED after {rep.records:,} good records: {rep.problem}")
    raise SystemExit(1)


@audit.command("prove")
@_log_options
@click.option("--seq", required=True, type=click.IntRange(0), help="The record's number.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), callback=_nonempty,
              help="Proof file; the record goes beside it as <out>.record.json.")
def audit_prove(log_dir: str, heads: str, seq: int, out: str) -> None:
    """Write an inclusion proof for one record (checkable with the public key alone)."""
    from smartsched.audit.verify import prove
    from smartsched.outputs import same_file

    # Neither file may replace part of the log, its heads, or anything but an earlier
    # proof (the heads or a segment were replaced, exit 0, and the log failed for good).
    log_root = Path(log_dir).resolve()
    for path, is_proof in ((Path(out), True), (Path(out + ".record.json"), False)):
        if same_file(path, heads) or path.resolve().is_relative_to(log_root):
            raise click.BadParameter(f"{str(path)[:200]!r} is part of the audit log or "
                                     "its heads", param_hint="'--out'")
        if path.exists() and not _earlier_proof(path, is_proof):
            raise click.BadParameter(f"{str(path)[:200]!r} exists and is not an earlier "
                                     "proof: give another path", param_hint="'--out'")
    record, proof = prove(log_dir, heads, seq)
    Path(out).write_bytes(proof)
    Path(out + ".record.json").write_text(json.dumps(record, indent=2) + "\n")
    click.echo(f"record {seq} ({record['kind']} by {record['principal']}): proof of "
               f"{len(proof)} bytes in {out}, record in {out}.record.json")


def _earlier_proof(path: Path, is_proof: bool) -> bool:
    """Whether ``path`` holds what ``audit prove`` writes (a proof: its magic bytes; the
    record beside it: a JSON document), so that a second proof may replace it."""
    from smartsched.audit.verify import PROOF_MAGIC
    from smartsched.outputs import report_path_problem

    if not path.is_file():
        return False
    if not is_proof:
        return report_path_problem(path) is None
    try:
        with open(path, "rb") as f:
            return f.read(len(PROOF_MAGIC)) == PROOF_MAGIC
    except OSError:
        return False


def _prom_duration(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """A Prometheus range duration (``30s``, ``1m``, ``1h30m``), checked before the sampling
    starts: anything else went into every query, where Prometheus refused it."""
    import re

    if not re.fullmatch(r"(?:[0-9]+(?:ms|y|w|d|h|m|s))+", value) or not re.search(
            r"[1-9]", value):
        raise click.BadParameter(f"{value[:40]!r} is not a Prometheus duration (e.g. 30s, "
                                 "1m, 1h30m)")
    return value


@audit.command("usage")
@click.option("--prometheus", "url", required=True, help="e.g. http://prometheus:9090")
@click.option("--log", "log_dir", required=True, type=click.Path(file_okay=False))
@click.option("--heads", required=True, type=click.Path(dir_okay=False),
              help="The signed heads file (outside --log).")
@click.option("--key-file", required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--interval", "interval_s", default=30.0, show_default=True,
              type=FiniteRange(min=1.0))
@click.option("--rate-window", default="1m", show_default=True, callback=_prom_duration)
@click.option("--once", is_flag=True, help="One sample, then exit.")
def audit_usage_cmd(url: str, log_dir: str, heads: str, key_file: str, interval_s: float,
                    rate_window: str, once: bool) -> None:
    """Sample every pod's resource use from Prometheus (cAdvisor, dcgm-exporter) into the
    audit log, every INTERVAL seconds (resource.use records, tenant = namespace)."""
    import time

    from smartsched.audit.keys import load_private_key
    from smartsched.audit.log import AuditLog
    from smartsched.audit.usage import audit_usage
    from smartsched.prometheus.pod_usage import PrometheusPodUsage

    col = PrometheusPodUsage(url, rate_window=rate_window)
    with AuditLog(log_dir, heads, load_private_key(key_file)) as log:
        while True:
            t0 = time.monotonic()
            click.echo(f"{audit_usage(log, col)} pods sampled")
            if once:
                break
            time.sleep(max(0.0, interval_s - (time.monotonic() - t0)))


@audit.command("check-proof")
@click.option("--proof", required=True, type=click.Path(dir_okay=False, exists=True))
@click.option("--record", "record_path", required=True,
              type=click.Path(dir_okay=False, exists=True))
@click.option("--public-key", required=True)
@click.option("--log-id", default=None, help="The log the record must be in (32 hex digits).")
def audit_check_proof(proof: str, record_path: str, public_key: str,
                      log_id: str | None) -> None:
    """Check a proof against a record (JSON) and the public key. Exits 1 when it fails."""
    from smartsched.audit.keys import load_public_key
    from smartsched.audit.verify import check_proof
    from smartsched.model.errors import ValidationError
    from smartsched.paths import read_regular_file

    try:  # a FIFO or /dev/zero given as a file is refused, not waited on or read forever
        record = json.loads(read_regular_file(record_path, MAX_PROOF_BYTES).decode("utf-8"))
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8 text, nested too deep
        raise ValidationError("record", f"not a JSON record ({type(e).__name__}: {e})",
                              source=record_path) from None
    except OSError as e:
        raise ValidationError("record", f"cannot read: {e.strerror or e}",
                              source=record_path) from None
    if not isinstance(record, dict):
        raise ValidationError("record", "not a JSON object (a record's fields)",
                              source=record_path)
    try:
        proof_bytes = read_regular_file(proof, MAX_PROOF_BYTES)
    except OSError as e:
        raise ValidationError("proof", f"cannot read: {e.strerror or e}", source=proof) from None
    ok, why = check_proof(proof_bytes, record, load_public_key(public_key), log_id)
    click.echo(("OK: " if ok else "FAILED: ") + why)
    if not ok:
        raise SystemExit(1)


@main.group()
def bench() -> None:
    """Benchmark suites that print figures (and write them with --json)."""


def _int_list(text: str, param: str, low: int, high: int) -> list[int]:
    """"24,48" -> [24, 48], each within low..high, or a BadParameter naming ``param``."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"not comma-separated whole numbers: {text!r}",
                                 param_hint=param) from None
    if not out or min(out) < low or max(out) > high:
        raise click.BadParameter(f"each must be within {low}..{high}", param_hint=param)
    _refuse_twice(out, param)
    return out




@bench.command("fgd")
@click.option("--variants", callback=_name_list, default="default", show_default=True,
              help="openb trace variants, comma-separated (default,cpu050,gpushare40,...).")
@click.option("--schedulers", callback=_scheduler_names,
              default="random,dotprod,gpu-clustering,gpu-packing,bestfit,fgd,"
              "k8s-default", show_default=True)
@click.option("--seeds", callback=_seed_list, default="42-51", show_default=True)
@click.option("--inflate", type=float, default=1.3, show_default=True)
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=None,
              help="Parallel runs (default: cores).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def bench_fgd(variants: str, schedulers: str, seeds: list[int], inflate: float, workers: int | None,
              json_path: str | None) -> None:
    """The FGD paper's fill experiment on openb-gpu, beside the published medians."""
    from smartsched.bench.fgd import run_fgd_bench

    names = [v.strip() for v in variants.split(",") if v.strip()]
    _openb_variants(names)
    res = run_fgd_bench(names,
                        [s for s in schedulers.split(",") if s], seeds, inflate,
                        workers, echo=click.echo)
    _write_json(json_path, res)


@bench.command("quality")
@click.option("--workload", "workloads", callback=_names_paired, default="mixed,openb:default",
              show_default=True,
              help="Workloads, comma-separated; paired with --cluster by position.")
@click.option("--cluster", "clusters", callback=_names_paired, default="medium,openb-all",
              show_default=True)
@click.option("--schedulers", callback=_scheduler_names,
              default=None, help="Default: every packaged profile.")
@click.option("--seeds", callback=_seed_list, default="0", show_default=True)
@click.option("--hours", type=float, default=24.0, show_default=True)
@click.option("--warmup-hours", type=float, default=6.0, show_default=True)
@click.option("--gpu-comm-share", type=FiniteRange(0.0, 1.0), default=0.0,
              show_default=True,
              help="Share of a multi-GPU pod's run spent moving data between its GPUs: "
                   "devices spanning NUMA sockets without need stretch it (0: run times "
                   "as the workload gives them).")
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=None)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def bench_quality(workloads: str, clusters: str, schedulers: str | None, seeds: list[int],
                  hours: float, warmup_hours: float, gpu_comm_share: float,
                  workers: int | None, json_path: str | None) -> None:
    """Every profile through the same twin: one markdown table per workload and cluster."""
    from smartsched.bench.quality import DEFAULT_SCHEDULERS, run_quality_bench

    ws = [w.strip() for w in workloads.split(",") if w.strip()]
    cs = [c.strip() for c in clusters.split(",") if c.strip()]
    if len(ws) != len(cs):
        raise click.BadParameter("give as many --cluster entries as --workload entries")
    # One workload on two clusters, or two on one, are two runs; one pair twice is one.
    _refuse_twice([f"{w} on {c}" for w, c in zip(ws, cs, strict=True)], "--workload/--cluster")
    scheds = [s for s in schedulers.split(",") if s] if schedulers else list(DEFAULT_SCHEDULERS)
    engine = {"gpu_comm_share": gpu_comm_share} if gpu_comm_share else None
    res = run_quality_bench(list(zip(ws, cs, strict=True)), scheds, seeds, hours,
                            warmup_hours, workers, echo=click.echo, engine=engine)
    _write_json(json_path, res)


@bench.command("heldout")
@click.option("--schedulers", callback=_heldout_schedulers,
              default="bestfit,fgd,load-aware,composite,rl:models/ppo_mixed_small",
              show_default=True,
              help="Compared with --baseline (always run) on the same seeds.")
@click.option("--seeds", callback=_seed_list, default="30000-30004", show_default=True,
              help="Held out: training uses seeds from 0, the sweep 20000+.")
@click.option("--cluster", default="medium", show_default=True)
@click.option("--workload", default="mixed", show_default=True)
@click.option("--hours", type=FiniteRange(min=0, min_open=True), default=24.0,
              show_default=True)
@click.option("--warmup-hours", type=FiniteRange(min=0), default=6.0, show_default=True)
@click.option("--baseline", callback=_scheduler_names, default="k8s-default", show_default=True)
@click.option("--composite", callback=_scheduler_names, default="composite", show_default=True)
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=None)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
@click.option("--merge", "merge", multiple=True, is_eager=True,
              type=click.Path(dir_okay=False, exists=True),
              help="Judge the seeds of earlier runs' --json files together (repeatable); "
                   "runs nothing.")
def bench_heldout(schedulers: str, seeds: list[int], cluster: str, workload: str, hours: float,
                  warmup_hours: float, baseline: str, composite: str, workers: int | None,
                  json_path: str | None, merge: tuple[str, ...]) -> None:
    """Held-out evaluation: medians with bootstrap intervals, paired changes vs the baseline
    and the composite, issue 17's targets checked."""
    from smartsched.bench.heldout import merge_heldout, run_heldout

    if merge:
        ctx = click.get_current_context()
        given = [p for p in ("schedulers", "seeds", "cluster", "workload", "hours",
                             "warmup_hours", "workers")
                 if ctx.get_parameter_source(p) == click.core.ParameterSource.COMMANDLINE]
        if given:
            flags = ", ".join("--" + g.replace("_", "-") for g in given)
            raise click.UsageError(f"--merge runs nothing: {flags} come from the merged files")
        if json_path and any(Path(json_path).resolve() == Path(m).resolve() for m in merge):
            # The merged summary has no runs: the input could never be merged again.
            raise click.BadParameter("is one of the --merge files; write the verdict to "
                                     "another file", param_hint="'--json'")
        _write_json(json_path, merge_heldout(merge, baseline=baseline, composite=composite,
                                             echo=click.echo))
        return
    scheds = [s for s in schedulers.split(",") if s]
    res = run_heldout(scheds, seeds, cluster=cluster, workload=workload, hours=hours,
                      warmup_hours=warmup_hours, baseline=baseline, composite=composite,
                      workers=workers, echo=click.echo)
    _write_json(json_path, res)


def _sandbox_options(ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """``bench sandbox --options`` checked as the command line is read, by building the
    wrapper with them: a typo (``validate=nope``, ``zzz=1``) was found only after the
    latency measurement, and with --skip-twin (which uses none) not at all."""
    from smartsched.model.errors import ValidationError
    from smartsched.scheduling.base import make_scheduler

    if not value:
        return value
    if ctx.params.get("skip_twin"):
        raise click.BadParameter("applies only without --skip-twin (the latency "
                                 "measurement takes no options)")
    try:
        make_scheduler(f"sandboxed:k8s-default?{value}")
    except ValidationError as e:
        raise click.BadParameter(str(e)) from None
    return value


@bench.command("sandbox")
@click.option("--profiles", callback=_scheduler_names,
              default="composite,rl:models/ppo_mixed_small", show_default=True,
              help="Each run as it is and as sandboxed:<profile> on the same seed.")
@click.option("--nodes", type=click.IntRange(min=2, max=100_000), default=1500,
              show_default=True, help="Region size for the validation latency.")
@click.option("--decisions", type=click.IntRange(min=1, max=100_000), default=200,
              show_default=True)
@click.option("--cluster", default="medium", show_default=True)
@click.option("--workload", default="mixed", show_default=True)
@click.option("--hours", type=FiniteRange(min=0, min_open=True), default=24.0,
              show_default=True)
@click.option("--warmup-hours", type=FiniteRange(min=0), default=6.0, show_default=True)
@click.option("--seed", type=click.IntRange(min=0), default=30000, show_default=True)
@click.option("--options", default="", callback=_sandbox_options,
              help="The sandboxed: wrapper's options, e.g. "
              "'validate=preemption,gangs&samples=1'.")
@click.option("--skip-twin", is_flag=True, is_eager=True, help="Only the validation latency.")
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=None)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def bench_sandbox(profiles: str, nodes: int, decisions: int, cluster: str, workload: str,
                  hours: float, warmup_hours: float, seed: int, options: str, skip_twin: bool,
                  workers: int | None, json_path: str | None) -> None:
    """Sandbox validation: time per decision at --nodes, and what it refuses on the twin."""
    from smartsched.bench.sandbox import run_sandbox_bench

    if skip_twin:  # the twin's options were dropped without a word (a typo included)
        ctx = click.get_current_context()
        for name in ("cluster", "workload", "hours", "warmup_hours", "seed", "workers"):
            if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
                raise click.BadParameter("applies to the twin part, which --skip-twin "
                                         "leaves out", param_hint=f"'--{name.replace('_', '-')}'")
    res = run_sandbox_bench([p for p in profiles.split(",") if p], nodes=nodes,
                            decisions=decisions, cluster=cluster, workload=workload,
                            hours=hours, warmup_hours=warmup_hours, seed=seed,
                            options=options, workers=workers, skip_twin=skip_twin,
                            echo=click.echo)
    _write_json(json_path, res)


@bench.command("gate")
@click.option("--incumbent", default="rl:models/ppo_mixed_small", show_default=True)
@click.option("--trials", type=click.IntRange(min=1), default=40, show_default=True)
@click.option("--seeds", type=click.IntRange(min=2), default=8, show_default=True,
              help="Paired episodes per gate.")
@click.option("--cluster", default="medium", show_default=True)
@click.option("--hours", type=FiniteRange(min=0, min_open=True), default=2.0,
              show_default=True)
@click.option("--warmup-hours", type=FiniteRange(min=0), default=1.0, show_default=True)
@click.option("--degrade", type=FiniteRange(min=0, max=1), default=0.5, show_default=True,
              help="The 'better' case: the incumbent vs itself with this share of decisions "
              "made by k8s-default.")
@click.option("--kinds", callback=_name_list, default="random,worst,nofilter,identical,better",
              show_default=True)
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=None)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def bench_gate(incumbent: str, trials: int, seeds: int, cluster: str, hours: float,
               warmup_hours: float, degrade: float, kinds: str, workers: int | None,
               json_path: str | None) -> None:
    """The promotion gate's verdicts over many trials: broken, identical, better candidates."""
    from smartsched.bench.gate import run_gate_bench

    names = tuple(k for k in kinds.split(",") if k)
    bad = set(names) - {"random", "worst", "nofilter", "identical", "better"}
    if bad:
        raise click.BadParameter(f"unknown kind {sorted(bad)[0]!r}", param_hint="--kinds")
    _write_json(json_path, run_gate_bench(incumbent, trials=trials, seeds=seeds,
                                          cluster=cluster, hours=hours,
                                          warmup_hours=warmup_hours, degrade=degrade,
                                          workers=workers, kinds=names, echo=click.echo))


@bench.command("rl")
@click.option("--policy", default=None, callback=_nonempty,
              help="Exported policy, as rl: takes it (PATH or PATH?options; default: an "
                   "untrained module).")
@click.option("--skip-sampling", is_flag=True, help="Skip the RLlib sampling measurement.")
@click.option("--latency-only", is_flag=True,
              help="Only the inference latency (what a policy with options is measured by).")
@click.option("--sizes", default="1500,5000", show_default=True,
              help="Cluster sizes (nodes) the inference latency is measured at.")
@click.option("--envs-per-runner", default="1,8,32,64", show_default=True,
              help="Twins each of the 2 env runners steps (comma list: one measurement each).")
@click.option("--rounds", type=click.IntRange(1, 100), default=5, show_default=True,
              help="Sampling rounds of 1,000 steps per runner, per measurement.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def bench_rl(policy: str | None, skip_sampling: bool, latency_only: bool, sizes: str,
             envs_per_runner: str, rounds: int, json_path: str | None) -> None:
    """Policy sampling throughput (twin vs model time) and inference latency per decision."""
    from smartsched.bench.rl import run_rl_bench

    envs = _int_list(envs_per_runner, "--envs-per-runner", 1, 256)
    nodes = _int_list(sizes, "--sizes", 2, 20_000)
    _write_json(json_path, run_rl_bench(policy, echo=click.echo, skip_sampling=skip_sampling,
                                        envs_per_runner=envs, rounds=rounds,
                                        latency_only=latency_only, sizes=tuple(nodes)))


@bench.command("audit")
@click.option("--records", default=1_000_000, show_default=True, type=click.IntRange(1))
@click.option("--proofs", default=100, show_default=True, type=click.IntRange(1))
@click.option("--no-fsync", is_flag=True, help="Skip fsync (shows what the disk costs).")
@click.option("--work-dir", type=click.Path(file_okay=False), default=None, callback=_nonempty,
              help="Keep the log here (default: a temporary folder, removed): new, "
                   "empty or made by an earlier run (never a real audit log: it is cleared).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def bench_audit(records: int, proofs: int, no_fsync: bool, work_dir: str | None,
                json_path: str | None) -> None:
    """The audit log: append rate, verify time, inclusion proof size and time."""
    from smartsched.bench.audit import run_audit_bench

    _write_json(json_path, run_audit_bench(records, proofs, not no_fsync, work_dir,
                                           echo=click.echo))


@bench.command("finance")
@click.option("--seeds", callback=_seed_list, default="0-4", show_default=True)
@click.option("--nights", type=click.IntRange(min=1, max=60), default=3, show_default=True)
@click.option("--mtbf-hours", type=FiniteRange(min=0, max=1e6, min_open=True), default=720.0,
              show_default=True, help="Mean time between failures per node.")
@click.option("--no-failures", is_flag=True, help="Run without node failures.")
@click.option("--repair-hours", type=FiniteRange(min=0, max=1e6, min_open=True), default=1.0,
              show_default=True)
@click.option("--variants", default=None, callback=_name_list,
              help="Comma-separated subset of k8s-default,k8s-default+10s,composite,finance "
                   "(the first is the baseline).")
@click.option("--workload", default="finance", show_default=True,
              help="finance or finance:<profile.yaml>")
@click.option("--cluster", default="finance", show_default=True,
              help="A preset or cluster file with nodes labelled pool=core and pool=batch.")
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=None)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def bench_finance(seeds: list[int], nights: int, mtbf_hours: float, no_failures: bool,
                  repair_hours: float, variants: str | None, workload: str, cluster: str,
                  workers: int | None, json_path: str | None) -> None:
    """Issue 19's finance case: nightly batch window, online availability and failover
    against k8s-default on the same failures."""
    from smartsched.bench.finance import VARIANTS, run_finance

    if workload.removeprefix("resample:").split(":", 1)[0] != "finance":  # another
        # workload has no nightly runs: a table of dashes, exit 0
        raise click.BadParameter(f"must be finance or finance:<profile.yaml>, got "
                                 f"{workload!r}", param_hint="'--workload'")
    ctx = click.get_current_context()
    for name in ("mtbf_hours", "repair_hours"):
        if no_failures and ctx.get_parameter_source(
                name) is not click.core.ParameterSource.DEFAULT:  # ignored without a word
            raise click.BadParameter("cannot be combined with --no-failures",
                                     param_hint=f"'--{name.replace('_', '-')}'")
    chosen = VARIANTS
    if variants:
        known = {v.name: v for v in VARIANTS}
        names = [v for v in variants.split(",") if v]
        bad = [v for v in names if v not in known]
        if bad or not names:
            raise click.BadParameter(f"unknown variant {bad[0] if bad else variants!r} "
                                     f"(known: {', '.join(known)})", param_hint="--variants")
        chosen = tuple(known[v] for v in names)
    res = run_finance(chosen, seeds, nights=nights,
                      mtbf_hours=None if no_failures else mtbf_hours,
                      repair_hours=repair_hours, cluster=cluster, workload=workload,
                      workers=workers, echo=click.echo)
    _write_json(json_path, res)


@bench.command("carbon")
@click.option("--series", callback=_name_list, default="ger-2020,gb-2020,ca-2022",
              show_default=True,
              help="Grid series: public names under the data dir, or CSV files of your "
              "own (FILE, its time and intensity columns found by name, or "
              "FILE:TIME_COLUMN:VALUE_COLUMN; g/kWh). With --twin: one region per series.")
@click.option("--slack-hours", default="24,48", show_default=True,
              help="Deadlines after arrival, comma-separated (at most 168).")
@click.option("--jobs", type=click.IntRange(min=1, max=1_000_000), default=2000,
              show_default=True)
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True)
@click.option("--plot", callback=_image_out, type=click.Path(dir_okay=False), default=None,
              help="PNG: one week of the first series with the shifted work on top.")
@click.option("--twin", is_flag=True,
              help="Instead: the twin on one region per --series grid (default: DE, GB, "
              "CA), the mixed workload's batch with these deadlines, agnostic / time / "
              "space / both.")
@click.option("--days", default="45,135,225,315", show_default=True,
              help="--twin: start days in the grid series (one run each).")
@click.option("--hours", type=FiniteRange(min=1, max=24 * 30), default=72.0,
              show_default=True, help="--twin: simulated hours per run.")
@click.option("--variants", callback=_name_list, default="agnostic,time,space,time+space",
              show_default=True,
              help="--twin: batch placement variants (also: green, time+green -- "
              "GreenScore instead of GridCarbon; green-run, time+green-run -- GreenScore "
              "on the renewable share expected over the pod's run).")
@click.option("--exact-hours", default=None,
              help="Also what the same rule captures were the forecast exact for the first "
              "k hours ahead, for each k (comma-separated, 1 to the longest --slack-hours): "
              "a what-if that reads the future, to size what a better forecast could buy.")
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=None)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def bench_carbon(series: str, slack_hours: str, jobs: int, seed: int, plot: str | None,
                 twin: bool, days: str, hours: float, variants: str, exact_hours: str | None,
                 workers: int | None, json_path: str | None) -> None:
    """Issue 20: temporal shifting by forecast against the perfect-knowledge bound (or,
    with --twin, temporal and spatial shifting in the twin)."""
    from smartsched.bench.carbon import run_carbon, run_twin_carbon

    # An option of the other experiment was ignored without a word (--days -1 ran).
    ctx = click.get_current_context()
    other = (("jobs", "seed", "plot", "exact_hours") if twin
             else ("days", "hours", "variants", "workers"))
    for name in other:
        if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
            raise click.BadParameter("applies only " + ("without" if twin else "with")
                                     + " --twin", param_hint=f"'--{name}'")
    slacks = _int_list(slack_hours, "--slack-hours", 1, 168)
    if twin:
        starts = _int_list(days, "--days", 0, 10_000)
        res = run_twin_carbon(starts, slacks, hours=hours,
                              variants=[v for v in variants.split(",") if v],
                              workers=workers, echo=click.echo,
                              series=[s for s in series.split(",") if s])
        _write_json(json_path, res)
        return
    names = [s for s in series.split(",") if s]
    # Past the longest deadline no forecast is read: k is then the same as that deadline.
    exact = (_int_list(exact_hours, "--exact-hours", 1, max(slacks))
             if exact_hours is not None else [])
    res = run_carbon(names, slacks, jobs=jobs, seed=seed, plot=plot, echo=click.echo,
                     exact_hours=exact)
    _write_json(json_path, res)


@bench.command("anneal")
@click.option("--part", default="gap,speed,fill", show_default=True,
              help="Comma-separated: gap (against the exact optimum), speed (a window on "
              "the whole openb cluster), fill (openb fill at 130 % in windows vs fgd), "
              "gangs (gap's windows with gangs; not in the default).")
@click.option("--seeds", callback=_seed_list, default="0-9", show_default=True,
              help="gap: instances.")
@click.option("--nodes", type=click.IntRange(min=2, max=1213), default=100, show_default=True,
              help="gap: openb nodes drawn per instance.")
@click.option("--pods", type=click.IntRange(min=1, max=5000), default=200, show_default=True,
              help="gap: pods in the window.")
@click.option("--sweeps", default="1,2,5,10,20,40,80", show_default=True,
              help="gap: the annealer's sweep budgets (the time-quality curve).")
@click.option("--limit-s", type=FiniteRange(min=0, min_open=True), default=60.0,
              show_default=True, help="gap: the exact solver's time limit.")
@click.option("--lns", type=click.IntRange(min=0, max=1_000_000), default=None,
              help="gap: ruin-and-recreate rounds after polish (default: the placer's).")
@click.option("--window", type=click.IntRange(min=1, max=20_000), default=1000,
              show_default=True, help="speed: pods in the window.")
@click.option("--variants", callback=_name_list, default="default,cpu050,gpushare40,multigpu50",
              show_default=True,
              help="fill: openb trace variants.")
@click.option("--fill-seeds", callback=_seed_list, default="42-44", show_default=True)
@click.option("--fill-spec", default="anneal:fgd?window=1000&value=gpu&homes=profile",
              show_default=True, help="fill: the windowed scheduler beside fgd.")
@click.option("--gang-share", type=FiniteRange(0, 1), default=0.5, show_default=True,
              help="gangs: probability that a run of 2-4 alike GPU pods is a gang.")
@click.option("--gang-sweeps", type=click.IntRange(min=1), default=20, show_default=True,
              help="gangs: the annealer's sweeps.")
@click.option("--colocate", type=FiniteRange(min=0, max=1e6, max_open=True), default=0.0,
              show_default=True, help="gangs: also the gang model with co-location (each "
              "pair of a gang's members on one node worth this fraction of a member).")
@click.option("--plot", callback=_image_out, type=click.Path(dir_okay=False), default=None,
              help="gap: PNG of the time-quality curve.")
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=None)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def bench_anneal(part: str, seeds: list[int], nodes: int, pods: int, sweeps: str, limit_s: float,
                 lns: int | None, window: int, variants: str, fill_seeds: list[int], fill_spec: str,
                 gang_share: float, gang_sweeps: int, colocate: float, plot: str | None,
                 workers: int | None, json_path: str | None) -> None:
    """Issue 21: the annealing window placer against the exact optimum, the clock, and
    sequential fgd in the fill experiment."""
    from smartsched.bench import anneal as bench_mod

    parts = [x for x in part.split(",") if x]
    unknown = set(parts) - {"gap", "speed", "fill", "gangs"}
    if unknown or not parts:
        raise click.BadParameter(f"unknown part(s) {sorted(unknown)}; use gap, speed, fill, "
                                 "gangs", param_hint="--part")
    _refuse_options_of_other_parts(click.get_current_context(), set(parts))
    if "fill" in parts:  # a typo failed only after the gap part's minutes
        try:
            _scheduler_names(click.get_current_context(), click.Option(["--fill-spec"]),
                             fill_spec)
        except click.BadParameter as e:
            e.param_hint = "'--fill-spec'"
            raise
        fill_variants = [v.strip() for v in variants.split(",") if v.strip()]
        _openb_variants(fill_variants)
    out: dict[str, Any] = {}
    if "gap" in parts:
        out["gap"] = bench_mod.run_gap(seeds, nodes=nodes, pods=pods,
                                       sweeps=_int_list(sweeps, "--sweeps", 1, 100_000),
                                       limit_s=limit_s, workers=workers, echo=click.echo,
                                       plot=plot,
                                       options=None if lns is None else {"lns": lns})
    if "speed" in parts:
        out["speed"] = bench_mod.run_speed(window=window, echo=click.echo)
    if "fill" in parts:
        out["fill"] = bench_mod.run_fill(fill_variants, fill_seeds, ["fgd", fill_spec],
                                         workers=workers, echo=click.echo)
    if "gangs" in parts:
        out["gangs"] = bench_mod.run_gangs(seeds, nodes=nodes, pods=pods,
                                           share=gang_share, sweeps=gang_sweeps,
                                           limit_s=limit_s, workers=workers, echo=click.echo,
                                           colocate=colocate)
    _write_json(json_path, out)


# bench anneal: the parts each option is read by (an option given for a part that does
# not run was dropped without a word).
ANNEAL_OPTION_PARTS = {
    "seeds": {"gap", "gangs"}, "nodes": {"gap", "gangs"}, "pods": {"gap", "gangs"},
    "limit_s": {"gap", "gangs"}, "sweeps": {"gap"}, "lns": {"gap"}, "plot": {"gap"},
    "window": {"speed"}, "variants": {"fill"}, "fill_seeds": {"fill"},
    "fill_spec": {"fill"}, "gang_share": {"gangs"}, "gang_sweeps": {"gangs"},
    "colocate": {"gangs"}}


def _refuse_options_of_other_parts(ctx: click.Context, parts: set[str]) -> None:
    """An option given on the command line for parts of which none runs is refused."""
    for p in ctx.command.params:
        read_by = ANNEAL_OPTION_PARTS.get(p.name or "")
        if (read_by is not None and not read_by & parts and ctx.get_parameter_source(
                p.name) is not click.core.ParameterSource.DEFAULT):
            raise click.BadParameter(f"applies to --part {','.join(sorted(read_by))} only, "
                                     f"not {','.join(sorted(parts))}",
                                     param_hint=f"'{p.opts[0]}'")


def _references(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``--references``: ``none``, or a list naming something (``,`` ran with none)."""
    return "" if value.strip().lower() == "none" else str(_name_list(ctx, param, value))


@bench.command("federation")
@_federation_options
@click.option("--out", default=None, callback=_model_out("forecaster.pt", "forecaster.json"),
              help="Also save the federated forecaster here.")
@_overwrite_option
@click.option("--references", default="central,local", show_default=True,
              callback=_references,
              help="Comma-separated: central (pooled data), local (each site alone); "
              "none for neither.")
def bench_federation(data: str, cluster: str, sites: str | None, partition: str, rounds: int,
                     local_epochs: int, mu: float, server_momentum: float, lookback: int,
                     hidden: int, seed: int, json_path: str | None, out: str | None,
                     overwrite: bool, references: str) -> None:
    """Issue 22: federated edge learning against central and local training (objective,
    rounds, bytes per round, round time)."""
    _run_federation(data, cluster, sites, partition, rounds, local_epochs, mu, server_momentum,
                    lookback, hidden, seed, json_path, out,
                    tuple(x.strip() for x in references.split(",") if x.strip()))


@bench.command("telemetry")
@click.option("--clusters", callback=_name_list, default="small,medium,large", show_default=True)
@click.option("--hours", default=2.0, show_default=True, help="Simulated before measuring.",
              type=FiniteRange(min=0, min_open=True))
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def bench_telemetry(clusters: str, hours: float, json_path: str | None) -> None:
    """Cost of the wide node telemetry: synthesize, project, and one /metrics scrape."""
    from smartsched.bench.telemetry import run_telemetry_bench

    names = [c for c in clusters.split(",") if c]
    _write_json(json_path, run_telemetry_bench(names, hours, echo=click.echo))


@bench.command("serve")
@click.option("--nodes-per-region", default=1500, show_default=True,
              type=click.IntRange(2, 100_000))
@click.option("--profiles", callback=_scheduler_names,
              default="k8s-default,rl:models/ppo_mixed_small", show_default=True,
              help="Comma-separated; each is deployed on every region and edge site in turn.")
@click.option("--requests", "requests_per_kind", default=200, show_default=True,
              type=click.IntRange(10, 100_000), help="Sequential requests per path.")
@click.option("--batches", default=4, show_default=True, type=click.IntRange(1, 1000))
@click.option("--batch-size", default=500, show_default=True, type=click.IntRange(1, 1000))
@click.option("--state-dir", default="runs/bench_serve", show_default=True, callback=_nonempty,
              help="The benchmark's own folder: new, empty or made by an earlier run "
                   "(never a service's --state-dir: its files are cleared).")
@click.option("--journal/--no-journal", default=True, show_default=True,
              help="Sites journal reservations (fsynced), as `smartsched serve` runs them.")
@click.option("--division", type=click.Choice(["aggregated", "by_capacity"]),
              default="by_capacity", show_default=True,
              help="The service's ranking.division: a batch's like pods divided by region "
                   "capacity, or all to the first ranked region.")
@click.option("--topology", type=click.Choice(["distributed", "single_process"]),
              default="distributed", show_default=True,
              help="The service's topology: each site its own replica, or every site in "
                   "the cloud ingress's replica (no edge entry then).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
def bench_serve(nodes_per_region: int, profiles: str, requests_per_kind: int, batches: int,
                batch_size: int, state_dir: str, journal: bool, division: str,
                topology: str, json_path: str | None) -> None:
    """The placement service on loopback beside a bare echo deployment (bounded load)."""
    from smartsched.bench.serve import format_serve_bench, run_serve_bench

    res = run_serve_bench(nodes_per_region=nodes_per_region,
                          profiles=tuple(p for p in profiles.split(",") if p),
                          requests_per_kind=requests_per_kind, batches=batches,
                          batch_size=batch_size, state_dir=state_dir, journal=journal,
                          division=division, topology=topology, echo=click.echo)
    click.echo(format_serve_bench(res))
    _write_json(json_path, res)


@bench.command("speed")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              callback=_out_file)
@click.option("--skip-large", is_flag=True, help="Skip the 24 h mixed runs on the large preset.")
@click.option("--profiles", callback=_scheduler_names, default=None,
              help="Profiles for the day on large, comma-separated (default: every packaged "
                   "profile).")
def bench_speed(json_path: str | None, skip_large: bool, profiles: str | None) -> None:
    """Wall time, decisions/s and peak memory of the reference runs (whole processes)."""
    from smartsched.bench.speed import run_speed_suite

    chosen = None if profiles is None else [p for p in profiles.split(",") if p]
    results = run_speed_suite(skip_large=skip_large, echo=click.echo, profiles=chosen)
    _write_json(json_path, results)


if __name__ == "__main__":
    main()
