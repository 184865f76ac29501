"""`spotrelay cost` and `status`'s figures (spotrelay.cli.costs): unsettled attempts at the spot prices in effect,
each pool's history read once for every job shown; a live instance's figure an estimate until it is gone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from spotrelay.aws.deployed_stack import JobStatus
from spotrelay.cli.costs import PriceHistories, job_cost, read_price_histories, spot_price_now
from spotrelay.cli.job_commands import describe_status
from spotrelay.models import Attempt, AttemptOutcome, Job, Market, Pool, PriceQuote, parse_job_spec

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
POOL = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a")
OTHER = Pool(instance_type="g6.xlarge", availability_zone="us-east-1b")
SPEC = parse_job_spec({"name": "train", "run": {"command": "python train.py"}, "resources": {"gpus": 1}})


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def attempt(job_id: str, number: int, **fields: Any) -> Attempt:
    values: dict[str, Any] = {"job_id": job_id, "attempt": number, "pool": POOL, "hourly_price": 0.35}
    values |= {"started_at": T0, "instance_id": f"i-{job_id}-{number}"} | fields
    return Attempt.model_validate(values)


def status(job_id: str, *attempts: Attempt) -> JobStatus:
    job = Job(job_id=job_id, spec=SPEC, submitted_at=T0, updated_at=T0, attempts=len(attempts))
    return JobStatus(job=job, attempts=list(attempts))


class Ec2History:
    """EC2's price history of POOL: $0.35/h, $0.70/h from 2 h on (and OTHER's, $0.40/h); every read recorded."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.reads: list[tuple[Pool, datetime, datetime]] = []
        self.fail = fail

    def __call__(self, pool: Pool, start: datetime, end: datetime) -> list[PriceQuote]:
        self.reads.append((pool, start, end))
        if self.fail is not None:
            raise self.fail
        series = [(at(-5), 0.35), (at(2), 0.70)] if pool.availability_zone == "us-east-1a" else [(at(-5), 0.40)]
        in_effect = [(since, usd) for since, usd in series if since <= start][-1:]
        window = [*in_effect, *((since, usd) for since, usd in series if start < since <= end)]
        spot = pool.model_copy(update={"market": Market.SPOT})
        return [PriceQuote(pool=spot, usd_per_hour=usd, timestamp=since) for since, usd in window]


def test_each_pools_history_is_read_once_for_every_job_and_each_attempt_counts_its_own_prices() -> None:
    # Given two jobs with unsettled spot attempts in one pool (launched at 0, 1 and 3 h; the price doubles at 2 h),
    # one of them also with a settled attempt and an on-demand one, and a third job whose bills are all settled
    training = status(
        "train-a",
        attempt("train-a", 1, cost_usd=0.10, billed_until=at(0.2), ended_at=at(0.2), outcome=AttemptOutcome.LOST),
        attempt("train-a", 2, started_at=at(1), ended_at=at(2.5), outcome=AttemptOutcome.INTERRUPTED),
        attempt("train-a", 3, started_at=at(3)),
    )
    other = status(
        "train-b",
        attempt("train-b", 1),
        attempt("train-b", 2, pool=POOL.model_copy(update={"market": Market.ON_DEMAND}), hourly_price=0.80),
    )
    ended = status("train-c", attempt("train-c", 1, cost_usd=1.0, billed_until=at(1), ended_at=at(1)))
    statuses = [training, other, ended]
    read = Ec2History()
    # When their costs are read at 4 h
    now = at(4)
    prices = read_price_histories([a for s in statuses for a in s.attempts], now, read)
    costs = {s.job.job_id: job_cost(s, prices, now) for s in statuses}
    # Then the pool's history was read once, over the window every attempt there needs
    assert read.reads == [(POOL, T0, now)]
    # And each attempt counts the prices in effect over its own billing: train-a's second 1 h at $0.35 and 0.5 h
    # at $0.70 (to its close), its third 1 h at $0.70; train-b's spot one 2 h at each, its on-demand one 4 h at $0.80
    assert costs["train-a"].total_usd == pytest.approx(0.10 + 0.35 + 0.35 + 0.70)
    assert costs["train-a"].live_usd == pytest.approx(0.70)
    assert costs["train-b"].total_usd == pytest.approx(2 * 0.35 + 2 * 0.70 + 4 * 0.80)
    assert costs["train-c"].total_usd == pytest.approx(1.0)
    # And a live instance's figure is an estimate until it is gone; settled bills are not
    assert [costs[j].is_estimate for j in ("train-a", "train-b", "train-c")] == [True, True, False]
    assert spot_price_now(training.attempts[2], prices, now) == 0.70


def test_a_history_that_cannot_be_read_leaves_the_attempts_at_their_launch_prices_and_says_why() -> None:
    # Given live attempts in two pools, and no permission to read the spot price history
    denied = ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "not allowed"}}, "x")
    read = Ec2History(fail=denied)
    job = status("train-a", attempt("train-a", 1), attempt("train-a", 2, pool=OTHER, hourly_price=0.40))
    # When the costs are read at 4 h
    prices = read_price_histories(job.attempts, at(4), read)
    # Then reading stopped at the first refusal, which is named, and each attempt counts at its launch price
    assert len(read.reads) == 1
    assert prices.error == "UnauthorizedOperation: not allowed"
    assert job_cost(job, prices, at(4)).total_usd == pytest.approx(4 * 0.35 + 4 * 0.40)
    # And status says what the estimate counts
    lines = describe_status(job, at(4), prices)
    assert (
        "  the live instance's cost is an estimate, its hours so far at its launch price (the spot price history "
        "could not be read): final once the instance is gone"
    ) in lines


def test_status_without_prices_counts_launch_prices_and_a_settled_job_says_no_estimate() -> None:
    # Given a job whose only attempt's bill is settled
    settled = status("train-a", attempt("train-a", 1, cost_usd=0.5, billed_until=at(1), ended_at=at(1)))
    # When its status is described (no prices asked for: none are needed)
    lines = describe_status(settled, at(4), PriceHistories())
    # Then its cost is the bill, with no word of an estimate
    assert any(line.startswith("  cost $0.50") for line in lines)
    assert not any("estimate" in line for line in lines)


def test_status_during_an_interruption_notice_says_when_the_instance_goes_and_what_happens_then() -> None:
    # Given a live spot attempt whose interruption warning arrived at 1 h
    warned = attempt("train-a", 1, interrupted_at=at(1))
    # When status is read during the notice
    lines = describe_status(status("train-a", warned), at(1) + timedelta(seconds=30), PriceHistories())
    # Then it says the notice, when EC2 takes the instance back, and what the job is waiting for
    assert (
        "  interruption notice at 11:00:00 UTC: EC2 takes the instance back by 11:02:00 UTC; waiting for the final "
        "checkpoint, then the job moves to another pool"
    ) in lines
    # And an attempt without a warning says nothing of the kind
    assert not any(
        "interruption notice" in line for line in describe_status(status("train-b", attempt("train-b", 1)), at(1))
    )
