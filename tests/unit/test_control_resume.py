"""Resume (`spotrelay resume JOB`): a FAILED or CANCELLED job queued again as a new run, from its newest
committed checkpoint, its earlier attempts and cost kept; everything else refused with the reason."""

from __future__ import annotations

import pytest
from control_builders import World

from spotrelay.control.resume import RESUME_SETTLE_SECONDS
from spotrelay.models import AttemptOutcome, JobState
from spotrelay.models.records import MAX_RUNS


def cancelled_after_a_checkpoint(world: World) -> None:
    """train-1 ran an hour on attempt 1, committed a checkpoint of 0.8 h of work, and was cancelled."""
    world.running(work_hours=4)
    world.advance(hours=1)
    world.checkpoint(attempt=1, seq=2, work_done_hours=0.8)
    world.cancel()
    assert world.job().state is JobState.CANCELLED
    world.advance(seconds=RESUME_SETTLE_SECONDS)  # no step of the cancelled run can still be running


def test_a_cancelled_job_resumes_as_a_new_run_from_its_checkpoint_with_its_attempts_and_cost_kept() -> None:
    # Given a job cancelled after a checkpoint, with a cancel note the dispatcher would act on
    world = World()
    cancelled_after_a_checkpoint(world)
    world.store.request_cancel_before_admission("train-1")
    spent = world.job().cost_usd
    assert spent > 0
    # When the user resumes it
    result = world.resume()
    # Then it is QUEUED again as run 2, from attempt 1's checkpoint, its cost kept, and the dispatcher woken
    assert (result.resumed, result.state, result.run) == (True, JobState.QUEUED, 2)
    assert result.checkpoint == "attempt 1, seq 2"
    job = world.job()
    assert (job.state, job.run, job.resumed_at) == (JobState.QUEUED, 2, world.clock.now())
    assert (job.failure_reason, job.ended_at, job.cancel_requested) == (None, None, False)
    assert job.previous_failure_reason == "run 1 ended CANCELLED: JobCancelled: cancelled by the user"
    assert job.cost_usd == spent
    assert job.execution_name == "train-1-run2"
    assert world.wakeup.reasons[-1] == "job train-1 resumed (run 2)"
    # And the dispatcher admits it (the cancel note gone) under a new execution, and its next attempt is 2,
    # restoring the checkpoint
    report = world.dispatch()
    assert report.admitted == ["train-1"]
    assert world.workflow.executions["train-1-run2"].status == "RUNNING"
    assert world.workflow.executions["train-1"].status == "ABORTED"  # the first run's, stopped by the cancel
    assert world.place().action == "launch"
    launched = world.launch(token="token-2")
    assert launched["attempt"] == 2
    assert world.attempt(number=1).outcome is AttemptOutcome.CANCELLED
    assert world.job().attempts == 2


def test_a_failed_job_resumes_with_a_fresh_allowance_of_restarts_and_interruptions() -> None:
    # Given a job that FAILED having used up its interruptions and restarts, its execution ended
    world = World()
    world.running(limits={"max_restarts": 2, "max_interruptions": 3})
    world.finalize(outcome="FAILED", error="TooManyInterruptions", cause="3 interruptions")
    job, version = world.store.get_job("train-1")
    world.store.put_job(job.model_copy(update={"restarts": 2, "interruptions": 3}), version)
    world.workflow.executions["train-1"].status = "FAILED"
    world.advance(seconds=RESUME_SETTLE_SECONDS)
    failed = world.job()
    # When resumed, Then the new run's counters start again, and its attempts stay counted
    result = world.resume()
    assert result.resumed
    job = world.job()
    assert (job.restarts, job.interruptions, job.attempts) == (0, 0, failed.attempts)
    assert result.checkpoint is None  # no checkpoint: it starts afresh


def test_a_repeated_resume_answers_what_the_first_did_and_queues_nothing_more() -> None:
    world = World()
    cancelled_after_a_checkpoint(world)
    first = world.resume()
    again = world.resume()
    assert first.resumed
    assert (again.resumed, again.already, again.run, again.refused) == (False, True, 2, None)
    assert world.job().run == 2
    assert len(world.wakeup.reasons) == 2  # the cancel's and the first resume's


@pytest.mark.parametrize(
    ("setup", "says"),
    [
        ("succeeded", "it SUCCEEDED: nothing is left to resume"),
        ("running", "it is RUNNING: only a FAILED or CANCELLED job resumes"),
        ("spent", "has cost $"),
        ("still ending", "its run 1 is still ending (execution train-1 RUNNING): try again in a minute"),
        ("invalid", "its message was never a valid job"),
        ("unschedulable", "it failed Unschedulable: no allowed type fits: it would fail so again"),
        ("corrupt", "a new run would restore the same checkpoint"),
        ("just ended", "its run 1 is still ending (ended at 10:00:00 UTC; a step it started may still be running)"),
        ("too many runs", f"it has run {MAX_RUNS} times, the most a job may"),
    ],
)
def test_what_cannot_resume_is_refused_with_the_reason_and_left_as_it_was(setup: str, says: str) -> None:
    world = World()
    if setup == "succeeded":
        world.running()
        world.finalize(outcome="SUCCEEDED")
    elif setup == "running":
        world.running()
    elif setup == "spent":
        world.running(limits={"max_total_cost": 5})
        world.finalize(outcome="FAILED", error="MaxCostExceeded", cause="over")
        job, version = world.store.get_job("train-1")
        world.store.put_job(job.model_copy(update={"cost_usd": 5.0}), version)
    elif setup == "still ending":
        world.running()
        job, version = world.store.get_job("train-1")
        world.store.put_job(job.model_copy(update={"state": JobState.FAILED, "failure_reason": "x"}), version)
    elif setup == "invalid":
        world.running()
        world.finalize(outcome="FAILED", error="InvalidJob", cause="bad")
        job, version = world.store.get_job("train-1")
        world.store.put_job(
            job.model_copy(update={"failure_reason": "InvalidJob: resources.gpus: must be >= 1"}), version
        )
    elif setup in {"unschedulable", "corrupt"}:
        world.running()
        world.finalize(outcome="FAILED", error="x", cause="x")
        job, version = world.store.get_job("train-1")
        why = "Unschedulable: no allowed type fits" if setup == "unschedulable" else "CheckpointCorrupt: sha256"
        world.store.put_job(job.model_copy(update={"failure_reason": why}), version)
    elif setup == "just ended":
        world.running()
        world.finalize(outcome="FAILED", error="JobFailed", cause="exit 1")
    elif setup == "too many runs":
        world.running()
        world.finalize(outcome="FAILED", error="JobFailed", cause="x")
        job, version = world.store.get_job("train-1")
        world.store.put_job(job.model_copy(update={"run": MAX_RUNS}), version)
    if setup not in {"running", "still ending"}:
        # the run's execution has ended; "just ended": stopped, a step it invoked perhaps still running
        world.workflow.executions["train-1"].status = "ABORTED" if setup == "just ended" else "FAILED"
    if setup != "just ended":
        world.advance(seconds=RESUME_SETTLE_SECONDS)
    before = world.job()
    result = world.resume()
    assert not result.resumed
    assert result.refused is not None
    assert says in result.refused
    assert world.job() == before


def test_an_unknown_job_is_refused_without_a_state() -> None:
    result = World().resume("nope-0123456789ab")
    assert result.state is None
    assert result.refused is not None
    assert "no record of job nope-0123456789ab: check the id" in result.refused


def test_a_run_that_just_ended_resumes_once_its_steps_cannot_be_running_any_more() -> None:
    # Given a job cancelled just now, its execution stopped (a step it had invoked may still be running)
    world = World()
    world.running()
    world.cancel()
    # When resumed within the settle time, Then it is refused; once past it, resumed
    world.advance(seconds=RESUME_SETTLE_SECONDS - 1)
    assert world.resume().refused is not None
    world.advance(seconds=1)
    assert world.resume().resumed


def test_a_resumed_job_past_its_deadline_says_it_runs_behind_schedule() -> None:
    world = World()
    world.running(work_hours=4, limits={"deadline_hours": 8})
    world.cancel()
    world.advance(hours=24)
    result = world.resume()
    assert result.resumed
    assert result.notes == [
        "its deadline (limits.deadline_hours 8, from its submission) has passed: it runs as a job behind "
        "schedule does, on on-demand where its limits allow it"
    ]


def test_a_run_whose_execution_reached_its_end_resumes_at_once() -> None:
    # Given a job whose run ended FAILED through its Finalize (every step returned)
    world = World()
    world.running()
    world.finalize(outcome="FAILED", error="JobFailed", cause="exit 1")
    world.workflow.executions["train-1"].status = "FAILED"
    # When resumed right away, Then it is queued again
    assert world.resume().resumed
