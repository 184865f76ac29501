"""The spot market model: price and capacity timelines per pool, and when an instance loses its pool."""

from __future__ import annotations

import csv
import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotrelay.market import (
    CapacityTimeline,
    MarketBuilder,
    MarketSpecError,
    PriceFileError,
    PriceTimeline,
    SpotMarket,
    from_scenario_market,
    load_trace_dir,
    parse_duration,
    spot_pool,
)
from spotrelay.models import Market, Pool

START = datetime(2026, 11, 30, tzinfo=UTC)
G6_A = spot_pool("g6.xlarge", "us-east-1a")
G6_B = spot_pool("g6.xlarge", "us-east-1b")
G5_A = spot_pool("g5.xlarge", "us-east-1a")
V100_A = spot_pool("p3.2xlarge", "us-east-1a")
MINUTE = 1 / 60
SHARED_TRACES = Path("/work/shared/data/cant-be-late-spot-traces")
REAL_TRACE_DIR = "availability/1-node/aws-02-15-2023"


def market_of(spec: dict[str, Any], base_dir: Path = Path()) -> SpotMarket:
    return from_scenario_market(spec, base_dir, START)


def row(pool: Pool, price: float, at: object = None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "instance_type": pool.instance_type,
        "availability_zone": pool.availability_zone,
        "spot_price_usd_per_hour": price,
    }
    if at is not None:
        entry["at"] = at
    return entry


def write_trace(directory: Path, name: str, data: list[int], gap_seconds: float = 60) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap_seconds}, "data": data}))
    return path


def spec_error(spec: dict[str, Any], base_dir: Path = Path()) -> str:
    with pytest.raises(MarketSpecError) as caught:
        market_of(spec, base_dir)
    return str(caught.value)


# --- prices ------------------------------------------------------------------------------------------


def test_a_timestamped_prices_csv_becomes_steps_and_an_untimed_row_a_constant(tmp_path: Path) -> None:
    # Given a PRICES.csv with g6.xlarge priced an hour before the start, then at +2h and +5h, and an untimed g5 row
    (tmp_path / "prices.csv").write_text(
        "instance_type,availability_zone,spot_price_usd_per_hour,timestamp\n"
        "g6.xlarge,us-east-1a,0.50,2026-11-30T05:00:00Z\n"
        "g6.xlarge,us-east-1a,0.30,2026-11-29T23:00:00Z\n"
        "g6.xlarge,us-east-1a,0.40,2026-11-30T02:00:00Z\n"
        "g5.xlarge,us-east-1a,0.61,\n"
    )

    # When the market is built from it
    market = market_of({"prices": [{"file": "prices.csv"}]}, tmp_path)

    # Then g6's price steps at each timestamp, holding until the next, whatever the row order in the file
    assert [market.price(G6_A, t) for t in (-1.0, 0.0, 1.99, 2.0, 4.99, 5.0, 500.0)] == [
        0.30,
        0.30,
        0.30,
        0.40,
        0.40,
        0.50,
        0.50,
    ]
    assert market.price(G6_A, -1.01) is None  # not offered before its first price
    # And g5's untimed price holds at any time
    assert market.price(G5_A, -100.0) == market.price(G5_A, 100.0) == 0.61


def test_inline_rows_with_at_replace_a_constant_price_from_their_time() -> None:
    # Given a constant price, a step at 3h, a step at a timestamp (05:00), and a pool priced only from 1h30m
    market = market_of(
        {
            "prices": [
                row(G6_A, 0.35),
                row(G6_A, 0.90, at="3h"),
                row(G6_A, 0.40, at="2026-11-30T05:00:00Z"),
                row(G6_B, 0.20, at="1h30m"),
            ]
        }
    )

    # When prices are read over time
    # Then each step holds on [its time, the next step)
    assert [market.price(G6_A, t) for t in (0, 2.99, 3, 4.99, 5, 9)] == [0.35, 0.35, 0.90, 0.90, 0.40, 0.40]
    # And the later pool is not offered (nor available) until its first price
    assert market.price(G6_B, 1.49) is None
    assert not market.available(G6_B, 1.49)
    assert market.price(G6_B, 1.5) == 0.20
    assert market.available(G6_B, 1.5)


def test_a_price_history_is_replayed_from_the_market_start(tmp_path: Path) -> None:
    # Given a training-on-a-dime price history for two regions, with a price in effect before the chosen anchor
    (tmp_path / "history.csv").write_text(
        "timestamp_utc,region,availability_zone,instance_type,gpu_model,gpu_count,product_description,"
        "spot_price_usd_per_hour\n"
        "2020-01-01T00:00:00Z,us-east-1,us-east-1a,p3.2xlarge,V100,1,Linux/UNIX,0.918000\n"
        "2020-01-01T10:00:00Z,us-east-1,us-east-1a,p3.2xlarge,V100,1,Linux/UNIX,1.100000\n"
        "2020-01-01T13:00:00Z,us-east-1,us-east-1a,p3.2xlarge,V100,1,Linux/UNIX,0.950000\n"
        "2020-01-01T11:00:00Z,us-west-2,us-west-2a,p3.2xlarge,V100,1,Linux/UNIX,3.000000\n"
    )

    # When it is replayed for us-east-1 with 2020-01-01T08:00 + 1h mapped to the market start
    market = market_of(
        {
            "price_history": {
                "file": "history.csv",
                "region": "us-east-1",
                "start_at": "2020-01-01T08:00:00Z",
                "offset": "1h",
            }
        },
        tmp_path,
    )

    # Then the price at 0 is the one then in effect, and the later rows step 1h and 4h after the start
    assert [market.price(V100_A, t) for t in (0, 0.99, 1, 3.99, 4)] == [0.918, 0.918, 1.1, 1.1, 0.95]
    # And the other region was filtered out
    assert market.pools() == [V100_A]


def test_a_price_history_given_as_a_prices_csv_is_refused_with_a_pointer(tmp_path: Path) -> None:
    # Given a price-history CSV listed under prices (which would otherwise parse, with its times ignored)
    (tmp_path / "history.csv").write_text(
        "timestamp_utc,region,availability_zone,instance_type,spot_price_usd_per_hour\n"
        "2020-01-01T00:00:00Z,us-east-1,us-east-1a,p3.2xlarge,0.918\n"
    )

    # When the market is built
    message = spec_error({"prices": [{"file": "history.csv"}]}, tmp_path)

    # Then the error names the field and says where the file belongs
    assert message.startswith("prices[0].file: ")
    assert "market.price_history" in message
    with pytest.raises(PriceFileError):
        MarketBuilder(START).add_price_file(tmp_path / "history.csv")


# --- capacity: outages and traces ----------------------------------------------------------------------


def test_an_outage_empties_the_pool_exactly_on_from_to() -> None:
    # Given g6 in us-east-1a with no capacity source, and an outage [2h, 6h) plus an overlapping one [5h, 7h)
    market = market_of(
        {
            "prices": [row(G6_A, 0.35), row(G6_B, 0.35)],
            "outages": [
                {"instance_type": "g6.xlarge", "availability_zone": "us-east-1a", "from": "2h", "to": "6h"},
                {"instance_type": "g6.xlarge", "availability_zone": "us-east-1a", "from": 5, "to": "420m"},
            ],
        }
    )

    # When availability is read around the edges
    # Then the pool is unavailable exactly on [2h, 7h), with unlimited capacity outside it
    before, start, inside, end = math.nextafter(2.0, 0.0), 2.0, 6.5, 7.0
    assert [market.available(G6_A, t) for t in (before, start, inside, math.nextafter(7.0, 0.0), end)] == [
        True,
        False,
        False,
        False,
        True,
    ]
    assert market.capacity(G6_A, 3.0) == 0
    assert market.capacity(G6_A, end) == math.inf
    # And an instance started before the outage is lost when it begins; one started during it cannot start
    assert market.interruption_time(G6_A, 1.0) == 2.0
    assert market.interruption_time(G6_A, 3.0) == 3.0
    assert market.interruption_time(G6_A, 7.0) is None
    # And the pool in the other zone is untouched
    assert market.interruption_time(G6_B, 0.0) is None


def test_a_capacity_trace_gives_availability_per_tick_and_the_first_zero_interrupts(tmp_path: Path) -> None:
    # Given a one-zone trace, ticks of 60 s: [1, 1, 0, 0, 1]
    write_trace(tmp_path / "traces", "us-east-1a_v100_1.json", [1, 1, 0, 0, 1])

    # When it is bound to p3.2xlarge (priced at 0.97)
    market = market_of(
        {"traces": {"dir": "traces", "instance_type": "p3.2xlarge", "spot_price_usd_per_hour": 0.97}}, tmp_path
    )

    # Then the pool is available in minutes [0, 2), not in [2, 4), again from 4 — and after the trace ends
    # (the last value holds)
    expected = {0: True, 1.5: True, 2: False, 3.99: False, 4: True, 4.5: True, 60 * 24: True}
    assert {m: market.available(V100_A, m * MINUTE) for m in expected} == expected
    assert market.capacity(V100_A, 2.5 * MINUTE) == 0
    assert market.capacity(V100_A, 0.0) == 1
    # And an instance started at 0 (or at 1 minute) is interrupted at the first 0, minute 2
    assert market.interruption_time(V100_A, 0.0) == pytest.approx(2 * MINUTE)
    assert market.interruption_time(V100_A, 1 * MINUTE) == pytest.approx(2 * MINUTE)
    # And one asking during the gap cannot start; one started at minute 4 is never interrupted
    assert market.interruption_time(V100_A, 3 * MINUTE) == 3 * MINUTE
    assert market.interruption_time(V100_A, 4 * MINUTE) is None
    assert market.pools() == [V100_A]
    assert market.horizon == pytest.approx(5 * MINUTE)


@pytest.mark.parametrize(
    ("offset", "first_zero_minute", "available_at_0"),
    [("1m", 1.0, True), ("90s", 0.5, True), ("2m", 0.0, False), (0, 2.0, True)],
)
def test_a_trace_offset_shifts_the_trace_onto_the_market_start(
    tmp_path: Path, offset: object, first_zero_minute: float, available_at_0: bool
) -> None:
    # Given the trace [1, 1, 0, 0, 1] at 60 s
    write_trace(tmp_path / "traces", "us-east-1a_v100_1.json", [1, 1, 0, 0, 1])

    # When it is replayed from `offset` into the trace
    market = market_of(
        {"traces": {"dir": "traces", "instance_type": "p3.2xlarge", "offset": offset, "spot_price_usd_per_hour": 1}},
        tmp_path,
    )

    # Then the first zero moves earlier by the offset
    assert market.available(V100_A, 0.0) is available_at_0
    assert market.interruption_time(V100_A, 0.0) == pytest.approx(first_zero_minute * MINUTE)


def test_a_trace_offset_past_the_end_and_ambiguous_zones_are_refused(tmp_path: Path) -> None:
    # Given a directory with two labels for the same zone
    write_trace(tmp_path / "traces", "us-east-1a_v100_1.json", [1, 1, 0, 0, 1])
    write_trace(tmp_path / "traces", "us-east-1a_v100_8.json", [1, 0, 1, 0, 1])

    # When the traces are bound without a label, or with an offset beyond the 5 minutes of data
    ambiguous = spec_error({"traces": {"dir": "traces", "instance_type": "p3.2xlarge"}}, tmp_path)
    too_far = spec_error(
        {"traces": {"dir": "traces", "instance_type": "p3.2xlarge", "label": "v100_1", "offset": "5m"}}, tmp_path
    )

    # Then both errors name the field and the way out
    assert ambiguous.startswith("traces[0]: ")
    assert "v100_1, v100_8" in ambiguous
    assert "label" in ambiguous
    assert too_far.startswith("traces[0]: ")
    assert "outside the trace" in too_far
    # And choosing a label works
    market = market_of(
        {"traces": {"dir": "traces", "instance_type": "p3.2xlarge", "label": "v100_8", "spot_price_usd_per_hour": 1}},
        tmp_path,
    )
    assert market.interruption_time(V100_A, 0.0) == pytest.approx(1 * MINUTE)


# --- max price ---------------------------------------------------------------------------------------------


def test_an_instance_is_interrupted_when_the_price_rises_above_its_max_price() -> None:
    # Given a pool at 0.30, rising to 0.50 at 3h and falling back to 0.30 at 5h
    market = market_of({"prices": [row(G6_A, 0.30), row(G6_A, 0.50, at="3h"), row(G6_A, 0.30, at="5h")]})

    # When instances with different max prices start at 0
    # Then a 0.40 cap loses the pool at 3h; a cap equal to the peak, or no cap, never does
    assert market.interruption_time(G6_A, 0.0, max_price=0.40) == 3.0
    assert market.interruption_time(G6_A, 0.0, max_price=0.50) is None
    assert market.interruption_time(G6_A, 0.0) is None
    # And while the price is above the cap it cannot start; after the peak it runs for good
    assert not market.available(G6_A, 4.0, max_price=0.40)
    assert market.interruption_time(G6_A, 4.0, max_price=0.40) == 4.0
    assert market.interruption_time(G6_A, 5.0, max_price=0.40) is None


def test_the_earlier_of_a_capacity_loss_and_a_price_rise_interrupts(tmp_path: Path) -> None:
    # Given a trace losing capacity at minute 2, and a price rising above 0.5 at minute 1
    write_trace(tmp_path / "traces", "us-east-1a_v100_1.json", [1, 1, 0, 0, 1])
    market = market_of(
        {
            "traces": {"dir": "traces", "instance_type": "p3.2xlarge"},
            "prices": [row(V100_A, 0.4), row(V100_A, 0.9, at="1m")],
        },
        tmp_path,
    )

    # When an instance starts at 0 with a max price of 0.5, and another without a cap
    # Then the price rise comes first for the first, the capacity loss for the other
    assert market.interruption_time(V100_A, 0.0, max_price=0.5) == pytest.approx(MINUTE)
    assert market.interruption_time(V100_A, 0.0) == pytest.approx(2 * MINUTE)


# --- quotes, pools and the event loop -------------------------------------------------------------------


def test_quotes_list_offered_pools_with_their_price_at_t(tmp_path: Path) -> None:
    # Given g6 in two zones (one from 3h only, one in an outage at 1h) and g5 with a timed price
    market = market_of(
        {
            "prices": [row(G6_A, 0.35), row(G6_B, 0.20, at="3h"), row(G5_A, 0.61, at="30m"), row(G5_A, 0.7, at="2h")],
            "outages": [{"instance_type": "g6.xlarge", "availability_zone": "us-east-1a", "from": 0, "to": "2h"}],
        }
    )

    # When quotes are asked at 1h and at 3h
    at_1h = market.quotes(1.0)
    at_3h = market.quotes(3.0)

    # Then each lists the pools offered then (with no capacity too), with their price and when it took effect
    assert [(q.pool, q.usd_per_hour) for q in at_1h] == [(G5_A, 0.61), (G6_A, 0.35)]
    assert [(q.pool, q.usd_per_hour) for q in at_3h] == [(G5_A, 0.7), (G6_A, 0.35), (G6_B, 0.20)]
    assert at_3h[0].timestamp == START + timedelta(hours=2)
    assert at_3h[1].timestamp is None  # a constant price carries no time
    assert all(q.pool.market is Market.SPOT for q in at_3h)
    assert market.zones() == ["us-east-1a", "us-east-1b"]
    assert market.pools() == [G5_A, G6_A, G6_B]


def test_next_change_walks_every_price_and_capacity_change_in_order(tmp_path: Path) -> None:
    # Given price steps at 3h and 5h (and rows at 4h and 5h30m that change nothing), an outage [2h, 6h),
    # and a trace [1, 1, 0, 0, 1] changing at minutes 2 and 4
    write_trace(tmp_path / "traces", "us-east-1b_v100_1.json", [1, 1, 0, 0, 1])
    market = market_of(
        {
            "prices": [
                row(G6_A, 0.3),
                row(G6_A, 0.5, at="3h"),
                row(G6_A, 0.9, at="4h"),
                row(G6_A, 0.5, at="4h"),
                row(G6_A, 0.4, at="5h"),
                row(G6_A, 0.4, at="5h30m"),
            ],
            "outages": [{"instance_type": "g6.xlarge", "availability_zone": "us-east-1a", "from": "2h", "to": "6h"}],
            "traces": {"dir": "traces", "instance_type": "p3.2xlarge", "spot_price_usd_per_hour": 1},
        },
        tmp_path,
    )

    # When an event loop walks next_change from the start
    walked: list[float] = []
    t = market.next_change(0.0)
    while t is not None:
        walked.append(t)
        t = market.next_change(t)

    # Then it visits every change once, in order (rows that leave the price as it was are no change: at 4h the
    # last of two rows restores 0.5, at 5h30m a row repeats 0.4)
    assert walked == pytest.approx([2 * MINUTE, 4 * MINUTE, 2.0, 3.0, 5.0, 6.0])
    # And at each of them some pool's price or capacity really differs from just before
    v100_b = spot_pool("p3.2xlarge", "us-east-1b")
    for change in walked:
        just_before = math.nextafter(change, -math.inf)
        assert any(
            (market.price(p, change), market.capacity(p, change))
            != (market.price(p, just_before), market.capacity(p, just_before))
            for p in (G6_A, v100_b)
        )
    assert market.next_change(0.0, pool=G6_A) == 2.0


def test_an_unknown_or_on_demand_pool_is_not_offered() -> None:
    # Given a market with g6 in us-east-1a only
    market = market_of({"prices": [row(G6_A, 0.35)]})
    on_demand = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a", market=Market.ON_DEMAND)

    # When other pools are asked about
    # Then they have no price and no capacity, and an instance cannot start there
    for pool in (G6_B, on_demand):
        assert market.price(pool, 0.0) is None
        assert market.capacity(pool, 0.0) == 0
        assert not market.available(pool, 0.0)
        assert market.interruption_time(pool, 1.0) == 1.0
    with pytest.raises(KeyError):
        market.timeline(G6_B)


def test_time_helpers_convert_hours_and_datetimes() -> None:
    # Given a market starting at 2026-11-30T00:00Z
    market = market_of({"prices": [row(G6_A, 0.35)]})

    # When times are converted both ways
    # Then hours since the start and datetimes agree
    assert market.to_datetime(1.5) == datetime(2026, 11, 30, 1, 30, tzinfo=UTC)
    assert market.to_hours(datetime(2026, 11, 29, 23, 0, tzinfo=UTC)) == -1.0
    assert market.start == START
    # And a naive start is refused
    with pytest.raises(ValueError, match="aware"):
        MarketBuilder(datetime(2026, 11, 30))


# --- durations and errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "hours"),
    [("2h", 2.0), ("90m", 1.5), ("1h30m", 1.5), (1.5, 1.5), (2, 2.0), ("30s", 1 / 120), ("1.5d", 36.0), ("0.5", 0.5)],
)
def test_durations_parse_to_hours(text: object, hours: float) -> None:
    # Given a duration as a scenario writes it
    # When it is parsed
    # Then it is that many hours
    assert parse_duration(text) == pytest.approx(hours)


@pytest.mark.parametrize("text", ["soon", "", "-2h", "2x", "h", True, None, float("inf"), "1m2h"])
def test_a_bad_duration_is_refused_naming_the_field(text: object) -> None:
    # Given something that is not a duration
    # When it is parsed for a named field
    with pytest.raises(ValueError, match="not a duration") as caught:
        parse_duration(text, "outages[0].to")
    # Then the message names the field and the value
    assert str(caught.value).startswith(f"outages[0].to: {text!r}")


def test_a_scenario_with_soon_as_an_outage_start_is_refused_naming_the_field() -> None:
    # Given an outage from "soon"
    spec = {"outages": [{"instance_type": "g6.xlarge", "availability_zone": "us-east-1a", "from": "soon", "to": "2h"}]}

    # When the market is built
    message = spec_error(spec)

    # Then the error names the field
    assert message.startswith("outages[0].from: 'soon' is not a duration")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"prices": [{"instance_type": "g6.xlarge", "availability_zone": "us-east-1a"}]}, "prices[0]: "),
        ({"prices": [row(G6_A, -1.0)]}, "prices[0].spot_price_usd_per_hour: "),
        ({"prices": [row(G6_A, 0.3, at="later")]}, "prices[0].at: "),
        ({"traces": {"dir": "missing", "instance_type": "p3.2xlarge"}}, "traces[0]: "),
        ({"traces": {"dir": "missing"}}, "traces[0].instance_type: "),
        ({"price_history": {"file": "h.csv", "start_at": 3}}, "price_history[0].start_at: "),
        (
            {"outages": [{"instance_type": "g6.xlarge", "availability_zone": "us-east-1a", "from": "3h", "to": 2}]},
            "outages[0]: from (3 h) must be before to (2 h)",
        ),
        ({"capacity": []}, "capacity: "),
    ],
)
def test_bad_market_sections_are_refused_naming_the_field(spec: dict[str, Any], expected: str) -> None:
    # Given a market section with one mistake
    # When it is built
    # Then the error starts with the field at fault
    assert spec_error(spec).startswith(expected)


# --- the interruption property -----------------------------------------------------------------------------

GRID = st.integers(0, 40).map(lambda half_hours: half_hours / 2)  # 0, 0.5, ..., 20 h: ties and shared edges
PRICES = st.sampled_from([0.1, 0.2, 0.3, 0.4, 0.5])
CAPACITY = st.sampled_from([0, 1, 1, 2, 2])  # mostly up, so that instances run for a while


@st.composite
def pool_histories(draw: st.DrawFn) -> dict[str, Any]:
    """A pool's sources: price rows (mostly with a constant price first), capacity steps or none, outages."""
    constant = draw(st.one_of(PRICES.map(lambda usd: [(None, usd)]), st.just([])))
    return {
        "prices": constant + draw(st.lists(st.tuples(st.one_of(st.none(), GRID), PRICES), max_size=12)),
        "capacity": draw(st.one_of(st.none(), st.tuples(CAPACITY, st.lists(st.tuples(GRID, CAPACITY), max_size=12)))),
        "outages": draw(st.lists(st.tuples(GRID, GRID.map(lambda length: length / 4 + 0.5)), max_size=2)),
    }


def reference(history: dict[str, Any], t: float, max_price: float | None) -> tuple[float | None, float, bool]:
    """(price, capacity, available) at `t`, computed straight from the inputs."""
    price = None
    for at, usd in sorted(history["prices"], key=lambda p: -math.inf if p[0] is None else p[0]):
        if at is None or at <= t:
            price = usd
    capacity: float = math.inf
    if history["capacity"] is not None:
        initial, steps = history["capacity"]
        capacity = initial
        for at, value in sorted(steps, key=lambda s: s[0]):
            if at <= t:
                capacity = value
    if any(start <= t < start + length for start, length in history["outages"]):
        capacity = 0
    ok = price is not None and capacity > 0 and (max_price is None or price <= max_price)
    return price, capacity, ok


@settings(max_examples=500, deadline=None)
@given(
    history=pool_histories(),
    start_t=st.integers(-4, 88).map(lambda quarters: quarters / 4),  # on and between the change points
    max_price=st.one_of(st.none(), PRICES),
)
def test_interruption_time_is_the_first_time_from_start_when_the_pool_is_lost(
    history: dict[str, Any], start_t: float, max_price: float | None
) -> None:
    """Property. Let r = interruption_time(pool, s, m), and say the pool is *up* at t when it is offered,
    has capacity > 0 and its price is <= m (any price if m is None). Then:
    (1) r is None or r >= s;
    (2) r == s exactly when the pool is not up at s;
    (3) if r is not None, the pool is not up at r: capacity 0, or price above m;
    (4) the pool is up at every time in [s, r) (in [s, inf) if r is None) — checked at s and at every
        time a source of the pool sets a value, which suffices because both timelines are step functions;
    and price, capacity and availability agree with a direct reading of the inputs at each of those times.
    """
    # Given a pool with random price steps, an optional capacity timeline and outages
    builder = MarketBuilder(START)
    for at, usd in history["prices"]:
        builder.add_price("g6.xlarge", "us-east-1a", usd, at)
    if history["capacity"] is not None:
        initial, steps = history["capacity"]
        builder.add_capacity("g6.xlarge", "us-east-1a", steps, initial=initial)
    for start, length in history["outages"]:
        builder.add_outage("g6.xlarge", "us-east-1a", start, start + length)
    if not (history["prices"] or history["capacity"] or history["outages"]):
        builder.add_capacity("g6.xlarge", "us-east-1a", [])
    market = builder.build()

    # When an instance starts at s with max price m
    interrupted_at = market.interruption_time(G6_A, start_t, max_price)

    # Then the property holds
    set_times = {at for at, _ in history["prices"] if at is not None}
    set_times |= {at for at, _ in history["capacity"][1]} if history["capacity"] else set()
    set_times |= {edge for start, length in history["outages"] for edge in (start, start + length)}
    checked = [start_t, *sorted(t for t in set_times if t > start_t)]
    for t in checked:
        price, capacity, up = reference(history, t, max_price)
        assert (market.price(G6_A, t), market.capacity(G6_A, t)) == (price, capacity)
        assert market.available(G6_A, t, max_price) is up
    up_at_start = reference(history, start_t, max_price)[2]
    if interrupted_at is None:
        assert all(reference(history, t, max_price)[2] for t in checked)
    else:
        assert interrupted_at >= start_t
        assert (interrupted_at == start_t) is (not up_at_start)
        assert not reference(history, interrupted_at, max_price)[2]
        assert all(reference(history, t, max_price)[2] for t in checked if t < interrupted_at)
        assert interrupted_at in checked


@settings(max_examples=200, deadline=None)
@given(
    prices=st.lists(PRICES, min_size=1, max_size=80),
    capacities=st.lists(CAPACITY, min_size=1, max_size=80),
    start_index=st.integers(0, 80),
    max_price=PRICES,
)
def test_long_timelines_find_the_same_first_loss_as_a_linear_scan(
    prices: list[float], capacities: list[int], start_index: int, max_price: float
) -> None:
    """On timelines long enough to need every level of the range-maximum table: the first price above
    `max_price`, and the first zero capacity, at or after the start, are those a linear scan finds."""
    # Given a price and a capacity change every hour
    price = PriceTimeline([(float(hour), usd) for hour, usd in enumerate(prices)])
    capacity = CapacityTimeline([(float(hour), value) for hour, value in enumerate(capacities)], initial=1)
    start_t = start_index + 0.5

    # When the first loss after start_t is asked
    # Then it is the first hour (or start_t itself) a scan finds, inf if none
    def scan(values: list[Any], lost: Any) -> float:
        at_start = values[min(start_index, len(values) - 1)]
        if lost(at_start):
            return start_t
        return next((float(h) for h, v in enumerate(values) if h > start_t and lost(v)), math.inf)

    assert price.first_above(start_t, max_price) == scan(prices, lambda usd: usd > max_price)
    assert capacity.first_zero(start_t) == scan(capacities, lambda value: value <= 0)


@pytest.mark.parametrize("length", [1, 2, 3, 63, 64, 65, 127, 128, 129, 1000])
def test_the_first_price_above_a_cap_is_found_however_far_away(length: int) -> None:
    # Given `length` hourly prices at the cap, then one above it
    price = PriceTimeline([(float(hour), 0.3 + 0.001 * (hour % 2)) for hour in range(length)] + [(float(length), 0.5)])

    # When the first price above 0.31 is asked from the start
    # Then it is the spike, wherever it is
    assert price.first_above(0.0, 0.31) == float(length)
    assert price.first_above(0.0, 0.5) == math.inf


# --- the real traces ----------------------------------------------------------------------------------------


def test_a_real_trace_is_available_as_often_as_its_index_says() -> None:
    # Given the 9 Can't Be Late availability traces of 2023-02-15 (p3.2xlarge, 195 s ticks), if present
    trace_dir = SHARED_TRACES / REAL_TRACE_DIR
    if not trace_dir.is_dir():
        pytest.skip(f"{trace_dir} is not here")
    with (SHARED_TRACES / "trace_index.csv").open() as index_file:
        index = {r["file"]: r for r in csv.DictReader(index_file) if r["file"].startswith(REAL_TRACE_DIR)}
    assert len(index) == 9

    # When the market replays them and availability is read in the middle of every tick
    market = market_of({"traces": {"dir": str(trace_dir), "instance_type": "p3.2xlarge", "spot_price_usd_per_hour": 1}})
    traces = {trace.zone: trace for trace in load_trace_dir(trace_dir)}

    # Then each zone's fraction of available ticks matches the index's mean value (1-node traces: 0 or 1)
    for name, entry in index.items():
        zone = entry["zone"]
        gap_hours = float(entry["gap_seconds"]) / 3600
        n_ticks = int(entry["n_ticks"])
        pool = spot_pool("p3.2xlarge", zone)
        up = sum(market.available(pool, (tick + 0.5) * gap_hours) for tick in range(n_ticks))
        assert up / n_ticks == pytest.approx(float(entry["mean_value"]), abs=1e-3), name
        assert up / n_ticks == pytest.approx(traces[zone].available_fraction())
