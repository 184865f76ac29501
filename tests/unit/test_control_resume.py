"""Resume (`spotrelay resume JOB`): a FAILED or CANCELLED job queued again as a new run, from its newest
committed checkpoint, its earlier attempts and cost kept; everything else refused with the reason."""

from __future__ import annotations

import pytest
from control_builders import World

from spotrelay.models import AttemptOutcome, JobState
from spotrelay.models.records import MAX_RUNS


def cancelled_after_a_checkpoint(world: World) -> None:
    """train-1 ran an hour on attempt 1, committed a checkpoint of 0.8 h of work, and was cancelled."""
    world.running(work_hours=4)
    world.advance(hours=1)
    world.checkpoint(attempt=1, seq=2, work_done_hours=0.8)
    world.cancel()
    assert world.job().state is JobState.CANCELLED


def test_a_cancelled_job_resumes_as_a_new_run_from_its_checkpoint_with_its_attempts_and_cost_kept() -> None:
    # Given a job cancelled after a checkpoint, with a cancel note the dispatcher would act on
    world = World()
    cancelled_after_a_checkpoint(world)
    world.store.request_cancel_before_admission("train-1")
    spent = world.job().cost_usd
    assert spent > 0
    # When the user resumes it
    world.advance(minutes=10)
    result = world.resume()
    # Then it is QUEUED again as run 2, from attempt 1's checkpoint, its cost kept, and the dispatcher woken
    assert (result.resumed, result.state, result.run) == (True, JobState.QUEUED, 2)
    assert result.checkpoint == "attempt 1, seq 2"
    job = world.job()
    assert (job.state, job.run, job.resumed_at) == (JobState.QUEUED, 2, world.clock.now())
    assert (job.failure_reason, job.ended_at, job.cancel_requested) == (None, None, False)
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
    elif setup == "too many runs":
        world.running()
        world.finalize(outcome="FAILED", error="JobFailed", cause="x")
        job, version = world.store.get_job("train-1")
        world.store.put_job(job.model_copy(update={"run": MAX_RUNS}), version)
    if setup not in {"running", "still ending"}:
        world.workflow.executions["train-1"].status = "FAILED"  # the run's execution has ended
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
    assert "no job nope-0123456789ab" in result.refused
