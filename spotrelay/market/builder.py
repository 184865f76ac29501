"""The spot market model's builder: `MarketBuilder` collects price sources (constant prices, PRICES.csv
tables, price histories) and capacity sources (availability traces, explicit steps, outages) per pool, then
builds an immutable `SpotMarket` (spotrelay.market.spot_market) of their timelines (spotrelay.market.timeline).

The model as a whole is described in spotrelay.market.model.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from datetime import datetime
from pathlib import Path
from typing import Self

from spotrelay.market.spot_market import SpotMarket
from spotrelay.market.timeline import (
    _ALWAYS,
    _NEVER,
    UNLIMITED,
    CapacityTimeline,
    PoolTimeline,
    PriceTimeline,
    _require_aware,
    hours_between,
    spot_pool,
)
from spotrelay.market.traces import (
    AvailabilityTrace,
    load_price_history,
    load_price_rows,
    load_trace_dir,
)
from spotrelay.models import PriceQuote


class MarketBuilder:
    """Collects price and capacity sources, then `build()`s an immutable `SpotMarket`.

    Prices of a pool from every source are merged into one timeline: constant prices hold from the
    beginning, timed ones from their time; at equal times the one added last wins. A pool has at most
    one capacity source (a trace or explicit steps); outages apply on top of it."""

    def __init__(self, start: datetime) -> None:
        _require_aware("start", start)
        self._start = start
        self._prices: dict[tuple[str, str], list[tuple[float, float]]] = {}
        self._capacity: dict[tuple[str, str], tuple[list[tuple[float, float]], float, str]] = {}
        self._outages: dict[tuple[str, str], list[tuple[float, float]]] = {}
        self._horizon = 0.0

    @property
    def start(self) -> datetime:
        return self._start

    def _hours(self, at: float | datetime | None, what: str) -> float:
        if at is None:
            return _ALWAYS
        if isinstance(at, datetime):
            _require_aware(what, at)
            return hours_between(self._start, at)
        if not math.isfinite(at):
            raise ValueError(f"{what} must be a finite number of hours, got {at}")
        return float(at)

    # --- prices ----------------------------------------------------------------------------------------

    def add_price(
        self, instance_type: str, availability_zone: str, usd_per_hour: float, at: float | datetime | None = None
    ) -> Self:
        """The pool's price from `at` (hours since start, or a datetime); from always if None."""
        if not (usd_per_hour >= 0 and math.isfinite(usd_per_hour)):
            raise ValueError(f"{instance_type}:{availability_zone}: price must be >= 0, got {usd_per_hour}")
        key = (instance_type, availability_zone)
        self._prices.setdefault(key, []).append((self._hours(at, "at"), float(usd_per_hour)))
        return self

    def add_quotes(self, quotes: Iterable[PriceQuote]) -> Self:
        """Timestamped quotes are steps at their time; untimed ones constant prices."""
        for quote in quotes:
            pool = quote.pool
            self.add_price(pool.instance_type, pool.availability_zone, quote.usd_per_hour, quote.timestamp)
        return self

    def add_price_file(self, path: str | Path) -> Self:
        """A PRICES.csv (the table of `spotrelay place`): timestamped rows are steps, others constant."""
        return self.add_quotes(load_price_rows(path))

    def add_price_history(
        self,
        source: str | Path | Iterable[PriceQuote],
        *,
        region: str | None = None,
        availability_zones: Collection[str] | None = None,
        instance_types: Collection[str] | None = None,
        start_at: datetime | None = None,
        offset_hours: float = 0.0,
    ) -> Self:
        """A spot price history (training-on-a-dime CSV, or its rows) replayed from the market's start:
        history time `start_at` (default: its first row kept by the filters) plus `offset_hours` maps to
        market time 0. Rows before that are kept, so the price at 0 is the one then in effect."""
        if isinstance(source, str | Path):
            rows = load_price_history(
                source, region=region, availability_zones=availability_zones, instance_types=instance_types
            )
        else:
            rows = [
                q
                for q in source
                if (region is None or q.pool.availability_zone[:-1] == region)
                and (availability_zones is None or q.pool.availability_zone in availability_zones)
                and (instance_types is None or q.pool.instance_type in instance_types)
            ]
        stamps = [q.timestamp for q in rows]
        if not rows or any(s is None for s in stamps):
            raise ValueError("a price history needs timestamped rows (none given, or some without a timestamp)")
        anchor = start_at if start_at is not None else min(s for s in stamps if s is not None)
        _require_aware("start_at", anchor)
        if not math.isfinite(offset_hours):
            raise ValueError(f"offset_hours must be finite, got {offset_hours}")
        for q, stamp in zip(rows, stamps, strict=True):
            assert stamp is not None
            at = hours_between(anchor, stamp) - offset_hours
            self.add_price(q.pool.instance_type, q.pool.availability_zone, q.usd_per_hour, at)
        return self

    # --- capacity --------------------------------------------------------------------------------------

    def add_outage(self, instance_type: str, availability_zone: str, from_hours: float, to_hours: float) -> Self:
        """No capacity in the pool during [from_hours, to_hours)."""
        if math.isnan(from_hours) or math.isnan(to_hours) or not from_hours < to_hours or from_hours == _NEVER:
            raise ValueError(
                f"{instance_type}:{availability_zone}: an outage needs from < to, got from={from_hours} to={to_hours}"
            )
        self._outages.setdefault((instance_type, availability_zone), []).append((float(from_hours), float(to_hours)))
        return self

    def add_capacity(
        self,
        instance_type: str,
        availability_zone: str,
        changes: Iterable[tuple[float, float]],
        initial: float = UNLIMITED,
        source: str = "capacity steps",
    ) -> Self:
        """The pool's capacity: `initial` instances, then each (hours, instances) change."""
        key = (instance_type, availability_zone)
        if key in self._capacity:
            raise ValueError(
                f"{instance_type}:{availability_zone}: a second capacity source ({source}); "
                f"it already has {self._capacity[key][2]}"
            )
        steps = [(float(at), value) for at, value in changes]
        for at, value in [*steps, (0.0, initial)]:
            if not math.isfinite(at) or not value >= 0:
                raise ValueError(f"{instance_type}:{availability_zone}: bad capacity step ({at}, {value}) in {source}")
        self._capacity[key] = (steps, initial, source)
        return self

    def add_trace(
        self,
        trace: AvailabilityTrace,
        instance_type: str,
        offset_hours: float = 0.0,
        spot_price_usd_per_hour: float | None = None,
    ) -> Self:
        """The capacity of `instance_type` in the trace's zone: trace time `offset_hours` is market time
        0; before its first tick the first value holds, after its last tick the last value holds."""
        if not 0 <= offset_hours < trace.duration_hours:
            raise ValueError(
                f"{trace.source or trace.zone}: offset {offset_hours} h is outside the trace "
                f"(0 to {trace.duration_hours:.2f} h)"
            )
        self.add_capacity(
            instance_type,
            trace.zone,
            trace.steps(offset_hours),
            initial=trace.run_values[0],
            source=f"trace {trace.source or trace.zone}",
        )
        self._horizon = max(self._horizon, trace.duration_hours - offset_hours)
        if spot_price_usd_per_hour is not None:
            self.add_price(instance_type, trace.zone, spot_price_usd_per_hour)
        return self

    def add_traces(
        self,
        source: str | Path | Iterable[AvailabilityTrace],
        instance_type: str,
        *,
        offset_hours: float = 0.0,
        label: str | None = None,
        spot_price_usd_per_hour: float | None = None,
    ) -> Self:
        """A directory of `<zone>_<label>.json` availability traces (or traces already loaded, so a
        benchmark can replay many offsets without reading the files again), one pool per zone of
        `instance_type`; `label` keeps only the files with that label."""
        traces = load_trace_dir(source, label) if isinstance(source, str | Path) else list(source)
        if label is not None:
            traces = [t for t in traces if t.label == label]
        by_zone: dict[str, list[AvailabilityTrace]] = {}
        for trace in traces:
            by_zone.setdefault(trace.zone, []).append(trace)
        for zone, same_zone in by_zone.items():
            if len(same_zone) > 1:
                labels = ", ".join(t.label for t in same_zone)
                raise ValueError(f"{zone} has {len(same_zone)} traces (labels {labels}): choose one with label")
        for trace in traces:
            self.add_trace(trace, instance_type, offset_hours, spot_price_usd_per_hour)
        return self

    # --- the market ------------------------------------------------------------------------------------

    def build(self) -> SpotMarket:
        keys = sorted({*self._prices, *self._capacity, *self._outages})
        timelines = []
        for key in keys:
            steps, initial, _ = self._capacity.get(key, ([], UNLIMITED, ""))
            timelines.append(
                PoolTimeline(
                    spot_pool(*key),
                    PriceTimeline(self._prices.get(key, [])),
                    CapacityTimeline(steps, initial, self._outages.get(key, [])),
                )
            )
        return SpotMarket(self._start, timelines, horizon=self._horizon)
