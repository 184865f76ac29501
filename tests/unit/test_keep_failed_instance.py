"""`recovery.keep_failed_instance_minutes`: the instance of a job whose code failed for good is kept to look at,
billed to the job, shown by `status` with the line that reaches it, and terminated by reconcile once the time
is up; nothing else ever keeps an instance."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from control_builders import World, error, recorded_event

from spotrelay.aws.deployed_stack import JobStatus
from spotrelay.cli.job_status import describe_status
from spotrelay.control.resume import RESUME_SETTLE_SECONDS
from spotrelay.models import AttemptOutcome, JobSpecError, JobState, parse_job_spec
from spotrelay.models.job_spec import JobSpec


def _terminated(world: World, instance_id: str) -> bool:
    return world.compute.instances[instance_id].state == "terminated"


def test_a_failed_jobs_instance_is_kept_billed_shown_and_terminated_when_the_time_is_up(events_dir: Path) -> None:
    # Given a job that asks to keep a failed instance 30 minutes, allowed no restart, whose code fails
    world = World()
    attempt = world.running(recovery={"keep_failed_instance_minutes": 30}, limits={"max_restarts": 0})
    instance_id = str(attempt.instance_id)
    world.advance(hours=1)
    failed_at = world.clock.now()
    result = world.recover(failure=error("JobFailed", exit_code=3))
    assert result.action == "fail"
    world.finalize(outcome="FAILED", error={"Error": "JobFailed", "Cause": '{"exit_code": 3}'})
    # Then the job is FAILED, its attempt closed, and its instance still runs until 30 minutes after the failure
    assert world.job().state is JobState.FAILED
    kept = world.attempt()
    assert kept.outcome is AttemptOutcome.FAILED
    assert kept.kept_until == failed_at + timedelta(minutes=30)
    assert not _terminated(world, instance_id)
    # And status says so, with the command that reaches it, and counts its cost while it is kept
    world.advance(minutes=10)
    lines = describe_status(JobStatus(world.job(), [world.attempt()]), world.clock.now())
    (line,) = [line for line in lines if "kept to debug" in line]
    assert f"aws ssm start-session --target {instance_id} --region us-east-1" in line
    assert world.attempt().billed_hours(world.clock.now()) == pytest.approx(1 + 10 / 60)
    # When reconcile runs while it is kept, it is left running; once the time is up, it is terminated
    world.reconcile()
    assert not _terminated(world, instance_id)
    world.advance(minutes=21)
    report = world.reconcile()
    assert instance_id in report.terminated_orphans
    assert _terminated(world, instance_id)
    # And its bill, settled at the state change, counts the kept time, in the job's cost too
    world.handle(
        recorded_event(
            events_dir, "instance-state-change-terminated.json", instance_id=instance_id, at=world.clock.now()
        )
    )
    settled = world.attempt()
    assert settled.cost_usd == pytest.approx(settled.hourly_price * (1 + 31 / 60), rel=1e-3)
    assert world.job().cost_usd == pytest.approx(settled.cost_usd)


@pytest.mark.parametrize(
    ("failure", "restarts"),
    [
        (error("JobFailed", exit_code=3), 1),  # restarted: the next attempt runs, nothing to keep
        (error("SpotInterrupted"), 0),  # an interruption is not the job's failure
        (error("InstanceLost"), 0),
    ],
)
def test_no_instance_is_kept_but_for_a_job_whose_code_failed_for_good(failure: dict[str, str], restarts: int) -> None:
    world = World()
    attempt = world.running(recovery={"keep_failed_instance_minutes": 30}, limits={"max_restarts": restarts})
    world.advance(minutes=30)
    world.recover(failure=failure)
    assert world.attempt().kept_until is None
    assert _terminated(world, str(attempt.instance_id))


def test_a_job_that_did_not_ask_keeps_nothing() -> None:
    world = World()
    attempt = world.running(limits={"max_restarts": 0})
    world.recover(failure=error("JobFailed", exit_code=1))
    world.finalize(outcome="FAILED", error={"Error": "JobFailed"})
    assert world.attempt().kept_until is None
    assert _terminated(world, str(attempt.instance_id))


@pytest.mark.parametrize("minutes", [-1, 24 * 60 + 1, 1.5, "10"])
def test_the_keep_time_is_whole_minutes_up_to_a_day(minutes: object) -> None:
    spec = {"name": "j", "run": {"command": "x"}, "resources": {"gpus": 1}}
    with pytest.raises(JobSpecError, match=r"recovery\.keep_failed_instance_minutes"):
        parse_job_spec({**spec, "recovery": {"keep_failed_instance_minutes": minutes}})
    assert isinstance(parse_job_spec({**spec, "recovery": {"keep_failed_instance_minutes": 60}}), JobSpec)


# --- what must never keep one, or keep one too long (a hostile review's cases) ----------------------------

KEEP = {"keep_failed_instance_minutes": 30}


def _failed_and_kept(world: World) -> str:
    attempt = world.running(recovery=KEEP, limits={"max_restarts": 0})
    world.advance(hours=1)
    assert world.recover(failure=error("JobFailed", exit_code=3)).action == "fail"
    world.finalize(outcome="FAILED", error={"Error": "JobFailed", "Cause": '{"exit_code": 3}'})
    assert world.attempt().kept_until is not None
    return str(attempt.instance_id)


def test_a_job_out_of_budget_keeps_nothing_and_a_keep_stops_where_the_budget_does() -> None:
    # A JobFailed with restarts left but the budget spent fails BudgetExhausted: nothing kept
    world = World()
    attempt = world.running(recovery=KEEP, limits={"max_restarts": 3, "max_total_cost": 1.0})
    world.advance(hours=3)
    result = world.recover(failure=error("JobFailed", exit_code=3))
    assert (result.action, result.error) == ("fail", "BudgetExhausted")
    assert world.attempt().kept_until is None
    assert _terminated(world, str(attempt.instance_id))
    # A job with $0.05 of its budget left keeps its instance only as long as that pays for
    world = World()
    attempt = world.running(recovery=KEEP, limits={"max_restarts": 0, "max_total_cost": 1.0})
    hours_left = (1.0 - 0.05) / attempt.hourly_price
    world.advance(hours=hours_left)
    world.recover(failure=error("JobFailed", exit_code=3))
    kept_until = world.attempt().kept_until
    assert kept_until is not None
    expected = timedelta(hours=0.05 / attempt.hourly_price)
    assert kept_until - world.clock.now() == pytest.approx(expected, abs=timedelta(seconds=1))


def test_cancel_of_the_failed_job_releases_its_kept_instance_and_settles_its_bill() -> None:
    world = World()
    instance_id = _failed_and_kept(world)
    world.advance(minutes=5)
    result = world.cancel()
    assert result.already_ended
    assert result.terminated == [instance_id]
    assert _terminated(world, instance_id)
    assert world.attempt().cost_usd == pytest.approx(world.attempt().hourly_price * (1 + 5 / 60), rel=1e-3)


def test_a_record_that_keeps_longer_than_a_day_is_not_believed() -> None:
    world = World()
    instance_id = _failed_and_kept(world)
    kept = world.attempt()
    assert kept.ended_at is not None
    world.store.put_attempt(kept.model_copy(update={"kept_until": kept.ended_at + timedelta(days=30)}))
    world.advance(days=1, minutes=1)
    world.reconcile()
    assert _terminated(world, instance_id)


def test_the_bill_is_settled_when_reconcile_ends_the_keep_even_if_the_state_change_is_lost() -> None:
    world = World()
    instance_id = _failed_and_kept(world)
    world.advance(minutes=31)
    assert instance_id in world.reconcile().terminated_orphans
    settled = world.attempt()
    assert settled.cost_usd == pytest.approx(settled.hourly_price * (1 + 31 / 60), rel=1e-3)
    assert world.job().cost_usd == pytest.approx(settled.cost_usd)


def test_a_resumed_run_that_ends_terminates_the_earlier_runs_kept_instance() -> None:
    world = World()
    instance_id = _failed_and_kept(world)
    world.workflow.executions["train-1"].status = "FAILED"
    world.advance(seconds=RESUME_SETTLE_SECONDS)
    assert world.resume().resumed
    world.dispatch()
    world.relaunched(token="token-2")
    world.finalize(outcome="SUCCEEDED")
    assert world.job().state is JobState.SUCCEEDED
    assert _terminated(world, instance_id)


def test_a_recover_that_comes_after_a_cancel_keeps_nothing() -> None:
    world = World()
    world.running(recovery=KEEP, limits={"max_restarts": 0})
    world.advance(hours=1)
    world.cancel()
    world.recover(failure=error("JobFailed", exit_code=3))  # the step the stopped execution had invoked
    assert world.attempt().kept_until is None


def test_reconcile_goes_on_over_an_instance_whose_job_was_deleted_and_terminates_it() -> None:
    world = World()
    instance_id = _failed_and_kept(world)
    del world.store.jobs["train-1"]
    world.advance(minutes=31)
    report = world.reconcile()
    assert instance_id in report.terminated_orphans
