"""`spotrelay events export --since 24h > incident.jsonl`: the stack's archived EC2 spot events from a
real account, as JSON lines a replay scenario can name (`events: {file: incident.jsonl}`).

EventBridge has no API that reads an archive's events: an archive can only be *replayed*
(StartReplay), and only onto the event bus it archives (cross-bus replays are refused). So the export:

1. finds the stack's archive (its CloudFormation resource) and its source bus;
2. creates a temporary SQS queue and a temporary rule on that bus matching only this replay's events
   (`{"replay-name": [<name>]}`), targeting the queue;
3. starts the replay of [since, until) with `Destination.FilterArns = [<temporary rule>]`, so that no
   other rule - none of the stack's - sees the replayed events again;
4. drains the queue until the replay is COMPLETED and the queue stays empty, then deletes the rule
   and the queue (also on errors and Ctrl-C).

It therefore writes to the account (a rule, a queue, a replay) and needs events:DescribeArchive,
StartReplay, DescribeReplay, PutRule, PutTargets, RemoveTargets, DeleteRule, sqs:CreateQueue,
SetQueueAttributes, ReceiveMessage, DeleteMessage, DeleteQueue, and read access to the jobs table.
EventBridge replays a minute of events at a time, so an export of a day takes a few minutes.

Each line is the event as EventBridge delivered it (without `replay-name`), plus a `spotrelay` note
`{"job": <job name>, "attempt": n}` when the instance id is one of the stack's attempts (the jobs
table's instance refs): a replay binds the event to the attempt of the job of the same name.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from spotrelay.control.ports import JobStore, NotFoundError

REPLAY_POLL_SECONDS = 5.0
QUIET_POLLS = 3  # empty receives in a row, after the replay completed, before the export ends


class ExportError(RuntimeError):
    """The archive cannot be exported (the message says why)."""


def stack_archive(cloudformation: Any, stack_name: str, events: Any = None) -> str:
    """The name of the stack's EventBridge archive (its physical id; or, where CloudFormation does not
    give one - moto - the one archive whose name starts with the stack's name)."""
    try:
        pages = cloudformation.get_paginator("list_stack_resources").paginate(StackName=stack_name)
        found = [
            r for page in pages for r in page["StackResourceSummaries"] if r["ResourceType"] == "AWS::Events::Archive"
        ]
    except Exception as e:  # botocore's ClientError, without importing botocore here
        raise ExportError(f"cannot list the resources of stack {stack_name}: {e}") from e
    if not found:
        raise ExportError(f"stack {stack_name} has no EventBridge archive")
    if found[0].get("PhysicalResourceId"):
        return str(found[0]["PhysicalResourceId"])
    named = [a["ArchiveName"] for a in (events.list_archives(NamePrefix=stack_name)["Archives"] if events else [])]
    if len(named) != 1:
        raise ExportError(f"cannot tell the archive of stack {stack_name}: {named or 'none'}")
    return str(named[0])


def stack_table(cloudformation: Any, stack_name: str) -> str:
    outputs = cloudformation.describe_stacks(StackName=stack_name)["Stacks"][0].get("Outputs", [])
    for output in outputs:
        if output.get("OutputKey") == "TableName":
            return str(output["OutputValue"])
    raise ExportError(f"stack {stack_name} has no TableName output")


@contextmanager
def _temporary_capture(events: Any, sqs: Any, bus_arn: str, replay_name: str) -> Iterator[tuple[str, str]]:
    """A queue and a rule on the bus that receives only `replay_name`'s events: (queue url, rule arn)."""
    bus_name = bus_arn.rsplit("/", 1)[-1]
    name = replay_name[:64]
    queue_url = sqs.create_queue(QueueName=name, Attributes={"MessageRetentionPeriod": "3600"})["QueueUrl"]
    rule_arn = ""
    try:
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        rule_arn = events.put_rule(
            Name=name,
            EventBusName=bus_name,
            EventPattern=json.dumps({"replay-name": [replay_name]}),
            State="ENABLED",
            Description="spotrelay events export (temporary)",
        )["RuleArn"]
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": "events.amazonaws.com"},
                    "Action": "sqs:SendMessage",
                    "Resource": queue_arn,
                    "Condition": {"ArnEquals": {"aws:SourceArn": rule_arn}},
                }
            ],
        }
        sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"Policy": json.dumps(policy)})
        events.put_targets(Rule=name, EventBusName=bus_name, Targets=[{"Id": "export", "Arn": queue_arn}])
        yield queue_url, rule_arn
    finally:
        if rule_arn:
            try:
                events.remove_targets(Rule=name, EventBusName=bus_name, Ids=["export"])
            finally:
                events.delete_rule(Name=name, EventBusName=bus_name)
        sqs.delete_queue(QueueUrl=queue_url)


def _drain(sqs: Any, queue_url: str) -> list[dict[str, Any]]:
    received: list[dict[str, Any]] = []
    while True:
        answer = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        messages = answer.get("Messages", [])
        if not messages:
            return received
        for message in messages:
            received.append(json.loads(message["Body"]))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])


def export_archive(
    *,
    events: Any,
    sqs: Any,
    archive_name: str,
    since: datetime,
    until: datetime,
    store: JobStore | None = None,
    poll_seconds: float = REPLAY_POLL_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
) -> list[dict[str, Any]]:
    """The archive's events in [since, until), in time order, each annotated with its job and attempt."""
    archive = events.describe_archive(ArchiveName=archive_name)
    archive_arn, bus_arn = archive["ArchiveArn"], archive["EventSourceArn"]
    replay_name = f"spotrelay-export-{uuid.uuid4().hex[:12]}"
    collected: dict[str, dict[str, Any]] = {}
    with _temporary_capture(events, sqs, bus_arn, replay_name) as (queue_url, rule_arn):
        events.start_replay(
            ReplayName=replay_name,
            Description="spotrelay events export",
            EventSourceArn=archive_arn,
            EventStartTime=since,
            EventEndTime=until,
            Destination={"Arn": bus_arn, "FilterArns": [rule_arn]},
        )
        quiet = 0
        while True:
            batch = _drain(sqs, queue_url)
            for event in batch:
                collected.setdefault(str(event.get("id")), event)
            state = events.describe_replay(ReplayName=replay_name)["State"]
            if state in {"FAILED", "CANCELLED"}:
                raise ExportError(f"replay {replay_name} is {state}")
            if state == "COMPLETED":
                quiet = 0 if batch else quiet + 1
                if quiet >= QUIET_POLLS:
                    break
            sleep(poll_seconds)
    exported = []
    for event in collected.values():
        event.pop("replay-name", None)
        note = _attempt_of(event, store) if store is not None else None
        if note is not None:
            event["spotrelay"] = note
        exported.append(event)
    return sorted(exported, key=lambda e: (str(e.get("time")), str(e.get("id"))))


def _attempt_of(event: dict[str, Any], store: JobStore) -> dict[str, Any] | None:
    detail = event.get("detail")
    instance_id = detail.get("instance-id") if isinstance(detail, dict) else None
    if not isinstance(instance_id, str):
        return None
    ref = store.get_instance_ref(instance_id)
    if ref is None:
        return None
    try:
        job, _ = store.get_job(ref.job_id)
    except NotFoundError:
        return None
    return {"job": job.spec.name, "attempt": ref.attempt, "job_id": ref.job_id}


def to_jsonl(events: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(e, sort_keys=True) + "\n" for e in events)
