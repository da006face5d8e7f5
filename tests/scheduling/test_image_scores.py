"""ImageLocality (upstream's formula and clamps) and the pull-aware ImagePull score."""

from __future__ import annotations

import numpy as np
import pytest

from smartsched.scheduling.framework import CycleContext
from smartsched.scheduling.plugins.images import MB, ImageLocality, ImagePull, image_locality
from smartsched.twin.state import ClusterState
from tests.builders import cluster, node, pod


@pytest.mark.parametrize(("size_mib", "holders", "total", "expect"), [
    (250, 1, 2, 10),      # 250 MiB on half the nodes: (125 - 23) * 100 // 977 = 10
    (250, 2, 2, 23),      # everywhere: (250 - 23) * 100 // 977 = 23
    (10, 1, 1, 0),        # below the 23 MiB floor
    (3000, 5, 10, 100),   # above the 1000 MiB cap
])
def test_image_locality_matches_upstream(size_mib: int, holders: int, total: int,
                                         expect: int) -> None:
    score = image_locality(np.array([True, False]), size_mib * MB, holders, total)
    assert score.tolist() == [float(expect), 0.0]


def _state() -> tuple[ClusterState, int]:
    st = ClusterState(cluster(node("a", pull_mbps=1000.0), node("b", pull_mbps=1000.0),
                              node("c", pull_mbps=100.0)))
    req = st.compile(pod("p", image="app", image_layers=(("os", 500), ("app", 700))))
    return st, req.image


def test_scores_prefer_nodes_holding_the_image_and_its_layers() -> None:
    st, img = _state()
    other = st.images.image_id("other", [("os", 500), ("x", 50)])
    st.images.pull(0, img, 0.0)  # a holds the whole image
    st.images.pull(1, other, 0.0)  # b holds the shared OS layer only
    st.now = 1e6  # long after: nothing in flight
    ctx = CycleContext(st, st.compile(pod("q", image="app",
                                          image_layers=(("os", 500), ("app", 700)))))
    loc = ImageLocality().score(ctx, np.ones(3, bool))
    assert loc[0] > 0 and loc[1] == loc[2] == 0  # whole image only, as upstream
    pull = ImagePull()
    t = pull.pull_seconds(ctx)
    assert t[0] == 0 and 0 < t[1] < t[2]  # b lacks 700 MiB at 1 Gbit/s, c all at 100 Mbit/s
    s = pull.score(ctx, np.ones(3, bool))
    assert s[0] == 100.0 and s[0] > s[1] > s[2] == 0.0


def test_pods_without_an_image_score_the_same_everywhere() -> None:
    st, _ = _state()
    ctx = CycleContext(st, st.compile(pod("plain")))
    assert ImageLocality().score(ctx, np.ones(3, bool)) == 0.0
    assert ImagePull().score(ctx, np.ones(3, bool)) == 0.0
