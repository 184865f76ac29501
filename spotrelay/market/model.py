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
price; a price equal to it is fine).

The model is deterministic (no randomness) and immutable once built: build it with `MarketBuilder`
or `from_scenario_market` (spotrelay.market.spec).

The model is split by concern; this module keeps the overview and re-exports their names:
- spotrelay.market.timeline: `PriceTimeline`, `CapacityTimeline` (the step functions and their fast
  lookups), `PoolTimeline` (one pool's queries), `UNLIMITED`, `hours_between`, `spot_pool`;
- spotrelay.market.spot_market: `SpotMarket`, every pool on one time axis;
- spotrelay.market.builder: `MarketBuilder`, from prices, price histories, traces and outages.
"""

from spotrelay.market.builder import MarketBuilder
from spotrelay.market.spot_market import SpotMarket
from spotrelay.market.timeline import (
    UNLIMITED,
    CapacityTimeline,
    PoolTimeline,
    PriceTimeline,
    hours_between,
    spot_pool,
)

__all__ = [
    "UNLIMITED",
    "CapacityTimeline",
    "MarketBuilder",
    "PoolTimeline",
    "PriceTimeline",
    "SpotMarket",
    "hours_between",
    "spot_pool",
]
