"""Reconcile (the schedule's safety net for missed events) and cancel (the user's `spotrelay cancel`)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from control_builders import CHEAPEST, HEARTBEAT_SECONDS, SECOND, THIRD, World, error, make_job, recorded_event
from fakes import FakeCompute, FakeJobStore, FunctionStopped

from spotrelay.config import TAG_MANAGED
from spotrelay.control.dispatcher import job_id_for
from spotrelay.control.lifecycle import InsufficientInstanceCapacity, LaunchThrottled
from spotrelay.control.ports import InstanceRef, InstanceState, LaunchRequest, UnreadableRecordError
from spotrelay.models import Attempt, AttemptOutcome, Job, JobSpec, JobState, Market, Pool

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


def gone(world: World, attempt: Attempt, instance_state: str) -> None:
    """The attempt's instance went away ("unknown": so long ago that EC2 no longer knows it)."""
    instance_id = str(attempt.instance_id)
    if instance_state == "unknown":
        del world.compute.instances[instance_id]
    else:
        world.compute.set_state(instance_id, instance_state)


def on_demand(world: World, attempt: Attempt) -> Attempt:
    """The attempt, on on-demand in the same zone instead of spot."""
    moved = attempt.model_copy(update={"pool": attempt.pool.model_copy(update={"market": Market.ON_DEMAND})})
    world.store.put_attempt(moved)
    return moved


@pytest.mark.parametrize("instance_state", ["terminated", "stopped", "unknown"])
def test_reconcile_fails_the_run_task_of_a_live_on_demand_attempt_whose_instance_is_gone(instance_state: str) -> None:
    # Given a job running on on-demand whose instance went away and whose state-change event was missed
    world = World()
    attempt = on_demand(world, world.running())
    gone(world, attempt, instance_state)
    world.advance(minutes=10)  # past the grace a fresh launch gets to show up in DescribeInstances
    # When reconcile runs
    report = world.reconcile()
    # Then the Run task fails with InstanceLost, as the event would have made it
    assert report.lost_attempts == ["train-1#1"]
    assert world.fail_results("token-1") == ["InstanceLost"]
    cause = json.loads(str(world.workflow.task_results[0].cause))
    assert cause == {"instance_id": attempt.instance_id, "state": instance_state, "by": "reconcile"}


@pytest.mark.parametrize("instance_state", ["terminated", "shutting-down", "unknown"])
def test_reconcile_takes_a_spot_instance_gone_before_any_warning_for_an_interruption(instance_state: str) -> None:
    # Given a job on spot whose instance went away with no interruption warning noted (the warning and the
    # state change missed, or late): its agent may have committed a final checkpoint at the notice
    world = World()
    attempt = world.running()
    gone(world, attempt, instance_state)
    world.advance(minutes=10)
    # When reconcile runs
    report = world.reconcile()
    # Then, as the state-change event would have, it is an interruption and not a loss: the Run task fails
    # with SpotInterrupted, the attempt notes the interruption, the pool is blocked and the interruption counted
    assert (report.interrupted_attempts, report.lost_attempts) == (["train-1#1"], [])
    assert world.fail_results("token-1") == ["SpotInterrupted"]
    cause = json.loads(str(world.workflow.task_results[0].cause))
    assert cause == {"instance_id": attempt.instance_id, "state": instance_state, "by": "reconcile"}
    assert world.attempt().interrupted_at == world.clock.now()
    assert world.blocked() == {CHEAPEST: world.clock.now() + timedelta(minutes=3)}  # the job's recovery.block_minutes
    assert world.store.pool_observations()[CHEAPEST.offering].interruptions == 1
    # And Recover waits for that final checkpoint instead of closing the attempt LOST at once
    assert world.recover(failure=error("SpotInterrupted")).action == "wait_checkpoint"
    # And the next reconcile does not fail the task again
    assert world.reconcile().interrupted_attempts == []
    assert len(world.workflow.task_results) == 1


@pytest.mark.parametrize(("market", "expected"), [(Market.SPOT, "SpotInterrupted"), (Market.ON_DEMAND, "InstanceLost")])
def test_reconcile_and_the_state_change_event_fail_a_gone_instance_the_same_way(
    events_dir: Path, market: Market, expected: str
) -> None:
    # Given two worlds with the same job, whose instance terminated with no warning noted
    worlds = []
    for _ in range(2):
        world = World()
        attempt = world.running()
        if market is Market.ON_DEMAND:
            attempt = on_demand(world, attempt)
        world.workflow.open_task("token-1")
        gone(world, attempt, "terminated")
        world.advance(minutes=10)
        worlds.append((world, attempt))
    # When one learns it from the state-change event and the other from reconcile
    (by_event, attempt), (by_reconcile, _) = worlds
    event = recorded_event(
        events_dir, "instance-state-change-terminated.json", instance_id=attempt.instance_id, at=by_event.clock.now()
    )
    by_event.handle(event)
    by_reconcile.reconcile()
    # Then both fail the Run task with the same error, and note the same on the attempt
    assert by_event.fail_results("token-1") == by_reconcile.fail_results("token-1") == [expected]
    assert by_event.attempt().interrupted_at == by_reconcile.attempt().interrupted_at


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
        "interrupted_attempts": [],
        "over_budget": [],
        "repaired_jobs": [],
        "restarted_executions": [],
        "standbys": [],
        "migrating": [],
        "dropped_standbys": [],
        "move_errors": [],
        "unreadable": [],
    }
    assert world.workflow.task_results == []
    assert world.compute.terminated == []


def test_a_job_whose_attempts_do_not_read_back_is_reported_and_the_others_are_reconciled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic import ValidationError

    from spotrelay.control.ports import UnreadableRecordError

    # Given two running jobs, the second's instance gone without a word, and the first's attempts unreadable
    world = World()
    first = world.running("train-1", "token-1")
    second = world.running("train-2", "token-2")
    world.compute.set_state(str(first.instance_id), "running")
    world.compute.set_state(str(second.instance_id), "terminated")
    world.advance(hours=1)
    attempts = world.store.attempts

    def spoilt(job_id: str) -> list[Attempt]:
        if job_id == "train-1":
            try:
                Attempt.model_validate_json('{"attempt": "one"}')
            except ValidationError as e:
                raise UnreadableRecordError.of("attempts of job train-1", e) from None
        return attempts(job_id)

    monkeypatch.setattr(world.store, "attempts", spoilt)
    # When reconcile runs
    report = world.reconcile()
    # Then the first is reported (and its instance left running: whose it is cannot be told), the second
    # reconciled as ever
    assert [line.split(":")[0] for line in report.unreadable] == ["train-1"]
    assert "does not read back" in report.unreadable[0]
    assert str(first.instance_id) not in world.compute.terminated
    assert report.interrupted_attempts == ["train-2#1"]


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


def cancelled_during_its_launch() -> World:
    """A job cancelled while Launch was starting its instance, which Launch recorded and, seeing the cancel,
    could not terminate (EC2 throttled the call): its attempt left open, its instance running."""
    world = World()
    world.admitted()
    world.place()
    world.compute = UserCancelsDuringLaunch(world)
    world.compute.fail_next["terminate"] = RuntimeError("RequestLimitExceeded")
    with pytest.raises(RuntimeError, match="RequestLimitExceeded"):
        world.launch()
    return world


def test_reconcile_terminates_an_instance_launched_for_a_job_cancelled_during_its_launch() -> None:
    # Given a job cancelled (execution stopped) while Launch was starting its instance, which Launch then
    # recorded and, seeing the cancel, could not terminate (EC2 throttled it): the attempt is left open
    world = cancelled_during_its_launch()
    assert world.job().state is JobState.CANCELLED
    instance_id = str(world.attempt().instance_id)
    assert world.compute.instances[instance_id].state != "terminated"
    # When reconcile runs, past the orphan grace
    world.advance(minutes=10)
    world.reconcile()
    # Then the instance is terminated: nothing runs, or bills, for a CANCELLED job
    assert world.compute.instances[instance_id].state == "terminated"
    assert world.attempt().outcome is not None


def test_reconcile_terminates_the_orphan_of_a_cancelled_job_even_when_closing_its_attempt_fails() -> None:
    # Given the instance left running for a job cancelled during its launch (its attempt left open), and a
    # record of the job that does not read back when reconcile totals the job again after closing it
    world = cancelled_during_its_launch()
    instance_id = str(world.attempt().instance_id)
    world.advance(minutes=10)
    world.store.fail_next["attempts"] = UnreadableRecordError.problem("attempt 2 of job train-1", "pool", "garbage")
    # When reconcile runs
    report = world.reconcile()
    # Then the instance is terminated all the same (not one more run, and bill, later), and the record reported
    assert world.compute.instances[instance_id].state == "terminated"
    assert instance_id in report.terminated_orphans
    assert report.unreadable


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


SUBMISSION = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"


def queued_message(world: World, spec: dict[str, Any] | None = None) -> str:
    """A job sent with a submission id, not read yet; returns the id the dispatcher will give it."""
    body = json.dumps(spec or {"name": "train", "run": {"command": "python train.py"}, "resources": {"gpus": 1}})
    world.queue.send(body, submission_id=SUBMISSION)
    return job_id_for("train", SUBMISSION)


def test_a_job_cancelled_before_its_message_is_read_is_recorded_cancelled_and_never_admitted() -> None:
    # Given a job whose message is still in the queue (no record)
    world = World()
    job_id = queued_message(world)
    # When the user cancels it
    result = world.cancel(job_id)
    # Then cancel says it has no record yet, and changes nothing else
    assert (result.state, result.before_admission, result.already_ended) == (None, True, False)
    # And when the dispatcher reads the message, the job is recorded CANCELLED, the message is gone, and
    # no execution starts
    report = world.dispatch()
    assert report.admitted == []
    job = world.job(job_id)
    assert job.state is JobState.CANCELLED
    assert job.failure_reason == "JobCancelled: cancelled by the user before it was admitted"
    assert world.queue.messages == []
    assert world.workflow.executions == {}


def test_a_cancel_note_is_kept_even_if_the_dispatcher_stopped_right_after_recording_the_job() -> None:
    # Given a job cancelled before its message was read, and a dispatcher run that records the job and then
    # stops (a timeout) before it reads the note; SQS delivers the message again
    world = World()
    job_id = queued_message(world)
    world.cancel(job_id)
    world.store.fail_next["cancel_requested_before_admission"] = FunctionStopped("the function timed out")
    with pytest.raises(FunctionStopped):
        world.dispatch()
    world.queue.redeliver()
    # When the dispatcher runs again
    report = world.dispatch()
    # Then the job is CANCELLED, not admitted, and no execution runs
    assert report.admitted == []
    assert world.job(job_id).state is JobState.CANCELLED
    assert world.workflow.executions == {}


def test_a_noted_job_the_stale_queue_index_still_lists_after_its_admission_is_left_to_cancel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a job admitted (its execution started) before a cancel note was written, and a queued index
    # that still lists it as QUEUED (the GSI lags the table)
    world = World()
    job_id = queued_message(world)
    world.dispatch()
    assert world.job(job_id).state is JobState.PLACING
    stale = world.job(job_id).model_copy(update={"state": JobState.QUEUED})
    world.store.request_cancel_before_admission(job_id)
    monkeypatch.setattr(world.store, "queued_jobs", lambda limit: [stale])
    # When the dispatcher runs again
    world.dispatch()
    # Then it does not write CANCELLED over a live job it cannot stop (that is `cancel_job`'s work)
    assert world.job(job_id).state is JobState.PLACING
    assert world.job(job_id).failure_reason is None


def test_a_message_recorded_under_older_rules_and_delivered_again_is_not_dead_lettered() -> None:
    # Given a job recorded from a message before a deadline needed work_hours, whose message SQS delivers
    # again after the upgrade (the earlier run stopped before deleting it)
    world = World()
    spec = {"name": "train", "run": {"command": "python train.py"}, "resources": {"gpus": 1}}
    spec["limits"] = {"deadline_hours": 5}
    job_id = queued_message(world, spec)
    now = world.clock.now()
    world.store.create_job(Job(job_id=job_id, spec=JobSpec.model_validate(spec), submitted_at=now, updated_at=now))
    # When the dispatcher reads it
    report = world.dispatch()
    # Then the message is done with, not dead-lettered, and the job stands (and is admitted)
    assert world.queue.messages == []
    assert world.queue.dlq == []
    assert report.rejected == []
    assert world.job(job_id).state is JobState.PLACING


def test_a_cancel_racing_the_dispatchers_intake_still_cancels_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a job whose message the dispatcher records just after cancel found no record, before its note
    world = World()
    job_id = queued_message(world)
    note = world.store.request_cancel_before_admission

    def intake_first(noted: str) -> None:
        world.dispatch()
        note(noted)

    monkeypatch.setattr(world.store, "request_cancel_before_admission", intake_first)
    # When cancel runs
    result = world.cancel(job_id)
    # Then it finds the record on its second look and cancels the job as any other
    assert (result.state, result.before_admission) == (JobState.CANCELLED, False)
    assert world.job(job_id).state is JobState.CANCELLED


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


# --- back to spot ----------------------------------------------------------------------------------


def on_demand_job(world: World, deadline_hours: float) -> Attempt:
    """A 2 h L4 job running on an on-demand g6.xlarge since now (the safety net put it there)."""
    attempt = world.running(
        work_hours=2, resources={"gpus": 1, "gpu_models": ["L4"]}, limits={"deadline_hours": deadline_hours}
    )
    on_demand = attempt.model_copy(
        update={
            "pool": Pool(
                instance_type="g6.xlarge", availability_zone=CHEAPEST.availability_zone, market=Market.ON_DEMAND
            )
        }
    )
    world.store.put_attempt(on_demand)
    world.compute.set_state(str(attempt.instance_id), "running")
    return on_demand


def test_reconcile_launches_a_spot_standby_for_an_on_demand_job_ahead_of_schedule() -> None:
    # Given a job with a 10 h deadline running on on-demand for 2 h: 1.94 h of its 2 h done, far ahead of
    # the uniform line (0.44 h at 2.2 h), with spot available
    world = World()
    on_demand_job(world, deadline_hours=10)
    world.advance(hours=2)
    # When reconcile runs
    report = world.reconcile()
    # Then a spot instance is launched first, as standby attempt 2 with no Run task yet, in the cheapest pool
    assert report.standbys == ["train-1#2"]
    standby = world.attempt(number=2)
    assert (standby.pool, standby.handover_from, standby.task_token, standby.outcome) == (CHEAPEST, 1, None, None)
    assert world.compute.launches[-1].pool == CHEAPEST
    # And the on-demand attempt is not asked to stop before the standby runs; the job is still on attempt 1
    assert world.attempt().migrate_requested_at is None
    assert world.job().attempts == 1
    # And the next reconcile, with the standby still booting, launches nothing more
    world.advance(minutes=5)
    assert world.reconcile().standbys == []
    assert len(world.compute.launches) == 2


def standby_running(world: World, events_dir: Path) -> Attempt:
    """The on-demand job of `on_demand_job` (10 h deadline) 2 h in, its standby launched and `running`."""
    on_demand_job(world, deadline_hours=10)
    world.advance(hours=2)
    world.reconcile()
    standby = world.attempt(number=2)
    world.advance(minutes=1)
    world.compute.set_state(str(standby.instance_id), "running")
    world.handle(
        recorded_event(
            events_dir, "instance-state-change-running.json", instance_id=standby.instance_id, at=world.clock.now()
        )
    )
    return standby


def test_a_running_standby_asks_the_on_demand_attempt_to_hand_its_job_over(events_dir: Path) -> None:
    # Given the standby launched for an on-demand job ahead of schedule
    world = World()
    # When its `running` state change arrives
    standby = standby_running(world, events_dir)
    # Then the on-demand attempt's agent is asked to hand the job back; its Run task is left alone
    assert world.attempt().migrate_requested_at == world.clock.now()
    assert world.attempt(number=2).running_at == world.clock.now()
    assert world.fail_results("token-1") == []
    assert world.job().state is JobState.RUNNING
    # And a reconcile that runs later does not ask again or launch another standby
    world.advance(minutes=2)
    report = world.reconcile()
    assert (report.standbys, report.migrating) == ([], [])
    assert standby.instance_id not in world.compute.terminated


def test_the_next_run_task_adopts_the_standby_and_resumes_from_the_handover_checkpoint(events_dir: Path) -> None:
    # Given the running standby, and the on-demand agent that committed its final checkpoint (1.95 h) and
    # failed its task with Migrating
    world = World()
    standby = standby_running(world, events_dir)
    world.advance(minutes=1)
    world.checkpoint(attempt=1, seq=3, work_done_hours=1.95, final=True)
    launches = len(world.compute.launches)
    # When Recover, Place and Launch run
    recovered = world.recover(failure=error("Migrating"))
    placed = world.place()
    launched = world.launch(token="token-2")
    # Then the on-demand attempt is MIGRATED with nothing blocked and no interruption counted
    assert recovered.action == "relaunch"
    assert world.attempt().outcome is AttemptOutcome.MIGRATED
    assert world.blocked() == {}
    assert world.job().interruptions == 0
    # And the standby becomes attempt 2's Run task, on its instance, resuming from the handover's checkpoint
    assert placed.action == "launch"
    assert launched["instance_id"] == standby.instance_id
    adopted = world.attempt(number=2)
    assert (adopted.task_token, adopted.work_done_hours_at_start) == ("token-2", 1.95)
    assert world.job().attempts == 2
    assert len(world.compute.launches) == launches  # no new instance
    assert world.attempt().instance_id in world.compute.terminated  # the on-demand one is stopped
    # And the job is RUNNING at once (the standby's `running` event came before it had the job)
    assert world.job().state is JobState.RUNNING
    # And a loss now costs only the work done since the handover, not the standby's wait
    world.advance(minutes=10)
    world.recover(failure=error("InstanceLost"))
    assert world.attempt(number=2).lost_work_hours == pytest.approx(10 / 60 * adopted.relative_speed)


def test_a_move_that_fails_is_reported_and_the_next_job_is_still_reconciled() -> None:
    # Given two on-demand jobs ahead of schedule (the first is reconciled first), and an EC2 error on the
    # first standby launch
    world = World()
    on_demand_job(world, deadline_hours=10)
    second = world.running(
        "train-2",
        token="token-9",
        work_hours=2,
        resources={"gpus": 1, "gpu_models": ["L4"]},
        limits={"deadline_hours": 10},
    )
    world.store.put_attempt(
        second.model_copy(update={"pool": world.attempt().pool, "hourly_price": world.attempt().hourly_price})
    )
    world.compute.set_state(str(second.instance_id), "running")
    world.advance(hours=2)
    world.compute.fail_next["launch"] = RuntimeError("RequestLimitExceeded")
    # When reconcile runs
    report = world.reconcile()
    # Then the failed move is reported, the other job still gets its standby, and nothing is half-written
    assert report.move_errors == ["train-1#1: RuntimeError: RequestLimitExceeded"]
    assert report.standbys == ["train-2#2"]
    assert [a.attempt for a in world.store.attempts("train-1")] == [1]
    # And the next run tries the first job again
    world.advance(minutes=5)
    assert world.reconcile().standbys == ["train-1#2"]


STANDBY_ID = "i-00000000000000abc"


def standby_record(world: World, on_demand: Attempt, *, running: bool) -> Attempt:
    """A standby (attempt 2, no task token) for `on_demand`, launched now in the cheapest pool, its instance
    running in EC2 (the record is for the test to write)."""
    world.compute.instances[STANDBY_ID] = InstanceState(
        instance_id=STANDBY_ID, state="running", tags={TAG_MANAGED: "true"}
    )
    return on_demand.model_copy(
        update={
            "attempt": 2,
            "pool": CHEAPEST,
            "hourly_price": 0.35,
            "instance_id": STANDBY_ID,
            "task_token": None,
            "handover_from": 1,
            "started_at": world.clock.now(),
            "running_at": world.clock.now() if running else None,
            "outcome": None,
            "ended_at": None,
        }
    )


class FinishesDuringRunInstances(FakeCompute):
    """The job succeeds on on-demand (Finalize) while reconcile waits for RunInstances to answer."""

    def __init__(self, world: World) -> None:
        super().__init__(world.compute.prices)
        self.instances = world.compute.instances
        self.world = world

    def launch(self, request: LaunchRequest) -> str:
        if request.attempt == 2:
            self.world.finalize(request.job_id, outcome="SUCCEEDED")
        return super().launch(request)


def test_a_standby_launched_while_the_job_finished_is_dropped_and_billed() -> None:
    # Given an on-demand job ahead of schedule that succeeds while reconcile is launching its standby
    world = World()
    on_demand_job(world, deadline_hours=10)
    world.advance(hours=2)
    world.compute = FinishesDuringRunInstances(world)
    # When reconcile runs
    report = world.reconcile()
    # Then the standby is closed and terminated at once, not left open on a finished job (CANCELLED, as
    # Finalize closes a standby never given the job)
    assert report.standbys == []
    assert report.dropped_standbys == ["train-1#2"]
    standby = world.attempt(number=2)
    assert standby.outcome is AttemptOutcome.CANCELLED
    assert standby.instance_id in world.compute.terminated
    assert world.job().state is JobState.SUCCEEDED


RUN_INSTANCES_SECONDS = 30  # how long RunInstances takes to answer the standby's launch, in these tests


class CancelDuringStandbyRunInstances(FakeCompute):
    """The user's cancel lands (and completes) while RunInstances is starting reconcile's standby."""

    def __init__(self, world: World) -> None:
        super().__init__(world.compute.prices)
        self.instances = world.compute.instances
        self.world = world

    def launch(self, request: LaunchRequest) -> str:
        if request.attempt == 2:
            self.world.advance(seconds=RUN_INSTANCES_SECONDS / 2)
            self.world.cancel(request.job_id)
            self.world.advance(seconds=RUN_INSTANCES_SECONDS / 2)
        return super().launch(request)


def test_a_cancel_during_the_standbys_run_instances_has_reconcile_stop_it_at_once() -> None:
    # Given an on-demand job ahead of schedule, cancelled while reconcile's standby launch is under way
    # (cancel finds no standby to stop, and on AWS it stops the execution: no Finalize follows)
    world = World()
    on_demand_job(world, deadline_hours=10)
    world.advance(hours=2)
    world.compute = CancelDuringStandbyRunInstances(world)
    # When reconcile records the standby
    report = world.reconcile()
    # Then, as Launch does, the standby is terminated at once, not left for the next reconcile
    assert (report.standbys, report.dropped_standbys) == ([], ["train-1#2"])
    standby = world.attempt(number=2)
    assert standby.instance_id in world.compute.terminated
    assert [i.instance_id for i in world.compute.managed_instances()] == []
    # And it is closed CANCELLED when reconcile saw the cancel, and charged for its seconds on the job
    assert (standby.outcome, standby.ended_at) == (AttemptOutcome.CANCELLED, world.clock.now())
    assert standby.cost(world.clock.now()) == pytest.approx(0.35 * RUN_INSTANCES_SECONDS / 3600)
    job = world.job()
    assert job.state is JobState.CANCELLED
    assert job.cost_usd == pytest.approx(sum(a.cost(world.clock.now()) for a in world.store.attempts("train-1")))


class StandbyCloseThrottled(FakeJobStore):
    """DynamoDB throttles the write that closes attempt 2 (once)."""

    def __init__(self) -> None:
        super().__init__()
        self.throttled = False

    def put_attempt(self, attempt: Attempt, expected_version: int | None = None) -> int:
        if attempt.attempt == 2 and attempt.outcome is not None and not self.throttled:
            self.throttled = True
            raise RuntimeError("ProvisionedThroughputExceededException")
        return super().put_attempt(attempt, expected_version)


def test_a_standby_of_a_job_cancelled_during_its_launch_is_terminated_even_if_its_close_fails() -> None:
    # Given an on-demand job cancelled during its standby's launch, and DynamoDB throttling the close
    world = World(store=StandbyCloseThrottled())
    on_demand_job(world, deadline_hours=10)
    world.advance(hours=2)
    world.compute = CancelDuringStandbyRunInstances(world)
    # When reconcile records the standby, and fails to close it
    report = world.reconcile()
    # Then the error is reported, but the instance was terminated first: the bill has stopped
    assert report.move_errors == ["train-1#1: RuntimeError: ProvisionedThroughputExceededException"]
    standby = world.attempt(number=2)
    assert standby.outcome is None
    assert standby.instance_id in world.compute.terminated
    assert [i.instance_id for i in world.compute.managed_instances()] == []


def test_a_throttled_standby_launch_blocks_no_pool_and_is_tried_again_at_the_next_run() -> None:
    # Given the on-demand job ahead of schedule, and EC2 throttling the standby's RunInstances
    world = World()
    on_demand_job(world, deadline_hours=10)
    world.advance(hours=2)
    world.compute.fail_next["launch"] = LaunchThrottled("RequestLimitExceeded", "Request limit exceeded.")
    # When reconcile runs
    report = world.reconcile()
    # Then the move is reported as failed, no pool is blocked and no other pool tried (throttling is per
    # account, not per pool), and the job is left as it was
    assert report.move_errors == ["train-1#1: LaunchThrottled: RequestLimitExceeded: Request limit exceeded."]
    assert world.blocked() == {}
    assert [r.attempt for r in world.compute.launches] == [1]  # the on-demand attempt's only
    assert [a.attempt for a in world.store.attempts("train-1")] == [1]
    # And the next run launches the standby in the cheapest pool
    world.advance(minutes=5)
    assert world.reconcile().standbys == ["train-1#2"]
    assert world.attempt(number=2).pool == CHEAPEST


def test_a_standby_left_open_on_a_finished_job_is_closed_and_its_cost_counted() -> None:
    # Given a finished job with a standby record still open (recorded after Finalize closed its attempts)
    world = World()
    attempt = on_demand_job(world, deadline_hours=10)
    world.advance(hours=2)
    world.finalize(outcome="SUCCEEDED")
    cost_before = world.job().cost_usd
    world.store.put_attempt(standby_record(world, attempt, running=False))
    world.store.put_instance_ref(InstanceRef(instance_id=STANDBY_ID, job_id="train-1", attempt=2))
    world.advance(minutes=20)
    # When reconcile runs
    world.reconcile()
    # Then the instance is terminated, the record closed, and its 20 minutes added to the job's cost
    assert STANDBY_ID in world.compute.terminated
    assert world.attempt(number=2).outcome is AttemptOutcome.CANCELLED
    assert world.job().cost_usd == pytest.approx(cost_before + 0.35 * 20 / 60)


def test_a_standby_adopted_while_reconcile_drops_it_keeps_its_instance(events_dir: Path) -> None:
    # Given a standby running for 31 min (late), whose on-demand agent has just committed its final checkpoint
    world = World()
    standby = standby_running(world, events_dir)
    world.advance(minutes=31)
    world.checkpoint(attempt=1, seq=3, work_done_hours=1.95, final=True)

    def handover() -> None:  # Recover, Place and Launch, between reconcile's read and its write
        world.recover(failure=error("Migrating"))
        world.place()
        world.launch(token="token-2")

    world.store.after_attempt_read.append(handover)
    # When reconcile runs and finds the standby late
    report = world.reconcile()
    # Then its drop loses to the adoption: the instance keeps running with the job
    assert report.dropped_standbys == []
    assert standby.instance_id not in world.compute.terminated
    adopted = world.attempt(number=2)
    assert (adopted.task_token, adopted.outcome) == ("token-2", None)


class StandbyRecordedDuringRunInstances(FakeCompute):
    """Reconcile records a standby under the number Launch is launching (it decided while the previous
    attempt still ran), while Launch waits for RunInstances to answer."""

    def __init__(self, world: World, standby: Attempt) -> None:
        super().__init__(world.compute.prices)
        self.instances = world.compute.instances
        self.world = world
        self.standby = standby

    def launch(self, request: LaunchRequest) -> str:
        instance_id = super().launch(request)
        recorded = {a.attempt for a in self.world.store.attempts("train-1")}
        if request.attempt == self.standby.attempt and self.standby.attempt not in recorded:
            self.world.store.put_attempt(self.standby)
            self.world.store.put_instance_ref(
                InstanceRef(instance_id=str(self.standby.instance_id), job_id="train-1", attempt=self.standby.attempt)
            )
        return instance_id


def test_launch_never_writes_over_a_standby_recorded_under_its_number() -> None:
    # Given an on-demand job whose instance was lost and recovered, and a standby that reconcile records as
    # attempt 2 while Launch is starting attempt 2
    world = World()
    attempt = on_demand_job(world, deadline_hours=10)
    world.advance(hours=2)
    world.recover(failure=error("InstanceLost"))
    assert world.place().action == "launch"
    standby = standby_record(world, attempt, running=True)
    world.compute = StandbyRecordedDuringRunInstances(world, standby)
    # When Launch runs
    with pytest.raises(InsufficientInstanceCapacity):
        world.launch(token="token-2")
    # Then the standby's record stands and Launch's own instance is terminated
    assert world.attempt(number=2).instance_id == STANDBY_ID
    assert len(world.compute.terminated) == 1  # Launch's own
    assert STANDBY_ID not in world.compute.terminated
    # And Place plans the standby, which the next Launch adopts
    assert world.place().action == "launch"
    assert world.launch(token="token-2")["instance_id"] == STANDBY_ID
    assert world.attempt(number=2).task_token == "token-2"


def test_a_standby_counts_toward_the_budget_while_it_waits() -> None:
    # Given an on-demand job ahead of schedule, capped so that its on-demand run alone stays within the cap
    # 25 minutes after its standby is launched, and the two together do not
    world = World()
    on_demand = on_demand_job(world, deadline_hours=10)
    od_cost_then = on_demand.hourly_price * (2 + 25 / 60)
    standby_cost_then = 0.35 * 25 / 60
    cap = od_cost_then + standby_cost_then / 2
    job, version = world.store.get_job("train-1")
    limits = job.spec.limits.model_copy(update={"max_total_cost": cap})
    world.store.put_job(job.model_copy(update={"spec": job.spec.model_copy(update={"limits": limits})}), version)
    world.advance(hours=2)
    assert world.reconcile().standbys == ["train-1#2"]
    # When reconcile runs 25 minutes later, the handover not done yet
    world.advance(minutes=25)
    report = world.reconcile()
    # Then the job is over its budget: the standby's minutes count
    assert report.over_budget == ["train-1"]
    assert world.fail_results("token-1") == ["BudgetExhausted"]


def test_a_launch_retried_after_adopting_the_standby_makes_the_job_running(events_dir: Path) -> None:
    # Given the running standby, the on-demand attempt handed over (Recover, Place done), and a Launch that
    # adopted the standby but failed before it wrote the job (a DynamoDB error)
    world = World()
    standby = standby_running(world, events_dir)
    world.checkpoint(attempt=1, seq=3, work_done_hours=1.95, final=True)
    world.recover(failure=error("Migrating"))
    world.place()
    world.store.fail_next["put_job"] = RuntimeError("ProvisionedThroughputExceededException")
    with pytest.raises(RuntimeError):
        world.launch(token="token-2")
    assert world.job().state is JobState.LAUNCHING
    # When Step Functions retries the Launch invocation (same task token)
    launched = world.launch(token="token-2")
    # Then it is the standby, and the job is RUNNING (its `running` event came long before)
    assert launched["instance_id"] == standby.instance_id
    assert (world.job().attempts, world.job().state) == (2, JobState.RUNNING)


def test_a_notice_for_a_standby_adopted_while_it_was_handled_fails_the_new_run_task(events_dir: Path) -> None:
    # Given the running standby, handed over; Launch adopts it while its interruption warning is being handled
    world = World()
    standby = standby_running(world, events_dir)
    world.checkpoint(attempt=1, seq=3, work_done_hours=1.95, final=True)
    world.recover(failure=error("Migrating"))
    world.place()
    adopt = True

    def launch_adopts() -> None:  # between ec2_events' read of the standby and its conditional close
        nonlocal adopt
        if adopt:
            adopt = False
            world.store.fail_next["put_job"] = RuntimeError("throttled")  # job.attempts not moved on yet
            with pytest.raises(RuntimeError):
                world.launch(token="token-2")
            world.workflow.open_task("token-2")

    world.store.after_attempt_read.append(launch_adopts)
    # When the warning for the standby's instance is handled
    world.advance(minutes=1)
    outcome = world.handle(
        recorded_event(
            events_dir, "spot-interruption-warning.json", instance_id=standby.instance_id, at=world.clock.now()
        )
    )
    # Then it is handled as the job's attempt: the new Run task fails with SpotInterrupted
    assert outcome.action == "interrupt"
    assert world.fail_results("token-2") == ["SpotInterrupted"]


def test_a_refused_standby_leaves_the_on_demand_job_running() -> None:
    # Given the on-demand job ahead of schedule, and every spot pool out of capacity
    world = World()
    on_demand_job(world, deadline_hours=10)
    world.advance(hours=2)
    for pool in (CHEAPEST, SECOND, THIRD):
        world.compute.refuse[pool] = "InsufficientInstanceCapacity"
    # When reconcile runs
    report = world.reconcile()
    # Then no standby, the job is not asked to stop, and the refused pools are blocked as at any refusal
    assert report.standbys == []
    assert world.attempt().migrate_requested_at is None
    assert CHEAPEST in world.blocked()
    assert world.job().attempts == 1


@pytest.mark.parametrize(
    ("event", "outcome", "blocked"),
    [
        ("spot-interruption-warning.json", AttemptOutcome.INTERRUPTED, True),
        ("instance-state-change-terminated.json", AttemptOutcome.LOST, False),
    ],
    ids=["interrupted", "terminated"],
)
def test_a_standby_that_goes_away_before_the_handover_is_closed_and_the_request_withdrawn(
    events_dir: Path, event: str, outcome: AttemptOutcome, blocked: bool
) -> None:
    # Given the running standby, the on-demand attempt asked to hand over and not yet acting on it
    world = World()
    standby = standby_running(world, events_dir)
    # When, 10 minutes on, the standby gets a spot interruption warning, or its instance is terminated
    world.advance(minutes=10)
    world.handle(recorded_event(events_dir, event, instance_id=standby.instance_id, at=world.clock.now()))
    # Then the standby is closed, with its hours (since its launch) in the pool's record; the pool is blocked
    # after a warning; the handover request is withdrawn, and the job's Run task on on-demand is left alone
    assert world.attempt(number=2).outcome is outcome
    assert world.store.pool_observations()[CHEAPEST.offering].instance_hours == pytest.approx(11 / 60)
    assert (CHEAPEST in world.blocked()) is blocked
    assert world.attempt().migrate_requested_at is None
    assert world.fail_results("token-1") == []
    assert world.job().state is JobState.RUNNING


def test_a_standby_not_adopted_in_time_is_terminated_and_retried_after_a_backoff(events_dir: Path) -> None:
    # Given the running standby, and an on-demand agent that never hands over (an old agent)
    world = World()
    standby = standby_running(world, events_dir)
    # When reconcile runs 31 min after the standby started running
    world.advance(minutes=31)
    report = world.reconcile()
    # Then the standby is terminated and closed, and the request withdrawn
    assert report.dropped_standbys == ["train-1#2"]
    assert standby.instance_id in world.compute.terminated
    assert world.attempt(number=2).outcome is AttemptOutcome.LAUNCH_FAILED
    assert world.attempt().migrate_requested_at is None
    # And no new standby within the 30 min backoff; one after it
    world.advance(minutes=29)
    assert world.reconcile().standbys == []
    world.advance(minutes=2)
    assert world.reconcile().standbys == ["train-1#3"]


def test_a_job_that_finishes_on_demand_ends_its_standby(events_dir: Path) -> None:
    # Given the running standby
    world = World()
    standby = standby_running(world, events_dir)
    # When the job succeeds on on-demand before handing over
    world.advance(minutes=1)
    world.finalize(outcome="SUCCEEDED")
    # Then the standby's instance is terminated, closed as CANCELLED, and billed for its minutes
    assert standby.instance_id in world.compute.terminated
    assert world.attempt(number=2).outcome is AttemptOutcome.CANCELLED
    assert world.attempt(number=2).lost_work_hours == 0
    assert world.job().cost_usd > world.attempt().cost(world.clock.now())


def on_demand_after_short_spot_runs(
    world: World, deadline_hours: float, minutes: list[float], pools: list[Pool] | None = None
) -> Attempt:
    """The L4 job of `on_demand_job`, whose spot attempts (in `pools`, in turn; the cheapest pool by
    default) were each interrupted after `minutes` (boot included), now running on an on-demand g6.xlarge
    since the clock's now."""
    first = world.running(
        work_hours=2, resources={"gpus": 1, "gpu_models": ["L4"]}, limits={"deadline_hours": deadline_hours}
    )
    assert first.pool == CHEAPEST
    started = first.started_at
    for number, ran in enumerate(minutes, start=1):
        ended = started + timedelta(minutes=ran)
        world.store.put_attempt(
            first.model_copy(
                update={
                    "attempt": number,
                    "pool": (pools or [CHEAPEST])[(number - 1) % len(pools or [CHEAPEST])],
                    "started_at": started,
                    "running_at": started,
                    "interrupted_at": ended,
                    "ended_at": ended,
                    "outcome": AttemptOutcome.INTERRUPTED,
                    "task_token": f"token-spot-{number}",
                }
            )
        )
        started = ended
    world.advance(seconds=(started - world.clock.now()).total_seconds())
    world.compute.set_state(str(first.instance_id), "terminated")
    number = len(minutes) + 1
    pool = Pool(instance_type="g6.xlarge", availability_zone=CHEAPEST.availability_zone, market=Market.ON_DEMAND)
    request = LaunchRequest(
        job_id="train-1",
        job_name="train-1",
        attempt=number,
        pool=pool,
        subnet_id="subnet-b",
        max_price=None,
        client_token=f"on-demand-{number}",
    )
    instance_id = world.compute.launch(request)
    world.compute.set_state(instance_id, "running")
    on_demand = first.model_copy(
        update={
            "attempt": number,
            "instance_id": instance_id,
            "started_at": started,
            "running_at": started,
            "pool": pool,
        }
    )
    world.store.put_attempt(on_demand)
    world.store.put_instance_ref(InstanceRef(instance_id=instance_id, job_id="train-1", attempt=number))
    job, version = world.store.get_job("train-1")
    world.store.put_job(job.model_copy(update={"attempts": number, "interruptions": len(minutes)}), version)
    return on_demand


def test_an_on_demand_job_behind_schedule_goes_back_to_spot_when_a_run_there_pays_for_the_switch() -> None:
    # Given a job due in 2.5 h, 0.5 h into its on-demand run: 0.48 h done, behind the line plus two restarts
    # (0.56 h), so the paper's hysteresis would keep it on on-demand; spot at $0.35/h against $0.80/h, in a
    # pool with no interruption seen (a run there is expected to last days)
    world = World()
    on_demand_job(world, deadline_hours=2.5)
    world.advance(minutes=30)
    # When reconcile runs
    report = world.reconcile()
    # Then it launches a spot standby to move the job to: a run there is expected to pay for the switch
    assert report.standbys == ["train-1#2"]
    assert world.attempt(number=2).pool == CHEAPEST


def test_an_on_demand_job_behind_schedule_stays_there_when_its_spot_runs_were_short() -> None:
    # Given the job due in 3 h, whose spot runs in each of the three pools lasted 4 to 8 minutes (restarts
    # take 6): they lose their capacity within minutes of a start. 0.5 h into its on-demand run it is behind
    # the line plus two restarts and outside the safety net
    world = World()
    on_demand_after_short_spot_runs(
        world, deadline_hours=3, minutes=[6, 4, 8, 5, 7, 6], pools=[CHEAPEST, SECOND, THIRD]
    )
    world.advance(minutes=30)
    launches = len(world.compute.launches)
    # When reconcile runs
    report = world.reconcile()
    # Then the job stays on on-demand: no standby, no handover asked, no launch
    assert (report.standbys, report.migrating, report.move_errors) == ([], [], [])
    assert world.attempt(number=7).migrate_requested_at is None
    assert len(world.compute.launches) == launches


def test_an_on_demand_job_behind_schedule_moves_only_to_a_pool_where_a_run_pays() -> None:
    # Given the same job, whose short runs were all in the cheapest pool
    world = World()
    on_demand_after_short_spot_runs(world, deadline_hours=3, minutes=[6, 4, 8])
    world.advance(minutes=30)
    # When reconcile runs
    report = world.reconcile()
    # Then its standby goes to the next pool, where nothing says a run would not pay, not the cheapest
    assert report.standbys == ["train-1#5"]
    assert world.attempt(number=5).pool == SECOND
