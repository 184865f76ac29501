"""The `market:` section of a replay scenario, and the market it builds.

```yaml
market:
  prices:          # rows, and/or {file: PRICES.csv}; `at` (optional): a duration after start, or a timestamp
    - {instance_type: g6.xlarge, availability_zone: us-east-1a, spot_price_usd_per_hour: 0.35}
    - {instance_type: g6.xlarge, availability_zone: us-east-1a, spot_price_usd_per_hour: 0.90, at: 3h}
    - {file: prices.csv}
  outages:         # no capacity in the pool during [from, to)
    - {instance_type: g6.xlarge, availability_zone: us-east-1a, from: 2h, to: 6h}
  traces:          # one, or a list: availability traces, one <zone>_<label>.json per zone
    {dir: traces/, instance_type: p3.2xlarge, offset: 24h, label: v100_1, spot_price_usd_per_hour: 0.97}
  price_history:   # one, or a list: a training-on-a-dime price-history CSV replayed from the start
    {file: history.csv, region: us-east-1, instance_types: [p3.2xlarge], start_at: 2020-01-01T00:00:00Z, offset: 2d}
```

Durations are "2h", "90m", "30s", "1h30m", "1.5d", or numbers of hours. Paths are relative to the
scenario's directory. Errors name the field: `outages[0].from: 'soon' is not a duration (...)`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from spotrelay.field_problems import field_problems
from spotrelay.market.model import MarketBuilder, SpotMarket

_UNIT_HOURS = {"d": 24.0, "h": 1.0, "m": 1 / 60, "s": 1 / 3600}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_DURATION = re.compile(rf"(?:({_NUMBER})\s*d)?\s*(?:({_NUMBER})\s*h)?\s*(?:({_NUMBER})\s*m)?\s*(?:({_NUMBER})\s*s)?")
_DURATION_HINT = "use e.g. 2h, 90m, 30s, 1h30m, 1.5d, or a number of hours"


class MarketSpecError(ValueError):
    """A market section we cannot build; the message names the field (`outages[0].from: ...`)."""


def parse_duration(value: object, field: str | None = None) -> float:
    """Hours in `value`: "2h" -> 2, "90m" -> 1.5, "1h30m" -> 1.5, "30s", "1.5d", or a number of hours
    (1.5, "1.5"). Refuses negative, infinite and unknown values with a message naming `field`."""
    hours = _duration_hours(value)
    if hours is None:
        where = f"{field}: " if field else ""
        raise ValueError(f"{where}{value!r} is not a duration ({_DURATION_HINT})")
    return hours


def _duration_hours(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if 0 <= value < math.inf else None
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    if re.fullmatch(_NUMBER, text):
        hours = float(text)
    else:
        match = _DURATION.fullmatch(text)
        if not text or match is None:
            return None
        hours = sum(
            float(amount) * hours for amount, hours in zip(match.groups(), _UNIT_HOURS.values(), strict=True) if amount
        )
    return hours if hours < math.inf else None  # ("9" * 400 + "h" is a float overflow, not a duration)


def _duration(value: object) -> float:
    return parse_duration(value)


def _time_point(value: object) -> object:
    """A datetime (naive = UTC) or an ISO timestamp stays a time; anything else is a duration in hours."""
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if isinstance(value, str) and re.match(r"\d{4}-\d{2}-\d{2}", value.strip()):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO 8601 timestamp (e.g. 2026-11-30T02:00:00Z)") from None
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    return parse_duration(value)


def _timestamp(value: object) -> object:
    if value is None:
        return None
    if not isinstance(value, datetime | str) or isinstance(_time_point(value), float):
        raise ValueError(f"{value!r} is not a timestamp (e.g. 2020-01-01T00:00:00Z)")
    return _time_point(value)


Hours = Annotated[float, BeforeValidator(_duration)]
TimePoint = Annotated[AwareDatetime | float, BeforeValidator(_time_point)]
Price = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class PriceEntrySpec(_Spec):
    """One price row, or `{file: PRICES.csv}`."""

    file: str | None = None
    instance_type: str | None = None
    availability_zone: str | None = None
    spot_price_usd_per_hour: Price | None = None
    at: TimePoint | None = Field(default=None, description="from when (a duration after start, or a timestamp)")

    @model_validator(mode="after")
    def _row_or_file(self) -> Self:
        row = {
            "instance_type": self.instance_type,
            "availability_zone": self.availability_zone,
            "spot_price_usd_per_hour": self.spot_price_usd_per_hour,
        }
        if self.file is not None:
            if any(v is not None for v in (*row.values(), self.at)):
                raise ValueError("give either file, or instance_type, availability_zone, spot_price_usd_per_hour[, at]")
        elif missing := [name for name, v in row.items() if v is None]:
            raise ValueError(f"a price row needs {', '.join(missing)} (or give file: PRICES.csv)")
        return self


class OutageSpec(_Spec):
    instance_type: str
    availability_zone: str
    from_: Hours = Field(alias="from")
    to: Hours

    @model_validator(mode="after")
    def _from_before_to(self) -> Self:
        if not self.from_ < self.to:
            raise ValueError(f"from ({self.from_:g} h) must be before to ({self.to:g} h)")
        return self


class TraceSpec(_Spec):
    dir: str
    instance_type: str
    offset: Hours = Field(default=0.0, description="trace time replayed at the market's start")
    label: str | None = Field(default=None, description="only the <zone>_<label>.json files with this label")
    spot_price_usd_per_hour: Price | None = Field(default=None, description="a constant price for these pools")


class PriceHistorySpec(_Spec):
    file: str
    region: str | None = None
    availability_zones: list[str] | None = None
    instance_types: list[str] | None = None
    start_at: Annotated[AwareDatetime | None, BeforeValidator(_timestamp)] = Field(
        default=None, description="history time replayed at the market's start (default: its first row)"
    )
    offset: Hours = Field(default=0.0, description="hours after start_at replayed at the market's start")


def _listed(value: object) -> object:
    return [value] if isinstance(value, Mapping) else value


class MarketSpec(_Spec):
    prices: list[PriceEntrySpec] = []
    outages: list[OutageSpec] = []
    traces: Annotated[list[TraceSpec], BeforeValidator(_listed)] = []
    price_history: Annotated[list[PriceHistorySpec], BeforeValidator(_listed)] = []


def parse_market_spec(spec: Mapping[str, Any] | MarketSpec | None) -> MarketSpec:
    if isinstance(spec, MarketSpec):
        return spec
    try:
        return MarketSpec.model_validate(spec or {})
    except ValidationError as e:
        raise MarketSpecError("; ".join(field_problems(e, model=MarketSpec, show_input=True))) from None


def from_scenario_market(
    spec: Mapping[str, Any] | MarketSpec | None, base_dir: str | Path, start: datetime
) -> SpotMarket:
    """The market of a scenario's `market:` section; paths relative to `base_dir`, time 0 at `start`.

    Prices of a pool merge into one timeline: a trace's `spot_price_usd_per_hour` is its pools' default,
    replaced by constant price rows (the last given wins) and followed by timed rows and histories."""
    market = parse_market_spec(spec)
    base = Path(base_dir)
    try:
        builder = MarketBuilder(start)
    except ValueError as e:
        raise MarketSpecError(str(e)) from None
    for i, traces in enumerate(market.traces):
        with _field(f"traces[{i}]"):
            builder.add_traces(
                base / traces.dir,
                traces.instance_type,
                offset_hours=traces.offset,
                label=traces.label,
                spot_price_usd_per_hour=traces.spot_price_usd_per_hour,
            )
    for i, entry in enumerate(market.prices):
        if entry.file is not None:
            with _field(f"prices[{i}].file"):
                builder.add_price_file(base / entry.file)
        elif entry.instance_type and entry.availability_zone and entry.spot_price_usd_per_hour is not None:
            with _field(f"prices[{i}]"):
                builder.add_price(entry.instance_type, entry.availability_zone, entry.spot_price_usd_per_hour, entry.at)
    for i, history in enumerate(market.price_history):
        with _field(f"price_history[{i}]"):
            builder.add_price_history(
                base / history.file,
                region=history.region,
                availability_zones=history.availability_zones,
                instance_types=history.instance_types,
                start_at=history.start_at,
                offset_hours=history.offset,
            )
    for i, outage in enumerate(market.outages):
        with _field(f"outages[{i}]"):
            builder.add_outage(outage.instance_type, outage.availability_zone, outage.from_, outage.to)
    return builder.build()


@contextmanager
def _field(name: str) -> Iterator[None]:
    """Re-raise a ValueError (PriceFileError and TraceFileError are, and name their file) naming `name`."""
    try:
        yield
    except ValueError as e:
        raise MarketSpecError(f"{name}: {e}") from None
