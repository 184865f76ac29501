"""The replay's billing invariant (spotrelay.local.invariants.check_bills): a settled bill is the scenario's
spot prices integrated from the attempt's launch to its instance's end, and no instance still running has
had its bill ended."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spotrelay.local.invariants import InstanceView, Snapshot, check_invariants
from spotrelay.market import MarketBuilder, SpotMarket
from spotrelay.models import Attempt, AttemptOutcome, Job, JobState, Pool, parse_job_spec

T0 = datetime(2026, 11, 30, tzinfo=UTC)
POOL = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a")


def doubling_market() -> SpotMarket:
    """The pool at $0.35/h, $0.70/h from an hour on."""
    builder = MarketBuilder(T0).add_price("g6.xlarge", "us-east-1a", 0.35)
    return builder.add_price("g6.xlarge", "us-east-1a", 0.70, 1.0).build()


def job() -> Job:
    spec = parse_job_spec({"name": "train-1", "run": {"command": "python train.py"}, "resources": {"gpus": 1}})
    return Job(job_id="train-1", spec=spec, state=JobState.SUCCEEDED, submitted_at=T0, updated_at=T0)


def billed(cost_usd: float, until: datetime = T0 + timedelta(hours=3)) -> Attempt:
    return Attempt(
        job_id="train-1",
        attempt=1,
        pool=POOL,
        hourly_price=0.35,
        instance_id="i-1",
        started_at=T0,
        ended_at=until,
        outcome=AttemptOutcome.SUCCEEDED,
        billed_until=until,
        cost_usd=cost_usd,
    )


def kinds(attempt: Attempt, *instances: InstanceView, now: datetime = T0 + timedelta(hours=4)) -> list[str]:
    s = Snapshot(
        now=now, jobs={"train-1": job()}, attempts={"train-1": [attempt]}, instances=instances, market=doubling_market()
    )
    return [v.kind for v in check_invariants(s)]


def test_a_bill_at_the_price_in_effect_holds() -> None:
    # Given an attempt billed three hours: one at $0.35, two at $0.70
    # Then no invariant is broken
    assert kinds(billed(0.35 + 2 * 0.70)) == []


def test_a_bill_at_the_launch_price_after_the_price_rose_is_reported() -> None:
    # Given the same attempt billed three hours at its launch price
    # Then it is billed off the price in effect
    assert kinds(billed(3 * 0.35)) == ["billed-off-price"]


def test_an_instance_still_running_whose_bill_ended_is_reported() -> None:
    # Given an attempt whose bill ended at 3 h, and its instance still running at 4 h
    running = InstanceView("i-1", "running", T0, "train-1", 1)
    # Then its seconds since are billed to no one
    assert "bill-ended-early" in kinds(billed(0.35 + 2 * 0.70), running)


@pytest.mark.parametrize("cost", [0.35 + 2 * 0.70, 99.0])
def test_without_the_scenario_prices_bills_are_not_checked_against_them(cost: float) -> None:
    s = Snapshot(now=T0 + timedelta(hours=4), jobs={"train-1": job()}, attempts={"train-1": [billed(cost)]})
    assert check_invariants(s) == []
