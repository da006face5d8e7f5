"""Cluster presets."""

from __future__ import annotations

import pytest


def test_regional_preset_for_the_service_bench() -> None:
    from smartsched.model.errors import ValidationError
    from smartsched.model.presets import regional

    c = regional(50, regions=2, edge_sites=2, nodes_per_edge=3)
    zs = c.zone_site()
    per_site: dict[str, int] = {}
    for n in c.nodes:
        per_site[zs[n.zone]] = per_site.get(zs[n.zone], 0) + 1
    assert per_site == {"region-a": 50, "region-b": 50, "mec-0": 3, "mec-1": 3}
    assert sum(n.num_gpu for n in c.nodes if zs[n.zone] == "region-a") == 10 * 8
    with pytest.raises(ValidationError):
        regional(50, regions=4)
