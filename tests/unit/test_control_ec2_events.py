"""EC2 events (recorded in events/recorded/): interruption warnings, rebalance recommendations, state changes.

They arrive at least once and out of order; each is fenced by the attempt its instance belongs to."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from control_builders import BLOCK_MINUTES, CHEAPEST, World, error, recorded_event

from spotrelay.control.decisions import SPOT_NOTICE
from spotrelay.control.ec2_events import Ec2Event, MalformedEvent, handle_ec2_event
from spotrelay.models import JobState, Market, Pool

WARNING = "spot-interruption-warning.json"
TERMINATED = "instance-state-change-terminated.json"


def event(events_dir: Path, name: str, world: World, number: int = 1) -> Ec2Event:
    """The recorded event `name`, about the instance of the job's attempt `number`."""
    return recorded_event(events_dir, name, instance_id=world.attempt(number=number).instance_id)


def blocked_at(world: World, when: Ec2Event) -> dict[Pool, datetime]:
    return {b.pool: b.until for b in world.store.blocked_pools(when.time)}


# --- interruption warning -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [WARNING, "spot-interruption-warning-az-arn.json"])
def test_an_interruption_warning_marks_the_attempt_blocks_the_pool_and_fails_the_run_task(
    events_dir: Path, name: str
) -> None:
    # Given a job running on its first instance
    world = World()
    world.running()
    warning = event(events_dir, name, world)
    # When the two-minute warning for that instance arrives
    outcome = world.handle(warning)
    # Then the attempt is marked interrupted, the pool is blocked and counted as interrupted once
    assert world.attempt().interrupted_at == warning.time
    assert blocked_at(world, warning) == {CHEAPEST: warning.time + timedelta(minutes=BLOCK_MINUTES)}
    assert world.store.pool_observations()[CHEAPEST.offering].interruptions == 1
    # And the Run task fails with SpotInterrupted, naming the instance and the attempt
    [result] = world.workflow.task_results
    assert (result.task_token, result.error) == ("token-1", "SpotInterrupted")
    assert result.cause is not None
    cause = json.loads(result.cause)
    assert (cause["instance_id"], cause["attempt"]) == (world.attempt().instance_id, 1)
    assert (outcome.action, outcome.job_id, outcome.attempt, outcome.reason) == ("interrupt", "train-1", 1, "")


def test_the_only_spot_pool_of_a_job_is_blocked_for_others_but_not_for_it(events_dir: Path) -> None:
    # Given a job running on the only spot pool its placement offered (confined to one zone and type)
    world = World()
    world.running()
    job, version = world.store.get_job("train-1")
    only = tuple(p for p in job.placement if p.pool == CHEAPEST or p.pool.market is Market.ON_DEMAND)
    assert CHEAPEST in {p.pool for p in only}
    world.store.put_job(job.model_copy(update={"placement": only}), version)
    warning = event(events_dir, WARNING, world)
    # When the two-minute warning arrives and Recover runs after the final checkpoint
    world.handle(warning)
    world.checkpoint(attempt=1, seq=1, work_done_hours=0.5, final=True)
    recovered = world.recover()
    # Then the pool is blocked for every other job, but this job prefers it: a block would only keep it
    # idle while the pool's capacity comes back; its next placement once EC2 has taken the instance back
    # (the notice's two minutes) may use the pool
    assert CHEAPEST in blocked_at(world, warning)
    assert recovered.action == "relaunch"
    assert world.job().preferred_pool == CHEAPEST
    world.clock.current = warning.time + SPOT_NOTICE
    assert world.place().action == "launch"
    assert world.job().placement[0].pool == CHEAPEST


def test_a_warning_blocks_its_pool_for_every_job_at_least_until_the_notice_ends(events_dir: Path) -> None:
    # Given a deployment whose warning block (1 minute) is shorter than EC2's two-minute notice
    world = World()
    world.running()
    warning = event(events_dir, WARNING, world)
    # When the warning is handled
    handle_ec2_event(warning, store=world.store, workflow=world.workflow, compute=world.compute, block_minutes=1)
    # Then its pool stays blocked for every job until the instance is gone, not only for the minute
    assert blocked_at(world, warning)[CHEAPEST] == warning.time + SPOT_NOTICE


def test_a_warning_and_a_rebalance_handled_at_once_keep_both_marks(events_dir: Path) -> None:
    # Given a running job, and a rebalance recommendation written by another invocation right after
    # this one read the attempt (EventBridge delivers the two events to concurrent invocations)
    world = World()
    world.running()
    warning = event(events_dir, WARNING, world)
    rebalanced_at = warning.time - timedelta(seconds=30)

    def concurrent_rebalance() -> None:
        stale = world.store.get_attempt("train-1", 1)
        world.store.put_attempt(stale.model_copy(update={"rebalance_at": rebalanced_at}))

    world.store.after_attempt_read.append(concurrent_rebalance)
    # When the warning is handled
    world.handle(warning)
    # Then the attempt keeps both: the warning's write lost the race, read again and kept the rebalance
    assert (world.attempt().interrupted_at, world.attempt().rebalance_at) == (warning.time, rebalanced_at)
    assert world.store.pool_observations()[CHEAPEST.offering].interruptions == 1


def test_a_late_running_event_does_not_reopen_an_attempt_recover_closed_meanwhile(events_dir: Path) -> None:
    # Given a launched job whose `running` state change is being handled while Recover closes the attempt
    world = World()
    world.launched()
    running = event(events_dir, "instance-state-change-running.json", world)

    def concurrent_recover() -> None:
        world.recover(failure=error("InstanceLost"))

    world.store.after_attempt_read.append(concurrent_recover)
    # When the running event is handled
    world.handle(running)
    # Then the attempt stays closed as Recover left it
    assert world.attempt().outcome is not None
    assert world.attempt().running_at is None


def test_the_same_warning_twice_fails_the_task_once_and_counts_one_interruption(events_dir: Path) -> None:
    # Given a warning already handled
    world = World()
    world.running()
    warning = event(events_dir, WARNING, world)
    world.handle(warning)
    # When EventBridge delivers it again
    outcome = world.handle(warning)
    # Then the task is not failed again, and the pool shows one interruption
    assert outcome.reason == "task already closed"
    assert world.fail_results("token-1") == ["SpotInterrupted"]
    assert world.store.pool_observations()[CHEAPEST.offering].interruptions == 1
    assert world.attempt().interrupted_at == warning.time


def test_a_warning_for_an_earlier_attempts_instance_is_ignored(events_dir: Path) -> None:
    # Given a job on its second attempt (the first instance was lost and the job relaunched elsewhere)
    world = World()
    world.running()
    first_instance_warning = event(events_dir, WARNING, world, number=1)
    world.advance(hours=1)
    world.recover(failure=error("InstanceLost"))
    second = world.relaunched(token="token-2")
    # When a late warning for the first instance arrives
    outcome = world.handle(first_instance_warning)
    # Then it is ignored: the second attempt is not interrupted, its pool not blocked, its task not failed
    assert outcome.action == "ignore"
    assert outcome.reason == "stale: attempt 1, the job is on attempt 2"
    assert world.attempt(number=2).interrupted_at is None
    assert second.pool not in blocked_at(world, first_instance_warning)
    assert world.fail_results("token-2") == []


def test_a_warning_for_an_instance_spotrelay_does_not_know_is_ignored(events_dir: Path) -> None:
    # Given a running job, and a warning for someone else's instance
    world = World()
    world.running()
    warning = recorded_event(events_dir, WARNING)  # its placeholder instance id
    # When it arrives
    outcome = world.handle(warning)
    # Then nothing is blocked or failed
    assert (outcome.action, outcome.reason) == ("ignore", "not a spotrelay instance")
    assert world.store.blocked_pools(warning.time) == []
    assert world.workflow.task_results == []


# --- state changes ----------------------------------------------------------------------------------------------


def test_the_running_state_change_marks_the_job_running(events_dir: Path) -> None:
    # Given a launched job
    world = World()
    world.launched()
    running = event(events_dir, "instance-state-change-running.json", world)
    # When its instance reaches `running` (and the event is delivered twice)
    first = world.handle(running)
    second = world.handle(running)
    # Then the job is RUNNING since the event's time, and the second delivery changes nothing
    assert world.job().state is JobState.RUNNING
    assert world.attempt().running_at == running.time
    assert first.action == "running"
    assert (second.action, second.reason) == ("ignore", "already running")


def test_the_pending_state_change_changes_nothing(events_dir: Path) -> None:
    world = World()
    world.launched()
    outcome = world.handle(event(events_dir, "instance-state-change-pending.json", world))
    assert (outcome.action, outcome.reason) == ("ignore", "pending")
    assert world.job().state is JobState.LAUNCHING


@pytest.mark.parametrize("name", [TERMINATED, "instance-state-change-stopping.json"])
def test_an_on_demand_instance_that_goes_away_is_lost(events_dir: Path, name: str) -> None:
    # Given a job running on on-demand, where no spot notice can come (spot: tests/unit/test_ec2_event_order.py)
    world = World()
    running = world.running()
    on_demand = Pool(
        instance_type=running.pool.instance_type,
        availability_zone=running.pool.availability_zone,
        market=Market.ON_DEMAND,
    )
    world.store.put_attempt(running.model_copy(update={"pool": on_demand}))
    gone = event(events_dir, name, world)
    # When its instance stops or terminates
    outcome = world.handle(gone)
    # Then the Run task fails with InstanceLost, naming the instance; nothing is blocked or counted
    assert outcome.action == "lost"
    assert world.attempt().interrupted_at is None
    assert world.store.pool_observations() == {}
    assert world.fail_results("token-1") == ["InstanceLost"]
    cause = json.loads(str(world.workflow.task_results[0].cause))
    assert cause["instance_id"] == world.attempt().instance_id


def test_termination_after_the_warning_is_already_handled(events_dir: Path) -> None:
    # Given a warning handled for the running instance
    world = World()
    world.running()
    world.handle(event(events_dir, WARNING, world))
    # When the instance then terminates
    outcome = world.handle(event(events_dir, TERMINATED, world))
    # Then that is ignored: the task failed once, with SpotInterrupted
    assert outcome.action == "ignore"
    assert world.fail_results("token-1") == ["SpotInterrupted"]


def test_events_for_a_finished_jobs_instance_are_ignored(events_dir: Path) -> None:
    # Given a job that succeeded (Finalize terminated its instance)
    world = World()
    world.running()
    world.advance(hours=1)
    world.finalize(outcome="SUCCEEDED")
    # When that instance's `terminated` event arrives
    outcome = world.handle(event(events_dir, TERMINATED, world))
    # Then it is not taken for a loss
    assert (outcome.action, outcome.reason) == ("ignore", "job is SUCCEEDED")
    assert world.workflow.task_results == []


# --- rebalance ---------------------------------------------------------------------------------------------------


def test_a_rebalance_recommendation_is_noted_once_and_does_not_end_the_attempt(events_dir: Path) -> None:
    # Given a running job
    world = World()
    world.running()
    first = event(events_dir, "rebalance-recommendation.json", world)
    later = first.model_copy(update={"time": first.time + timedelta(minutes=5)})
    # When two rebalance recommendations arrive for its instance
    noted = world.handle(first)
    again = world.handle(later)
    # Then the first is noted on the attempt, the second ignored, and the Run task keeps waiting
    assert noted.action == "rebalance"
    assert (again.action, again.reason) == ("ignore", "rebalance recommendation already noted")
    assert world.attempt().rebalance_at == first.time
    assert world.workflow.task_results == []
    assert world.attempt().is_live


# --- malformed and unknown ------------------------------------------------------------------------------------------


def test_a_warning_without_an_instance_id_is_malformed(events_dir: Path) -> None:
    # Given the recorded warning that lacks detail.instance-id
    malformed = recorded_event(events_dir, "malformed-interruption-warning.json")
    # When it is handled, then MalformedEvent names the event and the missing field
    with pytest.raises(MalformedEvent, match="instance-id: required") as raised:
        World().handle(malformed)
    assert malformed.id in str(raised.value)


@pytest.mark.parametrize(
    ("name", "detail_change", "field"),
    [
        pytest.param(TERMINATED, {"state": "exploded"}, "state", id="unknown-state"),
        pytest.param(WARNING, {"instance-action": "reboot"}, "instance-action", id="unknown-action"),
        pytest.param(TERMINATED, {"instance-id": "not-an-instance"}, "instance-id", id="bad-instance-id"),
    ],
)
def test_a_detail_with_a_bad_value_is_malformed(
    events_dir: Path, name: str, detail_change: dict[str, str], field: str
) -> None:
    # Given a running job, and an event about its instance with one bad value in `detail`
    world = World()
    world.running()
    good = event(events_dir, name, world)
    bad = good.model_copy(update={"detail": {**good.detail, **detail_change}})
    # When it is handled, then MalformedEvent names the field, and nothing was done to the job
    with pytest.raises(MalformedEvent, match=f"{field}: "):
        world.handle(bad)
    assert world.workflow.task_results == []
    assert world.job().state is JobState.RUNNING


def test_an_event_of_an_unknown_kind_is_acknowledged_and_ignored(events_dir: Path) -> None:
    # Given a running job, and an event this handler does not deal with (the queue-depth alarm)
    world = World()
    world.running()
    alarm = recorded_event(events_dir, "alarm-state-change.json")
    # When it is handled
    outcome = world.handle(alarm)
    # Then it is ignored as unknown, and nothing changes
    assert (outcome.kind, outcome.action) == ("unknown", "ignore")
    assert outcome.reason == "aws.cloudwatch / CloudWatch Alarm State Change"
    assert world.workflow.task_results == []
