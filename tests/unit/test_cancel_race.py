"""A `spotrelay cancel` racing Launch. Launch reads the job, calls RunInstances (seconds), then records
the attempt. A cancel that lands in between finds no attempt to stop, and on AWS it stops the execution,
so no Finalize follows. Launch therefore looks at the job again after recording the attempt. Cancel
writes `cancel_requested` before it reads the attempts, so at least one side sees the other.
Either way the user sees a CANCELLED job, its instance terminated and its attempt closed, within the
Launch invocation, not at the next reconcile."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from control_builders import CHEAPEST, PRICES, World
from fakes import FakeCompute, FakeJobStore

from spotrelay.control.lifecycle import JobCancelled
from spotrelay.control.ports import InstanceRef, LaunchRequest
from spotrelay.models import AttemptOutcome, JobState

RUN_INSTANCES_SECONDS = 30  # how long RunInstances takes to answer, in these tests


class CancelDuringRunInstances(FakeCompute):
    """The user's cancel lands (and completes) while RunInstances is still answering."""

    def __init__(self, world: World) -> None:
        super().__init__(world.compute.prices)
        self.world = world

    def launch(self, request: LaunchRequest) -> str:
        self.world.advance(seconds=RUN_INSTANCES_SECONDS / 2)
        self.world.cancel(request.job_id)
        self.world.advance(seconds=RUN_INSTANCES_SECONDS / 2)
        return super().launch(request)


class CancelAfterTheAttemptIsRecorded(FakeJobStore):
    """The user's cancel lands right after Launch recorded the attempt, before Launch looks at the job again."""

    def __init__(self, cancel: Callable[[], object]) -> None:
        super().__init__()
        self.cancel = cancel

    def put_instance_ref(self, ref: InstanceRef) -> None:
        super().put_instance_ref(ref)
        self.cancel()


def launching_job() -> World:
    """An admitted job that Place planned: Launch comes next."""
    world = World()
    world.admitted()
    assert world.place().action == "launch"
    return world


def test_a_cancel_during_run_instances_has_launch_terminate_the_instance_and_close_the_attempt() -> None:
    # Given a job whose cancel lands while RunInstances is starting its instance (cancel sees no attempt)
    world = launching_job()
    world.compute = CancelDuringRunInstances(world)
    # When Launch records the attempt
    with pytest.raises(JobCancelled, match="terminated as soon as it was launched"):
        world.launch()
    # Then the instance it started is terminated at once, not left for reconcile
    [request] = world.compute.launches
    attempt = world.attempt()
    assert attempt.instance_id is not None
    assert world.compute.instances[attempt.instance_id].state == "terminated"
    # And the attempt is closed CANCELLED when Launch saw the cancel, and charged for its seconds
    assert request.pool == attempt.pool == CHEAPEST
    assert (attempt.outcome, attempt.ended_at) == (AttemptOutcome.CANCELLED, world.clock.now())
    job = world.job()
    assert job.state is JobState.CANCELLED
    assert job.cost_usd == pytest.approx(PRICES[CHEAPEST] * RUN_INSTANCES_SECONDS / 3600)
    # And nothing of the job is left running
    assert [i.instance_id for i in world.compute.managed_instances()] == []


def test_a_cancel_right_after_the_attempt_is_recorded_is_seen_by_both_and_ends_the_same() -> None:
    # Given a job whose cancel lands after Launch recorded the attempt (cancel sees it, and fails its task)
    world = World()
    world.store = CancelAfterTheAttemptIsRecorded(lambda: world.cancel())
    world.admitted()
    assert world.place().action == "launch"
    world.workflow.open_task("token-1")
    # When Launch goes on
    with pytest.raises(JobCancelled):
        world.launch()
    # Then the instance is terminated, the attempt closed once as CANCELLED, the Run task failed once
    attempt = world.attempt()
    assert attempt.instance_id is not None
    assert world.compute.instances[attempt.instance_id].state == "terminated"
    assert attempt.outcome is AttemptOutcome.CANCELLED
    assert world.fail_results("token-1") == ["JobCancelled"]
    assert world.job().state is JobState.CANCELLED
    assert [i.instance_id for i in world.compute.managed_instances()] == []


def test_a_job_ended_otherwise_during_run_instances_gets_no_instance_either() -> None:
    # Given a job that reconcile failed (its execution had ended) while RunInstances was answering
    world = launching_job()

    class JobFailsDuringRunInstances(FakeCompute):
        def launch(self, request: LaunchRequest) -> str:
            job, version = world.store.get_job(request.job_id)
            ended = job.model_copy(update={"state": JobState.FAILED, "ended_at": world.clock.now()})
            world.store.put_job(ended, version)
            return super().launch(request)

    world.compute = JobFailsDuringRunInstances(world.compute.prices)
    # When Launch records the attempt
    with pytest.raises(JobCancelled, match="FAILED"):
        world.launch()
    # Then its instance is terminated and its attempt closed; the job keeps the state it ended in
    attempt = world.attempt()
    assert attempt.instance_id is not None
    assert world.compute.instances[attempt.instance_id].state == "terminated"
    assert attempt.outcome is AttemptOutcome.CANCELLED
    assert world.job().state is JobState.FAILED


def test_a_retried_launch_after_the_cancel_launches_nothing_more() -> None:
    # Given Launch terminated its instance for a job cancelled during RunInstances
    world = launching_job()
    world.compute = CancelDuringRunInstances(world)
    with pytest.raises(JobCancelled):
        world.launch()
    # When Step Functions invokes Launch again with the same token (a retried invocation)
    world.advance(minutes=1)
    with pytest.raises(JobCancelled):
        world.launch()
    # Then nothing more is launched, and the attempt stays as Launch closed it
    assert len(world.compute.launches) == 1
    assert world.attempt().ended_at == world.clock.now() - timedelta(minutes=1)


def test_cancel_terminates_the_instance_of_an_attempt_closed_before_its_instance_was_stopped() -> None:
    # Given a running job whose earlier attempt was closed by a step that died before terminating its instance
    world = World()
    first = world.running()
    world.advance(hours=1)
    world.store.put_attempt(first.model_copy(update={"outcome": AttemptOutcome.LOST, "ended_at": world.clock.now()}))
    job, version = world.store.get_job("train-1")
    world.store.put_job(job.model_copy(update={"attempts": 1, "state": JobState.RECOVERING}), version)
    second = world.relaunched(token="token-2")
    assert first.instance_id is not None
    assert second.instance_id is not None
    assert world.compute.instances[first.instance_id].state != "terminated"
    # When the user cancels the job
    result = world.cancel()
    # Then both instances are terminated: nothing of a cancelled job runs (only the live one is reported)
    assert result.terminated == [second.instance_id]
    assert world.compute.instances[first.instance_id].state == "terminated"
    assert world.compute.instances[second.instance_id].state == "terminated"
