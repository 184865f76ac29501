"""The spot market model's market: `SpotMarket`, every pool's timelines (spotrelay.market.timeline) on one
time axis, immutable, and the queries the replay and the bench ask of it (prices, capacity, interruptions,
quotes, change points).

The model as a whole is described in spotrelay.market.model; it is built with spotrelay.market.builder's
`MarketBuilder` or `from_scenario_market` (spotrelay.market.spec).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from spotrelay.market.timeline import _ALWAYS, _NEVER, PoolTimeline, _require_aware, hours_between
from spotrelay.models import Market, Pool, PriceQuote


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
