"""Grid series the project does not hold: a CSV of one's own, by file name (its columns
found by their names) or with its columns named, in the carbon benchmark, in a cluster
file's sites and in the twin's carbon runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from smartsched.model.carbon import load_public_series, load_series
from smartsched.model.errors import ValidationError

GB = "carbon-intensity-letswaitawhile-2020/gb_ci.csv"


@pytest.fixture()
def own_file(tmp_path: Path, data_dir: Path) -> Path:
    """Two months of the GB file as another operator exports it: other column names, an
    extra numeric column, hourly."""
    df = pd.read_csv(data_dir / GB).iloc[: 60 * 24 * 2]  # 60 days of half-hours
    df = df.rename(columns={"Time": "datetime_utc", "Carbon Intensity": "gCO2_per_kWh"})
    df.insert(1, "demand_mw", 30_000.0)
    path = tmp_path / "my_grid.csv"
    df.to_csv(path, index=False)
    return path


def test_a_file_of_ones_own_is_read_with_its_columns_found_by_name(own_file: Path,
                                                                    data_dir: Path) -> None:
    mine = load_series(str(own_file), data_dir)
    public = load_public_series("gb-2020", data_dir)
    assert mine.name == "my_grid" and mine.step_s == public.step_s
    np.testing.assert_allclose(mine.values, public.values[: mine.values.size])
    named = load_series(f"{own_file}:datetime_utc:gCO2_per_kWh", data_dir)
    np.testing.assert_array_equal(named.values, mine.values)


def test_the_shared_files_by_path_match_their_public_names(data_dir: Path) -> None:
    for name, rel in (("gb-2020", GB),
                      ("ca-2022", "carbon-intensity-sustaindc-eia-2022/CA_NG_avgCI.csv")):
        np.testing.assert_array_equal(load_series(str(data_dir / rel), data_dir).values,
                                      load_public_series(name, data_dir).values)


def test_columns_that_cannot_be_told_apart_are_named(tmp_path: Path, data_dir: Path) -> None:
    two = tmp_path / "two.csv"
    two.write_text("time,co2_avg,co2_marginal\n2020-01-01 00:00,100,300\n"
                   "2020-01-01 01:00,110,310\n")
    with pytest.raises(ValidationError, match="candidates: co2_avg, co2_marginal") as e:
        load_series(str(two), data_dir)
    assert e.value.field == "carbon" and "FILE:TIME_COLUMN:VALUE_COLUMN" in str(e.value)
    assert load_series(f"{two}:time:co2_marginal", data_dir).values[0] == 300
    no_time = tmp_path / "no_time.csv"
    no_time.write_text("when,ci\n2020-01-01 00:00,100\n2020-01-01 01:00,110\n")
    with pytest.raises(ValidationError, match="none of when, ci is named so"):
        load_series(str(no_time), data_dir)
    with pytest.raises(ValidationError, match=r"unknown series 'nope\.csv'") as e:
        load_series("nope.csv", data_dir)
    assert e.value.field == "carbon"
    with pytest.raises(ValidationError, match="missing column"):
        load_series(f"{two}:time:ci", data_dir)


def test_the_carbon_benchmark_runs_on_a_file_of_ones_own(own_file: Path,
                                                         data_dir: Path) -> None:
    from smartsched.bench.carbon import run_carbon

    lines: list[str] = []
    res = run_carbon([str(own_file)], [24], jobs=20, seed=3, data_dir=data_dir,
                     echo=lines.append)
    assert {r["series"] for r in res["rows"]} == {"my_grid"}
    assert all(r["deadline_misses"] == 0 for r in res["rows"])
    assert "my_grid" in res["forecast_errors"]


def test_a_cluster_sites_grid_and_the_twins_regions_may_be_own_files(
        own_file: Path, tmp_path: Path, data_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from smartsched.bench.carbon import _check_days_fit, grids_doc
    from smartsched.model.presets import cluster_from_dict

    monkeypatch.setenv("SMARTSCHED_DATA_DIR", str(data_dir.resolve()))
    monkeypatch.chdir(tmp_path)
    doc = grids_doc([own_file.name, "gb-2020"])  # relative: resolved here, read anywhere
    assert [s["carbon"] for s in doc["sites"]] == [str(own_file), "gb-2020"]
    monkeypatch.chdir("/")
    spec = cluster_from_dict(doc)
    assert [s.carbon.name for s in spec.sites] == ["my_grid", "gb-2020"]
    assert len(spec.nodes) == 24
    _check_days_fit([10], 30.0, doc)
    with pytest.raises(ValidationError, match="last start day") as e:
        _check_days_fit([59], 30.0, doc)  # the file holds 60 days
    assert e.value.field == "days"


def test_the_command_takes_a_file_and_names_a_bad_one(own_file: Path) -> None:
    from click.testing import CliRunner

    from smartsched.cli import main

    ok = CliRunner().invoke(main, ["bench", "carbon", "--series", str(own_file), "--jobs",
                                   "10", "--slack-hours", "24"])
    assert ok.exit_code == 0, ok.output
    assert "my_grid" in ok.output
    bad = CliRunner().invoke(main, ["bench", "carbon", "--series", "nope.csv"])
    assert bad.exit_code != 0 and "unknown series 'nope.csv'" in bad.output
    assert "Traceback" not in bad.output


def test_the_exact_forecast_what_if_reads_the_true_values_and_captures_all_when_long(
        own_file: Path, data_dir: Path) -> None:
    """``--exact-hours``: the forecast's first k horizons replaced by the truth. Exact over
    the whole deadline, the rank rule takes the bound's hours (captures 100 %); the
    forecaster's own row is unchanged beside it."""
    from smartsched.bench.carbon import exact_ahead, run_carbon
    from smartsched.carbon.forecast import ForecastTable

    y = np.arange(10.0)
    table = ForecastTable(np.full((10, 4), -1.0), "f")
    rows = exact_ahead(y, table, 2).rows
    assert rows[3].tolist() == [4.0, 5.0, -1.0, -1.0]  # hours 4, 5 exact; the rest kept
    assert np.isnan(rows[9, :2]).all() and np.isnan(rows[8, 1])  # past the series' end
    assert (table.rows == -1.0).all()  # the forecaster's table is not changed
    lines: list[str] = []
    plain = run_carbon([str(own_file)], [24], jobs=30, seed=3, data_dir=data_dir,
                       echo=lines.append)
    res = run_carbon([str(own_file)], [24], jobs=30, seed=3, data_dir=data_dir,
                     echo=lines.append, exact_hours=[6, 24])
    for r, p in zip(res["rows"], plain["rows"], strict=True):
        assert r["captured_pct"] == p["captured_pct"]
        if r["interruptible"]:
            assert r["captured_if_exact_pct"][24] == pytest.approx(100.0)
    assert "exact 6 h | exact 24 h" in lines[-1]


def test_the_exact_forecast_option_is_bounded_by_the_deadlines(own_file: Path) -> None:
    from click.testing import CliRunner

    from smartsched.cli import main

    for bad in ("0", "25", "6,6", "x", ""):
        r = CliRunner().invoke(main, ["bench", "carbon", "--series", str(own_file), "--jobs",
                                      "5", "--slack-hours", "24", "--exact-hours", bad])
        assert r.exit_code == 2 and "--exact-hours" in r.output, (bad, r.output)
    r = CliRunner().invoke(main, ["bench", "carbon", "--twin", "--exact-hours", "6"])
    assert r.exit_code == 2 and "only without --twin" in r.output


def test_a_cluster_files_series_is_read_beside_it_and_a_bad_one_names_the_site(
        own_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative series path in a cluster file was read from the working directory (a
    same-named file there used silently) and an unknown one named only ``carbon``."""
    from smartsched.model.presets import load_cluster

    folder = tmp_path / "conf"
    (folder / "grids").mkdir(parents=True)
    (folder / "grids" / "mine.csv").write_bytes(own_file.read_bytes())
    doc = ("name: c\nsites: [{name: s1, kind: cloud, carbon: grids/mine.csv}]\n"
           "zones: [{name: z, site: s1}]\n"
           "nodes: [{name: n, zone: z, cpu_milli: 1000, memory_mib: 1024}]\n")
    (folder / "c.yaml").write_text(doc)
    decoy = tmp_path / "grids"
    decoy.mkdir()
    (decoy / "mine.csv").write_text("Time,ci\n2020-01-01 00:00,1\n2020-01-01 01:00,1\n")
    monkeypatch.chdir(tmp_path)  # the decoy is what the working directory would give
    spec = load_cluster(str(folder / "c.yaml"))
    assert spec.sites[0].carbon.values.size > 1000  # two months, not the decoy's 2 hours
    (folder / "bad.yaml").write_text(doc.replace("grids/mine.csv", "grids/nope.csv"))
    with pytest.raises(ValidationError, match="unknown series") as e:
        load_cluster(str(folder / "bad.yaml"))
    assert (e.value.field, e.value.source) == ("sites.s1.carbon", str(folder / "bad.yaml"))


def test_a_value_column_named_twice_is_refused_by_name_or_found(tmp_path: Path,
                                                               data_dir: Path) -> None:
    """Named by FILE:TIME:VALUE, a series whose header holds ``ci`` twice was read as the
    first ``ci`` silently (``ci.1``, a name the file does not have, as the second), where a
    trace's header is refused (probe round 8)."""
    dup = tmp_path / "dup.csv"
    dup.write_text("timestamp,ci,ci\n" + "".join(
        f"2020-01-01 {h:02d}:00,{100 + h},900\n" for h in range(24)))
    for spec in (f"{dup}:timestamp:ci", f"{dup}:timestamp:ci.1", str(dup)):
        with pytest.raises(ValidationError, match="ci: column appears twice in the header"):
            load_series(spec, data_dir)


def test_a_named_column_empty_in_its_first_rows_is_still_found(tmp_path: Path,
                                                               data_dir: Path) -> None:
    """An export that starts with 300 missing readings was refused as "cannot tell which
    column is the carbon intensity (candidates: none)": the name was looked for only among
    columns with a number in the first 200 rows."""
    f = tmp_path / "late.csv"
    start = pd.Timestamp("2020-01-01", tz="UTC")
    rows = [f"{(start + pd.Timedelta(hours=h)).isoformat()},{'' if h < 300 else 100 + h % 7}"
            for h in range(1500)]
    f.write_text("timestamp,ci\n" + "\n".join(rows) + "\n")
    got = load_series(str(f), data_dir)
    assert got.values.size >= 1200 and np.isfinite(got.values).all()


def test_two_series_files_of_one_name_are_refused(own_file: Path, tmp_path: Path,
                                                  data_dir: Path) -> None:
    """Rows and forecast errors are keyed by the file's name: a second ``my_grid.csv``
    from another folder dropped the first one's errors from the table (probe round 8)."""
    from smartsched.bench.carbon import run_carbon

    other = tmp_path / "other"
    other.mkdir()
    (other / own_file.name).write_bytes(own_file.read_bytes())
    with pytest.raises(ValidationError, match="two series named 'my_grid'") as e:
        run_carbon([str(own_file), str(other / own_file.name)], (24,), 5, 0,
                   data_dir=data_dir, echo=lambda _: None)
    assert e.value.field == "series"
