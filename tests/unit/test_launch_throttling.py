"""EC2 throttling every RunInstances: the JobLifecycle's Place -> Run -> Place loop, played here against the
fakes as the state machine runs it (the Run task's first call and its retries of LaunchThrottled, then the
Catch back to Place, Place's WaitForCapacity), must be paced and end with the job's patience."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import pytest
from control_builders import CHEAPEST, SECOND, THIRD, World

from spotrelay.control.decisions import (
    MAX_FAILURE_REASON_CHARS,
    THROTTLED_WAIT_MAX_SECONDS,
    StepResult,
    throttled_wait_seconds,
)
from spotrelay.control.lifecycle import (
    LAUNCH_CALLS_PER_THROTTLED_ROUND,
    THROTTLED_LAUNCHES_PER_HOUR,
    InsufficientInstanceCapacity,
    LaunchThrottled,
    launch_throttled_retry_waits,
)
from spotrelay.models import JobState


def throttled() -> LaunchThrottled:
    return LaunchThrottled("RequestLimitExceeded", "Request limit exceeded.")


def run_lifecycle_throttled(world: World, until: datetime) -> tuple[list[datetime], StepResult]:
    """Play the state machine for the admitted job while EC2 throttles every launch, until Place fails it or
    the clock reaches `until`: the times of its RunInstances calls, and Place's last answer."""
    calls: list[datetime] = []
    tokens = itertools.count(1)
    result = world.place()
    while world.clock.now() < until:
        if result.action == "launch":  # Run: the first call, then the Retry of LaunchThrottled
            for wait in [0, *launch_throttled_retry_waits()]:
                world.advance(seconds=wait)
                world.compute.fail_next["launch"] = throttled()
                with pytest.raises(LaunchThrottled):
                    world.launch(token=f"token-{next(tokens)}")
                calls.append(world.clock.now())
                assert "launch" not in world.compute.fail_next  # RunInstances was called
            result = world.place()  # the Catch, back to Place
        elif result.action == "wait":  # WaitForCapacity
            assert result.wait_seconds >= 1
            world.advance(seconds=result.wait_seconds)
            result = world.place()
        else:
            break
    return calls, result


def per_hour(calls: list[datetime], start: datetime, hours: int) -> list[int]:
    return [
        sum(1 for c in calls if start + timedelta(hours=h) <= c < start + timedelta(hours=h + 1)) for h in range(hours)
    ]


def test_under_endless_throttling_launches_are_paced_and_the_job_fails_when_its_patience_is_spent() -> None:
    # Given a job with 3 h of patience that may not go on-demand, and EC2 throttling every RunInstances
    world = World()
    world.admitted(limits={"max_wait_hours": 3, "on_demand_fallback": False})
    start = world.clock.now()
    # When the state machine runs it for up to a day
    calls, last = run_lifecycle_throttled(world, start + timedelta(hours=24))
    # Then the launches back off: 7 a round, the rounds 3, 6 and 11.5 then every 11.5 minutes apart, at most 49
    # in the first hour and 37 in each after (without the backoff: 280 an hour, for as long as EC2 throttles)
    rounds = [c for i, c in enumerate(calls) if i % LAUNCH_CALLS_PER_THROTTLED_ROUND == 0]
    assert [int((r - start).total_seconds()) for r in rounds[:5]] == [0, 180, 540, 1230, 1920]
    assert per_hour(calls, start, 3)[0] <= 49
    assert all(n <= THROTTLED_LAUNCHES_PER_HOUR == 37 for n in per_hour(calls, start, 3)[1:])
    # And Place fails the job NoCapacity as soon as its patience is spent, saying that EC2 throttled it
    assert (last.action, last.error) == ("fail", "NoCapacity")
    assert 3 * 3600 <= (world.clock.now() - start).total_seconds() <= 3 * 3600 + 120
    assert last.cause is not None
    assert last.cause.startswith(
        "nothing launched for 3.0 h (limits.max_wait_hours 3); last: EC2 throttled RunInstances"
    )
    assert "RequestLimitExceeded" in last.cause
    # And nothing was blocked or launched: throttling says nothing of any pool's capacity
    assert world.blocked() == {}
    assert world.compute.launches == []
    # And the job ends FAILED with that reason, one bounded line
    world.finalize(outcome="FAILED", error={"Error": last.error, "Cause": last.cause})
    job = world.job()
    assert job.state is JobState.FAILED
    assert job.failure_reason == f"NoCapacity: {last.cause}"
    assert len(job.failure_reason) <= MAX_FAILURE_REASON_CHARS
    assert job.failure_reason.isprintable()


def test_throttled_waits_grow_as_the_job_has_waited_capped_and_end_with_its_patience() -> None:
    # (waited so far, patience left) -> the wait
    assert throttled_wait_seconds(10, 3600) == 60  # at least a minute
    assert throttled_wait_seconds(90, 3600) == 90  # as long again
    assert throttled_wait_seconds(270, 3600) == 270
    assert throttled_wait_seconds(5 * 3600, 20 * 3600) == THROTTLED_WAIT_MAX_SECONDS == 600  # at most 10 minutes
    assert throttled_wait_seconds(3000, 210) == 210  # not past the patience: the job fails on time
    assert throttled_wait_seconds(3599.5, 0.5) == 1


def test_a_launch_throttled_once_then_refused_everywhere_goes_back_to_place_as_a_refused_one() -> None:
    # Given a placed job whose first launch EC2 throttled, and whose retry every pool refused
    world = World()
    world.admitted()
    world.place()
    world.compute.fail_next["launch"] = throttled()
    with pytest.raises(LaunchThrottled):
        world.launch(token="token-1")
    world.advance(seconds=2)
    for pool in (CHEAPEST, SECOND, THIRD):
        world.compute.refuse[pool] = "InsufficientInstanceCapacity"
    with pytest.raises(InsufficientInstanceCapacity):
        world.launch(token="token-2")
    # When the Catch goes back to Place
    result = world.place()
    # Then Place waits as for refused pools (a minute, and why: every pool blocked), not as for throttling
    assert (result.action, result.wait_seconds) == ("wait", 60)
    reason = world.job().waiting_reason
    assert reason is not None
    assert reason.startswith("no pool can take the job now: 3 blocked")


def test_a_job_cancelled_while_it_waits_out_throttling_is_not_placed_again() -> None:
    # Given a job waiting after a throttled launch
    world = World()
    world.admitted()
    world.place()
    world.compute.fail_next["launch"] = throttled()
    with pytest.raises(LaunchThrottled):
        world.launch(token="token-1")
    assert world.place().action == "wait"
    # When the user cancels it, and the wait ends
    world.cancel()
    world.advance(seconds=90)
    # Then Place ends it as cancelled
    assert (world.place().action, world.job().state) == ("fail", JobState.CANCELLED)
