"""Price tables: the PRICES.csv of `spotrelay place`, and Spot Instance Advisor bands.

PRICES.csv columns: `instance_type,availability_zone,spot_price_usd_per_hour`, and optionally
`timestamp` (ISO 8601; where a pool has several rows, the latest counts — as in the output of
`aws ec2 describe-spot-price-history`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from spotrelay.models import Market, Pool, PriceQuote
from spotrelay.policy.placement import latest_quotes

PRICE_COLUMNS = ("instance_type", "availability_zone", "spot_price_usd_per_hour")


class PriceFileError(ValueError):
    """A price file we cannot use; the message names the file and the line."""


def load_prices(path: str | Path) -> list[PriceQuote]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise PriceFileError(f"{path}: cannot read: {e.strerror}") from None
    return parse_prices(text, str(path))


def parse_prices(text: str, source: str = "prices") -> list[PriceQuote]:
    """The latest quote per spot pool, in file order of first appearance."""
    reader = csv.DictReader(io.StringIO(text.removeprefix("\ufeff")))  # a BOM, as Excel writes
    columns = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in PRICE_COLUMNS if c not in columns]
    if missing:
        raise PriceFileError(
            f"{source}: line 1: missing column(s) {', '.join(missing)}; expected {','.join(PRICE_COLUMNS)}[,timestamp]"
        )
    reader.fieldnames = columns
    quotes = [_quote(row, source, reader.line_num) for row in reader if any(row.values())]
    if not quotes:
        raise PriceFileError(f"{source}: no price rows")
    return list(latest_quotes(quotes).values())


def _quote(row: dict[str, str | None], source: str, line: int) -> PriceQuote:
    def field(name: str) -> str:
        value = (row.get(name) or "").strip()
        if not value:
            raise PriceFileError(f"{source}: line {line}: {name} is empty")
        return value

    raw_price = field("spot_price_usd_per_hour")
    try:
        price = float(raw_price)
    except ValueError:
        raise PriceFileError(f"{source}: line {line}: spot_price_usd_per_hour {raw_price!r} is not a number") from None
    if not price >= 0 or price == float("inf"):
        raise PriceFileError(f"{source}: line {line}: spot_price_usd_per_hour must be >= 0, got {raw_price}")
    timestamp = None
    raw_time = (row.get("timestamp") or "").strip()
    if raw_time:
        try:
            timestamp = datetime.fromisoformat(raw_time.replace("Z", "+00:00"))
        except ValueError:
            raise PriceFileError(
                f"{source}: line {line}: timestamp {raw_time!r} is not ISO 8601 (e.g. 2026-11-30T00:00:00Z)"
            ) from None
        if timestamp.tzinfo is None:
            timestamp = timestamp.replace(tzinfo=UTC)
    pool = Pool(instance_type=field("instance_type"), availability_zone=field("availability_zone"), market=Market.SPOT)
    return PriceQuote(pool=pool, usd_per_hour=price, timestamp=timestamp)


def load_advisor_bands(path: str | Path, region: str) -> dict[str, int]:
    """Interruption bands (0..4) per instance type in `region`, from a Spot Instance Advisor CSV
    with the columns `region,instance_type,interruption_range_index` (others are ignored)."""
    path = Path(path)
    try:
        rows: Iterable[dict[str, str]] = list(csv.DictReader(io.StringIO(path.read_text())))
    except OSError as e:
        raise PriceFileError(f"{path}: cannot read: {e.strerror}") from None
    bands: dict[str, int] = {}
    for line, row in enumerate(rows, start=2):
        if row.get("region") != region:
            continue
        try:
            band = int(row["interruption_range_index"])
        except (KeyError, TypeError, ValueError):
            raise PriceFileError(f"{path}: line {line}: interruption_range_index must be an integer 0..4") from None
        if not 0 <= band <= 4:
            raise PriceFileError(f"{path}: line {line}: interruption_range_index must be 0..4, got {band}")
        bands[row["instance_type"]] = band
    return bands
