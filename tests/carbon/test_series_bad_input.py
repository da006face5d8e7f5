"""Bad carbon-intensity files are refused naming the file or row, never a traceback or an
absurd series: empty or non-UTF-8 files, intensities no grid has, a lone reading."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from smartsched.model.carbon import CarbonSeries, load_carbon_csv, load_generation_share
from smartsched.model.errors import ValidationError


def _write(tmp_path: Path, data: bytes) -> Path:
    p = tmp_path / "ci.csv"
    p.write_bytes(data)
    return p


@pytest.mark.parametrize(("data", "what"), [
    (b"", "empty"),
    (b"Time,ci\n2020-01-01 00:00,1\xff0\n2020-01-01 01:00,100\n", "UTF-8"),
])
def test_an_empty_or_non_utf8_file_is_named(tmp_path: Path, data: bytes, what: str) -> None:
    f = _write(tmp_path, data)
    with pytest.raises(ValidationError, match=what) as e:
        load_carbon_csv(f, "Time", "ci")
    assert (e.value.field, e.value.source) == ("file", str(f))
    with pytest.raises(ValidationError, match=what) as e:
        load_generation_share(f, "Time", ("WND",), ("WND", "NG"), 3600.0, 2)
    assert (e.value.field, e.value.source) == ("file", str(f))


@pytest.mark.parametrize("value", ["1e30", "5000.5", "inf"])
def test_an_intensity_no_grid_has_is_refused_naming_the_row(tmp_path: Path,
                                                            value: str) -> None:
    f = _write(tmp_path, f"Time,ci\n2020-01-01 00:00,100\n2020-01-01 01:00,{value}\n"
                         "2020-01-01 02:00,90\n".encode())
    with pytest.raises(ValidationError, match="<= 5000") as e:
        load_carbon_csv(f, "Time", "ci")
    assert (e.value.field, e.value.row) == ("ci", 1)


def test_the_bound_holds_for_series_built_directly_and_admits_the_dirtiest_grid() -> None:
    with pytest.raises(ValidationError) as e:
        CarbonSeries(np.array([100.0, 1e30]), 3600.0)
    assert e.value.field == "carbon.values"
    assert CarbonSeries(np.array([1200.0, 5000.0]), 3600.0).at(3600.0) == 5000.0


@pytest.mark.parametrize("rows", [
    ["2020-01-01 00:00,100"],
    ["2020-01-01 00:00,100", "2020-01-01 01:00,"],  # an empty value is no reading
])
def test_a_single_reading_is_not_a_series(tmp_path: Path, rows: list[str]) -> None:
    f = _write(tmp_path, ("Time,ci\n" + "\n".join(rows) + "\n").encode())
    with pytest.raises(ValidationError, match="single reading") as e:
        load_carbon_csv(f, "Time", "ci")
    assert (e.value.field, e.value.source) == ("ci", str(f))
    two = _write(tmp_path, b"Time,ci\n2020-01-01 00:00,100\n2020-01-01 01:00,80\n")
    assert load_carbon_csv(two, "Time", "ci", step_s=3600.0).values.tolist() == [100.0, 80.0]


@pytest.mark.parametrize("times", [
    ["1577836800", "1577838600", "1577840400"],  # seconds since 1970
    ["1577836800000", "1577838600000", "1577840400000"],  # milliseconds
    ["1577836800.0", "1577838600.5", "1577840400.0"],  # seconds as a Prometheus query gives
])
def test_epoch_numbers_read_as_the_dates_they_are(tmp_path: Path, times: list[str]) -> None:
    # Read as nanoseconds (pandas' default) they were a whole file in one bin: a constant.
    dates = _write(tmp_path, b"Time,ci\n2020-01-01 00:00,100\n2020-01-01 00:30,300\n"
                   b"2020-01-01 01:00,200\n")
    rows = "".join(f"{t},{v}\n" for t, v in zip(times, (100, 300, 200), strict=True))
    epoch = tmp_path / "epoch.csv"
    epoch.write_bytes(f"Time,ci\n{rows}".encode())
    want = load_carbon_csv(dates, "Time", "ci").values
    # (a reading half a second late moves its bin's time-weighted mean by 0.1 g/kWh)
    assert load_carbon_csv(epoch, "Time", "ci").values.tolist() == pytest.approx(
        want.tolist(), abs=0.2)
    assert len(set(want.tolist())) == 3


@pytest.mark.parametrize(("times", "row"), [
    (["1", "2", "3"], 0),  # no date: hours? days? refused, not guessed
    (["1577836800", "1577838600000", "1577840400"], 1),  # seconds, then milliseconds
    (["1577836800", "", "1577840400"], 1),  # an empty time
])
def test_epoch_numbers_of_no_single_unit_are_refused_naming_the_row(
        tmp_path: Path, times: list[str], row: int) -> None:
    f = tmp_path / "odd.csv"
    f.write_bytes(("Time,ci\n" + "".join(f"{t},100\n" for t in times)).encode())
    with pytest.raises(ValidationError) as e:
        load_carbon_csv(f, "Time", "ci")
    assert (e.value.field, e.value.row, e.value.source) == ("Time", row, str(f))


@pytest.mark.parametrize(("data", "field", "says"), [
    (b"Time,ci\nTrue,100\nFalse,300\n", "Time", "true/false"),
    # True/False values were read as 1 and 0 g/kWh
    (b"Time,ci\n2020-01-01 00:00,True\n2020-01-01 01:00,False\n", "ci", "true/false"),
])
def test_numbers_for_times_and_true_false_for_values_are_refused(
        tmp_path: Path, data: bytes, field: str, says: str) -> None:
    f = _write(tmp_path, data)
    with pytest.raises(ValidationError, match=says) as e:
        load_carbon_csv(f, "Time", "ci")
    assert (e.value.field, e.value.source) == (field, str(f))
