"""Money at the price in effect (spotrelay.models.billing): an attempt's bill runs until EC2 reports its
instance gone, at the spot prices over that time, and the job's cost, its budget and `spotrelay cost`
count it so; a duplicate or reordered termination bills once."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest
from control_builders import CHEAPEST, T0, World, error, recorded_event

from spotrelay.aws.stack import JobStatus
from spotrelay.control.ec2_events import Ec2Event
from spotrelay.models import AttemptOutcome

TERMINATED = "instance-state-change-terminated.json"
WARNING = "spot-interruption-warning.json"
LAUNCH_PRICE = 0.35  # CHEAPEST's, where World launches a job


def doubles_at(world: World, when: datetime) -> None:
    """CHEAPEST's spot price doubles at `when` (EC2's price history says so from then on)."""
    world.compute.price_changes[(CHEAPEST.instance_type, CHEAPEST.availability_zone)] = [(when, 2 * LAUNCH_PRICE)]


def gone(events_dir: Path, world: World, at: datetime, state: str = "terminated", number: int = 1) -> Ec2Event:
    """The state change of attempt `number`'s instance to `state` (a going-away one) at `at`."""
    event = recorded_event(events_dir, TERMINATED, instance_id=world.attempt(number=number).instance_id, at=at)
    return event.model_copy(update={"detail": {**event.detail, "state": state}})


def hours(delta: timedelta) -> float:
    return delta.total_seconds() / 3600


def test_a_spot_price_doubling_mid_run_is_billed_at_each_price_until_the_instance_terminates(
    events_dir: Path,
) -> None:
    # Given a job launched at $0.35/h whose pool's spot price doubles an hour into the run
    world = World()
    world.running()
    doubles_at(world, T0 + timedelta(hours=1))
    # When it succeeds three hours in, and its instance's `terminated` state change arrives
    world.advance(hours=3)
    world.finalize(outcome="SUCCEEDED")
    outcome = world.handle(gone(events_dir, world, world.clock.now()))
    # Then the attempt and the job cost one hour at $0.35 and two at $0.70, not three at the launch price
    expected = 1 * 0.35 + 2 * 0.70
    attempt = world.attempt()
    assert attempt.billed_until == world.clock.now()
    assert attempt.cost_usd == pytest.approx(expected)
    assert world.job().cost_usd == pytest.approx(expected)
    assert outcome.billed_until == world.clock.now()
    # And `spotrelay cost` reads the same figure from the records, later, without asking EC2 again
    asked = len(world.compute.history_requests)
    status = JobStatus(job=world.job(), attempts=world.store.attempts("train-1"))
    assert status.cost(world.clock.now() + timedelta(days=1)) == pytest.approx(expected)
    assert len(world.compute.history_requests) == asked == 1


@pytest.mark.parametrize(
    "recover_after", [timedelta(seconds=30), timedelta(seconds=150)], ids=["closed-first", "terminated-first"]
)
def test_an_interrupted_attempt_is_billed_until_its_instance_terminates_not_until_its_close(
    events_dir: Path, recover_after: timedelta
) -> None:
    # Given a running job whose spot interruption warning arrives an hour in
    world = World()
    world.running()
    world.advance(hours=1)
    notice = world.clock.now()
    world.handle(recorded_event(events_dir, WARNING, instance_id=world.attempt().instance_id, at=notice))
    # When Recover closes the attempt (after its final checkpoint, or once it gave up waiting for it), and
    # the instance's `terminated` state change, two minutes after the notice, is handled after that close
    world.checkpoint(attempt=1, seq=0, work_done_hours=1.0, final=recover_after < timedelta(seconds=120))
    world.clock.current = notice + recover_after
    assert world.recover(failure=error("SpotInterrupted")).action == "relaunch"
    world.advance(seconds=20)
    world.handle(gone(events_dir, world, notice + timedelta(minutes=2)))
    # Then its bill ends at the termination, not at the close, and the job's cost says so
    expected = LAUNCH_PRICE * (1 + 2 / 60)
    attempt = world.attempt()
    assert attempt.outcome is AttemptOutcome.INTERRUPTED
    assert attempt.ended_at == notice + recover_after
    assert attempt.billed_until == notice + timedelta(minutes=2)
    assert attempt.cost(world.clock.now()) == pytest.approx(expected)
    assert world.job().cost_usd == pytest.approx(expected)


def test_a_duplicated_and_reordered_termination_bills_once_until_the_first_state_that_ends_it(
    events_dir: Path,
) -> None:
    # Given a job whose price doubles an hour in, finalized two hours in: its instance went `shutting-down`
    # at once and `terminated` 40 s later
    world = World()
    world.running()
    doubles_at(world, T0 + timedelta(hours=1))
    world.advance(hours=2)
    world.finalize(outcome="SUCCEEDED")
    shutting_down = gone(events_dir, world, world.clock.now(), state="shutting-down")
    terminated = gone(events_dir, world, world.clock.now() + timedelta(seconds=40))
    # When `terminated` is handled first, then `shutting-down`, then `terminated` again (a duplicate)
    world.advance(minutes=1)
    for event in (terminated, shutting_down, terminated):
        world.handle(event)
    # Then the bill ends when the instance went `shutting-down`, counted once in the job's cost
    expected = 0.35 + 0.70
    assert world.attempt().billed_until == shutting_down.time
    assert world.attempt().cost_usd == pytest.approx(expected)
    assert world.job().cost_usd == pytest.approx(expected)
    # And the duplicate asked EC2 for nothing (only the reports that moved the end did)
    assert len(world.compute.history_requests) == 2


def test_the_budget_counts_the_spot_price_in_effect_not_the_launch_price() -> None:
    # Given a job capped at $1 in all, launched at $0.35/h, whose pool's price doubles an hour in
    world = World()
    world.running(limits={"max_total_cost": 1.0})
    doubles_at(world, T0 + timedelta(hours=1))
    world.compute.set_state(str(world.attempt().instance_id), "running")
    # When reconcile runs 1.5 hours in: $0.525 at the launch price, $0.70 at the prices in effect; then 1.95 h in
    world.advance(hours=1.5)
    assert world.reconcile().over_budget == []
    world.advance(minutes=27)
    report = world.reconcile()
    # Then the spend that reached the cap is the integrated one ($0.35 + 0.95 h at $0.70 = $1.015), where the
    # launch price would have counted $0.68 and let the job run on
    assert report.over_budget == ["train-1"]
    [result] = world.workflow.task_results
    assert result.error == "BudgetExhausted"
    assert result.cause is not None
    assert '"spent_usd": 1.015' in result.cause


def test_reconcile_settles_a_bill_whose_state_change_was_missed(events_dir: Path) -> None:
    # Given a job whose price doubles an hour in, interrupted two hours in: Recover closes the attempt and
    # terminates its instance, whose state change never arrives
    world = World()
    world.running()
    doubles_at(world, T0 + timedelta(hours=1))
    world.advance(hours=2)
    closed_at = world.clock.now()
    world.checkpoint(attempt=1, seq=0, work_done_hours=1.0, final=True)
    world.recover(failure=error("SpotInterrupted"))
    # When reconcile runs after the grace the state change had to arrive in
    world.advance(minutes=10)
    world.reconcile()
    # Then the attempt is billed until its close (when Recover terminated the instance), at the prices in effect
    attempt = world.attempt()
    assert attempt.billed_until == closed_at
    assert attempt.cost_usd == pytest.approx(0.35 + 0.70)
    assert world.job().cost_usd == pytest.approx(0.35 + 0.70)
