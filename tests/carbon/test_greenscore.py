"""GreenScore: its terms on hand-checked cases, the renewable share from a generation mix or
estimated from intensity (checked against the California file's own mix), bad input named."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError as PydanticError

from smartsched.carbon.greenscore import (
    GreenWeights,
    efficiency,
    green_score,
    pue_share,
    site_efficiency,
)
from smartsched.model.carbon import (
    GAS_G_PER_KWH,
    PUBLIC_MIX,
    PUBLIC_SERIES,
    CarbonSeries,
    load_generation_share,
    load_public_series,
)
from smartsched.model.cluster import ClusterSpec, Site, Zone
from smartsched.model.cluster_io import read_cluster, write_cluster
from smartsched.model.errors import ValidationError
from smartsched.model.presets import cluster_from_dict
from tests.builders import node


def test_efficiency_is_work_per_watt_relative_to_full_load() -> None:
    idle, peak = np.array([40.0]), np.array([100.0])
    assert efficiency(np.array([0.0]), idle, peak)[0] == 0.0
    assert efficiency(np.array([1.0]), idle, peak)[0] == pytest.approx(1.0)
    # u = 0.4: 0.4 * 100 W of work for 40 + 60 * 0.4 = 64 W drawn.
    assert efficiency(np.array([0.4]), idle, peak)[0] == pytest.approx(0.4 * 100 / 64)
    # Hardware with no idle draw is as efficient at any load.
    assert efficiency(np.array([0.1, 0.9]), np.zeros(2), np.full(2, 100.0)) == pytest.approx(1.0)
    # A node without watts (nothing known) is 0, not a division by zero.
    assert efficiency(np.array([0.5]), np.zeros(1), np.zeros(1))[0] == 0.0


def test_site_efficiency_counts_only_powered_on_nodes() -> None:
    use = np.array([1.0, 0.0, 0.5, 0.5])
    idle, peak = np.full(4, 50.0), np.full(4, 100.0)
    on = np.array([True, True, True, False])
    site = np.array([0, 0, 1, 1])
    eff = site_efficiency(use, idle, peak, on, site, 3)
    # Site 0: 100 W of work for 100 + 50 W; site 1: the node that is on only; site 2: none.
    assert eff == pytest.approx([100 / 150, 50 / 75, 0.0])


def test_green_score_is_the_weighted_mean_of_its_terms() -> None:
    assert pue_share(1.25) == pytest.approx(0.8)
    assert green_score(0.8, 0.5, 0.2) == pytest.approx(0.5)
    w = GreenWeights(pue=0, renewable=3, efficiency=1)
    assert green_score(0.8, 0.5, 0.2, w) == pytest.approx((3 * 0.5 + 0.2) / 4)
    with pytest.raises(PydanticError, match="renewable"):
        GreenWeights(renewable=-1)
    with pytest.raises(PydanticError, match="at least one"):
        GreenWeights(pue=0, renewable=0, efficiency=0)


def test_renewable_share_from_the_mix_or_estimated_from_intensity() -> None:
    s = CarbonSeries(np.array([100.0, 400.0]), 3600.0, "two", renewable=np.array([0.7, 0.1]))
    assert s.renewable_at(0.0) == 0.7
    assert s.renewable_at(np.array([3600.0, 7200.0])) == pytest.approx([0.1, 0.7])  # wraps
    est = dataclasses.replace(s, renewable=None)
    assert est.renewable_at(0.0) == pytest.approx(1 - 100 / GAS_G_PER_KWH)
    assert est.renewable_at(3600.0) == pytest.approx(1 - 400 / GAS_G_PER_KWH)
    dirty = CarbonSeries.constant(900.0)  # dirtier than gas: no low-carbon share, not < 0
    assert dirty.renewable_at(0.0) == 0.0
    coal = dataclasses.replace(dirty, fossil_g_per_kwh=1000.0)
    assert coal.renewable_at(0.0) == pytest.approx(0.1)
    assert s.with_offset(3600.0).renewable_at(0.0) == 0.1  # the offset moves both series


@pytest.mark.parametrize("kw,field", [
    ({"renewable": np.array([0.5])}, "carbon.renewable"),
    ({"renewable": np.array([0.5, 1.5])}, "carbon.renewable"),
    ({"renewable": np.array([0.5, np.nan])}, "carbon.renewable"),
    ({"fossil_g_per_kwh": 0.0}, "carbon.fossil_g_per_kwh"),
    ({"fossil_g_per_kwh": float("inf")}, "carbon.fossil_g_per_kwh"),
    ({"fossil_g_per_kwh": True}, "carbon.fossil_g_per_kwh"),
])
def test_bad_series_fields_are_named(kw: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        CarbonSeries(np.array([100.0, 200.0]), 3600.0, **kw)
    assert e.value.field == field


def test_generation_share_file_errors_name_column_and_row(tmp_path: Path) -> None:
    f = tmp_path / "mix.csv"
    f.write_text("t,WND,NG\n2022-01-01 00:00,1,3\n2022-01-01 01:00,,\n2022-01-01 02:00,2,2\n")
    share = load_generation_share(f, "t", ("WND",), ("WND", "NG"), 3600.0, 3)
    assert share == pytest.approx([0.25, 0.25, 0.5])  # the empty hour holds the last reading
    f.write_text("t,WND,NG\n2022-01-01 00:00,1,3\n2022-01-01 01:00,-2,3\n")
    with pytest.raises(ValidationError) as e:
        load_generation_share(f, "t", ("WND",), ("WND", "NG"), 3600.0, 2)
    assert (e.value.field, e.value.row) == ("WND", 1)
    f.write_text("t,WND,NG\n2022-01-01 00:00,1,3\n2022-01-01 01:00,0,0\n")
    with pytest.raises(ValidationError, match="no generation"):
        load_generation_share(f, "t", ("WND",), ("WND", "NG"), 3600.0, 2)
    f.write_text("t,WND\n2022-01-01 00:00,1\n")
    with pytest.raises(ValidationError) as e:
        load_generation_share(f, "t", ("WND",), ("WND", "NG"), 3600.0, 1)
    assert e.value.field == "NG"


def test_california_share_is_the_files_mix_and_the_estimate_tracks_it(data_dir: Path) -> None:
    rel, tcol, _ = PUBLIC_SERIES["ca-2022"]
    if not (data_dir / rel).is_file():
        pytest.skip("the California carbon file is not in SMARTSCHED_DATA_DIR")
    s = load_public_series("ca-2022", data_dir)
    df = pd.read_csv(data_dir / rel)
    share_of, total_of = PUBLIC_MIX["ca-2022"]
    ok = df[list(total_of)].notna().all(axis=1).to_numpy()
    t = (pd.to_datetime(df[tcol], utc=True) - pd.to_datetime(df[tcol].iloc[0], utc=True)
         ).dt.total_seconds().to_numpy()
    df, t = df[ok], t[ok]
    total = df[list(total_of)].sum(axis=1).to_numpy()
    actual = df[list(share_of)].sum(axis=1).to_numpy() / total
    assert np.abs(s.renewable_at(t) - actual).max() < 1e-9
    # The estimate from intensity alone, against the file's low-carbon share (nuclear too):
    low_carbon = df[[*share_of, "NUC"]].sum(axis=1).to_numpy() / total
    est = dataclasses.replace(s, renewable=None).renewable_at(t)
    assert np.abs(est - low_carbon).mean() < 0.05  # 0.025 measured (docs/benchmarks.md)


def test_cluster_files_keep_the_share_and_the_fossil_intensity(tmp_path: Path) -> None:
    series = CarbonSeries(np.array([100.0, 300.0]), 3600.0, "mix",
                          renewable=np.array([0.6, 0.2]), fossil_g_per_kwh=700.0)
    spec = ClusterSpec("c", (Site("r", carbon=series),), (Zone("z1", "r"),), (node("n0"),))
    write_cluster(spec, tmp_path / "c.parquet")
    back = read_cluster(tmp_path / "c.parquet").sites[0].carbon
    assert back.renewable == pytest.approx([0.6, 0.2]) and back.fossil_g_per_kwh == 700.0
    doc = {"sites": [{"name": "r", "carbon": 400, "fossil_g_per_kwh": 800}],
           "zones": [{"name": "z", "site": "r"}],
           "nodes": [{"name": "n", "zone": "z", "cpu_milli": 1000, "memory_mib": 1024}]}
    assert cluster_from_dict(doc).sites[0].carbon.renewable_at(0.0) == pytest.approx(0.5)
    doc["sites"][0]["fossil_g_per_kwh"] = -5
    with pytest.raises(ValidationError) as e:
        cluster_from_dict(doc)
    assert e.value.field == "sites.r.fossil_g_per_kwh"
