"""A crafted or damaged policy artifact is refused when it is loaded, naming the scheduler
and the key, parameter or file at fault: never a traceback at the first decision, never a
policy that silently decides with weights or settings other than its files declare, and
never a file read from outside the policy folder (or a service's models_dir)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from smartsched.cli import main
from smartsched.model.errors import ValidationError
from smartsched.scheduling.base import make_scheduler

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "ppo_mixed_small"


def _copy(tmp_path: Path, name: str = "policy") -> Path:
    folder = tmp_path / name
    shutil.copytree(SHIPPED, folder)
    return folder


def _edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _refused(folder: Path) -> ValidationError:
    with pytest.raises(ValidationError) as e:
        make_scheduler(f"rl:{folder}", 0)
    return e.value


def _weights(edit: Callable[[dict], dict]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        state = torch.load(folder / "module_weights.pt", weights_only=True)
        torch.save(edit(state), folder / "module_weights.pt")
    return apply


@pytest.mark.parametrize(("damage", "says"), [
    # Each of these loaded, and the policy then decided with NaN scores, with the module's
    # initial weights for what was missing, or without the layers it was trained with.
    (_weights(lambda s: {**s, "gate.1.bias": torch.full((5,), float("nan"))}),
     "'gate.1.bias' holds NaN or infinite values"),
    (_weights(lambda s: {**s, "score_mlp.1.weight": torch.full((1, 64), float("inf"))}),
     "'score_mlp.1.weight' holds NaN or infinite values"),
    (_weights(lambda s: {**s, "score_mlp.1.weight": torch.full((1, 64), 1e30)}),
     "'score_mlp.1.weight' holds values beyond"),
    (_weights(lambda s: {k: v.to(torch.int64) for k, v in s.items()}),
     "holds int64 values, not floating point"),
    (_weights(lambda s: {k: v for k, v in s.items() if k != "gate.1.bias"}),
     "lacks 1 parameter(s) of the module its spec declares, first 'gate.1.bias'"),
    (_weights(lambda s: {**s, "extra": torch.zeros(3)}),
     "holds 1 parameter(s) the module its spec declares has not, first 'extra'"),
    (lambda f: _edit_json(f / "module_spec.json",
                          lambda s: s["model_config"].update(heuristic_prior=False)),
     "the module its spec declares has not, first 'gate."),
])
def test_weights_other_than_the_specs_module_are_refused(tmp_path: Path, damage, says: str
                                                         ) -> None:
    folder = _copy(tmp_path)
    damage(folder)
    e = _refused(folder)
    assert e.field == "scheduler" and says in e.message, e.message
    assert "module_weights.pt" in e.message


@pytest.mark.parametrize(("edit", "says"), [
    (lambda s: s.update(evil="x"), "module_spec.json: evil: unknown key"),
    (lambda s: s.pop("model_config"), "module_spec.json: model_config: missing"),
    (lambda s: s["model_config"].update(hiden=128), "model_config.hiden"),
    (lambda s: s["model_config"].update(prior_scale="x"), "model_config.prior_scale"),
    (lambda s: s["observation_space"].update(extra={"low": 0, "high": 1, "shape": [3],
                                                    "dtype": "float32"}),
     "observation_space.extra: unknown key"),
    (lambda s: s["observation_space"]["pod"].update(dtype="object"),
     "observation_space.pod.dtype: must be float32"),
    (lambda s: s["observation_space"]["nodes"].update(high=float("nan")),
     "observation_space.nodes.high: must be a finite number"),
    (lambda s: s.update(observation_space=[1]), "observation_space: must be a mapping"),
])
def test_a_spec_unlike_an_export_names_the_key(tmp_path: Path, edit, says: str) -> None:
    """Unknown keys were ignored (a typo read as the default) and a missing one was a bare
    ``(KeyError)``: the key is named."""
    folder = _copy(tmp_path)
    _edit_json(folder / "module_spec.json", edit)
    e = _refused(folder)
    assert e.field == "scheduler" and says in e.message, e.message


def _export_with_width(tmp_path: Path, key: str, width: int) -> Path:
    """A consistent export (spec and weights agree) whose ``key`` observation is ``width``
    wide: what an export from another version looks like."""
    import gymnasium as gym

    from smartsched.rl.artifact import export_module, load_module
    from smartsched.rl.module import NodeScorerModule

    folder = _copy(tmp_path, f"width_{key}")
    shipped = load_module(SHIPPED)
    spaces = dict(shipped.observation_space.spaces)
    box = spaces[key]
    spaces[key] = gym.spaces.Box(float(box.low.flat[0]), float(box.high.flat[0]),
                                 (*box.shape[:-1], width), box.dtype)
    export_module(NodeScorerModule(observation_space=gym.spaces.Dict(spaces),
                                   action_space=shipped.action_space, inference_only=False,
                                   model_config=dict(shipped.model_config)), folder)
    return folder


@pytest.mark.parametrize(("key", "delta"), [("nodes", 2), ("pod", -1), ("weights", -1)])
def test_an_observation_width_other_than_this_versions_is_refused_when_loaded(
        tmp_path: Path, key: str, delta: int) -> None:
    """It loaded, and the first decision was a RuntimeError traceback (the service took the
    reload and then failed every placement)."""
    from smartsched.rl.observation import POD_COLUMNS, node_columns

    # What this version builds for the shipped export (which observes six reward weights).
    builds = {"nodes": len(node_columns(False, 0)), "pod": len(POD_COLUMNS), "weights": 6}[key]
    width = builds + delta
    folder = _export_with_width(tmp_path, key, width)
    e = _refused(folder)
    assert e.field == "scheduler"
    assert f"observes {width} {key} columns" in e.message and f"builds {builds}" in e.message
    if key == "nodes":
        res = CliRunner().invoke(main, ["simulate", "--scheduler", f"rl:{folder}",
                                        "--hours", "0.2", "--no-plots"])
        assert res.exit_code == 2 and f"observes {width} nodes columns" in res.output, \
            res.output


@pytest.mark.parametrize(("edit", "says"), [
    # "false" was read as true: the policy deferred although its export said not to.
    (lambda m: m["inference"].update(defer="false"), "inference.defer must be true or false"),
    (lambda m: m["env"].update(heuristic_features="false"),
     "env.heuristic_features must be true or false"),
    # These were tracebacks (TypeError, ValueError, AttributeError).
    (lambda m: m["env"].update(filters_profile=5), "env.filters_profile must be a string"),
    (lambda m: m["env"].update(base="composite", shortlist_k="x"),
     "env.shortlist_k must be an integer >= 1"),
    (lambda m: m["env"].update(telemetry=5), "env.telemetry must be a string"),
    (lambda m: m.update(inference=[1]), "inference must be a mapping"),
    (lambda m: m.update(node_columns=5), "node_columns must be a list of names"),
])
def test_a_policy_description_of_the_wrong_types_names_the_key(tmp_path: Path, edit,
                                                                says: str) -> None:
    folder = _copy(tmp_path)
    _edit_json(folder / "smartsched_policy.json", edit)
    e = _refused(folder)
    assert e.field == "scheduler" and says in e.message, e.message


def test_files_an_export_names_or_links_stay_inside_its_folder(tmp_path: Path) -> None:
    """The forecaster and telemetry projection a description names, and the weights file,
    were read wherever they pointed (``../..``, an absolute path, a symlink): a service
    reads policies only from its models_dir, and this read around it."""
    elsewhere = _copy(tmp_path, "elsewhere")
    for key, value in (("forecaster", "../elsewhere"), ("forecaster", str(elsewhere)),
                       ("telemetry", "../../elsewhere")):
        folder = _copy(tmp_path, f"{key}-{len(value)}")
        _edit_json(folder / "smartsched_policy.json",
                   lambda m, k=key, v=value: m["env"].update({k: v}))
        e = _refused(folder)
        assert e.field == "scheduler" and f"env.{key} must name a folder inside" in e.message
    folder = _copy(tmp_path, "linked")
    (folder / "module_weights.pt").unlink()
    (folder / "module_weights.pt").symlink_to(elsewhere / "module_weights.pt")
    e = _refused(folder)
    assert e.field == "scheduler" and "links outside the policy folder" in e.message
    # A link inside the folder is the folder's own file.
    inside = _copy(tmp_path, "inside")
    (inside / "module_weights.pt").rename(inside / "w.pt")
    (inside / "module_weights.pt").symlink_to("w.pt")
    make_scheduler(f"rl:{inside}", 0)


def test_a_telemetry_projection_of_object_arrays_is_named(tmp_path: Path) -> None:
    """An object array in the projection (pickle, which numpy refuses) was a ValueError
    traceback, raised after the guarded read."""
    from smartsched.twin.telemetry.reduction import PROJECTION_FILE, PROJECTION_META

    folder = _copy(tmp_path)
    tel = folder / "telemetry"
    tel.mkdir()
    (tel / PROJECTION_META).write_text('{"columns": ["a", "b", "c"], "k": 2}')
    np.savez(tel / PROJECTION_FILE, mean=np.array([object()], dtype=object),
             scale=np.ones(3), components=np.zeros((2, 3)), explained=np.zeros(2))
    _edit_json(folder / "smartsched_policy.json", lambda m: m["env"].update(telemetry="telemetry"))
    e = _refused(folder)
    assert e.field == "telemetry" and "Object arrays cannot be loaded" in e.message
    np.savez(tel / PROJECTION_FILE, mean=np.zeros(3), scale=np.ones(3),
             components=np.zeros((2, 4)), explained=np.zeros(2))  # 4 columns, not 3
    e = _refused(folder)
    assert e.field == "telemetry" and "not a telemetry projection" in e.message


def test_a_refused_reload_keeps_the_sites_policy(tmp_path: Path) -> None:
    """A site (a service replica) told to load a policy it cannot use keeps the one it has,
    and places with it; the error names the profile as the operator gave it."""
    from smartsched.model.pod import Pod, PodClass
    from smartsched.model.presets import load_cluster
    from smartsched.serving.site import SitePlacer, site_subspec

    site = SitePlacer(site_subspec(load_cluster("medium"), ["region-a"]), f"rl:{SHIPPED}")
    before = site.scheduler
    from smartsched.rl.observation import node_columns

    bad = _export_with_width(tmp_path, "nodes", len(node_columns(False, 0)) + 2)
    with pytest.raises(ValidationError) as e:
        site.set_profile(f"rl:{bad}", label="rl:width_nodes")
    assert e.value.field == "profile" and str(tmp_path) not in e.value.message
    assert site.scheduler is before and site.profile == f"rl:{SHIPPED}"
    pods = [Pod(id=f"p{i}", cpu_milli=500, memory_mib=512, pod_class=PodClass.BATCH)
            for i in range(3)]
    assert all(r.placed for r in site.place(pods, ttl_s=60))


@pytest.mark.parametrize("option", ["filters", "base"])
def test_a_reload_option_naming_a_file_is_held_to_the_models_dir(tmp_path: Path,
                                                                 option: str) -> None:
    """``rl:PATH?filters=FILE`` (or ``base=FILE``) read the profile file wherever it was:
    only the path before ``?`` was held to the models_dir."""
    from smartsched.serving.config import resolve_reload_profile

    models = tmp_path / "models"
    models.mkdir()
    outside = tmp_path / "outside.yaml"
    outside.write_text("name: x\n")
    for value in (str(outside), "../outside.yaml", "%2E%2E/outside.yaml"):
        with pytest.raises(ValidationError) as e:
            resolve_reload_profile(f"rl:ppo?{option}={value}", str(models))
        assert e.value.field == "profile" and "models_dir" in e.value.message
    # Inside the models dir: resolved there (not against the replica's working directory);
    # packaged names and other options pass as they are.
    got = resolve_reload_profile(f"rl:ppo?{option}=p/x.yaml&weights=green", str(models))
    assert got == f"rl:{models.resolve() / 'ppo'}?{option}={models.resolve() / 'p/x.yaml'}" \
                  "&weights=green"
    assert resolve_reload_profile(f"rl:ppo?{option}=composite", str(models)) == \
        f"rl:{models.resolve() / 'ppo'}?{option}=composite"


def test_the_rl_bench_runs_the_shipped_policy() -> None:
    """``smartsched bench rl --policy models/ppo_mixed_small`` failed at its first step: the
    env observed today's eight reward weights, the policy six."""
    from smartsched.bench.rl import env_and_model_split

    r = env_and_model_split(str(SHIPPED), steps=10)
    assert r["steps"] == 10


def _telemetry_policy(tmp_path: Path) -> Path:
    """A loadable export that carries its telemetry projection in a subfolder, as
    ``smartsched train`` exports one trained on telemetry features."""
    from smartsched.rl.observation import node_columns

    root = Path(__file__).resolve().parents[2]
    folder = _export_with_width(tmp_path, "nodes", len(node_columns(False, 8)))
    shutil.copytree(root / "models" / "telemetry", folder / "telemetry")
    _edit_json(folder / "smartsched_policy.json", lambda m: m["env"].update(telemetry="telemetry"))
    make_scheduler(f"rl:{folder}", 0)
    return folder


def test_a_store_holds_the_whole_policy_and_nothing_from_outside_it(tmp_path: Path) -> None:
    """``add`` and ``stage`` copied a policy's top-level files only: a policy carrying its
    telemetry projection was added, and its stored version did not load (promotion
    refused). And a link in the folder was followed: its target's bytes were copied in."""
    from smartsched.rl.versions import PolicyStore

    folder = _telemetry_policy(tmp_path)
    store = PolicyStore(tmp_path / "store")
    version = store.add(folder)
    assert store.promote(version) == version
    make_scheduler(f"rl:{store.path_of(version)}", 0)
    assert PolicyStore(tmp_path / "store").stage(folder)
    secret = tmp_path / "secret.txt"
    secret.write_text("not a policy's")
    (folder / "notes.md").symlink_to(secret)
    before = sorted(str(p) for p in store.root.rglob("*"))
    for act in (store.add, store.stage):
        with pytest.raises(ValidationError, match="links outside the policy folder"):
            act(folder)
    assert sorted(str(p) for p in store.root.rglob("*")) == before


def test_a_folder_name_holding_a_question_mark_is_explained(tmp_path: Path) -> None:
    """``rl:PATH`` splits its options at ``?``: a folder named ``odd ?&=x`` was refused as
    option ``''`` (field ``scheduler.``), which told the user nothing."""
    folder = _copy(tmp_path, "odd ?&=x")
    e = _refused(folder)
    assert e.field == "scheduler" and "a '?' in rl:PATH starts the options" in e.message


def test_the_files_of_an_attached_projection_stay_inside_the_policy_folder(
        tmp_path: Path) -> None:
    """The folder an export's description names was checked to be inside the policy
    folder, but not the files in it: a link there read any file the loader could."""
    from smartsched.twin.telemetry.reduction import PROJECTION_FILE, PROJECTION_META

    folder = _telemetry_policy(tmp_path)
    tel = folder / "telemetry"
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in (PROJECTION_META, PROJECTION_FILE):
        (tel / name).rename(outside / name)
        (tel / name).symlink_to(outside / name)
        e = _refused(folder)
        assert e.field == "scheduler" and f"{name} links outside the policy folder" in e.message
        (tel / name).unlink()
        (outside / name).rename(tel / name)
    make_scheduler(f"rl:{folder}", 0)  # as it was: loads
    (tel / PROJECTION_META).rename(tel / "kept.json")
    (tel / PROJECTION_META).symlink_to("kept.json")  # a link inside: the folder's own file
    make_scheduler(f"rl:{folder}", 0)
    (tel / PROJECTION_META).unlink()
    (tel / PROJECTION_META).mkdir()
    e = _refused(folder)
    assert e.field == "scheduler" and f"{PROJECTION_META} is not a file" in e.message
