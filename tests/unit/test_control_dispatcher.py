"""The dispatcher: queue messages become job records, then queued jobs are admitted and their executions start."""

from __future__ import annotations

import json
from typing import Any

import pytest
from control_builders import HEARTBEAT_SECONDS, World, limits, spec_dict
from fakes import FakeWorkflow

from spotrelay.control.dispatcher import MAX_QUEUED_CONSIDERED
from spotrelay.models import JobState

NO_ROOM = limits(max_concurrent_jobs=0)


def send(world: World, **spec_fields: Any) -> str:
    """Send a job spec as `aws sqs send-message` would; returns the message id."""
    return world.queue.send(json.dumps(spec_dict(**spec_fields))).message_id


# --- intake ---------------------------------------------------------------------------------------------


def test_a_valid_message_becomes_a_queued_job_and_is_deleted_from_the_queue() -> None:
    # Given a valid job spec on the queue, and no room to admit it yet
    world = World()
    send(world, name="resnet")
    # When the dispatcher runs
    report = world.dispatch(NO_ROOM)
    # Then the job is recorded as QUEUED under "<name>-<message id>", and the message is gone, not dead-lettered
    assert report.accepted == ["resnet-msg1"]
    job = world.job("resnet-msg1")
    assert job.state is JobState.QUEUED
    assert job.spec.name == "resnet"
    assert job.submitted_at == world.clock.now()
    assert world.queue.messages == []
    assert world.queue.dlq == []
    assert report.held == {"resnet-msg1": "max_concurrent_jobs 0 reached"}
    # And the job says why it waits in the queue (`spotrelay status`), until it is admitted
    assert job.waiting_reason == "held in the queue: max_concurrent_jobs 0 reached"
    world.dispatch()
    assert world.job("resnet-msg1").state is JobState.PLACING
    assert world.job("resnet-msg1").waiting_reason is None


def test_a_message_redelivered_after_a_failed_delete_does_not_create_a_second_job() -> None:
    # Given a message whose delete failed after its job was recorded (so SQS delivers it again)
    world = World()
    send(world)
    world.queue.fail_next["delete"] = RuntimeError("SQS throttled the delete")
    first = world.dispatch(NO_ROOM)
    assert first.errors == {"msg-1": "RuntimeError: SQS throttled the delete"}
    world.queue.redeliver()
    # When the dispatcher runs again
    report = world.dispatch(NO_ROOM)
    # Then there is still one job, and this time the message is deleted
    assert report.received == 1
    assert list(world.store.jobs) == ["train-msg1"]
    assert world.queue.messages == []


def test_a_submission_sent_twice_is_one_job_named_by_its_submission_id() -> None:
    # Given `spotrelay submit`'s message sent twice (an SDK retry after a timeout): two SQS messages, one
    # submission id; and a plain message with a submission id that is not a UUID
    world = World()
    body = json.dumps(spec_dict(name="resnet"))
    submission = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    world.queue.send(body, submission_id=submission)
    world.queue.send(body, submission_id=submission)
    world.queue.send(json.dumps(spec_dict(name="bert")), submission_id="../not-a-uuid")
    world.queue.send(json.dumps(spec_dict(name="gpt")), submission_id="A1B2C3D4-0000-4000-8000-000000000001")
    # When the dispatcher runs
    report = world.dispatch(NO_ROOM)
    # Then the resent submission is one job, named from the submission id (as `spotrelay submit` printed
    # it), both its messages are gone, the job with a bad id is named from its message id, and an upper
    # case UUID counts as the same lower case one
    assert report.received == 4
    assert sorted(world.store.jobs) == ["bert-msg3", "gpt-a1b2c3d40000", "resnet-0f1e2d3c4b5a"]
    assert world.queue.messages == []
    assert world.queue.dlq == []


def test_a_reused_submission_id_with_another_spec_is_kept_in_the_dlq_not_dropped() -> None:
    # Given two different jobs sent with the same submission id (a copied command line)
    world = World()
    submission = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    world.queue.send(json.dumps(spec_dict(name="resnet", resources={"gpus": 1})), submission_id=submission)
    world.queue.send(json.dumps(spec_dict(name="resnet", resources={"gpus": 4})), submission_id=submission)
    # When the dispatcher runs
    report = world.dispatch(NO_ROOM)
    # Then the first is the job, and the second is in the DLQ saying why, not silently merged into it
    assert list(world.store.jobs) == ["resnet-0f1e2d3c4b5a"]
    assert world.job("resnet-0f1e2d3c4b5a").spec.resources.gpus == 1
    assert report.rejected == []
    (kept,) = world.queue.dlq
    assert report.conflicts == [kept.message.message_id]
    assert "submission id 0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0 already names job resnet-0f1e2d3c4b5a" in kept.reason
    assert world.queue.messages == []


def test_a_duplicate_delivery_of_an_admitted_jobs_message_neither_resets_nor_duplicates_it() -> None:
    # Given a job admitted from a message
    world = World()
    message = world.queue.send(json.dumps(spec_dict()))
    world.dispatch()
    # When SQS delivers that message once more (at-least-once delivery)
    world.queue.messages.append(message)
    report = world.dispatch()
    # Then the one job stays PLACING with its one execution, and the duplicate is deleted
    assert list(world.store.jobs) == ["train-msg1"]
    assert world.job("train-msg1").state is JobState.PLACING
    assert list(world.workflow.executions) == ["train-msg1"]
    assert report.admitted == []
    assert world.queue.messages == []


@pytest.mark.parametrize(
    ("body", "job_id", "names"),
    [
        pytest.param("{not json", "invalid-msg1", "line 1: not valid JSON", id="bad-json"),
        pytest.param(json.dumps(spec_dict(resources={"gpus": 0})), "train-msg1", "resources.gpus", id="zero-gpus"),
        pytest.param(json.dumps(spec_dict(colour="blue")), "train-msg1", "colour: unknown key", id="unknown-key"),
        pytest.param(json.dumps(["a", "list"]), "invalid-msg1", "expected a mapping", id="not-a-mapping"),
    ],
)
def test_an_invalid_message_becomes_a_failed_job_naming_the_problem_and_goes_to_the_dlq(
    body: str, job_id: str, names: str
) -> None:
    # Given a message that is not a valid job
    world = World()
    world.queue.send(body)
    # When the dispatcher runs
    report = world.dispatch()
    # Then a FAILED job records why, naming the field, and the message is kept in the DLQ with that reason
    assert report.rejected == [job_id]
    job = world.job(job_id)
    assert job.state is JobState.FAILED
    assert job.failure_reason is not None
    assert job.failure_reason.startswith("InvalidJob: ")
    assert names in job.failure_reason
    assert job.ended_at == world.clock.now()
    assert [(d.message.body, d.reason) for d in world.queue.dlq] == [
        (body, job.failure_reason.removeprefix("InvalidJob: "))
    ]
    assert world.queue.messages == []
    # And nothing was started for it
    assert world.workflow.executions == {}


def test_a_message_whose_dead_lettering_failed_is_dead_lettered_on_redelivery() -> None:
    # Given an invalid message whose move to the DLQ failed
    world = World()
    world.queue.send("{not json")
    world.queue.fail_next["dead_letter"] = RuntimeError("SQS unavailable")
    assert world.dispatch().errors == {"msg-1": "RuntimeError: SQS unavailable"}
    assert world.queue.dlq == []
    world.queue.redeliver()
    # When the dispatcher runs again
    world.dispatch()
    # Then it is in the DLQ now, and there is one FAILED job for it
    assert [d.message.body for d in world.queue.dlq] == ["{not json"]
    assert world.queue.messages == []
    assert list(world.store.jobs) == ["invalid-msg1"]


# --- admission ------------------------------------------------------------------------------------------------


def test_admission_starts_one_execution_per_admitted_job_named_by_the_job_id_and_marks_it_placing() -> None:
    # Given two valid jobs on the queue and room for both
    world = World()
    send(world, name="first")
    send(world, name="second")
    # When the dispatcher runs
    report = world.dispatch()
    # Then each has one execution named by its job id, carrying the heartbeat, and is PLACING
    assert report.admitted == ["first-msg1", "second-msg2"]
    assert {name: e.payload for name, e in world.workflow.executions.items()} == {
        "first-msg1": {"job_id": "first-msg1", "heartbeat_seconds": HEARTBEAT_SECONDS},
        "second-msg2": {"job_id": "second-msg2", "heartbeat_seconds": HEARTBEAT_SECONDS},
    }
    assert world.job("first-msg1").state is JobState.PLACING
    assert world.job("second-msg2").state is JobState.PLACING


def test_a_run_with_nothing_queued_reads_neither_the_running_jobs_nor_spot_prices() -> None:
    # Given a running job and an empty queue (most scheduled runs), with the reads it would make set to fail
    world = World()
    send(world, name="running")
    world.dispatch()
    world.store.fail_next["active_jobs"] = RuntimeError("active_jobs was read")
    world.compute.fail_next["spot_prices"] = RuntimeError("spot prices were read")
    # When the dispatcher runs
    report = world.dispatch(limits(max_concurrent_jobs=1))
    # Then it admits nothing and reads neither (the faults are still pending)
    assert report.admitted == []
    assert report.held == {}
    assert set(world.store.fail_next) == {"active_jobs"}
    assert set(world.compute.fail_next) == {"spot_prices"}
    # And with a job waiting, the running one takes its room again
    world.store.fail_next.clear()
    send(world, name="waiting")
    report = world.dispatch(limits(max_concurrent_jobs=1))
    assert report.held == {"waiting-msg2": "max_concurrent_jobs 1 reached"}


def test_admission_follows_priority_across_messages() -> None:
    # Given a normal job and, sent after it, a high-priority one, with room for one
    world = World()
    send(world, name="normal")
    send(world, name="urgent", priority="high")
    # When the dispatcher runs
    report = world.dispatch(limits(max_concurrent_jobs=1))
    # Then the high-priority job starts and the normal one waits
    assert report.admitted == ["urgent-msg2"]
    assert world.job("normal-msg1").state is JobState.QUEUED
    assert list(world.workflow.executions) == ["urgent-msg2"]


def test_dispatching_twice_does_not_admit_or_start_a_job_twice() -> None:
    # Given a job admitted by one dispatcher run
    world = World()
    send(world)
    world.dispatch()
    # When the dispatcher runs again (the schedule, another alarm)
    report = world.dispatch()
    # Then nothing more is admitted or started, and the job is still PLACING
    assert report.admitted == []
    assert list(world.workflow.executions) == ["train-msg1"]
    assert world.job("train-msg1").state is JobState.PLACING


def test_a_job_still_queued_after_its_execution_started_is_marked_placing_on_the_next_run() -> None:
    # Given a dispatcher that crashed between starting a job's execution and marking the job PLACING
    world = World()
    send(world)
    world.store.fail_next["put_job"] = RuntimeError("Lambda timed out")
    with pytest.raises(RuntimeError):
        world.dispatch()
    assert world.job("train-msg1").state is JobState.QUEUED
    assert list(world.workflow.executions) == ["train-msg1"]
    # When the dispatcher runs again
    report = world.dispatch()
    # Then the job is PLACING, still with its single execution
    assert report.admitted == ["train-msg1"]
    assert world.job("train-msg1").state is JobState.PLACING
    assert list(world.workflow.executions) == ["train-msg1"]


class UserCancelsDuringStart(FakeWorkflow):
    """The user's `spotrelay cancel` lands while the dispatcher is starting the job's execution."""

    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world

    def start(self, job_id: str, payload: dict[str, object]) -> bool:
        started = super().start(job_id, payload)
        self.world.cancel(job_id)
        return started


def test_a_job_cancelled_while_its_execution_starts_stays_cancelled() -> None:
    # Given a queued job, and a cancel arriving while the dispatcher starts its execution
    world = World()
    send(world)
    world.workflow = UserCancelsDuringStart(world)
    # When the dispatcher admits it
    world.dispatch()
    # Then the job stays CANCELLED (admission does not overwrite it with PLACING)
    assert world.job("train-msg1").state is JobState.CANCELLED


def test_a_job_admission_can_never_start_fails_as_unschedulable_without_an_execution() -> None:
    # Given a job that needs H100s on a deployment that allows g families only
    world = World()
    send(world, resources={"gpus": 1, "gpu_models": ["H100"]})
    # When the dispatcher runs
    report = world.dispatch(limits(allowed_families=("g5", "g6")))
    # Then the job is FAILED, saying no allowed family fits it, and no execution starts
    assert report.failed == ["train-msg1"]
    job = world.job("train-msg1")
    assert job.state is JobState.FAILED
    assert job.failure_reason == "Unschedulable: no instance type of the allowed GPU families (g5, g6) fits resources"
    assert world.workflow.executions == {}


def test_a_run_considers_only_the_head_of_a_deep_queue_and_the_next_run_the_rest() -> None:
    # Given more queued jobs than a run considers (MAX_QUEUED_CONSIDERED), the urgent ones sent last
    world = World()
    deep = MAX_QUEUED_CONSIDERED + 20
    for n in range(deep):
        send(world, name=f"job{n}", priority="high" if n >= deep - 5 else "low")
    for _ in range(2):  # the messages are recorded (100 a run), nothing admitted yet
        world.dispatch(NO_ROOM)
    assert len(world.store.queued_jobs(10 * deep)) == deep
    # When the dispatcher runs with room for every one of them
    first = world.dispatch(limits(max_concurrent_jobs=10_000))
    # Then it admits the head of the queue only, the urgent jobs among them, and the next run the rest
    assert len(first.admitted) == MAX_QUEUED_CONSIDERED
    assert {f"job{n}" for n in range(deep - 5, deep)} <= {world.job(j).spec.name for j in first.admitted}
    second = world.dispatch(limits(max_concurrent_jobs=10_000))
    assert len(second.admitted) == 20
    assert not set(first.admitted) & set(second.admitted)
