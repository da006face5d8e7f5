"""A damaged policy folder is a clear error naming the scheduler, never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from smartsched.model.errors import ValidationError
from smartsched.scheduling.base import make_scheduler

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "ppo_mixed_small"


@pytest.mark.parametrize(("damaged", "content", "says"), [
    ("smartsched_policy.json", "{bad json", "not a readable policy description"),
    ("smartsched_policy.json", "[1, 2]", "not a policy description"),
    ("module_weights.pt", "junk", "cannot load the policy module"),
    ("module_spec.json", '{"class": "os.system"}', "is not one SmartSched builds"),
])
def test_a_damaged_policy_names_the_scheduler(tmp_path: Path, damaged: str, content: str,
                                              says: str) -> None:
    folder = tmp_path / "policy"
    shutil.copytree(SHIPPED, folder)
    (folder / damaged).write_text(content)
    with pytest.raises(ValidationError) as e:
        make_scheduler(f"rl:{folder}", 0)
    assert e.value.field == "scheduler" and says in e.value.message


@pytest.mark.parametrize(("where", "value", "says"), [
    (("model_config", "hidden"), 2_000_000, "sizes no SmartSched policy has"),
    (("model_config", "topology_dim"), 10**9, "sizes no SmartSched policy has"),
    (("model_config", "hidden"), True, "sizes no SmartSched policy has"),
    (("action_space", "n"), 10**12, "sizes no SmartSched policy has"),
    (("observation_space", "nodes", "shape"), [100_000_000, 48], "not a list of sizes"),
    (("observation_space", "nodes", "shape"), [200_000, 200], "sizes no SmartSched policy"),
    (("observation_space", "pod", "shape"), [-1], "not a list of sizes"),
    (("observation_space", "pod", "shape"), "19", "not a list of sizes"),
])
def test_a_spec_declaring_absurd_sizes_is_refused_before_anything_is_built(
        tmp_path: Path, where: tuple, value: object, says: str) -> None:
    """A spec is data: its sizes must not size allocations (a crafted one could ask for
    terabytes while the module is built, before any weight is read)."""
    import json

    folder = tmp_path / "policy"
    shutil.copytree(SHIPPED, folder)
    spec = json.loads((folder / "module_spec.json").read_text())
    target = spec
    for k in where[:-1]:
        target = target[k]
    target[where[-1]] = value
    (folder / "module_spec.json").write_text(json.dumps(spec))
    with pytest.raises(ValidationError) as e:
        make_scheduler(f"rl:{folder}", 0)
    assert e.value.field == "scheduler" and says in e.value.message, e.value.message


def test_the_shipped_policy_holds_no_pickle() -> None:
    # Loading a pickle runs whatever it holds: the export is JSON plus tensors only.
    assert not list(SHIPPED.glob("*.pkl"))
    assert (SHIPPED / "module_spec.json").exists() and (SHIPPED / "module_weights.pt").exists()


class _RunsCode:
    """A pickle payload: unpickling it calls ``touch(marker)``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("where", [".", "learner_group/learner/rl_module/default_policy"])
def test_a_crafted_pickle_checkpoint_is_refused_without_running_it(tmp_path: Path,
                                                                    where: str) -> None:
    """An RLlib checkpoint's pickle files run whatever they hold: a folder with one (at the
    top or where a training checkpoint keeps its module) is refused, and nothing ran --
    the payloads, the weights in a tensor file included, are never unpickled."""
    import pickle

    import torch

    marker = tmp_path / "ran"
    folder = tmp_path / "ckpt"
    module = folder / where
    module.mkdir(parents=True)
    for name in ("class_and_ctor_args.pkl", "module_state.pkl"):
        (module / name).write_bytes(pickle.dumps(_RunsCode(marker)))
    (module / "rllib_checkpoint.json").write_text('{"type": "RLModule"}')
    with pytest.raises(ValidationError) as e:
        make_scheduler(f"rl:{folder}", 0)
    assert e.value.field == "scheduler" and "pickle" in e.value.message
    # An export whose weights file is a pickle of an object, not tensors: refused too.
    export = tmp_path / "export"
    shutil.copytree(SHIPPED, export)
    import warnings

    for save in (lambda f: torch.save({"w": _RunsCode(marker)}, f),  # torch's own format
                 lambda f: f.write_bytes(pickle.dumps({"w": _RunsCode(marker)}, protocol=4))):
        save(export / "module_weights.pt")
        with warnings.catch_warnings(record=True) as seen:  # our one line, not torch's notes
            warnings.simplefilter("always")
            with pytest.raises(ValidationError, match="cannot load the policy module"):
                make_scheduler(f"rl:{export}", 0)
        assert not [w for w in seen if "pickle" in str(w.message).lower()], seen
    assert not marker.exists()


def test_filters_option_masks_the_policys_choices(tmp_path: Path) -> None:
    """``rl:PATH?filters=<profile>``: another profile's filters mask what the policy may
    choose. Here only nodes 1,800 km away have room for an edge pod with a 10 ms SLO:
    with the filters it was trained with the policy places it there, beyond the SLO;
    with a latency-SLO filter it never does (no node within the SLO has room)."""
    from smartsched.model.cluster import ClusterSpec, NodeSpec, Site, Zone
    from smartsched.model.pod import Pod, PodClass
    from smartsched.twin.state import ClusterState

    sites = (Site("region-near", "cloud", (600.0, 0.0), 5.0),
             Site("region-far", "cloud", (-1500.0, 0.0), 5.0),
             Site("mec-0", "edge", (400.0, 0.0), 1.0))
    zones = tuple(Zone(f"{s.name}-1", s.name) for s in sites)
    nodes = (NodeSpec("far", 64000, 262144, zone="region-far-1"),
             NodeSpec("near", 400, 32768, zone="region-near-1"),
             NodeSpec("mec", 400, 16384, zone="mec-0-1"))
    spec = ClusterSpec("edge-test", sites, zones, nodes)
    profile = tmp_path / "slo.yaml"
    profile.write_text("name: slo\nfilters: [NodeUnschedulable, NodeResourcesFit, "
                       "NodeAffinity, TaintToleration, RegionAllowed, LatencySLO]\n")
    pod = Pod(id="e0", cpu_milli=500, memory_mib=512, pod_class=PodClass.EDGE_RT,
              origin_site="mec-0", latency_slo_ms=10.0)
    st = ClusterState(spec)
    req = st.compile(pod)
    as_trained = make_scheduler(f"rl:{SHIPPED}", 0).decide(st, req)
    assert as_trained.node == st.index["far"]
    masked = make_scheduler(f"rl:{SHIPPED}?filters={profile}", 0).decide(st, req)
    assert masked.node is None and "latency" in " ".join(masked.reasons).lower()
    with pytest.raises(ValidationError) as e:
        make_scheduler(f"rl:{SHIPPED}?filters=", 0)
    assert e.value.field == "scheduler.filters"
    with pytest.raises(ValidationError):
        make_scheduler(f"rl:{SHIPPED}?filters={tmp_path / 'missing.yaml'}", 0)


def test_an_export_observes_the_reward_components_it_was_trained_with(tmp_path: Path) -> None:
    """Components are only appended: the shipped policy (six components) observes six
    weights; an export claiming components this version orders differently is refused."""
    import json

    from smartsched.objectives.reward import COMPONENTS

    sched = make_scheduler(f"rl:{SHIPPED}", 0)
    assert len(COMPONENTS) > 6 and sched.weights.shape == (6,)
    assert list(sched.weights) == [1.0, 0.5, 0.2, 0.1, 0.1, 0.05]  # balanced's first six
    folder = tmp_path / "policy"
    shutil.copytree(SHIPPED, folder)
    meta = json.loads((folder / "smartsched_policy.json").read_text())
    for bad in (["qos", "utilization"], [], "utilization"):
        meta["reward_components"] = bad
        (folder / "smartsched_policy.json").write_text(json.dumps(meta))
        with pytest.raises(ValidationError) as e:
            make_scheduler(f"rl:{folder}", 0)
        assert e.value.field == "scheduler" and "reward components" in e.value.message
