"""The spot market model: prices, capacity and interruptions per pool over time, from scenario tables
and trace files; and the price tables of `spotrelay place`."""

from spotrelay.market.model import (
    UNLIMITED,
    CapacityTimeline,
    MarketBuilder,
    PoolTimeline,
    PriceTimeline,
    SpotMarket,
    hours_between,
    spot_pool,
)
from spotrelay.market.prices import PriceFileError, load_advisor_bands, load_prices, parse_prices
from spotrelay.market.spec import (
    MarketSpec,
    MarketSpecError,
    OutageSpec,
    PriceEntrySpec,
    PriceHistorySpec,
    TraceSpec,
    from_scenario_market,
    parse_duration,
    parse_market_spec,
)
from spotrelay.market.traces import (
    AvailabilityTrace,
    TraceFileError,
    load_availability_trace,
    load_price_history,
    load_price_rows,
    load_trace_dir,
    parse_availability_trace,
    parse_price_history,
    parse_price_rows,
)

__all__ = [
    "UNLIMITED",
    "AvailabilityTrace",
    "CapacityTimeline",
    "MarketBuilder",
    "MarketSpec",
    "MarketSpecError",
    "OutageSpec",
    "PoolTimeline",
    "PriceEntrySpec",
    "PriceFileError",
    "PriceHistorySpec",
    "PriceTimeline",
    "SpotMarket",
    "TraceFileError",
    "TraceSpec",
    "from_scenario_market",
    "hours_between",
    "load_advisor_bands",
    "load_availability_trace",
    "load_price_history",
    "load_price_rows",
    "load_prices",
    "load_trace_dir",
    "parse_availability_trace",
    "parse_duration",
    "parse_market_spec",
    "parse_price_history",
    "parse_price_rows",
    "parse_prices",
    "spot_pool",
]
