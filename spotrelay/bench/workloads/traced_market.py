"""The market of a workload's traced pools: their capacity from the traces, their spot prices, and how
long the inputs span.

Prices of spot pools: a price history is replayed from the market's start (its time 0 is the latest
first row among the pools kept, so every pool has a price from time 0; the history's dates are not
the traces' dates: each pool's capacity and price are real, their alignment in time is ours); a
PRICES.csv gives constant prices (its timestamped rows become steps, its earliest timestamp at time 0).
With a price file, traced pools it has no price for are left out. Without one, a pool's spot price is
its on-demand price (catalog) times (1 - the Advisor's savings for its type and region) with
`--advisor`, else times 0.97 / 3.06 (the Can't Be Late paper's p3.2xlarge figures: 68% savings, in
the 66-86% the Advisor gives p3 types in us-east/us-west in its 2025-06 snapshot).

The inputs are read by spotrelay.bench.workloads.inputs; the overview of the workloads is
spotrelay.bench.workloads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from spotrelay.bench.workloads.common import DEFAULT_SPOT_FRACTION, MARKET_START, WorkloadError
from spotrelay.bench.workloads.inputs import Advisor, BenchInputs, PriceTable, TracedPool
from spotrelay.catalog import INSTANCE_TYPES
from spotrelay.market import MarketBuilder, SpotMarket


def region_of(zone: str) -> str:
    return zone[:-1] if zone and zone[-1].isalpha() else zone


def on_demand_price(instance_type: str) -> float | None:
    itype = INSTANCE_TYPES.get(instance_type)
    return None if itype is None else itype.on_demand_usd_per_hour


def fallback_spot_price(instance_type: str, zone: str, advisor: Advisor | None) -> float | None:
    """On-demand x (1 - the Advisor's savings), or x 0.97/3.06 without the Advisor (module docstring)."""
    od = on_demand_price(instance_type)
    if od is None:
        return None
    if advisor is not None:
        pct = advisor.savings_pct.get((region_of(zone), instance_type))
        if pct is not None:
            return od * (1 - pct / 100)
    return od * DEFAULT_SPOT_FRACTION


def build_market(
    pools: Iterable[TracedPool],
    inputs: BenchInputs,
    *,
    spot_prices: Mapping[str, float] | None = None,
) -> tuple[SpotMarket, list[str]]:
    """A market of `pools`: their traces for capacity; prices from `spot_prices` (constant per type,
    for every pool of that type) if given, else from the price file, else the fallback."""
    pools = list(pools)
    notes: list[str] = []
    builder = MarketBuilder(MARKET_START)
    priced: set[tuple[str, str]] = set()
    if spot_prices is not None:
        kept = [p for p in pools if p.instance_type in spot_prices]
        for p in kept:
            builder.add_price(p.instance_type, p.zone, spot_prices[p.instance_type])
    elif inputs.prices is not None:
        have = inputs.prices.pools()
        kept = [p for p in pools if (p.instance_type, p.zone) in have]
        dropped = [f"{p.instance_type}:{p.zone}" for p in pools if (p.instance_type, p.zone) not in have]
        if dropped:
            notes.append(f"left out (no price in {inputs.prices.source}): {', '.join(dropped)}")
        priced = {(p.instance_type, p.zone) for p in kept}
        if priced:
            inputs.prices.apply(builder, priced)
    else:
        kept = []
        for p in pools:
            price = fallback_spot_price(p.instance_type, p.zone, inputs.advisor)
            if price is not None:
                builder.add_price(p.instance_type, p.zone, price)
                kept.append(p)
    if not kept:
        raise WorkloadError("no traced pool has a spot price")
    for p in kept:
        builder.add_trace(p.trace, p.instance_type)
    return builder.build(), notes


@dataclass(frozen=True, slots=True)
class Span:
    """How long the inputs of a market reach from its start, and which input ends first."""

    hours: float
    limited_by: str  # e.g. "the trace DIR/us-west-2a_v100_1.json", "the prices in FILE (timestamps ...)"
    inputs: str  # what spans it: "traces", or "traces and prices"

    def __str__(self) -> str:
        return f"the {self.inputs} span {self.hours:.1f} h, limited by {self.limited_by}"


def market_span(pools: Iterable[TracedPool], prices: PriceTable | None) -> Span:
    """The span every trace of `pools` covers, and `prices` (the price file the market's prices come from,
    if any; its timestamps' span, as `PriceTable.horizon_hours`) too."""
    pools = list(pools)
    shortest = min(pools, key=lambda p: p.trace.duration_hours)
    span = Span(
        shortest.trace.duration_hours,
        f"the trace {shortest.trace.source or shortest.zone}",
        "traces" if prices is None else "traces and prices",
    )
    if prices is None or prices.horizon_hours() >= span.hours:
        return span
    stamps = [q.timestamp for q in prices.quotes if q.timestamp is not None]
    first, last = min(stamps), max(stamps)
    return Span(
        prices.horizon_hours(),
        f"the prices in {prices.source} (its timestamps run from {first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC)",
        span.inputs,
    )
