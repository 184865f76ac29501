"""The spot market model's timelines: per pool, a price timeline and a capacity timeline, right-continuous
step functions on the market's time axis (hours since its start), and `PoolTimeline`, the queries on both.

Lookups bisect sorted change points, O(log n); the interruption query also uses, per capacity change point,
the next zero-capacity time, and, per price timeline, a sparse table of range maxima ("first price above x
after i" in O(log n) for any x).

The model as a whole is described in spotrelay.market.model; its siblings: spotrelay.market.spot_market
(`SpotMarket`, the pools' timelines as one market) and spotrelay.market.builder (`MarketBuilder`).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable
from datetime import datetime
from typing import TypeVar

from spotrelay.config import SPOT_NOTICE_SECONDS
from spotrelay.models import Market, Pool

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
