"""Money at the price in effect (spotrelay.models.billing): an attempt's bill runs until EC2 reports its
instance gone, at the spot prices over that time, and the job's cost, its budget and `spotrelay cost`
count it so; a duplicate or reordered termination bills once."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from control_builders import (
    CHEAPEST,
    FORBIDDEN_PRICES,
    PRICES,
    SECOND,
    T0,
    THIRD,
    World,
    error,
    limits,
    recorded_event,
    spec_dict,
)
from fakes import FakeCompute

from spotrelay.aws.deployed_stack import JobStatus
from spotrelay.config import ORPHAN_GRACE_SECONDS
from spotrelay.control.ec2_events import Ec2Event
from spotrelay.control.resume import RESUME_SETTLE_SECONDS
from spotrelay.models import AttemptOutcome, PriceQuote

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


class QuoteCountingCompute(FakeCompute):
    """The world's EC2, counting the calls for current spot prices (`spot_prices`)."""

    def __init__(self) -> None:
        super().__init__(
            {(p.instance_type, p.availability_zone): usd for p, usd in (PRICES | FORBIDDEN_PRICES).items()}
        )
        self.quote_requests: list[tuple[list[str], list[str]]] = []

    def spot_prices(self, instance_types: Sequence[str], zones: Sequence[str], now: datetime) -> list[PriceQuote]:
        self.quote_requests.append((list(instance_types), list(zones)))
        return super().spot_prices(instance_types, zones, now)


def test_a_spot_price_rise_holds_the_job_that_would_take_the_budget_past_its_hourly_limit() -> None:
    # Given a budget of $2.5/h, and a 1-GPU job running on g6.2xlarge spot at $0.30/h: counted at its estimate,
    # g6.xlarge's on-demand $0.8048/h, like each job the dispatcher admits
    compute = QuoteCountingCompute()
    world = World(compute=compute)
    third = (THIRD.instance_type, THIRD.availability_zone)
    compute.prices[third] = 0.30
    assert world.running("busy", "token-busy").pool == THIRD
    budget = limits(budget_usd_per_hour=2.5)
    world.queue.send(json.dumps(spec_dict(name="first")))
    assert world.dispatch(budget).admitted == ["first-msg1"]  # $0.80 + $0.80 + $0.80 = $2.41/h
    # When its pool's spot price rises to $0.95/h (still below its on-demand price) and another job comes
    compute.price_changes[third] = [(world.clock.now(), 0.95)]
    world.queue.send(json.dumps(spec_dict(name="second")))
    compute.quote_requests.clear()
    report = world.dispatch(budget)
    # Then the busy job counts at the price in effect now, and the new job waits: it would take $2.56/h
    assert report.admitted == []
    assert report.held == {"second-msg2": "budget: $1.75/h in use + $0.80/h for this job > $2.5/h"}
    # And the prices were read in one call for the run, with no price history
    assert compute.quote_requests == [(["g6.2xlarge"], ["us-east-1a"])]
    assert compute.history_requests == []
    # And once the price falls back, the job is admitted
    compute.price_changes[third].append((world.advance(minutes=5), 0.30))
    assert world.dispatch(budget).admitted == ["second-msg2"]


def test_admission_goes_on_at_the_launch_prices_when_the_spot_prices_cannot_be_read() -> None:
    # Given a job running on g6.2xlarge spot, launched at $0.95/h, and a budget of $1.7/h
    world = World()
    world.compute.prices[(THIRD.instance_type, THIRD.availability_zone)] = 0.95
    world.compute.prices[(CHEAPEST.instance_type, CHEAPEST.availability_zone)] = 1.5
    world.compute.prices[(SECOND.instance_type, SECOND.availability_zone)] = 1.5
    assert world.running("busy", "token-busy").pool == THIRD
    world.compute.prices[(THIRD.instance_type, THIRD.availability_zone)] = 0.10
    world.queue.send(json.dumps(spec_dict(name="next")))
    # When EC2 throttles the price read
    world.compute.fail_next["spot_prices"] = RuntimeError("RequestLimitExceeded")
    report = world.dispatch(limits(budget_usd_per_hour=1.7))
    # Then the run goes on, the busy job counted at its launch price ($0.95/h > its $0.80/h estimate)
    assert report.held == {"next-msg1": "budget: $0.95/h in use + $0.80/h for this job > $1.7/h"}


def test_reconcile_reads_each_pools_price_history_once_a_run_for_all_its_budgeted_attempts() -> None:
    # Given three budgeted jobs launched an hour apart in one pool at $0.35/h, whose price doubles at 2.5 h
    world = World()
    caps = {"job-a": 1.5, "job-b": 1.2, "job-c": 1.0}
    for job_id, cap in caps.items():
        assert world.running(job_id, f"token-{job_id}", limits={"max_total_cost": cap}).pool == CHEAPEST
        world.advance(hours=1)
    doubles_at(world, T0 + timedelta(hours=2.5))
    world.advance(minutes=30)
    asked = len(world.compute.history_requests)
    # When reconcile runs 3.5 h after the first launch
    report = world.reconcile()
    # Then the pool's history was read once, over the window all three need (the first launch to now)
    assert world.compute.history_requests[asked:] == [(CHEAPEST, T0, world.clock.now())]
    # And each job's spend is what a read of its own window gives: a $1.575 (cap $1.5) and b $1.225 (cap $1.2)
    # over their caps, where the launch price counts $1.225 and $0.875; c $0.875, under its $1
    assert report.over_budget == ["job-a", "job-b"]
    spent = {r.task_token: json.loads(str(r.cause))["spent_usd"] for r in world.workflow.task_results}
    assert spent == {"token-job-a": pytest.approx(1.575), "token-job-b": pytest.approx(1.225)}
    # And the next run reads it once again, not once per attempt
    world.advance(minutes=5)
    world.reconcile()
    assert len(world.compute.history_requests) == asked + 2


def failed_over_budget() -> World:
    """A job with a $1.50 budget, launched at $0.35/h, whose pool's price doubles an hour in, failed over budget
    three hours in (1 h at $0.35 + 2 h at $0.70 = $1.75), before EC2 reports its instance gone."""
    world = World()
    world.running(limits={"max_total_cost": 1.5})
    doubles_at(world, T0 + timedelta(hours=1))
    world.advance(hours=3)
    world.finalize(outcome="FAILED", error="BudgetExhausted", cause="spent $1.75")
    world.workflow.executions["train-1"].status = "FAILED"
    return world


def test_a_budgeted_job_resumes_only_once_its_bills_are_settled_and_under_its_budget(events_dir: Path) -> None:
    # Given a job failed over budget before EC2 reported its instance gone
    world = failed_over_budget()
    world.advance(seconds=RESUME_SETTLE_SECONDS)
    # At the launch price the job seems to have cost $1.05, under its budget
    assert world.job().cost_usd == pytest.approx(3 * LAUNCH_PRICE)
    # When the user resumes it now, Then it is refused: its bill is not known yet
    result = world.resume()
    assert not result.resumed
    assert result.refused is not None
    assert "attempt 1 is not settled yet" in result.refused
    assert "limits.max_total_cost $1.50" in result.refused
    due = T0 + timedelta(hours=3, seconds=ORPHAN_GRACE_SECONDS)
    assert f"try again after {due:%H:%M:%S} UTC" in result.refused
    assert world.job().state.value == "FAILED"
    # And once the termination settles it at the prices in effect, the budget refuses it
    world.handle(gone(events_dir, world, T0 + timedelta(hours=3)))
    assert world.job().cost_usd == pytest.approx(1.75)
    result = world.resume()
    assert result.refused is not None
    assert "it has cost $1.75 of its limits.max_total_cost $1.50" in result.refused


def test_a_budgeted_job_whose_termination_report_was_lost_resumes_and_its_run_spends_nothing_past_the_budget() -> None:
    # Given the job above, failed over budget, whose instance's `terminated` state change never comes
    world = failed_over_budget()
    # When the user resumes it once the report is overdue (not refused for ever: it was lost)
    world.advance(seconds=ORPHAN_GRACE_SECONDS)
    result = world.resume()
    assert result.resumed, result.refused
    # Then the new run's reconcile settles the bill at the prices in effect, and Place has no budget left to
    # launch with
    assert world.dispatch().admitted == ["train-1"]
    world.reconcile()
    assert world.attempt().cost_usd == pytest.approx(1.75)
    assert world.job().cost_usd == pytest.approx(1.75)
    assert world.place().action != "launch"
    assert len(world.compute.launches) == 1
