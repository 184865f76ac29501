"""Recovery strategies: what happens after an attempt ends without finishing the job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from spotrelay.models import (
    Attempt,
    AttemptOutcome,
    Job,
    JobSpec,
    Market,
    PlannedPool,
    Pool,
    PriceQuote,
    parse_job_spec,
)
from spotrelay.policy import (
    STRATEGIES,
    AttemptEnded,
    BlockedPool,
    EagerNextPool,
    EndKind,
    Fail,
    RecoveryStrategy,
    Relaunch,
    SamePoolFirst,
    active_blocks,
    decide_recovery,
    place,
    strategy_for,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LOST_AT = T0 + timedelta(hours=3)
POOL = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a", market=Market.SPOT)
OTHER_POOL = Pool(instance_type="g6.xlarge", availability_zone="us-east-1b", market=Market.SPOT)
BOTH_STRATEGIES = [pytest.param(EagerNextPool(), id="eager"), pytest.param(SamePoolFirst(), id="same-pool")]


def job_spec(**fields: Any) -> JobSpec:
    data: dict[str, Any] = {"name": "train", "run": {"command": "python train.py"}, "resources": {"gpus": 1}}
    data.update(fields)
    return parse_job_spec(data)


def make_job(
    spec: JobSpec | None = None, *, interruptions: int = 0, restarts: int = 0, cost_usd: float = 0.0, attempts: int = 1
) -> Job:
    return Job(
        job_id="job-1",
        spec=spec if spec is not None else job_spec(),
        submitted_at=T0,
        updated_at=T0,
        attempts=attempts,
        interruptions=interruptions,
        restarts=restarts,
        cost_usd=cost_usd,
    )


def ended(kind: EndKind, pool: Pool = POOL, attempt: int = 1, exit_code: int | None = None) -> AttemptEnded:
    return AttemptEnded(kind=kind, pool=pool, at=LOST_AT, attempt=attempt, exit_code=exit_code)


def attempt(number: int, pool: Pool, outcome: AttemptOutcome | None) -> Attempt:
    started = T0 + timedelta(hours=number - 1)
    return Attempt(
        job_id="job-1",
        attempt=number,
        pool=pool,
        hourly_price=0.3,
        started_at=started,
        ended_at=None if outcome is None else started + timedelta(minutes=50),
        outcome=outcome,
    )


@pytest.mark.parametrize(
    ("kind", "is_interruption", "is_launch_failure", "outcome"),
    [
        (EndKind.SPOT_INTERRUPTED, True, False, AttemptOutcome.INTERRUPTED),
        (EndKind.INSTANCE_LOST, True, False, AttemptOutcome.LOST),
        (EndKind.HEARTBEAT_TIMEOUT, True, False, AttemptOutcome.LOST),
        (EndKind.JOB_FAILED, False, False, AttemptOutcome.FAILED),
        (EndKind.INSUFFICIENT_CAPACITY, False, True, AttemptOutcome.LAUNCH_FAILED),
        (EndKind.PRICE_ABOVE_CAP, False, True, AttemptOutcome.LAUNCH_FAILED),
    ],
)
def test_each_end_kind_is_classified_and_recorded_as_its_outcome(
    kind: EndKind, is_interruption: bool, is_launch_failure: bool, outcome: AttemptOutcome
) -> None:
    # Given an error name the state machine reports
    # When it is classified
    # Then it counts (or not) as an interruption or a launch failure, and maps to the attempt's outcome
    assert kind.is_interruption is is_interruption
    assert kind.is_launch_failure is is_launch_failure
    assert kind.outcome is outcome


# --- eager-next-pool ---------------------------------------------------------------------------------


@pytest.mark.parametrize("block_minutes", [60, 15])
def test_eager_next_pool_blocks_the_lost_pool_for_block_minutes_and_relaunches(block_minutes: int) -> None:
    # Given a job whose spot instance was interrupted
    job = make_job(job_spec(recovery={"strategy": "eager-next-pool", "block_minutes": block_minutes}))
    # When recovery decides
    action = EagerNextPool().decide(job, [attempt(1, POOL, None)], ended(EndKind.SPOT_INTERRUPTED))
    # Then it relaunches now with that pool blocked until block_minutes after the loss, counting an interruption
    assert isinstance(action, Relaunch)
    assert [(b.pool, b.until) for b in action.block] == [(POOL, LOST_AT + timedelta(minutes=block_minutes))]
    assert action.prefer is None
    assert action.counts_interruption
    assert not action.counts_restart


def test_eager_next_pool_blocks_a_pool_with_no_capacity_without_counting_an_interruption() -> None:
    # Given a launch that failed with InsufficientInstanceCapacity
    job = make_job()
    # When recovery decides
    action = EagerNextPool().decide(job, [], ended(EndKind.INSUFFICIENT_CAPACITY))
    # Then the pool is blocked, and no interruption is counted (the job never ran there)
    assert isinstance(action, Relaunch)
    assert [b.pool for b in action.block] == [POOL]
    assert not action.counts_interruption


# --- limits common to every strategy -----------------------------------------------------------------


@pytest.mark.parametrize("strategy", BOTH_STRATEGIES)
@pytest.mark.parametrize("restarts", [0, 1])
def test_a_failing_job_restarts_without_blocking_while_restarts_remain(
    strategy: RecoveryStrategy, restarts: int
) -> None:
    # Given a job whose code exited non-zero, with restarts left (max_restarts = 2)
    job = make_job(job_spec(limits={"max_restarts": 2}), restarts=restarts)
    # When recovery decides
    action = strategy.decide(job, [], ended(EndKind.JOB_FAILED, exit_code=3))
    # Then it restarts, counting a restart, blaming no pool
    assert isinstance(action, Relaunch)
    assert action.counts_restart
    assert action.block == ()
    assert action.prefer is None
    assert not action.counts_interruption


@pytest.mark.parametrize("strategy", BOTH_STRATEGIES)
def test_a_failing_job_fails_with_job_failed_once_max_restarts_are_used(strategy: RecoveryStrategy) -> None:
    # Given a job whose code has failed and been restarted max_restarts (2) times already
    job = make_job(job_spec(limits={"max_restarts": 2}), restarts=2)
    # When its code fails again
    action = strategy.decide(job, [], ended(EndKind.JOB_FAILED, attempt=3, exit_code=3))
    # Then the job fails with JobFailed, naming the exit code
    assert isinstance(action, Fail)
    assert action.error == "JobFailed"
    assert "code 3" in action.reason


@pytest.mark.parametrize("strategy", BOTH_STRATEGIES)
@pytest.mark.parametrize("kind", [EndKind.SPOT_INTERRUPTED, EndKind.INSTANCE_LOST, EndKind.HEARTBEAT_TIMEOUT])
def test_one_interruption_beyond_max_interruptions_fails_the_job(strategy: RecoveryStrategy, kind: EndKind) -> None:
    # Given a job that has had max_interruptions (3) interruptions
    job = make_job(job_spec(limits={"max_interruptions": 3}), interruptions=3)
    # When it loses its instance once more
    action = strategy.decide(job, [], ended(kind, attempt=4))
    # Then it fails with TooManyInterruptions
    assert isinstance(action, Fail)
    assert action.error == "TooManyInterruptions"


@pytest.mark.parametrize("strategy", BOTH_STRATEGIES)
def test_the_last_allowed_interruption_still_relaunches(strategy: RecoveryStrategy) -> None:
    # Given a job with one interruption left (2 of max 3)
    job = make_job(job_spec(limits={"max_interruptions": 3}), interruptions=2)
    # When it is interrupted
    action = strategy.decide(job, [], ended(EndKind.SPOT_INTERRUPTED, attempt=3))
    # Then it relaunches
    assert isinstance(action, Relaunch)
    assert action.counts_interruption


@pytest.mark.parametrize("strategy", BOTH_STRATEGIES)
def test_a_launch_failure_does_not_count_against_max_interruptions(strategy: RecoveryStrategy) -> None:
    # Given a job that has used all its interruptions
    job = make_job(job_spec(limits={"max_interruptions": 3}), interruptions=3)
    # When a launch fails for lack of capacity
    action = strategy.decide(job, [], ended(EndKind.INSUFFICIENT_CAPACITY, attempt=4))
    # Then it is relaunched elsewhere, not failed
    assert isinstance(action, Relaunch)


@pytest.mark.parametrize("strategy", BOTH_STRATEGIES)
@pytest.mark.parametrize("cost_usd", [50.0, 51.0])
def test_a_job_that_has_spent_its_budget_fails_with_budget_exhausted(
    strategy: RecoveryStrategy, cost_usd: float
) -> None:
    # Given a job that has spent all (or more than) its max_total_cost of $50
    job = make_job(job_spec(limits={"max_total_cost": 50}), cost_usd=cost_usd)
    # When it is interrupted
    action = strategy.decide(job, [], ended(EndKind.SPOT_INTERRUPTED))
    # Then it fails with BudgetExhausted
    assert isinstance(action, Fail)
    assert action.error == "BudgetExhausted"


@pytest.mark.parametrize("strategy", BOTH_STRATEGIES)
def test_a_job_with_budget_left_relaunches(strategy: RecoveryStrategy) -> None:
    # Given a job that has spent $49.99 of $50
    job = make_job(job_spec(limits={"max_total_cost": 50}), cost_usd=49.99)
    # When it is interrupted
    action = strategy.decide(job, [], ended(EndKind.SPOT_INTERRUPTED))
    # Then it relaunches
    assert isinstance(action, Relaunch)


# --- same-pool-first ---------------------------------------------------------------------------------


def test_same_pool_first_goes_back_to_the_pool_after_a_first_loss_there() -> None:
    # Given a job interrupted in the first attempt
    job = make_job(job_spec(recovery="same-pool-first"))
    # When recovery decides
    action = SamePoolFirst().decide(
        job, [attempt(1, POOL, AttemptOutcome.INTERRUPTED)], ended(EndKind.SPOT_INTERRUPTED)
    )
    # Then it prefers the same pool and blocks nothing
    assert isinstance(action, Relaunch)
    assert action.prefer == POOL
    assert action.block == ()
    assert action.counts_interruption


@pytest.mark.parametrize("previous_outcome", [AttemptOutcome.INTERRUPTED, AttemptOutcome.LOST])
def test_same_pool_first_blocks_the_pool_when_lost_there_twice_in_a_row(previous_outcome: AttemptOutcome) -> None:
    # Given attempt 1 was lost in the pool, and attempt 2 (back in the same pool) is lost there too
    job = make_job(job_spec(recovery="same-pool-first"), interruptions=1, attempts=2)
    attempts = [attempt(1, POOL, previous_outcome), attempt(2, POOL, AttemptOutcome.INTERRUPTED)]
    # When recovery decides
    action = SamePoolFirst().decide(job, attempts, ended(EndKind.SPOT_INTERRUPTED, attempt=2))
    # Then the pool is blocked for block_minutes and nothing is preferred
    assert isinstance(action, Relaunch)
    assert action.prefer is None
    assert [(b.pool, b.until) for b in action.block] == [(POOL, LOST_AT + timedelta(minutes=3))]
    assert "twice in a row" in action.reason


@pytest.mark.parametrize(
    ("previous_pool", "previous_outcome"),
    [
        pytest.param(OTHER_POOL, AttemptOutcome.INTERRUPTED, id="lost-elsewhere-before"),
        pytest.param(POOL, AttemptOutcome.FAILED, id="code-failed-here-before"),
    ],
)
def test_same_pool_first_prefers_the_pool_when_the_previous_attempt_was_not_lost_there(
    previous_pool: Pool, previous_outcome: AttemptOutcome
) -> None:
    # Given the previous attempt was lost in another pool, or ended by the user's code in this pool
    job = make_job(job_spec(recovery="same-pool-first"), attempts=2)
    attempts = [attempt(1, previous_pool, previous_outcome), attempt(2, POOL, AttemptOutcome.INTERRUPTED)]
    # When attempt 2 is interrupted
    action = SamePoolFirst().decide(job, attempts, ended(EndKind.SPOT_INTERRUPTED, attempt=2))
    # Then this is the first loss in this pool in a row: the same pool is tried again
    assert isinstance(action, Relaunch)
    assert action.prefer == POOL
    assert action.block == ()


def test_same_pool_first_blocks_a_pool_with_no_capacity_at_once() -> None:
    # Given the relaunch could not get an instance in the pool
    job = make_job(job_spec(recovery="same-pool-first"))
    # When recovery decides
    action = SamePoolFirst().decide(job, [], ended(EndKind.INSUFFICIENT_CAPACITY))
    # Then the pool is blocked right away, without preferring it
    assert isinstance(action, Relaunch)
    assert action.prefer is None
    assert [b.pool for b in action.block] == [POOL]
    assert "no capacity" in action.reason


@pytest.mark.parametrize(
    ("recovery", "strategy_type"),
    [("same-pool-first", SamePoolFirst), ({"strategy": "eager-next-pool"}, EagerNextPool), (None, EagerNextPool)],
)
def test_the_strategy_is_chosen_by_the_jobs_spec(recovery: Any, strategy_type: type) -> None:
    # Given a job spec naming a strategy (or none: the default)
    spec = job_spec() if recovery is None else job_spec(recovery=recovery)
    job = make_job(spec)
    # When the strategy is looked up and asked
    strategy = strategy_for(job)
    action = decide_recovery(job, [], ended(EndKind.SPOT_INTERRUPTED))
    # Then it is the named strategy, and decide_recovery answers as it does
    assert isinstance(strategy, strategy_type)
    assert strategy is STRATEGIES[spec.recovery.strategy]
    assert action == strategy.decide(job, [], ended(EndKind.SPOT_INTERRUPTED))


# --- blocks ------------------------------------------------------------------------------------------


def test_active_blocks_drop_blocks_that_have_lapsed() -> None:
    # Given one block lapsing before now, one lapsing exactly now and one still running
    now = T0 + timedelta(hours=2)
    third = Pool(instance_type="g5.xlarge", availability_zone="us-east-1a")
    blocks = [
        BlockedPool(pool=POOL, until=now - timedelta(minutes=1), reason="SpotInterrupted on attempt 1"),
        BlockedPool(pool=OTHER_POOL, until=now, reason="SpotInterrupted on attempt 2"),
        BlockedPool(pool=third, until=now + timedelta(minutes=1), reason="SpotInterrupted on attempt 3"),
    ]
    # When the active blocks are taken at `now`
    active = active_blocks(blocks, now)
    # Then only the one still running remains (a block lapses at its `until`)
    assert active == frozenset({third})


def test_eager_next_pool_relaunch_moves_the_job_to_the_next_cheapest_pool() -> None:
    # Given a job placed in the cheapest of three pools
    spec = job_spec(work_hours=10)
    quotes = [
        PriceQuote(pool=POOL, usd_per_hour=0.30),
        PriceQuote(pool=OTHER_POOL, usd_per_hour=0.32),
        PriceQuote(pool=Pool(instance_type="g5.xlarge", availability_zone="us-east-1a"), usd_per_hour=0.34),
    ]
    first = place(spec, quotes).best
    assert first is not None
    assert first.pool == POOL
    job = make_job(spec)
    # When it is interrupted there and eager-next-pool decides (the default 3 min block), and placement
    # runs a minute later
    action = decide_recovery(job, [attempt(1, POOL, None)], ended(EndKind.SPOT_INTERRUPTED))
    assert isinstance(action, Relaunch)
    blocked = active_blocks(action.block, LOST_AT + timedelta(minutes=1))
    second = place(spec, quotes, blocked=blocked)
    # Then the next choice is the next-cheapest pool, and the lost pool is rejected as blocked
    assert second.best is not None
    assert second.best.pool == OTHER_POOL
    assert [(r.pool, r.category) for r in second.rejected] == [(POOL, "blocked")]
    # and once the block lapses the cheapest pool is back on top
    later = place(spec, quotes, blocked=active_blocks(action.block, LOST_AT + timedelta(minutes=4)))
    assert later.best is not None
    assert later.best.pool == POOL


# --- the only spot pool ------------------------------------------------------------------------------


def planned(*pools: Pool) -> tuple[PlannedPool, ...]:
    return tuple(PlannedPool(pool=p, hourly_price=0.3, relative_speed=1.0) for p in pools)


ON_DEMAND_POOL = Pool(instance_type="g6.xlarge", availability_zone="us-east-1b", market=Market.ON_DEMAND)


@pytest.mark.parametrize(
    ("plan", "blocked"),
    [
        pytest.param((POOL,), False, id="only-pool"),
        pytest.param((POOL, ON_DEMAND_POOL), False, id="only-spot-pool"),
        pytest.param((POOL, OTHER_POOL), True, id="another-spot-pool"),
        pytest.param((), True, id="no-placement-recorded"),
    ],
)
def test_eager_next_pool_blocks_the_lost_pool_only_when_placement_offered_another_spot_pool(
    plan: tuple[Pool, ...], blocked: bool
) -> None:
    # Given a job whose last placement ranked `plan`
    job = make_job(job_spec()).model_copy(update={"placement": planned(*plan)})
    # When it is interrupted in POOL
    action = EagerNextPool().decide(job, [attempt(1, POOL, None)], ended(EndKind.SPOT_INTERRUPTED))
    # Then the pool is blocked only if there is another spot pool to go to; either way it relaunches now
    assert isinstance(action, Relaunch)
    assert action.counts_interruption
    assert [b.pool for b in action.block] == ([POOL] if blocked else [])
    if not blocked:
        assert "only spot pool" in action.reason


def test_same_pool_first_does_not_block_the_only_spot_pool_when_lost_there_twice() -> None:
    # Given a job with one spot pool, lost there on two attempts in a row
    job = make_job(job_spec(recovery="same-pool-first"), interruptions=1, attempts=2).model_copy(
        update={"placement": planned(POOL)}
    )
    attempts = [attempt(1, POOL, AttemptOutcome.INTERRUPTED), attempt(2, POOL, AttemptOutcome.INTERRUPTED)]
    # When recovery decides
    action = SamePoolFirst().decide(job, attempts, ended(EndKind.SPOT_INTERRUPTED, attempt=2))
    # Then the pool is not blocked (there is nowhere else to go), and the interruption counts
    assert isinstance(action, Relaunch)
    assert action.block == ()
    assert action.counts_interruption


def test_a_single_zone_job_is_placed_back_on_its_pool_right_after_a_loss() -> None:
    # Given a job whose only spot pool is POOL, interrupted there
    spec = job_spec(work_hours=10)
    quotes = [PriceQuote(pool=POOL, usd_per_hour=0.30)]
    first = place(spec, quotes)
    job = make_job(spec).model_copy(
        update={
            "placement": tuple(
                PlannedPool(pool=r.pool, hourly_price=r.hourly_price, relative_speed=r.relative_speed)
                for r in first.ranked
            )
        }
    )
    action = decide_recovery(job, [attempt(1, POOL, None)], ended(EndKind.SPOT_INTERRUPTED))
    assert isinstance(action, Relaunch)
    # When it is placed again 10 minutes later
    again = place(spec, quotes, blocked=active_blocks(action.block, LOST_AT + timedelta(minutes=10)))
    # Then its pool is ranked again (Launch finds out whether capacity is back)
    assert ranked_first(again) == POOL


def ranked_first(placement: Any) -> Pool | None:
    return None if placement.best is None else placement.best.pool
