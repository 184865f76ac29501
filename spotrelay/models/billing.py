"""What an instance costs: the price in effect over the time it is billed, integrated.

AWS bills a spot instance per second at the spot price in effect while it runs: "You pay the Spot price
that's in effect, billed to the nearest second" (Overview of Amazon EC2 Spot Instances, How Spot Instances
Work: https://docs.aws.amazon.com/whitepapers/latest/cost-optimization-leveraging-ec2-spot-instances/how-spot-instances-work.html);
an on-demand instance at its fixed price. Neither is billed once it is `stopping`, `stopped`,
`shutting-down` or `terminated` (the instance states and their billing, Amazon EC2 User Guide, Amazon EC2
instance state changes: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-lifecycle.html).

A price series is a right-continuous step function: a price set at `t` holds on [t, next change). One
integration of it (`step_integral`) serves the benchmark (market hours, spotrelay.bench.sim) and the
control plane (an attempt's prices from DescribeSpotPriceHistory, `attempt_cost`), so the two count money
the same way.

An attempt's bill (`Attempt.cost`) is settled once its instance is seen gone (`settle`): the price series
from its launch to the earliest time its instance was reported gone, integrated, stored on the attempt
with that time (`Attempt.cost_usd`, `Attempt.billed_until`), so that reading a cost never calls EC2. A
report that comes later than the first, or again, changes nothing; an earlier one (EventBridge keeps no
order: a `terminated` handled before its `shutting-down`; reconcile's sighting, an upper bound, before the
event it missed) moves the end back to it. The result is the same whatever order the reports come in.

Until it is settled, an attempt's cost so far is the same integration up to the end of its billing so far
(`cost_so_far`), at its pool's price history: the control plane's budget check and `spotrelay cost` read
each pool's history once over the one window every attempt there needs (`price_windows`), not once per
attempt. That figure is an estimate while the instance runs: its bill ends when its instance is gone.

Two deliberate simplifications, both on the side of counting more: billing starts at the launch
(`Attempt.started_at`), though EC2 does not bill `pending` (a minute or so at boot; `Attempt.running_at` is
moved at a handover, so it is no record of the instance's own start); and a Linux spot instance that EC2
itself interrupts in its first hour is not charged (Amazon EC2 User Guide, Billing for interrupted Spot
Instances), which is not modelled: spotrelay terminates an interrupted instance itself once its final
checkpoint is committed, and then the seconds are charged.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from spotrelay.models.records import Attempt, Market, Pool, PriceQuote

# A spot price series: (instance type, availability zone). One per pool, whatever the pool's market field says.
SeriesKey = tuple[str, str]


def step_integral(times: Sequence[float], prices: Sequence[float | None], start: float, end: float) -> float:
    """The integral over [start, end] of the step function that is `prices[i]` on [times[i], times[i+1])
    (`times` sorted; before `times[0]`, and where a price is None — not offered — it counts 0). In the unit
    of the prices times the unit of the times: USD per hour over hours is USD."""
    if end <= start:
        return 0.0
    i = bisect_right(times, start) - 1
    total = 0.0
    t = start
    while t < end:
        nxt = times[i + 1] if i + 1 < len(times) else math.inf
        upto = min(nxt, end)
        price = prices[i] if i >= 0 else None
        total += (price or 0.0) * (upto - t)
        t = upto
        i += 1
    return total


def billed_usd(launch_price: float, changes: Iterable[tuple[datetime, float]], start: datetime, end: datetime) -> float:
    """USD for one instance billed from `start` to `end`: each (since, usd_per_hour) of `changes` holds from
    `since` until the next change (of two at one time, the later given wins); before the first, or with none
    known, `launch_price` (the price the attempt was launched at)."""
    if end <= start:
        return 0.0
    times: list[float] = [-math.inf]
    prices: list[float | None] = [launch_price]
    for since, price in sorted(changes, key=lambda change: change[0]):
        at = (since - start).total_seconds() / 3600
        if at == times[-1]:
            prices[-1] = price
        else:
            times.append(at)
            prices.append(price)
    return step_integral(times, prices, 0.0, (end - start).total_seconds() / 3600)


def attempt_cost(attempt: Attempt, history: Iterable[PriceQuote], until: datetime) -> float:
    """What `attempt`'s instance costs from its launch to `until`: on-demand at its fixed price; spot at the
    prices of `history` (its pool's, as `Compute.spot_price_history` gives them: the price in effect at the
    launch, stamped when it took effect, and each change after it), the launch price before the first."""
    if attempt.pool.market is Market.ON_DEMAND:
        return attempt.hourly_price * max(0.0, (until - attempt.started_at).total_seconds() / 3600)
    pool = attempt.pool
    changes = [
        (quote.timestamp or attempt.started_at, quote.usd_per_hour)  # no timestamp: a price that always held
        for quote in history
        if (quote.pool.instance_type, quote.pool.availability_zone) == (pool.instance_type, pool.availability_zone)
    ]
    return billed_usd(attempt.hourly_price, changes, attempt.started_at, until)


def billing_end(attempt: Attempt, gone_at: datetime) -> datetime | None:
    """When the attempt's bill ends, its instance reported gone at `gone_at`: the earlier of that and the end
    already recorded (never before the launch). None if this report changes nothing: the recorded end, with
    its cost settled, is no later (a duplicate, or a later state of the same termination)."""
    end = max(gone_at, attempt.started_at)
    if attempt.billed_until is not None and attempt.billed_until <= end:
        if attempt.cost_usd is not None:
            return None
        end = attempt.billed_until  # an end recorded without its cost: settle it there
    return end


def settle(attempt: Attempt, history: Sequence[PriceQuote], gone_at: datetime) -> Attempt | None:
    """The attempt with its bill settled at `billing_end(attempt, gone_at)`: the end and the cost integrated
    up to it at `history`'s prices (covering the launch to `gone_at` at least). None if nothing changes: a
    change for `spotrelay.control.jobs.update_attempt`, decided again on a fresh read after a lost race."""
    end = billing_end(attempt, gone_at)
    if end is None:
        return None
    return attempt.model_copy(update={"billed_until": end, "cost_usd": attempt_cost(attempt, history, end)})


def needs_prices(attempt: Attempt) -> bool:
    """Its cost so far depends on a price series EC2 has to be asked for: a spot attempt not yet settled."""
    return attempt.cost_usd is None and attempt.pool.market is Market.SPOT


def series_key(pool: Pool) -> SeriesKey:
    """The spot price series `pool` is billed at (the key of `price_windows` and `cost_so_far`'s histories)."""
    return (pool.instance_type, pool.availability_zone)


@dataclass(frozen=True, slots=True)
class PriceWindow:
    """The span of one pool's spot price history that some attempts' costs need."""

    pool: Pool
    start: datetime
    end: datetime


def price_windows(attempts: Iterable[Attempt], now: datetime) -> dict[SeriesKey, PriceWindow]:
    """For each pool of the attempts whose cost needs prices (`needs_prices`), the one window of its history
    that covers them all: from the earliest launch to the latest end of billing so far (`Attempt.billing_end`).
    A history read over it holds the price in effect at each attempt's launch and every change after, so
    `attempt_cost` gives each attempt what a read of its own window would: one read per pool, not per attempt."""
    windows: dict[SeriesKey, PriceWindow] = {}
    for attempt in attempts:
        if not needs_prices(attempt):
            continue
        key = series_key(attempt.pool)
        start, end = attempt.started_at, max(attempt.started_at, attempt.billing_end(now))
        known = windows.get(key)
        if known is not None:
            start, end = min(start, known.start), max(end, known.end)
        windows[key] = PriceWindow(pool=attempt.pool, start=start, end=end)
    return windows


def cost_so_far(attempt: Attempt, histories: Mapping[SeriesKey, Sequence[PriceQuote]], now: datetime) -> float:
    """What `attempt` has cost up to `now`: its settled bill; else, its pool's history read (`histories`: series
    key -> the pool's prices over at least the attempt's billing so far, as over its `price_windows` window),
    the prices in effect integrated to the end of its billing so far; else its hours at the launch price."""
    history = histories.get(series_key(attempt.pool)) if needs_prices(attempt) else None
    if history is None:
        return attempt.cost(now)
    return attempt_cost(attempt, history, attempt.billing_end(now))
