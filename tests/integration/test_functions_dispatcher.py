"""The dispatcher function on moto: the queue-depth alarm turns queue messages into job records,
admits the valid job by starting its JobLifecycle execution, and keeps the invalid one in the DLQ."""

from __future__ import annotations

import json
from collections.abc import Mapping

from spotrelay.aws.queue import ERROR_ATTRIBUTE
from spotrelay.control.dispatcher import job_id_for
from spotrelay.models import JobState

from .function_harness import HEARTBEAT_SECONDS, Deployment, recorded_event, resnet50_spec

INVALID_JOB = {"name": "x", "run": {"command": "c"}, "resources": {"gpus": 0}}


def send(deployment: Deployment, body: Mapping[str, object]) -> str:
    return deployment.sqs.send_message(QueueUrl=deployment.queues.queue_url, MessageBody=json.dumps(body))["MessageId"]


def messages_left(deployment: Deployment, queue_url: str) -> int:
    attributes = deployment.sqs.get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def test_the_alarm_admits_the_valid_job_and_dead_letters_the_invalid_one(deployment: Deployment) -> None:
    # Given the job queue holding resnet50 and a job asking for no GPU
    valid_id = job_id_for("resnet50", send(deployment, resnet50_spec()))
    invalid_message = send(deployment, INVALID_JOB)
    invalid_id = job_id_for("x", invalid_message)

    # When the queue-depth alarm fires
    report = deployment.invoke("dispatcher", recorded_event("alarm-state-change"))

    # Then the valid job is PLACING, with its execution started under its id and the dispatcher's input
    assert report["accepted"] == [valid_id]
    assert report["admitted"] == [valid_id]
    assert deployment.job(valid_id).state is JobState.PLACING
    assert deployment.executions() == [valid_id]
    execution = deployment.execution(valid_id)
    assert json.loads(execution["input"]) == {"job_id": valid_id, "heartbeat_seconds": HEARTBEAT_SECONDS}

    # And the invalid one is a FAILED job saying which field is wrong, its message kept in the DLQ with that reason
    assert report["rejected"] == [invalid_id]
    invalid = deployment.job(invalid_id)
    assert invalid.state is JobState.FAILED
    assert invalid.failure_reason is not None
    assert "resources.gpus" in invalid.failure_reason
    dead = deployment.sqs.receive_message(
        QueueUrl=deployment.queues.dlq_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
    )["Messages"]
    assert [json.loads(m["Body"]) for m in dead] == [INVALID_JOB]
    assert "resources.gpus" in dead[0]["MessageAttributes"][ERROR_ATTRIBUTE]["StringValue"]

    # And nothing is left in the job queue
    assert messages_left(deployment, deployment.queues.queue_url) == 0


def test_a_duplicate_alarm_starts_no_second_execution(deployment: Deployment) -> None:
    # Given the alarm already dispatched resnet50
    job_id = job_id_for("resnet50", send(deployment, resnet50_spec()))
    deployment.invoke("dispatcher", recorded_event("alarm-state-change"))
    job_before = deployment.job(job_id)

    # When the same alarm is delivered again
    report = deployment.invoke("dispatcher", recorded_event("alarm-state-change"))

    # Then nothing is received or admitted, the job is unchanged and it still has exactly one execution
    assert (report["received"], report["admitted"]) == (0, [])
    assert deployment.job(job_id) == job_before
    assert deployment.executions() == [job_id]
