"""Price tables: the latest quote per pool counts, and a file we cannot use is refused with its line."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotrelay.market import PriceFileError, load_advisor_bands, load_prices, parse_prices
from spotrelay.models import Market, Pool

WriteFile = Callable[[str, str], Path]

HEADER = "instance_type,availability_zone,spot_price_usd_per_hour,timestamp\n"
ADVISOR_HEADER = (
    "snapshot_commit_date,region,os,instance_type,vcpus,ram_gb,savings_pct_vs_ondemand,"
    "interruption_range_index,interruption_range_label,interruption_range_upper_pct\n"
)


def prices_by_offering(text: str) -> dict[str, float]:
    return {q.pool.offering: q.usd_per_hour for q in parse_prices(text, "p.csv")}


def price_error(text: str) -> str:
    with pytest.raises(PriceFileError) as caught:
        parse_prices(text, "p.csv")
    return str(caught.value)


# --- parse_prices: what counts ----------------------------------------------------------------------


def test_latest_row_per_pool_wins_wherever_it_is_in_the_file() -> None:
    # Given one pool whose newest price comes first, and another whose newest price comes last
    text = (
        HEADER
        + "g6.xlarge,us-east-1a,0.51,2026-11-30T00:09:00Z\n"
        + "g5.xlarge,us-east-1b,0.60,2026-11-30T00:05:00Z\n"
        + "g6.xlarge,us-east-1a,0.10,2026-11-29T12:00:00Z\n"
        + "g5.xlarge,us-east-1b,0.55,2026-11-30T00:40:00Z\n"
    )

    # When the table is parsed
    quotes = parse_prices(text, "p.csv")

    # Then each pool has one quote, its latest, in order of first appearance
    assert [(q.pool.offering, q.usd_per_hour) for q in quotes] == [
        ("g6.xlarge:us-east-1a", 0.51),
        ("g5.xlarge:us-east-1b", 0.55),
    ]
    assert quotes[0].timestamp == datetime(2026, 11, 30, 0, 9, tzinfo=UTC)
    assert all(q.pool.market is Market.SPOT for q in quotes)


def test_example_table_ignores_its_older_row(events_dir: Path) -> None:
    # Given the example table, where g6.xlarge in us-east-1a has a newer row and, later, an older cheaper one
    # When it is loaded
    quotes = {q.pool: q for q in load_prices(events_dir / "prices" / "us-east-1-example.csv")}

    # Then the newer price counts, and every pool appears once
    assert quotes[Pool(instance_type="g6.xlarge", availability_zone="us-east-1a")].usd_per_hour == 0.5117
    assert len(quotes) == 52


def test_rows_without_timestamp_keep_the_last_one_given() -> None:
    # Given a table without a timestamp column, one pool listed twice
    text = (
        "instance_type,availability_zone,spot_price_usd_per_hour\n"
        "g6.xlarge,us-east-1a,0.40\n"
        "g5.xlarge,us-east-1a,0.50\n"
        "g6.xlarge,us-east-1a,0.38\n"
    )

    # When it is parsed
    quotes = parse_prices(text, "p.csv")

    # Then the last row of that pool counts, and no quote carries a time
    assert prices_by_offering(text) == {"g6.xlarge:us-east-1a": 0.38, "g5.xlarge:us-east-1a": 0.50}
    assert all(q.timestamp is None for q in quotes)


def test_blank_timestamp_cell_is_allowed() -> None:
    # Given a timestamp column where one row leaves the cell empty
    # When it is parsed
    quotes = parse_prices(HEADER + "g6.xlarge,us-east-1a,0.40,\n", "p.csv")

    # Then the row counts, untimed
    assert [(q.usd_per_hour, q.timestamp) for q in quotes] == [(0.40, None)]


def test_timestamp_without_zone_is_read_as_utc() -> None:
    # Given a timestamp written without a zone
    # When it is parsed
    (quote,) = parse_prices(HEADER + "g6.xlarge,us-east-1a,0.40,2026-11-30T00:09:00\n", "p.csv")

    # Then it is taken as UTC (describe-spot-price-history prints UTC)
    assert quote.timestamp == datetime(2026, 11, 30, 0, 9, tzinfo=UTC)


def test_spaces_around_headers_and_cells_are_ignored() -> None:
    # Given a hand-aligned table
    text = "instance_type, availability_zone, spot_price_usd_per_hour\ng6.xlarge , us-east-1a , 0.40\n"

    # When it is parsed
    # Then the values are read without the padding
    assert prices_by_offering(text) == {"g6.xlarge:us-east-1a": 0.40}


# --- parse_prices: what is refused ------------------------------------------------------------------


def test_missing_column_is_named_on_line_one() -> None:
    # Given a table without the availability_zone column
    # When it is parsed
    message = price_error("instance_type,spot_price_usd_per_hour\ng6.xlarge,0.4\n")

    # Then the message names the file, line 1, the missing column and the expected header
    assert message == (
        "p.csv: line 1: missing column(s) availability_zone; "
        "expected instance_type,availability_zone,spot_price_usd_per_hour[,timestamp]"
    )


def test_non_numeric_price_names_its_line_and_column() -> None:
    # Given a price that is not a number on the third line
    # When it is parsed
    message = price_error(HEADER + "g6.xlarge,us-east-1a,0.4,\ng5.xlarge,us-east-1a,cheap,\n")

    # Then the message names the file, the line, the column and the value
    assert message == "p.csv: line 3: spot_price_usd_per_hour 'cheap' is not a number"


def test_line_number_counts_blank_lines_in_the_file() -> None:
    # Given a table with a blank line, and a bad price on line 4 of the file
    text = HEADER + "g6.xlarge,us-east-1a,0.4,\n\ng5.xlarge,us-east-1a,cheap,\n"
    assert text.splitlines()[3].startswith("g5.xlarge")

    # When it is parsed
    message = price_error(text)

    # Then the message points at line 4, where the user will look
    assert message.startswith("p.csv: line 4: ")


@pytest.mark.parametrize("price", ["-0.01", "nan", "inf"])
def test_price_must_be_a_finite_non_negative_number(price: str) -> None:
    # Given a price that no pool can have
    # When it is parsed
    message = price_error(HEADER + f"g6.xlarge,us-east-1a,{price},\n")

    # Then the message names the line and says what is allowed
    assert message == f"p.csv: line 2: spot_price_usd_per_hour must be >= 0, got {price}"


def test_bad_timestamp_names_its_line_and_shows_the_format() -> None:
    # Given a timestamp that is not ISO 8601
    # When it is parsed
    message = price_error(HEADER + "g6.xlarge,us-east-1a,0.4,yesterday\n")

    # Then the message names the line and gives an example of the format
    assert message == "p.csv: line 2: timestamp 'yesterday' is not ISO 8601 (e.g. 2026-11-30T00:00:00Z)"


@pytest.mark.parametrize(
    ("row", "column"),
    [("g6.xlarge,,0.4,", "availability_zone"), (",us-east-1a,0.4,", "instance_type")],
)
def test_empty_pool_cell_names_its_line_and_column(row: str, column: str) -> None:
    # Given a row that leaves a pool column empty
    # When it is parsed
    # Then the message names the line and the column
    assert price_error(HEADER + row + "\n") == f"p.csv: line 2: {column} is empty"


def test_empty_file_is_refused_for_its_missing_header() -> None:
    # Given an empty file
    # When it is parsed
    message = price_error("")

    # Then the message points at line 1 and lists the columns expected there
    assert message.startswith(
        "p.csv: line 1: missing column(s) instance_type, availability_zone, spot_price_usd_per_hour"
    )


def test_header_without_rows_is_refused() -> None:
    # Given a header and nothing else
    # When it is parsed
    # Then the message says there are no prices
    assert price_error(HEADER) == "p.csv: no price rows"


def test_missing_price_file_names_the_path(tmp_path: Path) -> None:
    # Given a path with no file
    path = tmp_path / "prices.csv"

    # When it is loaded
    with pytest.raises(PriceFileError) as caught:
        load_prices(path)

    # Then the message names the path
    assert str(caught.value) == f"{path}: cannot read: No such file or directory"


def test_load_prices_names_the_file_in_errors(write_file: WriteFile) -> None:
    # Given a price file with a bad row
    path = write_file("prices.csv", HEADER + "g6.xlarge,us-east-1a,free,\n")

    # When it is loaded
    with pytest.raises(PriceFileError) as caught:
        load_prices(path)

    # Then the message starts with the file path and the line
    assert str(caught.value).startswith(f"{path}: line 2: ")


# --- load_advisor_bands ------------------------------------------------------------------------------


def test_advisor_bands_come_from_the_requested_region_only(write_file: WriteFile) -> None:
    # Given an Advisor snapshot with the same types in two regions, banded differently
    path = write_file(
        "advisor.csv",
        ADVISOR_HEADER
        + "2025-06-28,us-east-1,Linux,g6.xlarge,4,16.0,62,0,<5%,5\n"
        + "2025-06-28,us-west-2,Linux,g6.xlarge,4,16.0,55,3,15-20%,22\n"
        + "2025-06-28,us-east-1,Linux,p5.4xlarge,16,256.0,40,4,>20%,100\n"
        + "2025-06-28,us-west-2,Linux,g5.xlarge,4,16.0,70,2,10-15%,16\n",
    )

    # When the bands of us-east-1 are loaded
    bands = load_advisor_bands(path, "us-east-1")

    # Then only that region's types and bands are there
    assert bands == {"g6.xlarge": 0, "p5.4xlarge": 4}
    assert load_advisor_bands(path, "us-west-2") == {"g6.xlarge": 3, "g5.xlarge": 2}


def test_advisor_region_without_rows_gives_no_bands(write_file: WriteFile) -> None:
    # Given an Advisor snapshot without eu-north-1
    path = write_file("advisor.csv", ADVISOR_HEADER + "2025-06-28,us-east-1,Linux,g6.xlarge,4,16.0,62,0,<5%,5\n")

    # When that region's bands are loaded
    # Then there are none (placement falls back to its default band)
    assert load_advisor_bands(path, "eu-north-1") == {}


@pytest.mark.parametrize(
    ("index", "says"),
    [("5", "must be 0..4, got 5"), ("high", "must be an integer 0..4")],
)
def test_advisor_band_outside_zero_to_four_names_its_line(write_file: WriteFile, index: str, says: str) -> None:
    # Given an Advisor row in the region with an impossible band on line 3
    path = write_file(
        "advisor.csv",
        ADVISOR_HEADER
        + "2025-06-28,us-east-1,Linux,g6.xlarge,4,16.0,62,0,<5%,5\n"
        + f"2025-06-28,us-east-1,Linux,g5.xlarge,4,16.0,62,{index},<5%,5\n",
    )

    # When the region's bands are loaded
    with pytest.raises(PriceFileError) as caught:
        load_advisor_bands(path, "us-east-1")

    # Then the message names the file, the line and the allowed range
    assert str(caught.value) == f"{path}: line 3: interruption_range_index {says}"


def test_missing_advisor_file_names_the_path(tmp_path: Path) -> None:
    # Given a path with no file
    path = tmp_path / "advisor.csv"

    # When it is loaded
    with pytest.raises(PriceFileError) as caught:
        load_advisor_bands(path, "us-east-1")

    # Then the message names the path
    assert str(caught.value) == f"{path}: cannot read: No such file or directory"
