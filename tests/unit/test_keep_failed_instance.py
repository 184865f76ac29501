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
