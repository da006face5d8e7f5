"""The mixed generator: seeded, every class present, gangs well-formed, real pressure."""

from __future__ import annotations

import numpy as np
import pytest

from smartsched.model.errors import ValidationError
from smartsched.model.pod import PodClass
from smartsched.model.presets import load_cluster
from smartsched.workloads.mixed import generate_mixed


def test_seeded_and_complete() -> None:
    spec = load_cluster("medium")
    a = generate_mixed(spec, hours=24, seed=5)
    b = generate_mixed(spec, hours=24, seed=5)
    assert a == b
    assert generate_mixed(spec, hours=24, seed=6) != a
    classes = {p.pod_class for p in a}
    assert classes == set(PodClass)
    assert len({p.tenant for p in a}) >= 5
    spec.validate_pods(a)


def test_gangs_and_edge_pods_are_well_formed() -> None:
    spec = load_cluster("medium")
    pods = generate_mixed(spec, hours=24, seed=1)
    gangs: dict[str, list] = {}
    for p in pods:
        if p.gang_id:
            gangs.setdefault(p.gang_id, []).append(p)
    assert gangs, "expected multi-node training gangs"
    for members in gangs.values():
        assert len(members) == members[0].gang_size
        assert len({m.arrival for m in members}) == 1
        assert all(m.num_gpu == 8 for m in members)
    edge = [p for p in pods if p.pod_class is PodClass.EDGE_RT]
    assert edge and all(p.origin_site and p.latency_slo_ms for p in edge)


def _demand_by_hour(pods, res) -> np.ndarray:
    """Requested resource in use per hour if every pod started on arrival."""
    hours = np.arange(0, 24 * 3600, 3600.0)
    out = np.zeros(hours.size)
    for p in pods:
        end = p.arrival + (p.duration or 1e12)
        out += res(p) * ((hours >= p.arrival) & (hours < end))
    return out


def test_pressure_at_peak_and_idle_at_night() -> None:
    spec = load_cluster("medium")
    pods = generate_mixed(spec, hours=24, seed=2)
    gpu = _demand_by_hour(pods, lambda p: p.gpu_total_milli) / (1000 * spec.total_gpus)
    assert gpu.max() > 1.0, "GPU demand should exceed capacity at peak"
    online = [p for p in pods if p.pod_class is PodClass.ONLINE]
    cpu = _demand_by_hour(online, lambda p: p.cpu_milli)
    assert cpu[5] < 0.7 * cpu[20]  # small-hours trough well below the evening peak


def test_priority_classes_resolve_and_bad_ones_name_the_field() -> None:
    import copy

    import pytest

    from smartsched.model.errors import ValidationError
    from smartsched.workloads.mixed import load_profile

    spec = load_cluster("small")
    pods = generate_mixed(spec, hours=2, seed=0)
    by_class = {p.pod_class: p.priority for p in pods}
    assert by_class[PodClass.ONLINE] > by_class[PodClass.AI_INFER] > \
        by_class[PodClass.AI_TRAIN] > by_class[PodClass.BATCH]
    bad = copy.deepcopy(load_profile())
    bad["ai-train"]["priority_class"] = "gold"
    with pytest.raises(ValidationError) as e:
        generate_mixed(spec, hours=2, seed=0, profile=bad)
    assert e.value.field == "workload.ai-train.priority_class" and "gold" in e.value.message
    bad = copy.deepcopy(load_profile())
    bad["priority_classes"] = {"batch": {"value": 10, "preemption_policy": "Sometimes"}}
    with pytest.raises(ValidationError) as e:
        generate_mixed(spec, hours=2, seed=0, profile=bad)
    assert e.value.field == "workload.priority_classes.batch.preemption_policy"


@pytest.mark.parametrize(("section", "key", "value", "field"), [
    ("online", "load", -1, "workload.online.load"),
    ("online", "load", float("nan"), "workload.online.load"),
    ("online", "load", True, "workload.online.load"),
    ("batch", "duration_hours_mean", 0, "workload.batch.duration_hours_mean"),
    ("edge-rt", "cpu_milli", [], "workload.edge-rt.cpu_milli"),
    ("edge-rt", "cpu_milli", [500, -5], "workload.edge-rt.cpu_milli.1"),
    ("ai-infer", "gpu_milli", [5000], "workload.ai-infer.gpu_milli.0"),
    ("ai-train", "gpus", {1: -1}, "workload.ai-train.gpus.1"),
    ("ai-train", "gpus", {100: 1.0}, "workload.ai-train.gpus"),  # nothing fits small
    ("batch", "best_effort_share", 2, "workload.batch.best_effort_share"),
    ("batch", "window_hours", [30, 4], "workload.batch.window_hours.0"),
    ("online", "apps", 0, "workload.online.apps"),
    ("online", "flash_sale", {"hour": 20, "minutes": 15, "multiplier": 1e12,
                              "duration_hours_mean": 0.75},
     "workload.online.flash_sale.multiplier"),
    ("day", "night_floor", -2, "workload.day.night_floor"),
])
def test_profile_numbers_out_of_range_name_the_field(section: str, key: str, value: object,
                                                     field: str) -> None:
    """A negative load or an empty size list used to come out as no pods or a "math domain
    error"; a load of 10^6 as an attempt to allocate billions of pods."""
    import copy

    from smartsched.workloads.mixed import load_profile

    profile = copy.deepcopy(load_profile())
    profile.setdefault(section, {})[key] = value
    with pytest.raises(ValidationError) as e:
        generate_mixed(load_cluster("small"), hours=2.0, seed=0, profile=profile)
    assert e.value.field == field, str(e.value)


def test_an_unknown_top_level_key_is_named_not_ignored(tmp_path) -> None:
    """A typo (``onlin:``) or a stray key used to leave its section at the defaults, or
    the whole workload empty, without a word."""
    from smartsched.workloads.mixed import load_profile

    for doc, field in (("foo: 1\n", "workload.foo"),
                       ("extends: mixed\nonlin: {}\n", "workload.onlin"),
                       # a typo inside a section, or inside its flash sale
                       ("extends: mixed\nonline: {laod: 0.99}\n", "workload.online.laod"),
                       ("extends: mixed\nonline: {flash_sale: {hours: 20}}\n",
                        "workload.online.flash_sale.hours"),
                       ("extends: mixed\nday: {peak: 20}\n", "workload.day.peak"),
                       # no section at all: the workload would be empty
                       ("name: x\n", "workload"),
                       ("day: {peak_hour: 20}\n", "workload")):
        f = tmp_path / "p.yaml"
        f.write_text(doc)
        with pytest.raises(ValidationError) as e:
            generate_mixed(load_cluster("small"), hours=1.0, seed=0, profile=load_profile(f))
        assert e.value.field == field, str(e.value)
    for name in ("mixed", "iiot"):  # the packaged profiles pass
        assert generate_mixed(load_cluster("small"), hours=0.5, seed=0,
                              profile=load_profile(name))


def test_a_profile_implying_more_pods_than_a_run_can_hold_is_refused() -> None:
    import copy

    from smartsched.workloads.mixed import MAX_ARRIVALS, load_profile

    profile = copy.deepcopy(load_profile())
    profile["online"]["duration_hours_mean"] = 1e-6  # within range, absurd with the load
    with pytest.raises(ValidationError, match=f"at most {MAX_ARRIVALS:,}") as e:
        generate_mixed(load_cluster("small"), hours=2.0, seed=0, profile=profile)
    assert e.value.field == "workload.online"


def test_an_exponent_number_in_yaml_is_a_number(tmp_path) -> None:
    """YAML 1.1 read ``1e30`` (no dot) as text, and the error then had to explain that;
    the loader reads it as YAML 1.2 does, a number, so the range check names it."""
    from smartsched.workloads.mixed import load_profile

    f = tmp_path / "p.yaml"
    f.write_text("extends: mixed\nonline: {load: 1e30}\n")
    with pytest.raises(ValidationError, match=r"within \[0, 100\], got 1e\+30") as e:
        generate_mixed(load_cluster("small"), hours=1.0, seed=0, profile=load_profile(f))
    assert e.value.field == "workload.online.load"


@pytest.mark.parametrize(("images", "field"), [
    ({"zipf_s": "x"}, "workload.images.zipf_s"),
    ({"zipf_s": None}, "workload.images.zipf_s"),
    ({"classes": [1]}, "workload.images.classes"),
    ({"classes": {"online": 5}}, "workload.images.classes.online"),
    ({"classes": {"online": {"count": 2, "gb": [1.0, float("inf")]}}},
     "workload.images.classes.online.gb"),
    ({"base_layers_mib": {"os": 80},
      "classes": {"online": {"count": 2, "gb": [1.0, 2.0], "base": "os"}}},
     "workload.images.classes.online.base"),
    ({"base_layers_mib": {"os": 80},
      "classes": {"online": {"count": 2, "gb": [1.0, 2.0], "base": [["os"]]}}},
     "workload.images.classes.online.base"),
])
def test_a_mistyped_images_section_names_the_field(images: dict, field: str) -> None:
    """Each of these was a traceback (float('x'), .items() of a list, .get of an int,
    OverflowError of an infinite size, a list looked up as a layer name)."""
    import copy

    from smartsched.workloads.mixed import load_profile

    profile = copy.deepcopy(load_profile())
    profile["images"] = images
    with pytest.raises(ValidationError) as e:
        generate_mixed(load_cluster("small"), hours=1.0, seed=0, profile=profile)
    assert e.value.field == field, str(e.value)


def test_an_empty_day_section_is_the_defaults(tmp_path) -> None:
    """``day:`` with nothing under it passed the checks and then was a traceback
    (``None.get``)."""
    from smartsched.workloads.mixed import load_profile

    f = tmp_path / "p.yaml"
    f.write_text("extends: mixed\nday:\n")
    pods = generate_mixed(load_cluster("small"), hours=1.0, seed=0, profile=load_profile(f))
    assert [p.id for p in pods] == [p.id for p in generate_mixed(
        load_cluster("small"), hours=1.0, seed=0, profile=load_profile("mixed"))]


def test_gpu_weights_summing_past_the_largest_number_are_named() -> None:
    import copy

    from smartsched.workloads.mixed import load_profile

    profile = copy.deepcopy(load_profile())
    profile["ai-train"]["gpus"] = {1: 1e308, 2: 1e308}
    with pytest.raises(ValidationError, match="sum past") as e:
        generate_mixed(load_cluster("small"), hours=1.0, seed=0, profile=profile)
    assert e.value.field == "workload.ai-train.gpus"


@pytest.mark.parametrize(("tenants", "field"), [
    ({"online": [True]}, "workload.tenants.online"),
    ({"online": [{"a": 1}]}, "workload.tenants.online"),
    ({"online": "shop"}, "workload.tenants.online"),
    ({"onlin": ["shop"]}, "workload.tenants.onlin"),
    (["shop"], "workload.tenants"),
])
def test_mistyped_tenants_are_named_not_turned_into_text(tenants: object, field: str) -> None:
    """A tenant written as true or {a: 1} became a tenant called "True" or "{'a': 1}" in
    every report and fairness figure; a typo in the class was ignored."""
    import copy

    from smartsched.workloads.mixed import load_profile

    profile = copy.deepcopy(load_profile())
    profile["tenants"] = tenants
    with pytest.raises(ValidationError) as e:
        generate_mixed(load_cluster("small"), hours=1.0, seed=0, profile=profile)
    assert e.value.field == field, str(e.value)
