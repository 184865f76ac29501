"""spotrelay.aws.stack without AWS: what an older deployment or a failed wake-up looks like to a user."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import ClientError

from spotrelay.aws.stack import DeployedStack, JobsClient, StackError, deployed_stack
from spotrelay.aws.store import DynamoJobStore
from spotrelay.control.dispatcher import job_id_for
from spotrelay.models import parse_job_spec

STACK = DeployedStack(
    name="SpotRelay", queue_url="https://queue", table_name="t", dispatcher_function="d", cancel_function="c"
)
SPEC = parse_job_spec(
    {"name": "train", "run": {"command": "python train.py"}, "resources": {"gpus": 1}, "recovery": "same-pool-first"}
)


class Outputs:
    def __init__(self, outputs: dict[str, str]) -> None:
        self.outputs = outputs

    def describe_stacks(self, StackName: str) -> dict[str, Any]:
        return {"Stacks": [{"Outputs": [{"OutputKey": k, "OutputValue": v} for k, v in self.outputs.items()]}]}


class Queue:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def send_message(self, QueueUrl: str, MessageBody: str) -> dict[str, str]:
        self.sent.append(MessageBody)
        return {"MessageId": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"}


class RefusingLambda:
    def invoke(self, **kwargs: Any) -> dict[str, Any]:
        raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "not allowed"}}, "Invoke")


def test_a_stack_deployed_before_the_outputs_existed_is_named_with_what_it_lacks() -> None:
    older = Outputs({"QueueUrl": "https://queue", "TableName": "t"})
    with pytest.raises(StackError) as raised:
        deployed_stack(older, "SpotRelay")
    assert str(raised.value) == (
        "stack SpotRelay has no output DispatcherFunctionName, CancelFunctionName: "
        "deploy this version of spotrelay (cdk deploy)"
    )


def test_the_outputs_name_the_queue_table_and_functions() -> None:
    outputs = {
        "QueueUrl": "https://queue",
        "TableName": "t",
        "DispatcherFunctionName": "d",
        "CancelFunctionName": "c",
        "BucketName": "b",
    }
    assert deployed_stack(Outputs(outputs), "SpotRelay") == STACK


def test_submit_sends_the_spec_the_dispatcher_reads_back_and_survives_a_refused_wake_up() -> None:
    queue = Queue()
    client = JobsClient(STACK, sqs=queue, lambda_=RefusingLambda(), store=DynamoJobStore("t"))  # type: ignore[arg-type]
    submitted = client.submit(SPEC)
    # The message is sent, and it is the same spec once the dispatcher parses it
    (body,) = queue.sent
    assert parse_job_spec(json.loads(body)) == SPEC
    # The job id is the one the dispatcher gives the message
    assert submitted.job_id == job_id_for("train", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0") == "train-0f1e2d3c4b5a"
    # A refused wake-up is reported, not raised: the alarm or the schedule admits the job anyway
    assert not submitted.dispatcher_woken
    assert submitted.wake_error == "AccessDeniedException: not allowed"
