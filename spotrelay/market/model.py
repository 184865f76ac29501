"""The spot market model: per pool, a price timeline and a capacity timeline, on one time axis.

Time is in hours since the market's `start` (an aware datetime); `to_datetime`/`to_hours` convert.
A pool is a spot (instance type x zone). Both of its timelines are right-continuous step functions:
a value set at `t` holds on `[t, next change)`.

- Price: None until the pool's first price (not offered yet), then the latest price. A constant
  price (a row without a time) holds from the beginning of time; timed rows replace it from their time.
- Capacity: instances available (0 = none, `math.inf` = unlimited). A pool without a capacity source
  (trace or explicit steps) has unlimited capacity; outages force 0 on `[from, to)`. An availability
  trace holds its first value before it starts and its last value after it ends.

An instance started in a pool at `s` is interrupted at the first `t >= s` when the pool's capacity is 0
or its price is above the instance's max price (AWS interrupts when the spot price exceeds your max
price; a price equal to it is fine). Lookups bisect sorted change points, O(log n); the interruption
query also uses, per capacity change point, the next zero-capacity time, and, per price timeline, a
sparse table of range maxima ("first price above x after i" in O(log n) for any x).

The model is deterministic (no randomness) and immutable once built: build it with `MarketBuilder`
or `from_scenario_market` (spotrelay.market.spec).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Self, TypeVar

from spotrelay.config import SPOT_NOTICE_SECONDS
from spotrelay.market.traces import (
    AvailabilityTrace,
    load_price_history,
    load_price_rows,
    load_trace_dir,
)
from spotrelay.models import Market, Pool, PriceQuote

UNLIMITED = math.inf
"""The capacity of a pool without a capacity source."""

_NEVER = math.inf
_ALWAYS = -math.inf

V = TypeVar("V")


def hours_between(start: datetime, when: datetime) -> float:
    """Hours from `start` to `when` (negative if `when` is earlier)."""
    return (when - start).total_seconds() / 3600


def spot_pool(instance_type: str, availability_zone: str) -> Pool:
    return Pool(instance_type=instance_type, availability_zone=availability_zone, market=Market.SPOT)


def _require_aware(name: str, when: datetime) -> None:
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"{name} must be an aware datetime (with a time zone), got {when.isoformat()}")


def _steps(changes: Iterable[tuple[float, V]], initial: V) -> tuple[tuple[float, ...], tuple[V, ...]]:
    """Change points (the first at -inf, holding `initial`) of a step function: changes sorted by time
    (stable), the last given at a same time wins, and changes to the value already held dropped."""
    times: list[float] = [_ALWAYS]
    values: list[V] = [initial]
    for at, value in sorted(changes, key=lambda change: change[0]):
        if at == times[-1]:
            values[-1] = value
        else:
            times.append(at)
            values.append(value)
    kept_times: list[float] = [times[0]]
    kept_values: list[V] = [values[0]]
    for at, value in zip(times[1:], values[1:], strict=True):
        if value != kept_values[-1]:
            kept_times.append(at)
            kept_values.append(value)
    return tuple(kept_times), tuple(kept_values)


class PriceTimeline:
    """The spot price of one pool over time (USD per hour; None before the pool's first price)."""

    __slots__ = ("_maxima", "_prices", "_suffix_max", "_times")

    def __init__(self, changes: Iterable[tuple[float, float]] = ()) -> None:
        """`changes`: (hours, usd_per_hour); hours -inf for a price that has always held."""
        initial: float | None = None
        self._times, self._prices = _steps(changes, initial)
        # _maxima[k][j] = max(price[j : j + 2**k]); None counts as -inf (never above any max price).
        level: tuple[float, ...] = tuple(_ALWAYS if p is None else p for p in self._prices)
        maxima = [level]
        width = 1
        while 2 * width <= len(level):
            previous = maxima[-1]
            maxima.append(tuple(max(previous[j], previous[j + width]) for j in range(len(previous) - width)))
            width *= 2
        self._maxima = tuple(maxima)
        suffix = [_ALWAYS] * (len(level) + 1)
        for j in range(len(level) - 1, -1, -1):
            suffix[j] = max(level[j], suffix[j + 1])
        self._suffix_max = tuple(suffix)

    def at(self, t: float) -> float | None:
        return self._prices[bisect_right(self._times, t) - 1]

    def since(self, t: float) -> float:
        """When the price in effect at `t` took effect (-inf: it always held)."""
        return self._times[bisect_right(self._times, t) - 1]

    def first_above(self, t: float, max_price: float) -> float:
        """The first time >= t when the price is above `max_price`; inf if never."""
        i = bisect_right(self._times, t) - 1
        price = self._prices[i]
        if price is not None and price > max_price:
            return float(t)
        return self._first_above_after(i, max_price)

    def _first_above_after(self, i: int, max_price: float) -> float:
        """The time of the first change point after index `i` whose price is above `max_price`."""
        j = i + 1
        if self._suffix_max[j] <= max_price:
            return _NEVER
        for k in range(len(self._maxima) - 1, -1, -1):
            row = self._maxima[k]
            if j < len(row) and row[j] <= max_price:
                j += 1 << k
        return self._times[j]

    def change_times(self) -> tuple[float, ...]:
        return self._times[1:]

    def changes(self) -> list[tuple[float, float]]:
        """(hours, usd_per_hour) of every price set (hours -inf: a price that always held)."""
        return [(t, p) for t, p in zip(self._times, self._prices, strict=True) if p is not None]


class CapacityTimeline:
    """Instances available in one pool over time (0 = none, inf = unlimited)."""

    __slots__ = ("_next_zero", "_times", "_values")

    def __init__(
        self,
        changes: Iterable[tuple[float, float]] = (),
        initial: float = UNLIMITED,
        outages: Iterable[tuple[float, float]] = (),
    ) -> None:
        """`changes`: (hours, instances), `initial` holding before the first; `outages`: [from, to)
        intervals in hours with no capacity, whatever the changes say."""
        times, values = _steps(changes, initial)
        windows = _merge_windows(outages)
        if windows:
            starts = [w[0] for w in windows]
            base_times, base_values = times, values

            def capacity_at(t: float) -> float:
                k = bisect_right(starts, t) - 1
                if k >= 0 and t < windows[k][1]:
                    return 0
                return base_values[bisect_right(base_times, t) - 1]

            points = sorted({*base_times[1:], *starts, *(w[1] for w in windows if w[1] < _NEVER)})
            times, values = _steps(((p, capacity_at(p)) for p in points), initial)
        self._times: tuple[float, ...] = times
        self._values: tuple[float, ...] = values
        next_zero = [_NEVER] * len(self._times)
        for i in range(len(self._times) - 2, -1, -1):
            next_zero[i] = self._times[i + 1] if self._values[i + 1] <= 0 else next_zero[i + 1]
        self._next_zero: tuple[float, ...] = tuple(next_zero)

    def at(self, t: float) -> float:
        return self._values[bisect_right(self._times, t) - 1]

    def first_zero(self, t: float) -> float:
        """The first time >= t with no capacity; inf if never."""
        i = bisect_right(self._times, t) - 1
        return float(t) if self._values[i] <= 0 else self._next_zero[i]

    def change_times(self) -> tuple[float, ...]:
        return self._times[1:]

    def changes(self) -> list[tuple[float, float]]:
        """(hours, instances) of every change (the first at -inf: the capacity before any change)."""
        return list(zip(self._times, self._values, strict=True))


def _merge_windows(windows: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(windows):
        if start >= end:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


class PoolTimeline:
    """One pool's price and capacity timelines, and the queries on both (the fast path for callers
    that ask about the same pool many times: `SpotMarket.timeline(pool)`)."""

    __slots__ = (
        "_capacity",
        "_change_times",
        "_ctimes",
        "_cvalues",
        "_next_zero",
        "_pool",
        "_price",
        "_prices",
        "_ptimes",
    )

    def __init__(self, pool: Pool, price: PriceTimeline, capacity: CapacityTimeline) -> None:
        self._pool = pool
        self._price = price
        self._capacity = capacity
        self._ptimes = price._times
        self._prices = price._prices
        self._ctimes = capacity._times
        self._cvalues = capacity._values
        self._next_zero = capacity._next_zero
        self._change_times = tuple(sorted({*price.change_times(), *capacity.change_times()}))

    @property
    def pool(self) -> Pool:
        return self._pool

    @property
    def price_timeline(self) -> PriceTimeline:
        return self._price

    @property
    def capacity_timeline(self) -> CapacityTimeline:
        return self._capacity

    def price(self, t: float) -> float | None:
        return self._prices[bisect_right(self._ptimes, t) - 1]

    def capacity(self, t: float) -> float:
        return self._cvalues[bisect_right(self._ctimes, t) - 1]

    def available(self, t: float, max_price: float | None = None) -> bool:
        """The pool is offered at `t`, has capacity, and its price is not above `max_price`."""
        price = self._prices[bisect_right(self._ptimes, t) - 1]
        if price is None or (max_price is not None and price > max_price):
            return False
        return self._cvalues[bisect_right(self._ctimes, t) - 1] > 0

    def launchable(self, t: float, max_price: float | None = None) -> bool:
        """An instance can be launched at `t`: `available`, and its capacity not being taken back
        (`reclaiming`)."""
        return self.available(t, max_price) and not self.reclaiming(t)

    def reclaiming(self, t: float) -> bool:
        """The pool's capacity goes within EC2's two-minute interruption notice of `t`: its instances have
        their warnings, and EC2 launches nothing into the capacity it is taking back (the local EC2 refuses
        such a launch, and the bench offers none)."""
        reclaimed_at = self._capacity.first_zero(t)
        # in whole seconds: hours carry rounding, and a launch exactly a notice ahead of the reclaim is taken
        return round((reclaimed_at - t) * 3600, 6) < SPOT_NOTICE_SECONDS

    def interruption_time(self, start_t: float, max_price: float | None = None) -> float | None:
        """The first time >= start_t when an instance started at `start_t` loses it: no capacity, or
        the price above `max_price`. `start_t` itself if it cannot start then; None if never."""
        i = bisect_right(self._ptimes, start_t) - 1
        price = self._prices[i]
        if price is None or (max_price is not None and price > max_price):
            return float(start_t)
        j = bisect_right(self._ctimes, start_t) - 1
        if self._cvalues[j] <= 0:
            return float(start_t)
        end = self._next_zero[j]
        if max_price is not None:
            end = min(end, self._price._first_above_after(i, max_price))
        return None if end == _NEVER else end

    def change_times(self) -> tuple[float, ...]:
        """Every time the price or the capacity changes, in order."""
        return self._change_times


class SpotMarket:
    """Spot prices and capacity per pool over time; immutable. Unknown pools (and on-demand pools)
    are not offered: price None, capacity 0."""

    __slots__ = ("_by_key", "_changes", "_horizon", "_pools", "_start")

    def __init__(self, start: datetime, timelines: Iterable[PoolTimeline], horizon: float | None = None) -> None:
        _require_aware("start", start)
        self._start = start
        by_key: dict[tuple[str, str], PoolTimeline] = {}
        for timeline in timelines:
            pool = timeline.pool
            if pool.market != Market.SPOT:
                raise ValueError(f"{pool}: the spot market holds spot pools only")
            key = (pool.instance_type, pool.availability_zone)
            if key in by_key:
                raise ValueError(f"{pool}: given twice")
            by_key[key] = timeline
        self._by_key = dict(sorted(by_key.items()))
        self._pools = tuple(t.pool for t in self._by_key.values())
        self._changes = tuple(sorted({t for tl in self._by_key.values() for t in tl.change_times()}))
        last_change = self._changes[-1] if self._changes else 0.0
        self._horizon = max(last_change, horizon if horizon is not None else last_change)

    # --- time axis -------------------------------------------------------------------------------------

    @property
    def start(self) -> datetime:
        return self._start

    @property
    def horizon(self) -> float:
        """Hours after which nothing changes any more (the last change, or the end of the last trace)."""
        return self._horizon

    def to_datetime(self, t: float) -> datetime:
        return self._start + timedelta(hours=t)

    def to_hours(self, when: datetime) -> float:
        _require_aware("when", when)
        return hours_between(self._start, when)

    # --- what is on the market -------------------------------------------------------------------------

    def pools(self) -> list[Pool]:
        """Every pool with a price or capacity source, sorted by instance type then zone."""
        return list(self._pools)

    def zones(self) -> list[str]:
        return sorted({pool.availability_zone for pool in self._pools})

    def instance_types(self) -> list[str]:
        return sorted({pool.instance_type for pool in self._pools})

    def timeline(self, pool: Pool) -> PoolTimeline:
        """The pool's timelines (KeyError if the market does not know the pool)."""
        found = self._find(pool)
        if found is None:
            raise KeyError(f"{pool} is not on this market")
        return found

    def _find(self, pool: Pool) -> PoolTimeline | None:
        if pool.market != Market.SPOT:
            return None
        return self._by_key.get((pool.instance_type, pool.availability_zone))

    # --- queries ---------------------------------------------------------------------------------------

    def price(self, pool: Pool, t: float) -> float | None:
        """The spot price at `t`; None if the pool is not offered (yet)."""
        found = self._find(pool)
        return None if found is None else found.price(t)

    def capacity(self, pool: Pool, t: float) -> float:
        """Instances available at `t` (math.inf: unlimited; 0 for a pool the market does not know)."""
        found = self._find(pool)
        return 0 if found is None else found.capacity(t)

    def available(self, pool: Pool, t: float, max_price: float | None = None) -> bool:
        """An instance can be launched at `t`: offered, capacity > 0, price not above `max_price`."""
        found = self._find(pool)
        return found is not None and found.available(t, max_price)

    def interruption_time(self, pool: Pool, start_t: float, max_price: float | None = None) -> float | None:
        """The first time >= start_t when an instance started at `start_t` loses it: the pool's capacity
        goes to 0, or its price rises above `max_price`. `start_t` itself if it could not start then
        (not `available`); None if never (nothing changes after `horizon`)."""
        found = self._find(pool)
        return float(start_t) if found is None else found.interruption_time(start_t, max_price)

    def quotes(self, t: float) -> list[PriceQuote]:
        """The price of every offered pool at `t`, stamped with when that price took effect (None for a
        price that always held), in `pools()` order. Pools without capacity are listed too, as on AWS."""
        quotes = []
        for timeline in self._by_key.values():
            price = timeline.price(t)
            if price is None:
                continue
            since = timeline.price_timeline.since(t)
            stamp = None if since == _ALWAYS else self.to_datetime(since)
            quotes.append(PriceQuote(pool=timeline.pool, usd_per_hour=price, timestamp=stamp))
        return quotes

    def price_changes(self, pool: Pool, from_t: float, to_t: float) -> list[tuple[float, float]]:
        """(hours, usd_per_hour): the price in effect at `from_t`, stamped when it took effect (`from_t` for
        a price that always held), then each change in (from_t, to_t] — what DescribeSpotPriceHistory
        answers for a window. Empty if the pool is not offered in the window."""
        found = self._find(pool)
        if found is None:
            return []
        changes = found.price_timeline.changes()
        times = [t for t, _ in changes]
        first = bisect_right(times, from_t) - 1
        last = bisect_right(times, to_t)
        window = changes[max(first, 0) : last]
        if window and window[0][0] == _ALWAYS:
            window[0] = (from_t, window[0][1])
        return window

    def next_change(self, t: float, pool: Pool | None = None) -> float | None:
        """The first time after `t` when any price or capacity changes (of `pool` only, if given); None
        if nothing changes after `t`."""
        if pool is None:
            changes: Sequence[float] = self._changes
        else:
            found = self._find(pool)
            if found is None:
                return None
            changes = found.change_times()
        i = bisect_right(changes, t)
        return changes[i] if i < len(changes) else None

    def change_times(self, from_t: float = _ALWAYS, to_t: float = _NEVER) -> list[float]:
        """Every time in [from_t, to_t] when some price or capacity changes, in order."""
        return list(self._changes[bisect_left(self._changes, from_t) : bisect_right(self._changes, to_t)])


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
