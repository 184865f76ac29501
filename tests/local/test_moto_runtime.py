"""The patched moto, on small resources made through the API (no stack): Lambda handlers in-process,
EventBridge targets, and Step Functions' waits, retries and task tokens on the virtual clock."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from spotrelay.local import LocalRuntime, VirtualClock

from .conftest import START

ECHO = """\
import os


GREETING = os.environ.get("GREETING")  # read at import, as the spotrelay functions read their settings


def handler(event, context):
    if isinstance(event, dict) and event.get("fail"):
        raise LookupError("asked to fail")
    return {"greeting": GREETING, "event": event, "request_id": context.aws_request_id}
"""


@pytest.fixture
def local(tmp_path: Path, clock: VirtualClock) -> Iterator[LocalRuntime]:
    (tmp_path / "handlers").mkdir()
    (tmp_path / "handlers" / "echo.py").write_text(ECHO)
    trust = {"Statement": [{"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:*"}]}
    with LocalRuntime(clock=clock, code_root=tmp_path) as runtime:
        runtime.client("iam").create_role(RoleName="local-test", AssumeRolePolicyDocument=json.dumps(trust))
        yield runtime


def zipped(text: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("handlers/echo.py", text)
    return buffer.getvalue()


ROLE_ARN = "arn:aws:iam::123456789012:role/local-test"


def echo_function(runtime: LocalRuntime, name: str, greeting: str) -> str:
    created = runtime.client("lambda").create_function(
        FunctionName=name,
        Runtime="python3.11",
        Role=ROLE_ARN,
        Handler="handlers/echo.handler",
        Code={"ZipFile": zipped(ECHO)},
        Environment={"Variables": {"GREETING": greeting}},
    )
    return str(created["FunctionArn"])


def state_machine(runtime: LocalRuntime, definition: dict[str, Any]) -> str:
    return runtime.sfn.create_state_machine(name="sm", definition=json.dumps(definition), roleArn=ROLE_ARN)[
        "stateMachineArn"
    ]


def start(runtime: LocalRuntime, clock: VirtualClock, arn: str, payload: dict[str, Any]) -> str:
    with clock.exclusive():
        return runtime.sfn.start_execution(stateMachineArn=arn, name="run", input=json.dumps(payload))["executionArn"]


def outcome(runtime: LocalRuntime, execution_arn: str) -> dict[str, Any]:
    described = runtime.sfn.describe_execution(executionArn=execution_arn)
    return {"status": described["status"], "output": json.loads(described.get("output") or "null")}


def test_each_function_runs_its_own_handler_module_with_its_own_environment(local: LocalRuntime) -> None:
    lambda_client = local.client("lambda")
    echo_function(local, "first", "hello")
    echo_function(local, "second", "bonjour")
    answers = [
        json.loads(lambda_client.invoke(FunctionName=name, Payload=b'{"n": 1}')["Payload"].read())
        for name in ("first", "second", "first")
    ]
    assert [a["greeting"] for a in answers] == ["hello", "bonjour", "hello"]
    assert answers[0]["event"] == {"n": 1}


def test_an_exception_comes_back_as_lambdas_error_envelope(local: LocalRuntime) -> None:
    echo_function(local, "first", "hello")
    answer = local.client("lambda").invoke(FunctionName="first", Payload=b'{"fail": true}')
    envelope = json.loads(answer["Payload"].read())
    assert "FunctionError" in answer
    assert (envelope["errorType"], envelope["errorMessage"]) == ("LookupError", "asked to fail")
    assert envelope["stackTrace"]
    assert local.lambdas.invocations[-1].error_type == "LookupError"


def test_an_asynchronous_invocation_runs_the_handler(local: LocalRuntime) -> None:
    echo_function(local, "first", "hello")
    answer = local.client("lambda").invoke(FunctionName="first", InvocationType="Event", Payload=b'{"n": 2}')
    assert answer["StatusCode"] == 202
    assert [i.event for i in local.lambdas.invocations] == [{"n": 2}]


def test_rules_deliver_to_lambda_step_functions_and_sqs_targets(local: LocalRuntime, clock: VirtualClock) -> None:
    # Given a rule with a Lambda, a Step Functions and an SQS target, and a schedule rule
    function_arn = echo_function(local, "first", "hello")
    machine_arn = state_machine(local, {"StartAt": "Done", "States": {"Done": {"Type": "Pass", "End": True}}})
    queue_url = local.sqs.create_queue(QueueName="q")["QueueUrl"]
    queue_arn = local.sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    events = local.events
    events.put_rule(Name="r", EventPattern=json.dumps({"source": ["test.local"]}))
    events.put_targets(
        Rule="r",
        Targets=[
            {"Id": "1", "Arn": function_arn},
            {"Id": "2", "Arn": machine_arn, "RoleArn": ROLE_ARN},
            {"Id": "3", "Arn": queue_arn},
        ],
    )
    events.put_rule(Name="every-5-minutes", ScheduleExpression="rate(5 minutes)")
    events.put_targets(Rule="every-5-minutes", Targets=[{"Id": "1", "Arn": function_arn}])
    clock.advance_to(START + timedelta(hours=1))
    # When an event is put
    event_id = local.put_event({"source": "test.local", "detail-type": "Test", "detail": {"k": "v"}})
    clock.wait_quiescent()
    # Then the function got it once, in AWS's shape, stamped with the virtual time (the schedule rule
    # matched nothing); the state machine ran with it as input; the queue got it through moto's own delivery
    (invocation,) = local.lambdas.invocations
    delivered = invocation.event
    assert delivered["id"] == event_id
    assert (delivered["time"], delivered["account"], delivered["detail"]) == (
        "2026-11-30T01:00:00Z",
        "123456789012",
        {"k": "v"},
    )
    assert set(delivered) == {
        "version",
        "id",
        "detail-type",
        "source",
        "account",
        "time",
        "region",
        "resources",
        "detail",
    }
    (execution,) = local.sfn.list_executions(stateMachineArn=machine_arn)["executions"]
    assert outcome(local, execution["executionArn"]) == {"status": "SUCCEEDED", "output": delivered}
    (message,) = local.sqs.receive_message(QueueUrl=queue_url)["Messages"]
    assert json.loads(message["Body"])["id"] == event_id
    assert [(d.target_arn, d.error) for d in local.deliveries] == [(function_arn, None), (machine_arn, None)]
    # When the schedule rule fires (moto runs no schedule: the replay fires it), Then its target gets a
    # Scheduled Event
    scheduled_id = local.fire_schedule("every-5-minutes")
    scheduled = local.lambdas.invocations[-1].event
    assert (scheduled["id"], scheduled["detail-type"], scheduled["source"]) == (
        scheduled_id,
        "Scheduled Event",
        "aws.events",
    )
    assert scheduled["resources"] == ["arn:aws:events:us-east-1:123456789012:rule/every-5-minutes"]


def test_retry_intervals_run_on_the_virtual_clock_and_catch_sees_the_error_type(
    local: LocalRuntime, clock: VirtualClock
) -> None:
    function_arn = echo_function(local, "first", "hello")
    machine = state_machine(
        local,
        {
            "StartAt": "Call",
            "States": {
                "Call": {
                    "Type": "Task",
                    "Resource": "arn:aws:states:::lambda:invoke",
                    "Parameters": {"FunctionName": function_arn, "Payload.$": "$"},
                    "Retry": [
                        {"ErrorEquals": ["LookupError"], "IntervalSeconds": 60, "BackoffRate": 2, "MaxAttempts": 2}
                    ],
                    "Catch": [{"ErrorEquals": ["LookupError"], "ResultPath": "$.error", "Next": "Caught"}],
                    "End": True,
                },
                "Caught": {"Type": "Pass", "End": True},
            },
        },
    )
    execution = start(local, clock, machine, {"fail": True})
    clock.wait_quiescent()
    assert clock.next_wakeup() == START + timedelta(seconds=60)  # the first retry, not in real time
    clock.advance_to(START + timedelta(seconds=60))
    assert clock.next_wakeup() == START + timedelta(seconds=180)  # backoff: 120 s more
    clock.advance_to(START + timedelta(minutes=10))
    result = outcome(local, execution)
    assert result["status"] == "SUCCEEDED"
    assert result["output"]["error"]["Error"] == "LookupError"
    assert len(local.lambdas.invocations) == 3


def test_wait_states_and_task_token_timeouts_run_on_the_virtual_clock(local: LocalRuntime, clock: VirtualClock) -> None:
    function_arn = echo_function(local, "first", "hello")
    machine = state_machine(
        local,
        {
            "StartAt": "Seconds",
            "States": {
                "Seconds": {"Type": "Wait", "SecondsPath": "$.wait", "Next": "Until"},
                "Until": {"Type": "Wait", "Timestamp": "2026-11-30T02:00:00Z", "Next": "Token"},
                "Token": {
                    "Type": "Task",
                    "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
                    "Parameters": {"FunctionName": function_arn, "Payload": {"token.$": "$$.Task.Token"}},
                    "TimeoutSeconds": 300,
                    "Catch": [{"ErrorEquals": ["States.Timeout"], "ResultPath": "$.error", "Next": "TimedOut"}],
                    "End": True,
                },
                "TimedOut": {"Type": "Pass", "End": True},
            },
        },
    )
    execution = start(local, clock, machine, {"wait": 3600})
    clock.wait_quiescent()
    assert clock.next_wakeup() == START + timedelta(hours=1)
    clock.advance_to(START + timedelta(hours=1))
    assert clock.next_wakeup() == START + timedelta(hours=2)  # the Timestamp, against the virtual now
    clock.advance_to(START + timedelta(hours=2))
    assert clock.next_wakeup() == START + timedelta(hours=2, seconds=300)  # the token's TimeoutSeconds
    assert outcome(local, execution)["status"] == "RUNNING"
    clock.advance_to(START + timedelta(hours=3))
    result = outcome(local, execution)
    assert (result["status"], result["output"]["error"]["Error"]) == ("SUCCEEDED", "States.Timeout")


def test_a_message_left_on_a_queue_comes_back_after_its_visibility_timeout_of_virtual_time(
    local: LocalRuntime, clock: VirtualClock
) -> None:
    sqs = local.client("sqs")
    url = sqs.create_queue(QueueName="jobs", Attributes={"VisibilityTimeout": "600"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="job")
    # Given a message received and not deleted (its consumer failed)
    assert [m["Body"] for m in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", [])] == ["job"]
    # Then it stays hidden for its visibility timeout on the virtual clock, and only so long
    clock.advance_to(START + timedelta(seconds=599))
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == []
    clock.advance_to(START + timedelta(seconds=601))
    again = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0, AttributeNames=["ApproximateReceiveCount"])
    assert [(m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in again["Messages"]] == [("job", "2")]
