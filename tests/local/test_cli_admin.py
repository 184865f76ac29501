"""`spotrelay admin quarantined / release` against the deployed stack (in moto), found by the stack's name
alone, as an operator runs them after a job record was set aside as unreadable and then fixed by hand."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from typer.testing import CliRunner

from spotrelay.aws.store import DynamoJobStore
from spotrelay.cli import app
from spotrelay.local import LocalRuntime, VirtualClock, patches
from spotrelay.models import Job, parse_job_spec

from .conftest import REPO_ROOT, START

JOB_ID = "train-0123456789ab"


def run(clock: VirtualClock, *args: str) -> Any:
    with clock.exclusive():
        result = CliRunner().invoke(app, list(args))
    clock.wait_quiescent()
    return result


def test_an_operator_lists_a_quarantined_job_and_releases_it_once_fixed(
    runtime: LocalRuntime, clock: VirtualClock
) -> None:
    assert runtime.stack is not None
    table, dynamodb = runtime.stack.table_name, runtime.dynamodb
    key = {"pk": {"S": f"JOB#{JOB_ID}"}, "sk": {"S": "JOB"}}

    def set_record(text: str) -> None:
        dynamodb.update_item(
            TableName=table,
            Key=key,
            UpdateExpression="SET #r = :r",
            ExpressionAttributeNames={"#r": "record"},
            ExpressionAttributeValues={":r": {"S": text}},
        )

    # Given a queued job whose record was spoilt, and quarantined by the dispatcher's read
    spec = parse_job_spec({"name": "train", "run": {"command": "python train.py"}, "resources": {"gpus": 1}})
    store = DynamoJobStore(table, dynamodb, quarantine=True)
    assert store.create_job(Job(job_id=JOB_ID, spec=spec, submitted_at=START, updated_at=START))
    good = dynamodb.get_item(TableName=table, Key=key)["Item"]["record"]["S"]
    set_record(good.replace('"gpus":1', '"gpus":"one"'))
    assert store.queued_jobs(10) == []

    # When the operator lists the quarantined records
    listed = run(clock, "admin", "quarantined", "--json")
    table_text = run(clock, "admin", "quarantined").stdout

    # Then the job is there: why, when, where from, and that it does not read back yet
    assert listed.exit_code == 0, listed.output
    [entry] = json.loads(listed.stdout)
    assert entry["job_id"] == JOB_ID
    assert entry["reason"].startswith("does not read as a Job (spec.resources.gpus: Input should be a valid integer")
    assert (entry["index"], entry["reads_back"]) == ("QUEUED", False)
    assert entry["quarantined_at"].startswith("20")
    for shown in (JOB_ID, "QUEUED", "spec.resources.gpus"):
        assert shown in table_text

    # When the operator releases it before fixing it: refused, saying why (and it stays quarantined)
    refused = run(clock, "admin", "release", JOB_ID)
    assert refused.exit_code == 1
    assert refused.stderr.startswith(
        f"error: job {JOB_ID} is still quarantined: its record does not read as a Job (spec.resources.gpus:"
    )

    # When the operator fixes the record by hand and releases it
    set_record(good)
    released = run(clock, "admin", "release", JOB_ID)

    # Then it is released, back in the queue, where `ls` (and the dispatcher) sees it again, and the list is empty
    assert released.exit_code == 0, released.output
    assert released.stdout == f"job {JOB_ID} released: back in the QUEUED index\n"
    assert [(j["job_id"], j["state"]) for j in json.loads(run(clock, "ls", "--json").stdout)] == [(JOB_ID, "QUEUED")]
    empty = run(clock, "admin", "quarantined")
    assert (empty.exit_code, empty.stdout, empty.stderr) == (0, "", "no quarantined job records\n")

    # And a job that does not exist is the one-line error of a wrong id
    unknown = run(clock, "admin", "release", "nope-0123456789ab")
    assert (unknown.exit_code, unknown.stderr) == (2, "error: no job nope-0123456789ab in stack SpotRelay\n")


def test_an_operator_redrives_the_events_lambda_dead_lettered_during_an_outage(
    runtime: LocalRuntime, clock: VirtualClock
) -> None:
    from spotrelay.aws import recovery

    assert runtime.stack is not None
    dlq = runtime.stack.outputs[recovery.dead_letter_queue_output("ec2_events")]
    sqs = runtime.client("sqs")
    # Given two EC2 events Lambda gave up on while the functions were down: one about an instance that is
    # not ours (acknowledged as such), one that is no event the handler knows (logged, counted, acknowledged)
    recorded = json.loads((REPO_ROOT / "events" / "recorded" / "instance-state-change-running.json").read_text())
    recorded["detail"]["instance-id"] = "i-0123456789abcdef0"
    for body in (json.dumps(recorded), json.dumps({"detail-type": "something else", "detail": {}})):
        sqs.send_message(QueueUrl=dlq, MessageBody=body)

    # When the operator redrives the DLQ
    answer = run(clock, "admin", "redrive", "--json")

    # Then both were handled and deleted: the DLQ is empty, and a second run finds nothing
    assert answer.exit_code == 0, answer.output
    done, targets = json.loads(answer.stdout)
    assert (targets["function"], targets["found"]) == ("event targets", 0)
    assert "Ec2Events" in done["function"]  # the deployed function's name
    assert (done["found"], done["handled"], done["failed"], done["complete"]) == (2, 2, 0, True)
    depth = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
    assert depth["ApproximateNumberOfMessages"] == "0"
    again = run(clock, "admin", "redrive")
    assert again.exit_code == 0
    assert again.stdout.endswith("event targets: 0 of 0 dead-lettered events handled\n")


def test_an_operator_redrives_the_events_eventbridge_could_not_deliver(
    runtime: LocalRuntime, clock: VirtualClock
) -> None:
    from spotrelay.aws import recovery
    from spotrelay.config import EVENT_TARGET_DLQ_OUTPUT

    assert runtime.stack is not None
    outputs = runtime.stack.outputs
    dlq = outputs[EVENT_TARGET_DLQ_OUTPUT]
    ec2_events = outputs[recovery.function_name_output("ec2_events")]
    sqs = runtime.client("sqs")
    arn = f"arn:aws:lambda:{runtime.stack.region}:{runtime.stack.account_id}:function:"

    def undelivered(body: dict[str, Any], target: str) -> None:
        # as EventBridge dead-letters an event: the event as the body, the target in an attribute
        attributes = {"TARGET_ARN": {"DataType": "String", "StringValue": target}}
        sqs.send_message(QueueUrl=dlq, MessageBody=json.dumps(body), MessageAttributes=attributes)

    # Given an EC2 event EventBridge could not deliver to ec2_events, a schedule tick for the reconciler,
    # and an event for a function that is not the stack's
    recorded = json.loads((REPO_ROOT / "events" / "recorded" / "instance-state-change-running.json").read_text())
    recorded["detail"]["instance-id"] = "i-0123456789abcdef0"
    undelivered(recorded, arn + ec2_events)
    tick = {"detail-type": "Scheduled Event", "source": "aws.events", "detail": {}}
    undelivered(tick, arn + "SpotRelay-Reconcile-XYZ")
    undelivered(recorded, arn + "someone-elses-function")

    # When the operator redrives
    answer = run(clock, "admin", "redrive", "--json")

    # Then the EC2 event was handled by ec2_events, the tick dropped, and the stranger's event stays:
    # the command says so and exits 1
    assert answer.exit_code == 1, answer.output
    targets = json.loads(answer.stdout)[-1]
    assert (targets["found"], targets["handled"], targets["failed"]) == (3, 2, 1)
    assert "someone-elses-function" in targets["errors"][0]
    handled = [i for i in runtime.lambdas.invocations if i.function_name == ec2_events]
    assert [i.event["detail"]["instance-id"] for i in handled] == ["i-0123456789abcdef0"]
    clock.advance_by(timedelta(seconds=recovery.REDRIVE_VISIBILITY_SECONDS + 1))
    left = sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10, MessageAttributeNames=["All"])["Messages"]
    assert [m["MessageAttributes"]["TARGET_ARN"]["StringValue"] for m in left] == [arn + "someone-elses-function"]


class GivingUp:
    """patches.DeliveryFaults: every delivery to a Lambda target fails its retries (a throttled function)."""

    def deliver(
        self,
        rule: str,
        target_arn: str,
        event: Mapping[str, Any],
        send: Callable[[], str | None],
        undeliverable: patches.Undeliverable,
    ) -> None:
        undeliverable.give_up("THROTTLING", "Rate Exceeded.")


def test_an_event_eventbridge_gives_up_on_lands_in_the_target_dlq_as_aws_sends_it_and_is_redriven(
    runtime: LocalRuntime, clock: VirtualClock, recorded_event: Callable[..., dict[str, Any]]
) -> None:
    from spotrelay.aws import recovery
    from spotrelay.config import EVENT_TARGET_DLQ_OUTPUT

    assert runtime.stack is not None
    outputs = runtime.stack.outputs
    ec2_events = outputs[recovery.function_name_output("ec2_events")]
    installed = patches.installed()
    assert installed is not None
    installed.delivery_faults = GivingUp()
    # Given a state change EventBridge could not deliver to ec2_events, every retry of its RetryPolicy throttled
    event_id = runtime.put_event(recorded_event("instance-state-change-running", instance_id="i-0fedcba987654321"))
    assert not [i for i in runtime.lambdas.invocations if i.function_name == ec2_events]
    # Then it is in the rule targets' DLQ: the event as the body, the rule, target and error as attributes
    sqs = runtime.client("sqs")
    dlq = outputs[EVENT_TARGET_DLQ_OUTPUT]
    [message] = sqs.receive_message(
        QueueUrl=dlq, MaxNumberOfMessages=10, MessageAttributeNames=["All"], VisibilityTimeout=0
    )["Messages"]
    body = json.loads(message["Body"])
    assert (body["id"], body["detail"]["instance-id"]) == (event_id, "i-0fedcba987654321")
    attributes = {k: v["StringValue"] for k, v in message["MessageAttributes"].items()}
    rules = runtime.client("events").list_rule_names_by_target(TargetArn=attributes["TARGET_ARN"])["RuleNames"]
    assert attributes["TARGET_ARN"].endswith(f":function:{ec2_events}")
    assert attributes["RULE_ARN"].rpartition("/")[2] in rules
    assert (attributes["ERROR_CODE"], attributes["ERROR_MESSAGE"]) == ("THROTTLING", "Rate Exceeded.")
    assert attributes["EXHAUSTED_RETRY_CONDITION"] == "MaximumEventAgeInSeconds"
    assert attributes["RETRY_ATTEMPTS"] == "8"  # the stack's RetryPolicy for the EC2 rules
    # When the operator redrives, Then ec2_events handles it and the DLQ is empty
    installed.delivery_faults = None
    answer = run(clock, "admin", "redrive", "--json")
    assert answer.exit_code == 0, answer.output
    targets = json.loads(answer.stdout)[-1]
    assert (targets["function"], targets["found"], targets["handled"]) == ("event targets", 1, 1)
    handled = [i for i in runtime.lambdas.invocations if i.function_name == ec2_events]
    assert [i.event["id"] for i in handled] == [event_id]
