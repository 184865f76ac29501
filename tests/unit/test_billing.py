"""An instance's bill (spotrelay.models.billing): the price in effect integrated over the time it is billed,
settled once at its instance's earliest reported end, whatever order and however often the reports come."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from spotrelay.bench import sim
from spotrelay.models import Attempt, AttemptOutcome, Market, Pool, PriceQuote
from spotrelay.models.billing import (
    attempt_cost,
    billing_end,
    cost_so_far,
    price_windows,
    series_key,
    settle,
    step_integral,
)

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
POOL = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a")


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def quote(usd: float, since: datetime, pool: Pool = POOL) -> PriceQuote:
    return PriceQuote(pool=pool, usd_per_hour=usd, timestamp=since)


def spot_attempt(**fields: object) -> Attempt:
    values: dict[str, object] = {"job_id": "train-1", "attempt": 1, "pool": POOL, "hourly_price": 0.35}
    values["started_at"] = T0
    values.update(fields)
    return Attempt.model_validate(values)


# A price series that doubles an hour into the run: $0.35/h, then $0.70/h
DOUBLING = [quote(0.35, at(-3)), quote(0.70, at(1))]


def test_the_bench_integrates_with_the_shared_function() -> None:
    # Given the benchmark's replay and the control plane's billing
    # Then they count money with one integration, not two
    assert vars(sim)["step_integral"] is step_integral


def test_a_step_integral_holds_each_price_from_its_time_until_the_next() -> None:
    # Given a series: nothing offered before 0, $1/h on [0, 2), $3/h from 2 on
    times, prices = (-math.inf, 0.0, 2.0), (None, 1.0, 3.0)
    # Then the integral over [-1, 3] counts nothing before 0, 2 h at $1 and 1 h at $3
    assert step_integral(times, prices, -1.0, 3.0) == pytest.approx(5.0)
    assert step_integral(times, prices, 0.5, 1.5) == pytest.approx(1.0)
    assert step_integral(times, prices, 3.0, 3.0) == 0.0


def test_a_spot_price_doubling_mid_run_is_billed_at_each_price_for_its_time() -> None:
    # Given a spot attempt launched at $0.35/h whose pool's price doubles an hour into the run
    attempt = spot_attempt()
    # When it is billed for three hours
    cost = attempt_cost(attempt, DOUBLING, at(3))
    # Then the first hour is at $0.35, the next two at $0.70: not three hours at the launch price
    assert cost == pytest.approx(0.35 * 1 + 0.70 * 2)


def test_before_any_known_price_the_launch_price_holds_and_other_pools_prices_are_not_used() -> None:
    # Given a history that starts an hour into the run (EC2 keeps 90 days), and another pool's prices
    attempt = spot_attempt()
    other = Pool(instance_type="g6.xlarge", availability_zone="us-east-1b")
    history = [quote(0.70, at(1)), quote(9.0, at(0), other)]
    # Then the launch price holds until the first known price
    assert attempt_cost(attempt, history, at(2)) == pytest.approx(0.35 + 0.70)


def test_an_on_demand_attempt_is_billed_at_its_fixed_price() -> None:
    attempt = spot_attempt(pool=POOL.model_copy(update={"market": Market.ON_DEMAND}), hourly_price=0.80)
    assert attempt_cost(attempt, DOUBLING, at(2)) == pytest.approx(1.60)


def test_settling_keeps_the_earliest_reported_end_whatever_the_order() -> None:
    # Given an attempt whose instance is reported gone three times: terminated at 2 h, shutting-down at
    # 1.5 h (handled later), and terminated at 2 h again (a duplicate)
    reports = [at(2), at(1.5), at(2)]
    for order in (reports, list(reversed(reports)), sorted(reports)):
        attempt = spot_attempt()
        for gone_at in order:
            attempt = settle(attempt, DOUBLING, gone_at) or attempt
        # Then, in any order, the bill ends at the earliest report, and is counted once
        assert attempt.billed_until == at(1.5)
        assert attempt.cost_usd == pytest.approx(0.35 + 0.70 * 0.5)
    # And a report no earlier than the recorded end changes nothing (no price need be asked for)
    assert billing_end(attempt, at(2)) is None
    assert billing_end(attempt, at(1.5)) is None
    assert settle(attempt, DOUBLING, at(1.5)) is None


def test_a_bill_never_ends_before_the_launch() -> None:
    attempt = settle(spot_attempt(), DOUBLING, at(-1))
    assert attempt is not None
    assert (attempt.billed_until, attempt.cost_usd) == (T0, 0.0)


def test_a_cost_is_the_settled_bill_and_until_then_the_billed_hours_at_the_launch_price() -> None:
    # Given an attempt closed at 2 h, its instance not yet reported gone
    closed = spot_attempt(ended_at=at(2), outcome=AttemptOutcome.SUCCEEDED)
    # Then its cost so far is its hours to the close at the launch price, whenever it is read
    assert closed.cost(at(5)) == pytest.approx(0.70)
    assert spot_attempt().cost(at(1)) == pytest.approx(0.35)  # a live one: up to now
    # And once its instance's end is reported, the settled bill, past the close if the instance ran on
    settled = settle(closed, DOUBLING, at(2) + timedelta(minutes=2))
    assert settled is not None
    assert settled.cost(at(5)) == pytest.approx(0.35 + 0.70 * (1 + 2 / 60))
    assert settled.billed_hours(at(5)) == pytest.approx(2 + 2 / 60)


def test_the_spend_so_far_integrates_the_prices_of_the_attempts_not_yet_settled() -> None:
    # Given a settled attempt 1 ($0.50) and a live spot attempt 2 launched at $0.35/h whose price doubled
    first = spot_attempt(cost_usd=0.5, billed_until=at(0.5), ended_at=at(0.5), outcome=AttemptOutcome.INTERRUPTED)
    second = spot_attempt(attempt=2)
    # When the spend is asked for at 3 h with attempt 2's prices, then without them
    with_prices = sum(cost_so_far(a, {series_key(second.pool): DOUBLING}, at(3)) for a in (first, second))
    without = sum(cost_so_far(a, {}, at(3)) for a in (first, second))
    # Then attempt 2 counts at the prices in effect, or at its launch price where none were asked for
    assert with_prices == pytest.approx(0.5 + 0.35 + 0.70 * 2)
    assert without == pytest.approx(0.5 + 0.35 * 3)


def test_an_attempt_record_without_a_bill_reads_and_one_with_it_round_trips() -> None:
    # Given a record written before bills were settled, and one written with its bill
    old = spot_attempt().model_dump(mode="json", exclude={"billed_until", "cost_usd"})
    new = spot_attempt(billed_until=at(1), cost_usd=0.35)
    # Then both read back
    assert Attempt.model_validate(old).cost_usd is None
    assert Attempt.model_validate_json(new.model_dump_json()) == new


def test_one_history_over_the_pools_price_window_bills_each_attempt_as_its_own_window_would() -> None:
    # Given three unsettled spot attempts in one pool (launched at 0, 1 and 2.5 h; one closed at 1.5 h), a settled
    # one, an on-demand one, and one in another pool
    elsewhere = Pool(instance_type="g6.xlarge", availability_zone="us-east-1b")
    attempts = [
        spot_attempt(),
        spot_attempt(attempt=2, started_at=at(1), ended_at=at(1.5), outcome=AttemptOutcome.INTERRUPTED),
        spot_attempt(attempt=3, started_at=at(2.5)),
        spot_attempt(attempt=4, started_at=at(-2), cost_usd=0.1, billed_until=at(-1.5)),
        spot_attempt(attempt=5, started_at=at(-3), pool=POOL.model_copy(update={"market": Market.ON_DEMAND})),
        spot_attempt(attempt=6, started_at=at(0.5), pool=elsewhere),
    ]
    # When the windows of their prices are asked for at 3 h
    windows = price_windows(attempts, at(3))
    # Then each pool has one, from the earliest unsettled spot launch there to now; settled and on-demand bills
    # need none
    assert {key: (w.start, w.end) for key, w in windows.items()} == {
        ("g6.xlarge", "us-east-1a"): (T0, at(3)),
        ("g6.xlarge", "us-east-1b"): (at(0.5), at(3)),
    }
    # And the pool's history over it bills each attempt its own time: 1 h at $0.35 and 2 h at $0.70; 0.5 h at
    # $0.70 to its close; 0.5 h at $0.70
    pooled = {("g6.xlarge", "us-east-1a"): DOUBLING}
    assert [cost_so_far(a, pooled, at(3)) for a in attempts[:3]] == pytest.approx([0.35 + 0.70 * 2, 0.35, 0.35])
    assert cost_so_far(attempts[3], pooled, at(3)) == 0.1  # settled
    # And without its pool's history an attempt counts at its launch price
    assert cost_so_far(attempts[5], pooled, at(3)) == pytest.approx(0.35 * 2.5)
