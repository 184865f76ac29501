"""Reconcile (the schedule's safety net for missed events) and cancel (the user's `spotrelay cancel`)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from control_builders import HEARTBEAT_SECONDS, World, error, make_job
from fakes import FakeCompute

from spotrelay.config import TAG_MANAGED
from spotrelay.control.ports import InstanceState, LaunchRequest
from spotrelay.models import AttemptOutcome, JobState

# ============================================================================================= Reconcile


def stray_instance(world: World, instance_id: str, *, launched_minutes_ago: float) -> None:
    """An instance tagged as ours that no attempt knows (its launch was never recorded)."""
    world.compute.instances[instance_id] = InstanceState(
        instance_id=instance_id,
        state="running",
        tags={TAG_MANAGED: "true"},
        launched_at=world.clock.now() - timedelta(minutes=launched_minutes_ago),
    )


def test_reconcile_terminates_a_managed_instance_no_attempt_knows_once_past_the_grace() -> None:
    # Given two instances tagged as ours that no attempt knows: one launched 10 minutes ago, one 1 minute ago
    world = World()
    stray_instance(world, "i-0000000000000a01", launched_minutes_ago=10)
    stray_instance(world, "i-0000000000000a02", launched_minutes_ago=1)
    # When reconcile runs
    report = world.reconcile()
    # Then the old one is terminated; the fresh one may still be recorded by its launch, and is left alone
    assert report.terminated_orphans == ["i-0000000000000a01"]
    assert world.compute.instances["i-0000000000000a01"].state == "terminated"
    assert world.compute.instances["i-0000000000000a02"].state == "running"


def test_recovery_terminates_the_instance_of_the_attempt_it_closes() -> None:
    # Given a job whose user code failed on attempt 1 (its instance still up)
    world = World()
    first = world.running()
    world.advance(hours=1)
    # When Recover closes the attempt
    world.recover(failure=error("JobFailed", exit_code=1))
    # Then its instance is terminated at once: no second instance is billed while the job relaunches
    assert world.compute.instances[str(first.instance_id)].state == "terminated"


def test_reconcile_terminates_the_instance_of_an_attempt_that_has_ended() -> None:
    # Given a job that relaunched as attempt 2, while attempt 1's instance survived its termination
    world = World()
    first = world.running()
    world.advance(hours=1)
    world.recover(failure=error("JobFailed", exit_code=1))
    world.compute.set_state(str(first.instance_id), "running")
    second = world.relaunched(token="token-2")
    # When reconcile runs
    report = world.reconcile()
    # Then the ended attempt's instance is terminated, the live one's is not
    assert report.terminated_orphans == [first.instance_id]
    assert world.compute.instances[str(first.instance_id)].state == "terminated"
    assert world.compute.instances[str(second.instance_id)].state == "pending"


@pytest.mark.parametrize("instance_state", ["terminated", "stopped", "unknown"])
def test_reconcile_fails_the_run_task_of_a_live_attempt_whose_instance_is_gone(instance_state: str) -> None:
    # Given a running job whose instance went away and whose state-change event was missed
    world = World()
    attempt = world.running()
    instance_id = str(attempt.instance_id)
    if instance_state == "unknown":
        del world.compute.instances[instance_id]  # EC2 no longer knows it
    else:
        world.compute.set_state(instance_id, instance_state)
    world.advance(minutes=10)  # past the grace a fresh launch gets to show up in DescribeInstances
    # When reconcile runs
    report = world.reconcile()
    # Then the Run task fails with InstanceLost, as the event would have made it
    assert report.lost_attempts == ["train-1#1"]
    assert world.fail_results("token-1") == ["InstanceLost"]
    cause = json.loads(str(world.workflow.task_results[0].cause))
    assert cause == {"instance_id": instance_id, "state": instance_state, "by": "reconcile"}


def test_reconcile_gives_a_just_launched_instance_time_to_show_up() -> None:
    # Given an instance launched a minute ago that DescribeInstances does not list yet
    world = World()
    attempt = world.running()
    del world.compute.instances[str(attempt.instance_id)]
    world.advance(minutes=1)
    # When reconcile runs
    report = world.reconcile()
    # Then the attempt is not called lost
    assert report.lost_attempts == []
    assert world.workflow.task_results == []


def test_reconcile_fails_the_run_task_of_a_job_that_spent_its_budget() -> None:
    # Given a job capped at $1 in total, running for 4 h on a pool that costs more than $0.25/h
    world = World()
    attempt = world.running(limits={"max_total_cost": 1.0})
    world.compute.set_state(str(attempt.instance_id), "running")
    world.advance(hours=4)
    # When reconcile runs
    report = world.reconcile()
    # Then the Run task fails with BudgetExhausted, naming what was spent
    assert report.over_budget == ["train-1"]
    assert world.fail_results("token-1") == ["BudgetExhausted"]
    assert json.loads(str(world.workflow.task_results[0].cause))["max_total_cost"] == 1.0


def test_reconcile_leaves_a_healthy_running_job_alone() -> None:
    # Given a running job whose instance runs and whose execution runs
    world = World()
    attempt = world.running()
    world.compute.set_state(str(attempt.instance_id), "running")
    world.advance(hours=1)
    # When reconcile runs
    report = world.reconcile()
    # Then nothing is terminated, failed, repaired or started
    assert report.model_dump() == {
        "terminated_orphans": [],
        "lost_attempts": [],
        "over_budget": [],
        "repaired_jobs": [],
        "restarted_executions": [],
    }
    assert world.workflow.task_results == []
    assert world.compute.terminated == []


def test_reconcile_does_not_report_an_interrupted_instance_as_lost() -> None:
    # Given a job whose interruption warning was handled and whose instance has since terminated
    world = World()
    attempt = world.running()
    world.warned()
    world.compute.set_state(str(attempt.instance_id), "terminated")
    # When reconcile runs before Recover has closed the attempt
    report = world.reconcile()
    # Then the Run task is not failed a second time with InstanceLost
    assert report.lost_attempts == []
    assert world.workflow.task_results == []


def test_reconcile_fails_an_active_job_whose_execution_has_ended() -> None:
    # Given a running job whose JobLifecycle execution ended FAILED without finalizing it
    world = World()
    world.running()
    world.workflow.executions["train-1"].status = "FAILED"
    # When reconcile runs
    report = world.reconcile()
    # Then the job is FAILED, saying what happened
    assert report.repaired_jobs == ["train-1"]
    job = world.job()
    assert job.state is JobState.FAILED
    assert job.failure_reason == "ExecutionEnded: the JobLifecycle execution ended FAILED before the job did"
    assert job.ended_at == world.clock.now()


def test_reconcile_terminates_the_instance_of_a_job_it_failed_because_its_execution_ended() -> None:
    # Given a running job whose execution ended FAILED without finalizing it (its instance still up)
    world = World()
    attempt = world.running()
    world.workflow.executions["train-1"].status = "FAILED"
    # When reconcile runs, and runs again on the next schedule
    world.reconcile()
    world.advance(minutes=10)
    world.reconcile()
    # Then the job's instance is terminated: nothing runs, or bills, for a FAILED job
    assert world.job().state is JobState.FAILED
    assert world.compute.instances[str(attempt.instance_id)].state == "terminated"


class UserCancelsDuringLaunch(FakeCompute):
    """The user's `spotrelay cancel` lands while Launch is waiting for RunInstances to answer."""

    def __init__(self, world: World) -> None:
        super().__init__(world.compute.prices)
        self.world = world

    def launch(self, request: LaunchRequest) -> str:
        self.world.cancel(request.job_id)
        return super().launch(request)


def test_reconcile_terminates_an_instance_launched_for_a_job_cancelled_during_its_launch() -> None:
    # Given a job cancelled (execution stopped) while Launch was starting its instance, which Launch then recorded
    world = World()
    world.admitted()
    world.place()
    world.compute = UserCancelsDuringLaunch(world)
    launched = world.launch()
    assert world.job().state is JobState.CANCELLED
    # When reconcile runs, past the orphan grace
    world.advance(minutes=10)
    world.reconcile()
    # Then the instance is terminated: nothing runs, or bills, for a CANCELLED job
    assert world.compute.instances[str(launched["instance_id"])].state == "terminated"


def test_reconcile_starts_the_execution_of_an_active_job_that_has_none() -> None:
    # Given an admitted job whose execution never started
    world = World()
    world.store.create_job(make_job(state=JobState.PLACING))
    # When reconcile runs
    report = world.reconcile()
    # Then its execution is started, named by the job id
    assert report.restarted_executions == ["train-1"]
    assert world.workflow.executions["train-1"].payload == {"job_id": "train-1", "heartbeat_seconds": HEARTBEAT_SECONDS}


# ================================================================================================ Cancel


def test_cancelling_a_queued_job_ends_it_with_nothing_to_terminate() -> None:
    # Given a job waiting in the queue
    world = World()
    world.store.create_job(make_job())
    # When the user cancels it
    result = world.cancel()
    # Then it is CANCELLED, and nothing was terminated or stopped
    assert (result.state, result.terminated, result.already_ended) == (JobState.CANCELLED, [], False)
    job = world.job()
    assert job.state is JobState.CANCELLED
    assert job.failure_reason == "JobCancelled: cancelled by the user"
    assert job.ended_at == world.clock.now()
    assert world.compute.terminated == []
    assert world.workflow.executions == {}


def test_cancelling_a_running_job_terminates_its_instance_and_stops_its_execution() -> None:
    # Given a job that has run for two hours at $0.35/h
    world = World()
    attempt = world.running()
    world.advance(hours=2)
    # When the user cancels it
    result = world.cancel()
    # Then its instance is terminated and its attempt closed as CANCELLED now
    assert result.terminated == [attempt.instance_id]
    assert world.compute.instances[str(attempt.instance_id)].state == "terminated"
    closed = world.attempt()
    assert (closed.outcome, closed.ended_at) == (AttemptOutcome.CANCELLED, world.clock.now())
    # And the Run task fails with JobCancelled, the execution is stopped, the job is CANCELLED and charged
    assert world.fail_results("token-1") == ["JobCancelled"]
    assert world.workflow.executions["train-1"].status == "ABORTED"
    # And the dispatcher is woken: the job's slot is free for the next queued job
    assert world.wakeup.reasons == ["job train-1 cancelled"]
    job = world.job()
    assert job.state is JobState.CANCELLED
    assert job.cost_usd == pytest.approx(0.70)


def test_cancelling_a_waiting_job_stops_its_execution() -> None:
    # Given an admitted job waiting for a feasible pool
    world = World()
    world.admitted(limits={"max_price_per_hour": 0.3})
    assert world.place().action == "wait"
    # When the user cancels it
    world.cancel()
    # Then it is CANCELLED and its execution stopped, with nothing to terminate
    assert world.job().state is JobState.CANCELLED
    assert world.workflow.executions["train-1"].status == "ABORTED"
    assert world.compute.terminated == []


def test_cancelling_twice_does_nothing_the_second_time() -> None:
    # Given a running job the user cancelled
    world = World()
    world.running()
    world.advance(hours=1)
    world.cancel()
    job = world.job()
    # When the user cancels it again
    world.advance(minutes=5)
    again = world.cancel()
    # Then it says the job had already ended, and nothing more is terminated, failed or changed
    assert (again.state, again.terminated, again.already_ended) == (JobState.CANCELLED, [], True)
    assert len(world.compute.terminated) == 1
    assert world.fail_results("token-1") == ["JobCancelled"]
    assert world.job() == job


def test_cancelling_a_finished_job_leaves_it_as_it_ended() -> None:
    # Given a job that succeeded
    world = World()
    world.running()
    world.advance(hours=1)
    world.finalize(outcome="SUCCEEDED")
    # When the user cancels it
    result = world.cancel()
    # Then it stays SUCCEEDED
    assert (result.state, result.already_ended) == (JobState.SUCCEEDED, True)
    assert world.job().state is JobState.SUCCEEDED
