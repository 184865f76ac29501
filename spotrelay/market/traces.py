"""Trace files the spot market replays: availability traces and spot price histories.

Availability traces are the "Can't Be Late" (NSDI'24) spot-traces JSON format,
`{"metadata": {"gap_seconds": G}, "data": [v0, v1, ...]}`, one file per zone named `<zone>_<label>.json`
(`us-east-1a_v100_1.json`: zone `us-east-1a`, label `v100_1`). Tick *i* covers
`[i*G, (i+1)*G)` seconds from the trace's start and `v_i` is the number of instances available then
(0 = none). A trace is kept as runs of equal values: ~20,000 ticks become a few hundred runs.

Price histories are the training-on-a-dime CSV (`timestamp_utc,region,availability_zone,instance_type,
gpu_model,gpu_count,product_description,spot_price_usd_per_hour`): price-change events, each holding
until the next row of the same (type, zone).

PRICES.csv (the table of `spotrelay place`) is read row by row here too, so that its timestamps can
become steps of a price timeline (`parse_prices` keeps only the latest row of each pool).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from spotrelay.market.prices import PRICE_COLUMNS, PriceFileError, _quote
from spotrelay.models import PriceQuote

PRICE_HISTORY_COLUMNS = ("timestamp_utc", "availability_zone", "instance_type", "spot_price_usd_per_hour")


class TraceFileError(ValueError):
    """An availability trace we cannot use; the message names the file."""


@dataclass(frozen=True, slots=True)
class AvailabilityTrace:
    """One zone's availability trace, compressed to runs: run *k* starts at tick `run_starts[k]` and
    holds `run_values[k]` instances until the next run (the last run until tick `n_ticks`)."""

    zone: str
    label: str
    gap_seconds: float
    n_ticks: int
    run_starts: tuple[int, ...]
    run_values: tuple[int, ...]
    source: str = ""

    @property
    def duration_hours(self) -> float:
        return self.n_ticks * self.gap_seconds / 3600

    def available_fraction(self) -> float:
        """The fraction of ticks with at least one instance available."""
        return sum(n for n, v in self._run_lengths() if v > 0) / self.n_ticks

    def mean_value(self) -> float:
        return sum(n * v for n, v in self._run_lengths()) / self.n_ticks

    def steps(self, offset_hours: float = 0.0) -> list[tuple[float, int]]:
        """`(hours, instances)` per run, on a time axis where trace time `offset_hours` is 0."""
        hours_per_tick = self.gap_seconds / 3600
        return [
            (tick * hours_per_tick - offset_hours, v) for tick, v in zip(self.run_starts, self.run_values, strict=True)
        ]

    def _run_lengths(self) -> Iterator[tuple[int, int]]:
        ends = (*self.run_starts[1:], self.n_ticks)
        for start, end, value in zip(self.run_starts, ends, self.run_values, strict=True):
            yield end - start, value


def zone_and_label(path: Path) -> tuple[str, str]:
    """`us-east-1a_v100_1.json` -> (`us-east-1a`, `v100_1`); a name without `_` is all zone."""
    zone, _, label = path.stem.partition("_")
    if not zone:
        raise TraceFileError(f"{path}: the file name must be <zone>_<label>.json")
    return zone, label


def parse_availability_trace(text: str, zone: str, label: str = "", source: str = "trace") -> AvailabilityTrace:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceFileError(f"{source}: not JSON: {e}") from None
    if not isinstance(document, dict):
        raise TraceFileError(f'{source}: expected {{"metadata": {{"gap_seconds": G}}, "data": [...]}}')
    metadata = document.get("metadata")
    gap = metadata.get("gap_seconds") if isinstance(metadata, dict) else None
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not 0 < gap < math.inf:
        raise TraceFileError(f"{source}: metadata.gap_seconds must be a positive number, got {gap!r}")
    data = document.get("data")
    if not isinstance(data, list) or not data:
        raise TraceFileError(f"{source}: data must be a non-empty list of instance counts")
    run_starts: list[int] = []
    run_values: list[int] = []
    previous = None
    for tick, value in enumerate(data):
        if value != previous:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TraceFileError(f"{source}: data[{tick}] must be an instance count (integer >= 0), got {value!r}")
            run_starts.append(tick)
            run_values.append(value)
            previous = value
    return AvailabilityTrace(
        zone=zone,
        label=label,
        gap_seconds=float(gap),
        n_ticks=len(data),
        run_starts=tuple(run_starts),
        run_values=tuple(run_values),
        source=source,
    )


def load_availability_trace(path: str | Path) -> AvailabilityTrace:
    path = Path(path)
    zone, label = zone_and_label(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise TraceFileError(f"{path}: cannot read: {e.strerror}") from None
    return parse_availability_trace(text, zone, label, str(path))


def load_trace_dir(path: str | Path, label: str | None = None) -> list[AvailabilityTrace]:
    """Every `<zone>_<label>.json` in `path` (only those with `label`, if given), sorted by zone then
    label. Refuses a directory with no matching file."""
    path = Path(path)
    if not path.is_dir():
        raise TraceFileError(f"{path}: not a directory of availability traces")
    files = sorted(path.glob("*.json"))
    if label is not None:
        files = [f for f in files if zone_and_label(f)[1] == label]
    if not files:
        wanted = f" with label {label!r}" if label is not None else ""
        raise TraceFileError(f"{path}: no <zone>_<label>.json trace files{wanted}")
    traces = [load_availability_trace(f) for f in files]
    return sorted(traces, key=lambda t: (t.zone, t.label))


def _csv_rows(
    text: str, source: str, required: tuple[str, ...], expected: str
) -> tuple[list[str], csv.DictReader[str]]:
    reader = csv.DictReader(io.StringIO(text.removeprefix("\ufeff")))
    columns = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in required if c not in columns]
    if missing:
        raise PriceFileError(f"{source}: line 1: missing column(s) {', '.join(missing)}; expected {expected}")
    reader.fieldnames = columns
    return columns, reader


def parse_price_rows(text: str, source: str = "prices") -> list[PriceQuote]:
    """Every row of a PRICES.csv, in file order (timestamped or not) — unlike `parse_prices`, which
    keeps the latest row per pool."""
    columns, reader = _csv_rows(text, source, PRICE_COLUMNS, ",".join(PRICE_COLUMNS) + "[,timestamp]")
    if "timestamp_utc" in columns and "timestamp" not in columns:
        raise PriceFileError(
            f"{source}: this is a spot price history (timestamp_utc,region,availability_zone,...): "
            "give it as market.price_history, whose times are replayed from the market's start"
        )
    quotes = [_quote(row, source, reader.line_num) for row in reader if any(row.values())]
    if not quotes:
        raise PriceFileError(f"{source}: no price rows")
    return quotes


def load_price_rows(path: str | Path) -> list[PriceQuote]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise PriceFileError(f"{path}: cannot read: {e.strerror}") from None
    return parse_price_rows(text, str(path))


def parse_price_history(
    text: str,
    source: str = "price history",
    *,
    region: str | None = None,
    availability_zones: Collection[str] | None = None,
    instance_types: Collection[str] | None = None,
) -> list[PriceQuote]:
    """The rows of a training-on-a-dime price history kept by the filters, sorted by time (rows at
    the same time keep their file order). The region of a row without a `region` column is its zone
    minus the last letter."""
    _, reader = _csv_rows(text, source, PRICE_HISTORY_COLUMNS, ",".join(PRICE_HISTORY_COLUMNS) + ",...")
    quotes: list[PriceQuote] = []
    for row in reader:
        line = reader.line_num
        zone = (row.get("availability_zone") or "").strip()
        instance_type = (row.get("instance_type") or "").strip()
        if not zone and not instance_type:
            continue
        row_region = (row.get("region") or "").strip() or zone[:-1]
        if region is not None and row_region != region:
            continue
        if availability_zones is not None and zone not in availability_zones:
            continue
        if instance_types is not None and instance_type not in instance_types:
            continue
        raw_time = (row.get("timestamp_utc") or "").strip()
        try:
            timestamp = datetime.fromisoformat(raw_time.replace("Z", "+00:00"))
        except ValueError:
            raise PriceFileError(f"{source}: line {line}: timestamp_utc {raw_time!r} is not ISO 8601") from None
        if timestamp.tzinfo is None:
            timestamp = timestamp.replace(tzinfo=UTC)
        quote = _quote({**row, "timestamp": None}, source, line)
        quotes.append(quote.model_copy(update={"timestamp": timestamp}))
    if not quotes:
        raise PriceFileError(f"{source}: no price rows match the filters")
    quotes.sort(key=lambda q: q.timestamp or datetime.min.replace(tzinfo=UTC))
    return quotes


def load_price_history(
    path: str | Path,
    *,
    region: str | None = None,
    availability_zones: Collection[str] | None = None,
    instance_types: Collection[str] | None = None,
) -> list[PriceQuote]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise PriceFileError(f"{path}: cannot read: {e.strerror}") from None
    return parse_price_history(
        text, str(path), region=region, availability_zones=availability_zones, instance_types=instance_types
    )
