"""Image caches and pulls: time from bytes and bandwidth, shared layers once, serialized pulls,
LRU that never drops what runs, a cache within its disk; pods start after their pull."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartsched.model.errors import ValidationError
from smartsched.model.pod import Pod
from smartsched.twin.engine import Decision, Engine, EngineConfig
from smartsched.twin.images import MBIT_PER_MIB, ImageCaches
from smartsched.twin.podtable import DONE
from tests.builders import cluster, node, pod

BASE = ("base/os", 100)


def _caches(disk_mib: int = 10_000, mbps: float = 800.0) -> ImageCaches:
    return ImageCaches(cluster(node("a", image_disk_mib=disk_mib, pull_mbps=mbps),
                               node("b", image_disk_mib=disk_mib, pull_mbps=mbps)))


def test_a_pull_takes_missing_bytes_over_bandwidth_and_shared_layers_once() -> None:
    c = _caches()
    web = c.image_id("web", [BASE, ("web/app", 300)])
    api = c.image_id("api", [BASE, ("api/app", 200)])
    done, mib, _ = c.pull(0, web, now=10.0)
    assert mib == 400 and done == pytest.approx(10.0 + 400 * MBIT_PER_MIB / 800.0)
    # The second image shares the OS layer: only its own layer is fetched, after the first
    # pull (pulls on a node are serialized).
    done2, mib2, _ = c.pull(0, api, now=10.0)
    assert mib2 == 200 and done2 == pytest.approx(done + 200 * MBIT_PER_MIB / 800.0)
    # The same image again while it is still coming: no bytes, ready when it arrives.
    done3, mib3, _ = c.pull(0, web, now=11.0)
    assert mib3 == 0 and done3 == pytest.approx(done)
    # Much later: cached, ready at once.
    assert c.pull(0, web, now=1e6)[:2] == (1e6, 0)
    assert c.present[0, web] and c.present[0, api] and not c.present[1, web]
    assert c.nodes_with(web) == 1 and c.missing_mib(web).tolist() == [0, 400]


def test_lru_evicts_unused_layers_only_and_stays_within_the_disk() -> None:
    c = _caches(disk_mib=1000)
    a = c.image_id("a", [("a/1", 400)])
    b = c.image_id("b", [("b/1", 400)])
    big = c.image_id("c", [("c/1", 500)])
    c.pull(0, a, 0.0)
    _, _, pin_b = c.pull(0, b, 1.0)
    c.release(0, pin_b)  # b's pod left; a's still runs
    c.pull(0, big, 2.0)  # needs 500: evicts b (unused), never a (in use)
    assert c.present[0, a] and not c.present[0, b] and c.present[0, big]
    assert c.used_mib[0] == 900 <= c.capacity_mib[0]
    huge = c.image_id("huge", [("h/1", 5000)])
    _, mib, pinned = c.pull(0, huge, 3.0)  # larger than the disk: pulled, not kept
    assert mib == 5000 and pinned == () and not c.present[0, huge]
    assert c.used_mib[0] <= c.capacity_mib[0]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1), st.booleans()), max_size=60),
       st.integers(200, 3000))
def test_the_cache_never_exceeds_its_disk(ops, disk) -> None:
    c = _caches(disk_mib=disk)
    imgs = [c.image_id(f"i{k}", [BASE, (f"i{k}/x", 150 * (k + 1))]) for k in range(6)]
    held: list[tuple[int, tuple[int, ...]]] = []
    t = 0.0
    for k, n, release in ops:
        t += 1.0
        if release and held:
            node, pinned = held.pop(0)
            c.release(node, pinned)
        else:
            held.append((n, c.pull(n, imgs[k], t)[2]))
        assert (c.used_mib <= c.capacity_mib).all()
        for node in (0, 1):
            in_use = {j for nd, p in held if nd == node for j in p}
            assert in_use <= set(c._lru[node])  # nothing in use was evicted
        _assert_presence_matches_layers(c)


def _assert_presence_matches_layers(c: ImageCaches) -> None:
    """``present`` (kept incrementally) is what the cached layers say, image by image."""
    for n in range(c.num_nodes):
        for k, layers in enumerate(c.image_layers):
            assert c.present[n, k] == all(c.cached[n, j] for j in layers), (n, k)


def test_an_image_made_of_cached_layers_is_present_after_the_next_pull_there() -> None:
    c = _caches()
    web = c.image_id("web", [BASE, ("web/app", 300)])
    c.pull(0, web, 0.0)
    # Registered later, made only of layers node 0 already keeps: its next pull there
    # fetches nothing, and still records the image as present.
    slim = c.image_id("slim", [BASE])
    assert not c.present[0, slim]
    _, mib, _ = c.pull(0, slim, 100.0)
    assert mib == 0 and c.present[0, slim] and not c.present[1, slim]
    _assert_presence_matches_layers(c)


def test_pods_start_after_their_pull() -> None:
    layers = (("os", 100), ("app", 900))
    pods = [pod("p", arrival=0.0, duration=100.0, image="img", image_layers=layers),
            pod("q", arrival=0.0, duration=100.0, image="img", image_layers=layers),
            pod("plain", arrival=0.0, duration=100.0)]
    e = Engine(cluster(node("a", pull_mbps=1000.0)), pods,
               EngineConfig(power_management=False, container_start_s=3.0))
    while e.next_decision() is not None:
        e.apply(Decision(0))
    pull = 1000 * MBIT_PER_MIB / 1000.0
    tb = e.table
    assert tb.started_at[0] == pytest.approx(pull + 3.0)  # pulled, then started
    assert tb.started_at[1] == pytest.approx(pull + 3.0)  # joined the same pull
    assert tb.started_at[2] == 0.0  # no image modelled: starts at once
    assert tb.finished_at[0] == pytest.approx(pull + 3.0 + 100.0)
    m = e.run_report()
    assert m["images"]["pulled_gib"] == pytest.approx(1000 / 1024)
    assert m["classes"]["batch"]["image_pull_s"]["p50"] == pytest.approx(pull + 3.0)
    assert e.state.images._pins[0] == {}  # every pod left: nothing pinned


def test_a_pod_restarted_in_place_leaves_its_layers_evictable() -> None:
    # "web" runs on a, a fails at 50 s and is repaired at 150 s (before the eviction):
    # web pulls again in place. Once it is done, "big" needs the disk web's layer holds:
    # that layer is unused and must make way (its first pins were never released).
    pods = [pod("web", duration=1000.0, image="web", image_layers=(("web/app", 400),)),
            pod("big", arrival=3000.0, duration=10.0, image="big",
                image_layers=(("big/app", 800),))]
    e = Engine(cluster(node("a", image_disk_mib=1000)), pods,
               EngineConfig(power_management=False, repair_s=100.0))
    e.inject_failure(0, 50.0)
    while e.next_decision() is not None:
        e.apply(Decision(0))
    c = e.state.images
    assert e.table.last_start[0] > 150.0  # it did restart in place
    assert (e.table.status == DONE).all() and c._pins[0] == {}
    assert c.present[0, c.image_ids["big"]] and not c.present[0, c.image_ids["web"]]


@pytest.mark.parametrize(("kw", "field"), [
    ({"image": "x", "image_layers": (("l", -5),)}, "image_layers[0]"),
    ({"image": "x", "image_layers": ()}, "image_layers"),
    ({"image_layers": (("l", 5),)}, "image"),
    ({"image": "x", "image_layers": (("l", 5), ("l", 6))}, "image_layers[1]"),
])
def test_bad_images_name_the_field(kw: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        Pod(id="p", cpu_milli=100, memory_mib=100, **kw)
    assert e.value.field == field


def test_a_layer_with_two_sizes_is_refused() -> None:
    c = _caches()
    c.image_id("a", [("shared", 10)])
    with pytest.raises(ValidationError, match="two sizes"):
        c.image_id("b", [("shared", 11)])
