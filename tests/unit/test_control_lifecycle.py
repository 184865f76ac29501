"""The JobLifecycle steps: Place, Launch, Recover and Finalize, each run (and re-run) against the fakes."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from control_builders import CHEAPEST, SECOND, THIRD, World, error, make_job, recorded_event
from fakes import FunctionStopped

from spotrelay.control.decisions import MAX_FAILURE_REASON_CHARS, StepResult, place_wait_seconds
from spotrelay.control.lifecycle import InsufficientInstanceCapacity, JobCancelled, LaunchThrottled
from spotrelay.control.ports import InstanceRef
from spotrelay.models import AttemptOutcome, Job, JobState, Market, Pool
from spotrelay.policy import BlockedPool, MarketAction, MarketDecision


def planned_pools(world: World, job_id: str = "train-1") -> list[Pool]:
    return [p.pool for p in world.job(job_id).placement]


# =============================================================================================== Place


def test_place_ranks_the_allowed_pools_in_the_subnets_zones_cheapest_first_and_moves_to_launching() -> None:
    # Given an admitted job and spot prices for allowed pools, a cheaper pool in a zone without a subnet,
    # and a cheaper pool of a family the deployment does not allow
    world = World()
    world.admitted()
    # When Place runs
    result = world.place()
    # Then Launch gets the allowed pools cheapest first, with their prices, and the job is LAUNCHING
    assert result.action == "launch"
    job = world.job()
    assert job.state is JobState.LAUNCHING
    assert [(p.pool, p.hourly_price) for p in job.placement] == [(CHEAPEST, 0.35), (SECOND, 0.40), (THIRD, 0.45)]


def test_place_waits_when_every_pool_is_above_the_jobs_price_cap() -> None:
    # Given a job that pays at most $0.30/h, and every allowed pool costs more
    world = World()
    world.admitted(limits={"max_price_per_hour": 0.3})
    # When Place runs
    result = world.place()
    # Then the job WAITs a minute with no plan, remembering since when it waits
    assert (result.action, result.wait_seconds) == ("wait", 60)
    job = world.job()
    assert job.state is JobState.WAITING
    assert job.placement == ()
    assert job.waiting_since == world.clock.now()
    # And says why, with the price the cap would have to allow: the cheapest pool, $0.35/h
    assert job.waiting_reason is not None
    assert job.waiting_reason.startswith("no pool can take the job now: 3 price-cap (cheapest: ")
    assert f"{CHEAPEST}: $0.3500/h is above max_price_per_hour $0.3" in job.waiting_reason
    assert "; market: " in job.waiting_reason  # and what the market choice was


def test_a_plan_clears_the_reason_the_job_waited() -> None:
    # Given a job that waited for a price under its cap
    world = World()
    world.admitted(limits={"max_price_per_hour": 0.3})
    world.place()
    # When the prices fall under the cap and Place runs again
    world.compute.prices[(CHEAPEST.instance_type, CHEAPEST.availability_zone)] = 0.25
    result = world.place()
    # Then the job launches and no longer carries a reason to wait
    assert result.action == "launch"
    assert world.job().waiting_reason is None


def test_place_backs_off_doubling_the_wait_up_to_the_three_minute_block() -> None:
    # Given a job no pool can take
    world = World()
    world.admitted(limits={"max_price_per_hour": 0.3})
    waits = []
    # When Place runs again after each wait
    for _ in range(7):
        result = world.place()
        assert result.action == "wait"
        waits.append(result.wait_seconds)
        world.advance(seconds=result.wait_seconds)
    # Then the waits double from one minute and stop at three (a refused pool's block)
    assert waits == [60, 120, 180, 180, 180, 180, 180]


@pytest.mark.parametrize(
    ("checkpoint", "net_margin_hours"),
    [
        # the safety net keeps 2 x 0.1 h restart overhead of slack
        ({"interval_minutes": 15, "grace_seconds": 90}, 0.2),
        # a job given no grace at the notice (it saves every 15 min on its own) may lose 0.25 h of work at a
        # preemption, which the net keeps on top: it is due at 0.45 h of slack, not 0.2 h (~15 min later)
        ({"interval_minutes": 15, "grace_seconds": 0}, 0.45),
    ],
    ids=["saves-at-the-notice", "saves-only-periodically"],
)
def test_a_waiting_job_wakes_no_later_than_the_deadline_safety_net(
    checkpoint: dict[str, int], net_margin_hours: float
) -> None:
    # Given a 2 h job on L4s with 0.1 h done (a checkpoint), no spot anywhere: on-demand g6.xlarge needs
    # 1.9/0.968 = 1.9628 h, and the deadline puts the job's safety net 100 s from now; the job is ahead of
    # the uniform line, so it waits for spot (rule 1 does not apply)
    world = World()
    world.compute.prices.clear()
    world.admitted(
        work_hours=2,
        resources={"gpus": 1, "gpu_models": ["L4"]},
        limits={"deadline_hours": 1.9628 + net_margin_hours + 100 / 3600},
        checkpoint=checkpoint,
    )
    world.checkpoint(attempt=1, seq=0, work_done_hours=0.1)
    # When Place finds nothing and the job waits, twice
    first = world.place()
    world.advance(seconds=first.wait_seconds)
    second = world.place()
    # Then the first wait is the one-minute backoff, the second is cut to the ~40 s left before the net
    assert (first.action, first.wait_seconds) == ("wait", 60)
    assert second.action == "wait"
    assert 38 <= second.wait_seconds <= 41
    # And when the job wakes at the net, it is placed on on-demand in time
    world.advance(seconds=second.wait_seconds)
    assert world.place().action == "launch"
    assert {p.pool.market for p in world.job().placement} == {Market.ON_DEMAND}


def test_a_job_past_its_net_with_nothing_placeable_waits_the_backoff_not_a_second() -> None:
    # Given the 2 h L4 job already inside its safety net (0.19 h of slack, the net keeps 0.2 h), no spot
    # anywhere and every on-demand pool over its budget
    world = World()
    world.compute.prices.clear()
    world.admitted(
        work_hours=2,
        resources={"gpus": 1, "gpu_models": ["L4"]},
        limits={"deadline_hours": 2.0661 + 0.19, "max_total_cost": 0.5},
    )
    # When Place finds nothing, twice
    first = world.place()
    world.advance(seconds=first.wait_seconds)
    second = world.place()
    # Then it waits the backoff (one minute, then two), not a second at a time: the net is due already,
    # and waking sooner would not make a pool usable
    assert [(r.action, r.wait_seconds) for r in (first, second)] == [("wait", 60), ("wait", 120)]


def place_until_the_hour_is_up(world: World) -> tuple[StepResult, StepResult]:
    """Place at T0, a minute before the hour is up, and at the hour; the last two results."""
    world.place()
    world.advance(minutes=59)
    before = world.place()
    world.advance(minutes=1)
    return before, world.place()


def test_place_fails_with_no_capacity_once_the_job_has_waited_max_wait_hours() -> None:
    # Given a job with one hour of patience that has found no pool since T0
    world = World()
    world.admitted(limits={"max_price_per_hour": 0.3, "max_wait_hours": 1})
    # When Place runs a minute before the hour is up, and again at the hour
    before, after = place_until_the_hour_is_up(world)
    # Then it still waits at first, then fails with NoCapacity, saying why
    assert before.action == "wait"
    assert (after.action, after.error) == ("fail", "NoCapacity")
    assert after.cause is not None
    assert "nothing launched for 1.0 h (limits.max_wait_hours 1)" in after.cause
    assert "max_price_per_hour" in after.cause


def test_a_job_that_found_a_pool_starts_its_backoff_afresh() -> None:
    # Given a job that waited twice, then found a pool
    world = World()
    world.admitted(limits={"max_price_per_hour": 0.38})
    world.compute.prices = {("g6.xlarge", "us-east-1a"): 0.40}
    world.place()
    world.place()
    world.compute.prices = {("g6.xlarge", "us-east-1b"): 0.35}
    assert world.place().action == "launch"
    # When, later, no pool is feasible again
    world.compute.prices = {("g6.xlarge", "us-east-1a"): 0.40}
    result = world.place()
    # Then the wait starts again at one minute, and the patience counts from now
    assert (result.action, result.wait_seconds) == ("wait", 60)
    assert world.job().waiting_since == world.clock.now()


@pytest.mark.parametrize(
    "cancelled",
    [
        pytest.param(make_job(state=JobState.PLACING).model_copy(update={"cancel_requested": True}), id="requested"),
        pytest.param(make_job(state=JobState.CANCELLED), id="cancelled"),
    ],
)
def test_place_for_a_cancelled_job_fails_with_job_cancelled(cancelled: Job) -> None:
    # Given a job the user cancelled
    world = World()
    world.store.create_job(cancelled)
    # When Place runs
    result = world.place()
    # Then it fails with JobCancelled and plans nothing
    assert (result.action, result.error) == ("fail", "JobCancelled")
    assert world.job().placement == ()


def test_place_skips_a_blocked_pool_until_its_block_lapses() -> None:
    # Given the cheapest pool blocked for 30 minutes
    world = World()
    world.admitted()
    world.store.block_pool(BlockedPool(pool=CHEAPEST, until=world.clock.now() + timedelta(minutes=30), reason="test"))
    # When Place runs now, and again once the block has lapsed
    world.place()
    while_blocked = planned_pools(world)
    world.advance(minutes=30)
    world.place()
    after_block = planned_pools(world)
    # Then the blocked pool is left out, then back in first place
    assert while_blocked == [SECOND, THIRD]
    assert after_block == [CHEAPEST, SECOND, THIRD]


def test_place_puts_the_preferred_pool_first_and_launch_uses_up_the_preference() -> None:
    # Given recovery asked to try the dearest pool first (same-pool-first)
    world = World()
    world.admitted()
    job, version = world.store.get_job("train-1")
    world.store.put_job(job.model_copy(update={"preferred_pool": THIRD}), version)
    # When Place runs
    world.place()
    # Then that pool heads the plan, the others follow cheapest first
    assert planned_pools(world) == [THIRD, CHEAPEST, SECOND]
    # And once Launch has started the instance there, the preference is used up
    launched = world.launch(token="token-1")
    assert (launched["instance_type"], launched["availability_zone"]) == (THIRD.instance_type, THIRD.availability_zone)
    assert world.job().preferred_pool is None


def test_the_preferred_pool_is_exempt_from_the_block_its_own_loss_put_there() -> None:
    # Given same-pool-first asked for the pool an interruption warning just blocked
    world = World()
    world.admitted()
    world.store.block_pool(BlockedPool(pool=THIRD, until=world.clock.now() + timedelta(hours=1), reason="warning"))
    job, version = world.store.get_job("train-1")
    world.store.put_job(job.model_copy(update={"preferred_pool": THIRD}), version)
    # When Place and Launch run
    world.place()
    launched = world.launch(token="token-1")
    # Then the job goes back to that pool
    assert planned_pools(world)[0] == THIRD
    assert launched["instance_type"] == THIRD.instance_type


# ============================================================================================== Launch


def test_launch_starts_an_instance_in_the_first_planned_pool_and_records_the_attempt() -> None:
    # Given a placed job with a price cap of $0.50/h
    world = World()
    world.admitted(limits={"max_price_per_hour": 0.5})
    world.place()
    # When Launch runs for the Run task's token
    launched = world.launch(token="token-1")
    # Then one instance is asked for in the cheapest pool's zone and subnet, capped at the job's price
    [request] = world.compute.launches
    assert (request.pool, request.subnet_id, request.max_price, request.attempt) == (CHEAPEST, "subnet-bbbb", 0.5, 1)
    # And attempt 1 records the token, pool, price and instance; the instance points back at the attempt
    attempt = world.attempt()
    assert (attempt.task_token, attempt.pool, attempt.hourly_price) == ("token-1", CHEAPEST, 0.35)
    assert attempt.instance_id == launched["instance_id"]
    assert attempt.started_at == world.clock.now()
    assert attempt.is_live
    assert world.store.get_instance_ref(str(attempt.instance_id)) == InstanceRef(
        instance_id=str(attempt.instance_id), job_id="train-1", attempt=1
    )
    assert world.job().attempts == 1
    assert launched["attempt"] == 1
    assert launched["instance_type"] == "g6.xlarge"


def test_launch_records_the_run_tasks_heartbeat_timeout_with_the_attempt_for_its_agent() -> None:
    world = World()
    world.admitted()
    world.place()
    world.launch(token="token-1", heartbeat_timeout_seconds=900)
    assert world.attempt().heartbeat_timeout_seconds == 900


def test_launch_puts_the_jobs_tags_on_its_instance() -> None:
    # Given a placed job with tags
    world = World()
    world.admitted(tags={"team": "vision", "cost-center": "ml-42"})
    world.place()
    # When Launch runs
    launched = world.launch(token="token-1")
    # Then the instance is asked for with the job's tags, and carries them beside spotrelay's own
    [request] = world.compute.launches
    assert request.tags == {"team": "vision", "cost-center": "ml-42"}
    tags = world.compute.instances[launched["instance_id"]].tags
    assert (tags["team"], tags["spotrelay:job-id"]) == ("vision", "train-1")


def test_launch_blocks_a_pool_without_capacity_for_three_minutes_and_uses_the_next() -> None:
    # Given a placed job, and no capacity in the cheapest pool
    world = World()
    world.admitted()
    world.place()
    world.compute.refuse[CHEAPEST] = "InsufficientInstanceCapacity"
    # When Launch runs
    world.launch()
    # Then the instance is in the next pool, and the refusing pool is blocked for three minutes
    assert world.attempt().pool == SECOND
    assert world.blocked() == {CHEAPEST: world.clock.now() + timedelta(minutes=3)}
    world.advance(minutes=3)
    assert world.blocked() == {}


def test_launch_skips_a_pool_blocked_after_place_planned_it() -> None:
    # Given a placed job, and then another job's instance interrupted in the cheapest pool
    world = World()
    world.admitted()
    world.place()
    world.store.block_pool(BlockedPool(pool=CHEAPEST, until=world.clock.now() + timedelta(hours=1), reason="test"))
    # When Launch runs
    world.launch()
    # Then it launches in the next planned pool
    assert [r.pool for r in world.compute.launches] == [SECOND]
    assert world.attempt().pool == SECOND


def test_a_refused_preferred_pool_is_no_longer_exempt_from_its_block() -> None:
    # Given a placed job that prefers the cheapest pool (recovery sent it back there) and no capacity anywhere
    world = World()
    world.admitted()
    job, version = world.store.get_job("train-1")
    world.store.put_job(job.model_copy(update={"preferred_pool": CHEAPEST}), version)
    world.place()
    for pool in (CHEAPEST, SECOND, THIRD):
        world.compute.refuse[pool] = "InsufficientInstanceCapacity"
    # When Launch is refused everywhere, Then the preference is spent and the next Place waits instead of
    # ranking the refused pool again (Launch -> Place has no Wait: that would go round without a pause)
    with pytest.raises(InsufficientInstanceCapacity):
        world.launch()
    assert world.job().preferred_pool is None
    assert world.place().action == "wait"


def test_launch_raises_insufficient_capacity_when_every_pool_refuses_and_place_then_waits() -> None:
    # Given a placed job and no capacity anywhere
    world = World()
    world.admitted()
    world.place()
    for pool in (CHEAPEST, SECOND, THIRD):
        world.compute.refuse[pool] = "InsufficientInstanceCapacity"
    # When Launch runs
    with pytest.raises(InsufficientInstanceCapacity) as refused:
        world.launch()
    # Then no attempt is recorded, every refusing pool is named and blocked
    assert "every ranked pool refused" in str(refused.value)
    assert str(refused.value).count("InsufficientInstanceCapacity") == 3
    assert world.store.attempts("train-1") == []
    assert world.job().attempts == 0
    assert set(world.blocked()) == {CHEAPEST, SECOND, THIRD}
    # And the next Place (the state machine's catch) waits instead of retrying the same pools
    assert world.place().action == "wait"


def test_a_throttled_launch_blocks_no_pool_and_the_job_launches_in_its_first_pool_after_the_retry() -> None:
    # Given a placed job, and EC2 throttling the account's RunInstances calls (RequestLimitExceeded)
    world = World()
    world.admitted()
    world.place()
    world.compute.fail_next["launch"] = LaunchThrottled("RequestLimitExceeded", "Request limit exceeded.")
    # When Launch runs
    with pytest.raises(LaunchThrottled, match="RequestLimitExceeded"):
        world.launch(token="token-1")
    # Then throttling is not taken for the pool's refusal: nothing is blocked, no other pool is tried (the
    # call would be throttled too), nothing is recorded, and the job keeps its plan
    assert world.blocked() == {}
    assert world.compute.launches == []
    assert world.store.attempts("train-1") == []
    assert (world.job().state, planned_pools(world)) == (JobState.LAUNCHING, [CHEAPEST, SECOND, THIRD])
    # And when the Run task's Retry launches again (a new task token), the cheapest pool gets the job
    world.advance(seconds=2)
    world.launch(token="token-2")
    assert world.attempt().pool == CHEAPEST
    assert world.job().attempts == 1


def test_a_launch_throttled_past_its_retries_goes_back_to_place_which_waits_then_launches() -> None:
    # Given a placed job whose launches EC2 throttled until the Run task's retries were spent (90 s)
    world = World()
    world.admitted()
    world.place()
    throttled_at = world.clock.now()
    world.compute.fail_next["launch"] = LaunchThrottled("RequestLimitExceeded", "Request limit exceeded.")
    with pytest.raises(LaunchThrottled):
        world.launch(token="token-1")
    world.advance(seconds=90)
    # When the state machine's Catch goes back to Place
    placed = world.place()
    # Then Place waits as long as the job has waited (no plan straight into another throttled launch), and
    # the job WAITs since its throttled launch, saying why, with no pool blocked
    assert (placed.action, placed.wait_seconds) == ("wait", 90)
    job = world.job()
    assert (job.state, job.waiting_since) == (JobState.WAITING, throttled_at)
    assert job.waiting_reason is not None
    assert job.waiting_reason.startswith("EC2 throttled RunInstances (RequestLimitExceeded: Request limit exceeded.)")
    assert world.blocked() == {}
    # And when the wait is over, Place plans afresh and Launch gets the cheapest pool: the job never failed
    world.advance(seconds=placed.wait_seconds)
    assert world.place().action == "launch"
    world.launch(token="token-2")
    assert world.attempt().pool == CHEAPEST
    job = world.job()
    assert (job.state, job.waiting_since, job.waiting_reason) == (JobState.LAUNCHING, None, None)


def test_launch_retried_after_a_crash_before_the_instance_ref_was_recorded_records_it(events_dir: Path) -> None:
    # Given a Launch that recorded attempt 1, then stopped before recording which attempt its instance runs
    world = World()
    world.admitted()
    world.place()
    world.store.fail_next["put_instance_ref"] = FunctionStopped()
    with pytest.raises(FunctionStopped):
        world.launch(token="token-1")
    # When the invocation is retried with the same token
    launched = world.launch(token="token-1")
    world.workflow.open_task("token-1")
    # Then the instance is known as attempt 1's, so its interruption warning is handled, not ignored
    instance_id = str(launched["instance_id"])
    assert world.store.get_instance_ref(instance_id) == InstanceRef(
        instance_id=instance_id, job_id="train-1", attempt=1
    )
    warning = recorded_event(events_dir, "spot-interruption-warning.json", instance_id=instance_id)
    assert world.handle(warning).action == "interrupt"
    assert world.fail_results("token-1") == ["SpotInterrupted"]


def test_launch_run_twice_with_the_same_token_launches_once() -> None:
    # Given a job launched for token-1
    world = World()
    world.admitted()
    world.place()
    first = world.launch(token="token-1")
    # When Launch runs again with the same token (a retried invocation)
    second = world.launch(token="token-1")
    # Then it answers the same attempt, and there is still one instance and one attempt
    assert second == first
    assert len(world.compute.instances) == 1
    assert [a.attempt for a in world.store.attempts("train-1")] == [1]
    assert world.job().attempts == 1


def test_launch_retried_after_a_crash_before_the_attempt_was_recorded_reuses_the_instance() -> None:
    # Given a Launch that got an instance, then crashed before recording the attempt
    world = World()
    world.admitted()
    world.place()
    world.store.fail_next["put_attempt"] = RuntimeError("Lambda timed out")
    with pytest.raises(RuntimeError):
        world.launch(token="token-1")
    # When the invocation is retried
    launched = world.launch(token="token-1")
    # Then the same instance (EC2 client token) becomes attempt 1: no second instance
    assert list(world.compute.instances) == [launched["instance_id"]]
    assert world.attempt().instance_id == launched["instance_id"]
    assert world.job().attempts == 1


def test_launch_retried_after_a_crash_before_the_job_counted_the_attempt_counts_it() -> None:
    # Given a Launch that recorded attempt 1 and its instance, then crashed before counting it on the job
    world = World()
    world.admitted()
    world.place()
    world.store.fail_next["put_job"] = RuntimeError("Lambda timed out")
    with pytest.raises(RuntimeError):
        world.launch(token="token-1")
    # When the invocation is retried with the same token, and later that instance is lost
    world.launch(token="token-1")
    world.workflow.open_task("token-1")
    world.advance(hours=1)
    recovered = world.recover(failure=error("InstanceLost"))
    # Then the job counts attempt 1, and Recover relaunches it (rather than finding no current attempt and failing)
    assert (world.job().attempts, recovered.action) == (1, "relaunch")


def test_launch_for_a_cancelled_job_raises_job_cancelled_and_starts_nothing() -> None:
    # Given a placed job the user has just cancelled
    world = World()
    world.admitted()
    world.place()
    job, version = world.store.get_job("train-1")
    world.store.put_job(job.model_copy(update={"cancel_requested": True}), version)
    # When Launch runs
    with pytest.raises(JobCancelled):
        world.launch()
    # Then no instance is started
    assert world.compute.instances == {}


# ============================================================================================= Recover


def test_recover_right_after_an_interruption_warning_waits_for_the_final_checkpoint() -> None:
    # Given a running attempt that got its interruption warning ten seconds ago, and no checkpoint yet
    world = World()
    world.running()
    world.advance(hours=1)
    world.warned()
    world.advance(seconds=10)
    # When Recover runs
    result = world.recover(failure=error("SpotInterrupted"))
    # Then it asks to poll again in 15 s, and the attempt and the job are untouched
    assert (result.action, result.wait_seconds) == ("wait_checkpoint", 15)
    assert world.attempt().is_live
    assert world.job().interruptions == 0
    assert world.blocked() == {}


def test_recover_does_not_take_an_earlier_attempts_checkpoint_for_the_final_one() -> None:
    # Given attempt 2 just warned, while the latest checkpoint is from attempt 1
    world = World()
    world.running()
    world.checkpoint(attempt=1, work_done_hours=0.5)
    world.advance(hours=1)
    world.recover(failure=error("InstanceLost"))
    world.relaunched(token="token-2")
    world.mark_running(number=2)
    world.advance(hours=1)
    world.warned(number=2)
    # When Recover runs
    result = world.recover(failure=error("SpotInterrupted"))
    # Then it still waits for attempt 2's final checkpoint
    assert result.action == "wait_checkpoint"
    assert world.attempt(number=2).is_live


def test_recover_does_not_take_a_periodic_checkpoint_of_the_interrupted_attempt_for_its_final_one() -> None:
    # Given an interrupted attempt whose latest checkpoint is a periodic one from before the notice
    world = World()
    world.running()
    world.advance(minutes=30)
    world.checkpoint(attempt=1, seq=2, work_done_hours=0.5)
    world.advance(minutes=10)
    world.warned()
    # When Recover runs right after the notice
    result = world.recover(failure=error("SpotInterrupted"))
    # Then it waits for the final checkpoint rather than relaunching from the periodic one
    assert result.action == "wait_checkpoint"
    assert world.attempt().is_live


def test_recover_after_the_final_checkpoint_closes_the_attempt_accounts_it_and_relaunches_elsewhere() -> None:
    # Given an attempt that ran 115 minutes, was warned, and committed its final checkpoint of 1.5 h of work
    world = World()
    world.launched()
    world.advance(minutes=6)
    world.mark_running()
    world.advance(minutes=114)
    world.warned()
    world.advance(minutes=1)
    world.checkpoint(attempt=1, seq=4, work_done_hours=1.5, final=True)
    # When Recover runs
    result = world.recover(failure=error("SpotInterrupted"))
    # Then the attempt is closed as INTERRUPTED now, losing nothing: its final checkpoint holds all it did
    attempt = world.attempt()
    assert attempt.outcome is AttemptOutcome.INTERRUPTED
    assert attempt.ended_at == world.clock.now()
    assert attempt.lost_work_hours == 0
    # And the job is charged for the 121 minutes it held the instance, counts one interruption, keeps its progress
    job = world.job()
    assert job.cost_usd == pytest.approx(0.35 * 121 / 60)
    assert job.interruptions == 1
    assert job.work_done_hours == 1.5
    assert job.lost_work_hours == pytest.approx(attempt.lost_work_hours)
    assert job.state is JobState.RECOVERING
    # And the lost pool is blocked for the job's block_minutes (eager-next-pool, the default 3 min)
    assert result.action == "relaunch"
    assert world.blocked() == {CHEAPEST: world.clock.now() + timedelta(minutes=3)}


def test_an_instance_never_seen_running_lost_no_work() -> None:
    # Given an attempt launched an hour ago whose instance never reached running (no agent ever heartbeated)
    world = World()
    world.launched()
    world.advance(hours=1)
    # When Recover runs on the heartbeat timeout
    result = world.recover(failure=error("States.Timeout"))
    # Then the job relaunches, is charged the hour, counts the interruption, and lost no work
    assert result.action == "relaunch"
    attempt = world.attempt()
    assert attempt.outcome is not None
    assert attempt.lost_work_hours == 0
    job = world.job()
    assert (job.interruptions, job.lost_work_hours) == (1, 0)
    assert job.cost_usd == pytest.approx(attempt.hourly_price)


def test_an_instance_whose_running_event_never_came_but_was_warned_lost_its_work() -> None:
    # Given an attempt whose `running` event was lost, warned of an interruption after an hour
    world = World()
    world.launched()
    world.advance(hours=1)
    world.warned()
    world.advance(seconds=150)
    # When Recover gives up waiting for its final checkpoint
    world.recover(failure=error("SpotInterrupted"))
    # Then the work from its launch to its reclaim two minutes after the warning is counted lost: the notice
    # says it ran
    attempt = world.attempt()
    assert attempt.lost_work_hours == pytest.approx((1 + 120 / 3600) * attempt.relative_speed)


def test_recover_stops_waiting_for_a_final_checkpoint_after_150_seconds() -> None:
    # Given an attempt that ran an hour, was warned 150 s ago, and never checkpointed
    world = World()
    world.running()
    world.advance(hours=1)
    world.warned()
    world.advance(seconds=150)
    # When Recover runs
    result = world.recover(failure=error("SpotInterrupted"))
    # Then it gives up waiting: everything the attempt did until EC2 reclaimed it is lost, and the job relaunches
    assert result.action == "relaunch"
    attempt = world.attempt()
    assert attempt.outcome is AttemptOutcome.INTERRUPTED
    assert attempt.lost_work_hours == pytest.approx((1 + 120 / 3600) * attempt.relative_speed)


@pytest.mark.parametrize("late_minutes", [3, 30, 600])
def test_a_late_recover_counts_no_work_lost_after_the_instance_was_reclaimed(late_minutes: int) -> None:
    # Given an attempt that ran an hour, was warned, committed a periodic checkpoint of 1 h of work a minute
    # later (not its final one), and whose Recover comes `late_minutes` after the warning (the control plane
    # was down, its events were dead-lettered and redriven)
    world = World()
    world.running()
    world.advance(hours=1)
    world.warned()
    world.advance(minutes=1)
    world.checkpoint(attempt=1, seq=3, work_done_hours=1.0 * world.attempt().relative_speed, final=False)
    world.advance(minutes=late_minutes - 1)
    # When Recover runs
    world.recover(failure=error("SpotInterrupted"))
    # Then only the two minutes of the notice count, less what the checkpoint saved: nothing of the time
    # since EC2 reclaimed the instance
    attempt = world.attempt()
    assert attempt.lost_work_hours == pytest.approx(2 / 60 * attempt.relative_speed)
    assert world.job().lost_work_hours == pytest.approx(attempt.lost_work_hours)


def test_an_attempt_whose_own_final_checkpoint_is_the_newest_lost_no_work_even_without_progress_reports() -> None:
    # Given an attempt that ran an hour and committed its final checkpoint at the notice, for a job that writes
    # no progress file (the pointer's work done is where the attempt started)
    world = World()
    world.running()
    world.advance(hours=1)
    world.warned()
    world.advance(seconds=30)
    world.checkpoint(attempt=1, seq=3, work_done_hours=world.attempt().work_done_hours_at_start, final=True)
    world.advance(seconds=30)
    # When Recover runs
    world.recover(failure=error("SpotInterrupted"))
    # Then nothing is lost: the final checkpoint holds everything the job did, whatever it reports
    assert world.attempt().lost_work_hours == 0
    assert world.job().lost_work_hours == 0


def test_a_late_recover_counts_the_work_only_until_the_instance_stopped_billing() -> None:
    # Given an on-demand attempt (no notice) that ran an hour and whose `terminated` state change said EC2
    # stopped billing it then, and a Recover that comes an hour later
    world = World()
    world.running()
    world.advance(hours=1)
    stopped = world.attempt().model_copy(update={"billed_until": world.clock.now()})  # what the event settles
    world.store.put_attempt(stopped)
    world.advance(hours=1)
    # When Recover runs on the lost instance
    world.recover(failure=error("InstanceLost"))
    # Then the hour it ran is lost, not the two hours since it started
    attempt = world.attempt()
    assert attempt.billed_until is not None
    assert attempt.lost_work_hours == pytest.approx(1 * attempt.relative_speed)


@pytest.mark.parametrize("error_name", ["InstanceLost", "States.HeartbeatTimeout"])
def test_recover_from_a_lost_instance_counts_an_interruption_in_the_pool_and_the_job(error_name: str) -> None:
    # Given an attempt that ran two hours, then its instance vanished without a warning
    world = World()
    world.running()
    world.advance(hours=2)
    # When Recover runs
    result = world.recover(failure=error(error_name))
    # Then the attempt is LOST, the pool's record shows 2 instance-hours and one interruption, and the job relaunches
    assert world.attempt().outcome is AttemptOutcome.LOST
    stats = world.store.pool_observations()[CHEAPEST.offering]
    assert stats.instance_hours == pytest.approx(2.0)
    assert stats.interruptions == 1
    assert world.job().interruptions == 1
    assert result.action == "relaunch"


def test_recover_run_twice_gives_the_same_answer_and_counts_once() -> None:
    # Given a job recovered once from a lost instance
    world = World()
    world.running()
    world.advance(hours=2)
    first = world.recover(failure=error("InstanceLost"))
    job_after_first = world.job()
    attempt_after_first = world.attempt()
    # When Recover runs again for the same failure, a little later (a retried invocation)
    world.advance(seconds=30)
    second = world.recover(failure=error("InstanceLost"))
    # Then it answers the same, and nothing is counted or charged twice
    assert second == first
    assert world.job() == job_after_first
    assert world.attempt() == attempt_after_first
    assert world.store.pool_observations()[CHEAPEST.offering].interruptions == 1


def test_recover_restarts_failing_user_code_up_to_max_restarts_then_fails() -> None:
    # Given a job allowed one restart, whose code exits with code 3
    world = World()
    world.running(limits={"max_restarts": 1})
    world.advance(hours=1)
    # When its first attempt fails
    first = world.recover(failure=error("JobFailed", exit_code=3))
    # Then it restarts, without blaming (blocking) the pool or counting an interruption
    assert first.action == "relaunch"
    assert world.attempt().outcome is AttemptOutcome.FAILED
    assert (world.job().restarts, world.job().interruptions) == (1, 0)
    assert world.blocked() == {}
    # When the second attempt fails the same way
    world.relaunched(token="token-2")
    world.advance(hours=1)
    second = world.recover(failure=error("JobFailed", exit_code=3))
    # Then the job fails, saying why
    assert (second.action, second.error) == ("fail", "JobFailed")
    assert second.cause is not None
    assert "exited with code 3 on attempt 2" in second.cause
    assert "limits.max_restarts is 1" in second.cause


def test_recover_fails_with_too_many_interruptions_past_max_interruptions() -> None:
    # Given a job allowed one interruption, already interrupted once
    world = World()
    world.running(limits={"max_interruptions": 1})
    world.advance(hours=1)
    assert world.recover(failure=error("InstanceLost")).action == "relaunch"
    world.relaunched(token="token-2")
    world.advance(hours=1)
    # When its second instance is lost too
    result = world.recover(failure=error("InstanceLost"))
    # Then the job fails with TooManyInterruptions, and its record counts as many as the reason says
    assert (result.action, result.error) == ("fail", "TooManyInterruptions")
    assert result.cause == "2 interruptions; limits.max_interruptions is 1"
    assert world.job().interruptions == 2


def test_recover_with_same_pool_first_prefers_the_lost_pool_instead_of_blocking_it() -> None:
    # Given a same-pool-first job whose first instance was lost
    world = World()
    world.running(recovery="same-pool-first")
    world.advance(hours=1)
    # When Recover runs
    result = world.recover(failure=error("InstanceLost"))
    # Then the job relaunches preferring that pool, which stays unblocked
    assert result.action == "relaunch"
    assert world.job().preferred_pool == CHEAPEST
    assert world.blocked() == {}


def test_a_job_that_prefers_the_pool_ec2_is_still_reclaiming_waits_for_the_notice_then_goes_back_to_it() -> None:
    # Given a same-pool-first job warned 25 s ago, whose final checkpoint is committed (Recover goes on)
    world = World()
    world.running(recovery="same-pool-first")
    world.advance(hours=1)
    world.warned()
    warned_at = world.clock.now()
    world.store.blocks.clear()  # the warning's own block aside: the preference exempts the job from it
    world.clock.advance(25)
    world.checkpoint(attempt=1, seq=1, work_done_hours=0.9, final=True)
    assert world.recover().action == "relaunch"
    assert world.job().preferred_pool == CHEAPEST
    # When Place runs while the two-minute notice still runs
    within = world.place()
    # Then the job waits for the notice to end (an instance launched now would run on the capacity being
    # reclaimed), without spending its patience, and keeps its preference
    assert (within.action, within.wait_seconds) == ("wait", 95)
    job = world.job()
    assert (job.state, job.preferred_pool, job.waiting_since, job.place_waits) == (
        JobState.WAITING,
        CHEAPEST,
        None,
        0,
    )
    # And once the notice has run out, it goes back to that pool first
    world.clock.current = warned_at + timedelta(minutes=2)
    assert world.place().action == "launch"
    assert planned_pools(world)[0] == CHEAPEST


def test_a_pool_ec2_is_still_reclaiming_is_not_offered_to_a_job_that_does_not_prefer_it() -> None:
    # Given an eager-next-pool job warned 25 s ago in its pool, whose block has lapsed already (a deployment
    # with a short block) and whose final checkpoint is committed
    world = World()
    world.running()
    world.advance(hours=1)
    world.warned()
    world.clock.advance(25)
    world.checkpoint(attempt=1, seq=1, work_done_hours=0.9, final=True)
    assert world.recover().action == "relaunch"
    world.store.blocks.clear()
    # When Place runs within the notice
    placed = world.place()
    # Then it plans the other pools, not the one being reclaimed
    assert placed.action == "launch"
    assert CHEAPEST not in planned_pools(world)


# ============================================================================================ Finalize


def test_finalize_succeeded_terminates_the_instance_and_totals_the_cost_of_every_attempt() -> None:
    # Given a job of 4 h of work that lost its first instance after 2 h ($0.35/h), then ran 3 h on the next
    # pool ($0.40/h)
    world = World()
    world.running(work_hours=4.0)
    world.advance(hours=2)
    world.recover(failure=error("InstanceLost"))
    second = world.relaunched(token="token-2")
    assert second.pool == SECOND
    world.advance(hours=3)
    # When Finalize runs with the Run task's success
    summary = world.finalize(outcome="SUCCEEDED")
    # Then the instance is terminated, the attempt closed, and the job SUCCEEDED with both attempts' cost
    assert world.compute.instances[str(second.instance_id)].state == "terminated"
    attempt = world.attempt(number=2)
    assert (attempt.outcome, attempt.ended_at, attempt.lost_work_hours) == (
        AttemptOutcome.SUCCEEDED,
        world.clock.now(),
        0,
    )
    job = world.job()
    assert job.state is JobState.SUCCEEDED
    assert job.ended_at == world.clock.now()
    assert job.work_done_hours == 4.0
    assert job.cost_usd == pytest.approx(0.35 * 2 + 0.40 * 3)
    assert (summary.state, summary.attempts, summary.interruptions) == (JobState.SUCCEEDED, 2, 1)
    assert summary.cost_usd == pytest.approx(1.9)
    assert summary.on_demand_cost_usd == pytest.approx(0.8048 * 5)
    # And the dispatcher is woken: a slot is free
    assert world.wakeup.reasons == ["job train-1 ended SUCCEEDED"]


def test_finalize_run_twice_changes_nothing_and_does_not_charge_twice() -> None:
    # Given a job finalized as SUCCEEDED after 3 h at $0.35/h
    world = World()
    world.running()
    world.advance(hours=3)
    world.finalize(outcome="SUCCEEDED")
    job, attempts = world.job(), world.store.attempts("train-1")
    # When Finalize runs again an hour later (a retried invocation)
    world.advance(hours=1)
    summary = world.finalize(outcome="SUCCEEDED")
    # Then the job and its attempts are as they were
    assert world.job() == job
    assert world.store.attempts("train-1") == attempts
    assert summary.cost_usd == pytest.approx(0.35 * 3)


def test_finalize_succeeded_while_the_running_event_is_still_on_its_way() -> None:
    # Given a job whose instance finished the work before its `running` event was processed
    world = World()
    world.launched()
    world.advance(hours=1)
    # When Finalize runs with success
    world.finalize(outcome="SUCCEEDED")
    # Then the job SUCCEEDED
    assert world.job().state is JobState.SUCCEEDED


def test_finalize_failed_records_the_error_the_state_machine_caught() -> None:
    # Given a job whose Place gave up with NoCapacity, before any launch
    world = World()
    world.admitted()
    # When Finalize runs with that error
    world.finalize(outcome="FAILED", error={"Error": "NoCapacity", "Cause": "no feasible pool for 24.0 h"})
    # Then the job FAILED with that reason, and nothing was terminated
    job = world.job()
    assert job.state is JobState.FAILED
    assert job.failure_reason == "NoCapacity: no feasible pool for 24.0 h"
    assert world.compute.terminated == []


def test_a_job_failed_by_a_function_error_keeps_its_message_not_the_envelope() -> None:
    # Given a Launch that failed with an error no Catch expects: Step Functions hands Finalize the function's
    # whole error envelope as the Cause (message, type, request id, stack trace)
    world = World()
    world.admitted()
    envelope = {
        "errorMessage": "An error occurred (UnauthorizedOperation) when calling the RunInstances operation:\n"
        "You are not authorized to perform this operation.",
        "errorType": "ClientError",
        "requestId": "7bbec0b2-b76e-4da8-a24e-993d88c19788",
        "stackTrace": ['  File "/var/task/functions/launch.py", line 53, in handler\n    launched = launch_step(\n']
        * 40,
    }
    # When Finalize runs with it
    world.finalize(outcome="FAILED", error={"Error": "ClientError", "Cause": json.dumps(envelope)})
    # Then the reason is one line: the error's name and message, no trace, no request id
    assert world.job().failure_reason == (
        "ClientError: An error occurred (UnauthorizedOperation) when calling the RunInstances operation: "
        "You are not authorized to perform this operation."
    )


@pytest.mark.parametrize(
    "cause",
    [
        "line\r\n\tafter\x1b[31m \u2028" * 5_000,  # long, multi-line, with control characters
        "{" * 30_000,  # looks like JSON, and would blow the parser's stack
        json.dumps({"errorType": "ValueError", "errorMessage": "x" * 10_000}),
    ],
)
def test_a_failure_reason_is_one_bounded_printable_line(cause: str) -> None:
    # Given a job that failed with a huge or hostile Cause (a worker fails its own task with any Cause)
    world = World()
    world.admitted()
    # When Finalize runs with it
    world.finalize(outcome="FAILED", error={"Error": "JobFailed", "Cause": cause})
    # Then its reason is one printable line of bounded length, cut with an ellipsis
    reason = str(world.job().failure_reason)
    assert reason.startswith("JobFailed: ")
    assert len(reason) == MAX_FAILURE_REASON_CHARS
    assert reason.endswith("…")
    assert reason.isprintable()


@pytest.mark.parametrize("outcome", ["FAILED", "CANCELLED"])
def test_finalize_after_a_cancel_keeps_the_job_cancelled(outcome: str) -> None:
    # Given a running job the user cancelled
    world = World()
    world.running()
    world.advance(hours=1)
    world.cancel()
    # When the execution finalizes late, with a failure
    world.finalize(outcome=outcome, error={"Error": "JobCancelled", "Cause": "cancelled by the user"})
    # Then the job stays CANCELLED, with the cancel's reason
    job = world.job()
    assert job.state is JobState.CANCELLED
    assert job.failure_reason == "JobCancelled: cancelled by the user"
    assert job.cost_usd == pytest.approx(0.35)


def test_a_job_told_to_wait_exactly_at_the_safety_net_wakes_a_second_later() -> None:
    # Given a waiting job (its 5th wait: a 3-minute backoff) whose slack is exactly the net's margin: rule 4
    # (time left < run + margin) does not fire yet, and one more backoff would sleep past the net
    at_net = MarketDecision(action=MarketAction.WAIT, reason="no spot", slack_hours=0.1, net_margin_hours=0.1)
    # When Place decides how long it waits
    wait = place_wait_seconds(5, at_net)
    # Then it wakes a second later, when the net fires, not 3 minutes later
    assert wait == 1
    # And a job the net already sent to on-demand, with no on-demand pool usable, keeps the backoff
    due = at_net.model_copy(update={"action": MarketAction.ON_DEMAND})
    assert place_wait_seconds(5, due) == 180


def patient_l4_job(world: World, *, done: float = 0.0, spot: bool = False) -> None:
    """A 2 h L4 job due in 100 h with one hour of patience (`max_wait_hours`), `done` hours done (a checkpoint);
    no spot quotes unless `spot`. Behind the uniform line from its first minute with none done, but within
    rule 1's band (about 96 h: slack to wait for spot); far ahead of the line with 1.5 h done."""
    if not spot:
        world.compute.prices.clear()
    world.admitted(
        work_hours=2,
        resources={"gpus": 1, "gpu_models": ["L4"]},
        limits={"deadline_hours": 100, "max_wait_hours": 1},
    )
    if done:
        world.checkpoint(attempt=1, seq=0, work_done_hours=done)


def place_refusing_launches(world: World, hours: float, *, until_on_demand: bool = False) -> tuple[StepResult, float]:
    """Place -> Launch (refused: every planned pool is made to refuse) -> Place ... for the job, waiting as
    told, until Place fails, plans on-demand (`until_on_demand`) or `hours` pass; the last result and its hour."""
    start = world.clock.now()
    while (elapsed := (world.clock.now() - start).total_seconds() / 3600) < hours:
        result = world.place()
        if result.action == "wait":
            world.advance(seconds=result.wait_seconds)
            continue
        if result.action != "launch":
            return result, elapsed
        if until_on_demand and {p.pool.market for p in world.job().placement} == {Market.ON_DEMAND}:
            return result, elapsed
        for planned in world.job().placement:
            world.compute.refuse[planned.pool] = "InsufficientInstanceCapacity"
        with pytest.raises(InsufficientInstanceCapacity):
            world.launch()
    return result, hours


@pytest.mark.parametrize(("done", "waits_because"), [(0.0, "band"), (1.5, "ahead of schedule")])
def test_a_job_out_of_patience_goes_on_demand_rather_than_fail_with_no_capacity(
    done: float, waits_because: str
) -> None:
    # Given the patient L4 job behind the line within rule 1's band, or ahead of the line, and no spot anywhere
    world = World()
    patient_l4_job(world, done=done)
    # When Place runs a minute before the hour is up, and again at the hour
    before, after = place_until_the_hour_is_up(world)
    # Then it waits for spot at first, then runs on on-demand instead of failing with NoCapacity: on-demand
    # could run it all along, so the wait was a choice, not a lack of capacity
    assert before.action == "wait"
    assert waits_because in (before.cause or "")
    assert after.action == "launch"
    assert {p.pool.market for p in world.job().placement} == {Market.ON_DEMAND}


def test_a_job_whose_spot_launches_are_all_refused_runs_out_of_patience_though_its_pools_are_ranked() -> None:
    # Given the patient L4 job with spot quotes: Place ranks the spot pools whenever their 3-minute blocks lapse
    world = World()
    patient_l4_job(world, spot=True)
    # When every launch is refused, until Place plans on-demand
    result, at = place_refusing_launches(world, hours=6, until_on_demand=True)
    # Then its patience counts from its first wait, through the refused launches: on-demand after about an hour
    # (a Place run or two past it), not when the 96 h band runs out
    assert result.action == "launch"
    assert 1 <= at <= 1 + 0.1


def test_a_job_out_of_patience_whose_on_demand_launches_are_refused_keeps_trying_for_another_max_wait() -> None:
    # Given the patient L4 job ahead of schedule, out of patience after an hour
    world = World()
    patient_l4_job(world, done=1.5)
    # When every on-demand launch it tries is refused
    result, at = place_refusing_launches(world, hours=6)
    # Then it keeps trying on-demand as the refused pools' blocks lapse, and fails with NoCapacity only after
    # another hour (twice max_wait_hours in all)
    assert (result.action, result.error) == ("fail", "NoCapacity")
    assert 2 <= at <= 2 + 0.1
    assert "limits.max_wait_hours 1" in (result.cause or "")


def test_a_job_out_of_patience_runs_on_demand_once_an_on_demand_pool_takes_it() -> None:
    # Given the patient L4 job ahead of schedule, whose on-demand launches are refused until 1.5 h
    world = World()
    patient_l4_job(world, done=1.5)
    result, _ = place_refusing_launches(world, hours=1.5)
    assert result.action != "fail"
    # When on-demand capacity is back
    world.compute.refuse.clear()
    launched = None
    for _ in range(10):
        result = world.place()
        if result.action == "launch":
            launched = world.launch()
            break
        world.advance(seconds=result.wait_seconds)
    # Then the job runs on on-demand
    assert launched is not None
    assert world.store.attempts("train-1")[-1].pool.market is Market.ON_DEMAND


def test_recover_stopped_after_its_block_and_retried_keeps_the_lost_pool_blocked() -> None:
    # Given an interrupted attempt whose final checkpoint is committed (the warning's own block lapsed)
    world = World()
    world.running()
    world.warned()
    world.checkpoint(attempt=1, seq=1, work_done_hours=0.5, final=True)
    world.store.blocks.clear()
    # When Recover's Lambda dies as it blocks the lost pool, and Step Functions retries it
    world.store.fail_next["block_pool"] = FunctionStopped()
    with pytest.raises(FunctionStopped):
        world.recover("train-1", error("SpotInterrupted"))
    retried = world.recover("train-1", error("SpotInterrupted"))

    # Then the retry relaunches, and the lost pool is blocked (the recovery was not recorded before its block)
    assert retried.action == "relaunch"
    assert CHEAPEST in world.blocked()
    assert world.job().interruptions == 1
