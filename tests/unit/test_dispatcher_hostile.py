"""The dispatcher against hostile messages: whatever one message holds, or whatever goes wrong while it
is recorded, the valid job received beside it is still recorded and admitted."""

from __future__ import annotations

import json

import pytest
from control_builders import World, spec_dict

from spotrelay.control.dispatcher import INVALID_JOB, MAX_BODY_BYTES, MAX_REASON_CHARS
from spotrelay.models import JobState

VALID_NEIGHBOUR = "good-msg2"  # the valid job sent right after the hostile message


def hostile_then_valid(world: World, body: str) -> None:
    world.queue.send(body)
    world.queue.send(json.dumps(spec_dict(name="good")))


@pytest.mark.parametrize(
    ("body", "job_id", "names"),
    [
        pytest.param(
            '{"name": "big", "run": {"command": "x"}, "resources": {"gpus": ' + "9" * 5000 + "}}",
            "invalid-msg1",
            "a number of 5000 digits: no field of a job spec takes one",
            id="integer-of-5000-digits",
        ),
        pytest.param("[" * 100_000 + "]" * 100_000, "invalid-msg1", "nested more than 32 levels deep", id="deep"),
        pytest.param(
            '{"name": "env", "run": {"command": "x", "env": {"HOME": "\\ud800"}}, "resources": {"gpus": 1}}',
            "env-msg1",
            "run.env.HOME: holds an unpaired UTF-16 surrogate",
            id="lone-surrogate-in-a-value",
        ),
        pytest.param(
            '{"name": "\\udfff", "run": {"command": "x"}, "resources": {"gpus": 1}}',
            "--msg1",
            "name: holds an unpaired UTF-16 surrogate",
            id="lone-surrogate-in-the-name",
        ),
        pytest.param(
            # Each \x85 (two bytes here) is echoed as the four characters \x85: a 240 KB body, a 480 KB reason
            json.dumps(spec_dict(resources={"gpus": 1, "gpu_models": ["\x85" * 120_000]}), ensure_ascii=False),
            "train-msg1",
            "resources.gpu_models: unknown GPU model",
            id="a-value-echoed-into-a-huge-reason",
        ),
        pytest.param(
            json.dumps(spec_dict(run={"command": "x", "env": {"PAD": "x" * MAX_BODY_BYTES}})),
            "invalid-msg1",
            f"bytes; a job spec is at most {MAX_BODY_BYTES} bytes",
            id="larger-than-sqs-allows",
        ),
    ],
)
def test_a_hostile_message_becomes_a_failed_job_and_the_valid_one_beside_it_is_admitted(
    body: str, job_id: str, names: str
) -> None:
    # Given a hostile message on the queue, and a valid job right after it
    world = World()
    hostile_then_valid(world, body)

    # When the dispatcher runs
    report = world.dispatch()

    # Then the valid job is recorded and admitted
    assert report.errors == {}
    assert report.accepted == [VALID_NEIGHBOUR]
    assert report.admitted == [VALID_NEIGHBOUR]
    assert world.job(VALID_NEIGHBOUR).state is JobState.PLACING
    assert list(world.workflow.executions) == [VALID_NEIGHBOUR]

    # And the hostile one is a FAILED job saying what is wrong, in a short printable reason
    assert report.rejected == [job_id]
    failed = world.job(job_id)
    assert failed.state is JobState.FAILED
    reason = failed.failure_reason
    assert reason is not None
    assert reason.startswith(f"{INVALID_JOB}: message msg-1: ")
    assert names in reason
    assert len(reason) <= len(f"{INVALID_JOB}: ") + MAX_REASON_CHARS
    assert reason.isprintable()

    # And its message is kept in the DLQ with that reason, nothing of it left on the queue
    assert [(d.message.body, d.reason) for d in world.queue.dlq] == [(body, reason.removeprefix(f"{INVALID_JOB}: "))]
    assert world.queue.messages == []


def test_a_value_echoed_into_a_huge_reason_still_leaves_room_for_every_field_it_names() -> None:
    # Given a spec with two wrong fields, one of them a huge value its error message echoes
    world = World()
    wrong = spec_dict(resources={"gpus": 1, "gpu_models": ["\x85" * 120_000]}, colour="blue")
    world.queue.send(json.dumps(wrong, ensure_ascii=False))

    # When the dispatcher runs
    world.dispatch()

    # Then the FAILED job names both fields, and what is allowed for each
    reason = world.job("train-msg1").failure_reason or ""
    assert "resources.gpu_models: unknown GPU model" in reason
    assert "colour: unknown key; allowed keys here: name, run, resources" in reason


def test_an_error_recording_one_message_leaves_it_on_the_queue_and_admits_the_others() -> None:
    # Given two valid jobs on the queue, and the store failing the first one's write
    world = World()
    world.queue.send(json.dumps(spec_dict(name="first")))
    world.queue.send(json.dumps(spec_dict(name="second")))
    world.store.fail_next["create_job"] = RuntimeError("ProvisionedThroughputExceededException")

    # When the dispatcher runs
    report = world.dispatch()

    # Then the second job is recorded and admitted
    assert report.accepted == ["second-msg2"]
    assert report.admitted == ["second-msg2"]
    assert world.job("second-msg2").state is JobState.PLACING

    # And the first is reported, left on the queue (not deleted, not dead-lettered) and has no record yet
    assert report.errors == {"msg-1": "RuntimeError: ProvisionedThroughputExceededException"}
    assert [m.message_id for m in world.queue.messages] == ["msg-1"]
    assert world.queue.dlq == []
    assert "first-msg1" not in world.store.jobs

    # And when SQS delivers it again, it is recorded and admitted
    world.queue.redeliver()
    again = world.dispatch()
    assert (again.accepted, again.admitted, again.errors) == (["first-msg1"], ["first-msg1"], {})
    assert world.queue.messages == []


def test_a_reason_holds_no_character_that_would_hide_or_reorder_what_status_prints() -> None:
    # Given a message whose refusal names a key holding bidirectional overrides, a zero-width space, U+FFFF
    world = World()
    key = "\\u202e\\u2066evil\\u200b\\uffff\\ud800"
    world.queue.send('{"' + key + '": 1, "name": "j", "run": {"command": "x"}, "resources": {"gpus": 1}}')
    # When the dispatcher reads it
    report = world.dispatch()
    # Then the FAILED job's reason says which key, with each of those characters replaced by U+FFFD
    [job_id] = report.rejected
    reason = world.job(job_id).failure_reason or ""
    assert "\ufffd\ufffdevil\ufffd\ufffd" in reason
    assert not any(c in reason for c in "\u202e\u2066\u200b\uffff")
