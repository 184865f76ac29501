"""The dispatcher function on moto against hostile messages: one that DynamoDB could not store as it
is (an unpaired surrogate, an error echoing a huge value past the 400 KB item limit) becomes a FAILED
job with a short reason and is kept in the DLQ, and the valid job received with it is admitted."""

from __future__ import annotations

import json

from spotrelay.aws.queue import ERROR_ATTRIBUTE
from spotrelay.control.dispatcher import INVALID_JOB, MAX_REASON_CHARS, job_id_for
from spotrelay.models import JobState

from .function_harness import Deployment, recorded_event, resnet50_spec

SURROGATE = '{"name": "env", "run": {"command": "x", "env": {"HOME": "\\ud800"}}, "resources": {"gpus": 1}}'
# Each \x85 (two bytes in the body) is echoed as the four characters \x85: a 240 KB body, a 480 KB reason
HUGE_ECHO = json.dumps(
    {"name": "echo", "run": {"command": "x"}, "resources": {"gpus": 1, "gpu_models": ["\x85" * 120_000]}},
    ensure_ascii=False,
)


def send(deployment: Deployment, body: str) -> str:
    return deployment.sqs.send_message(QueueUrl=deployment.queues.queue_url, MessageBody=body)["MessageId"]


def test_hostile_messages_are_dead_lettered_with_short_reasons_and_the_valid_job_is_admitted(
    deployment: Deployment,
) -> None:
    # Given the job queue holding two hostile messages, then resnet50
    surrogate_id = job_id_for("env", send(deployment, SURROGATE))
    echo_id = job_id_for("echo", send(deployment, HUGE_ECHO))
    valid_id = job_id_for("resnet50", send(deployment, json.dumps(resnet50_spec())))

    # When the queue-depth alarm fires
    report = deployment.invoke("dispatcher", recorded_event("alarm-state-change"))

    # Then resnet50 is admitted
    assert report["errors"] == {}
    assert (report["accepted"], report["admitted"]) == ([valid_id], [valid_id])
    assert deployment.job(valid_id).state is JobState.PLACING
    assert deployment.executions() == [valid_id]

    # And each hostile message is a FAILED job whose short reason names the field
    assert sorted(report["rejected"]) == sorted([surrogate_id, echo_id])
    for job_id, field in [
        (surrogate_id, "run.env.HOME: holds an unpaired UTF-16 surrogate"),
        (echo_id, "resources.gpu_models"),
    ]:
        failed = deployment.job(job_id)
        assert failed.state is JobState.FAILED
        assert failed.failure_reason is not None
        assert failed.failure_reason.startswith(f"{INVALID_JOB}: ")
        assert field in failed.failure_reason
        assert len(failed.failure_reason) <= len(f"{INVALID_JOB}: ") + MAX_REASON_CHARS

    # And both messages are kept in the DLQ, as sent, each with its reason
    dead = deployment.sqs.receive_message(
        QueueUrl=deployment.queues.dlq_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
    )["Messages"]
    reasons = {m["Body"]: m["MessageAttributes"][ERROR_ATTRIBUTE]["StringValue"] for m in dead}
    assert sorted(reasons) == sorted([SURROGATE, HUGE_ECHO])
    assert "run.env.HOME" in reasons[SURROGATE]
    assert "resources.gpu_models" in reasons[HUGE_ECHO]
    assert all(len(reason) <= MAX_REASON_CHARS for reason in reasons.values())
