"""The spot market model: prices per pool (and, later, capacity and interruptions over time)."""

from spotrelay.market.prices import PriceFileError, load_advisor_bands, load_prices, parse_prices

__all__ = ["PriceFileError", "load_advisor_bands", "load_prices", "parse_prices"]
