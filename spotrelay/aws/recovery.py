"""After the control plane was down: the operator's two steps (the third, the reconciler, catches up by
itself on its schedule). `spotrelay admin redrive` and `spotrelay admin replay-archive` call these, and so
does a replay's `operator:` step (spotrelay.local.replay), on moto.

- `redrive`: every event Lambda dead-lettered after its asynchronous retries (an ec2_events invocation
  that failed three times) is invoked again, synchronously, with the same payload, and deleted from the
  DLQ once the function handled it. A message the function fails again stays (visible again after its
  visibility timeout) and is counted: run the command again. The handlers are idempotent, so a message
  handled twice (the command interrupted between the invoke and the delete) does no harm.
- `redrive_event_targets`: the events EventBridge itself could not deliver to a rule's target (throttled,
  a permission or a deleted function: the target DLQ, `EVENT_TARGET_DLQ_OUTPUT`). Each message says its
  target in its `TARGET_ARN` attribute: one of the stack's functions named in `REDRIVABLE_TARGETS` is invoked
  with the event, as above; a schedule's tick for any other is deleted (the next tick does its work); a
  message for a target that is none of these stays, counted as failed.
- `replay_archive`: EventBridge's StartReplay of the stack's archive (the EC2 events) over a window, to
  the bus it archives; every rule matching an event delivers it again, as it did the first time.

The names of the stack outputs these need are here (pure names: stacks/ imports them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_lambda import LambdaClient
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef

# Functions EventBridge invokes asynchronously whose events the schedule would not make up for: each has
# its own DLQ (a dead-lettered message does not say which function it was for)
DEAD_LETTERED_FUNCTIONS = ("ec2_events",)
# Rule targets whose undelivered events are delivered again from the target DLQ (their names are outputs)
REDRIVABLE_TARGETS = ("ec2_events", "dispatcher")
SCHEDULED_EVENT = "Scheduled Event"  # a schedule rule's tick: the next one makes up for it
ARCHIVE_NAME_OUTPUT = "EventArchiveName"
ARCHIVE_ARN_OUTPUT = "EventArchiveArn"


def archive_name(outputs: Mapping[str, str]) -> str:
    """The archive's name from the stack's outputs: the last part of its ARN (arn:...:archive/NAME), which
    every CloudFormation implementation resolves (moto's Ref of an archive is no name), else the name."""
    arn = outputs.get(ARCHIVE_ARN_OUTPUT, "")
    if ":archive/" in arn:
        return arn.rsplit("/", 1)[-1]
    return outputs.get(ARCHIVE_NAME_OUTPUT, "")


def _pascal(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def dead_letter_queue_output(function: str) -> str:
    """ec2_events -> Ec2EventsDeadLetterQueueUrl: the stack output naming the function's DLQ."""
    return f"{_pascal(function)}DeadLetterQueueUrl"


def function_name_output(function: str) -> str:
    """ec2_events -> Ec2EventsFunctionName."""
    return f"{_pascal(function)}FunctionName"


MAX_REDRIVE_MESSAGES = 10_000  # one run's bound: a DLQ deeper than this takes another run
REDRIVE_VISIBILITY_SECONDS = 300  # a message being redriven is hidden this long (the function may take 60 s)


@dataclass
class Redrive:
    """What one redrive of a function's DLQ did."""

    function: str
    queue_url: str
    found: int = 0  # messages received
    handled: int = 0  # invoked without a function error, and deleted
    failed: int = 0  # the function failed again: left in the DLQ
    errors: list[str] = field(default_factory=list)  # the first few function errors, bounded

    @property
    def complete(self) -> bool:
        return self.failed == 0


EVENT_TARGETS = "event targets"  # how a redrive names the rule targets' DLQ


@dataclass(frozen=True)
class DeadLetterQueue:
    """A queue `spotrelay admin redrive` drains: a function's (Lambda gave up its retries on an event), or
    the rule targets' (events EventBridge could not deliver), whose events go back to `targets`."""

    name: str  # the function's name, or EVENT_TARGETS
    queue_url: str
    targets: frozenset[str] = frozenset()

    def redrive(self, sqs: SQSClient, lambda_: LambdaClient) -> Redrive:
        if self.name == EVENT_TARGETS:
            return redrive_event_targets(sqs, lambda_, queue_url=self.queue_url, functions=self.targets)
        return redrive(sqs, lambda_, queue_url=self.queue_url, function_name=self.name)


def dead_letter_queues(output: Callable[[str], str], targets_queue_url: str | None) -> list[DeadLetterQueue]:
    """The stack's DLQs in the order a redrive drains them: each dead-lettered function's, then the rule
    targets' (`targets_queue_url`, the EVENT_TARGET_DLQ_OUTPUT output: None for a stack deployed before it
    had one). `output(name)` reads a stack output (raising for one the stack lacks)."""
    queues = [
        DeadLetterQueue(output(function_name_output(f)), output(dead_letter_queue_output(f)))
        for f in DEAD_LETTERED_FUNCTIONS
    ]
    if targets_queue_url is not None:
        targets = frozenset(output(function_name_output(f)) for f in REDRIVABLE_TARGETS)
        queues.append(DeadLetterQueue(EVENT_TARGETS, targets_queue_url, targets))
    return queues


def redrive(sqs: SQSClient, lambda_: LambdaClient, *, queue_url: str, function_name: str) -> Redrive:
    """Invoke `function_name` with each message of its DLQ `queue_url` (the body: the event), deleting each
    one the function handled (see the module docstring)."""
    report = Redrive(function=function_name, queue_url=queue_url)
    return _drain(sqs, lambda_, report, lambda message: (function_name, None))


def redrive_event_targets(
    sqs: SQSClient, lambda_: LambdaClient, *, queue_url: str, functions: Collection[str]
) -> Redrive:
    """Deliver again each event of the target DLQ `queue_url` whose target (`TARGET_ARN`) is one of
    `functions` (their names), deleting each one the function handled; a schedule's tick for another
    target is deleted; anything else stays (see the module docstring)."""

    def route(message: MessageTypeDef) -> tuple[str | None, str | None]:
        attribute = message.get("MessageAttributes", {}).get("TARGET_ARN")
        target = attribute.get("StringValue", "") if attribute is not None else ""
        name = target.rpartition(":function:")[2].split(":")[0] if ":function:" in target else ""
        if name in functions:
            return name, None
        if _is_scheduled_tick(message.get("Body", "")):
            return None, None
        return None, f"an event for {target[:200] or 'no named target'}: not redriven, left in the DLQ"

    report = Redrive(function="event targets", queue_url=queue_url)
    return _drain(sqs, lambda_, report, route)


def _drain(
    sqs: SQSClient,
    lambda_: LambdaClient,
    report: Redrive,
    route: Callable[[MessageTypeDef], tuple[str | None, str | None]],
) -> Redrive:
    """Each message of `report.queue_url` (at most MAX_REDRIVE_MESSAGES a run): `route` says which function to
    invoke with its body (None: none, the message is only deleted) or why it stays; a message the function
    handled, or none was to, is deleted. Counted in `report`, which is returned."""
    while report.found < MAX_REDRIVE_MESSAGES:
        answer = sqs.receive_message(
            QueueUrl=report.queue_url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=REDRIVE_VISIBILITY_SECONDS,
            WaitTimeSeconds=0,
            MessageAttributeNames=["All"],  # a target DLQ message names its target (TARGET_ARN)
        )
        messages = answer.get("Messages", [])
        if not messages:
            break
        for message in messages:
            report.found += 1
            function_name, problem = route(message)
            if problem is None and function_name is not None:
                response = lambda_.invoke(
                    FunctionName=function_name, InvocationType="RequestResponse", Payload=message.get("Body", "")
                )
                if "FunctionError" in response:
                    problem = response["Payload"].read().decode("utf-8", "replace")[:300]
            if problem is not None:
                report.failed += 1
                if len(report.errors) < 5:
                    report.errors.append(problem)
                continue
            sqs.delete_message(QueueUrl=report.queue_url, ReceiptHandle=message["ReceiptHandle"])
            report.handled += 1
    return report


def _is_scheduled_tick(body: str) -> bool:
    try:
        event = json.loads(body)
    except ValueError:
        return False
    return (
        isinstance(event, dict) and event.get("detail-type") == SCHEDULED_EVENT and event.get("source") == "aws.events"
    )


def queue_depth(sqs: SQSClient, queue_url: str) -> int:
    """Messages in the queue, visible or in flight (a redrive's failures are in flight for a while)."""
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes.get("ApproximateNumberOfMessages", "0")) + int(
        attributes.get("ApproximateNumberOfMessagesNotVisible", "0")
    )


@dataclass(frozen=True)
class ArchiveReplay:
    name: str
    archive_arn: str
    destination_arn: str
    start: datetime
    end: datetime
    state: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


REPLAY_NAME = re.compile(r"[.\-_A-Za-z0-9]{1,64}")


def replay_name(start: datetime, end: datetime) -> str:
    """A replay's name from its window (EventBridge: 64 characters of [.-_A-Za-z0-9], unique per account)."""
    return f"spotrelay-{start:%Y%m%dT%H%M%S}-{end:%Y%m%dT%H%M%S}"


def replay_archive(
    events: EventBridgeClient, *, archive_name: str, start: datetime, end: datetime, name: str | None = None
) -> ArchiveReplay:
    """StartReplay of `archive_name`'s events between `start` and `end`, to the bus the archive records."""
    if start >= end:
        raise ValueError(f"the window is empty: {start.isoformat()} is not before {end.isoformat()}")
    name = name or replay_name(start, end)
    if not REPLAY_NAME.fullmatch(name):
        raise ValueError(f"replay name {name!r}: 1-64 characters of letters, digits, '.', '-', '_'")
    archive = events.describe_archive(ArchiveName=archive_name)
    answer = events.start_replay(
        ReplayName=name,
        Description=f"spotrelay: the events of {start.isoformat()} to {end.isoformat()} again",
        EventSourceArn=archive["ArchiveArn"],
        EventStartTime=start,
        EventEndTime=end,
        Destination={"Arn": archive["EventSourceArn"]},
    )
    return ArchiveReplay(
        name=name,
        archive_arn=archive["ArchiveArn"],
        destination_arn=archive["EventSourceArn"],
        start=start,
        end=end,
        state=str(answer.get("State", "")),
        raw=json.loads(json.dumps(answer, default=str)),
    )


__all__ = [
    "ARCHIVE_ARN_OUTPUT",
    "ARCHIVE_NAME_OUTPUT",
    "DEAD_LETTERED_FUNCTIONS",
    "ArchiveReplay",
    "Redrive",
    "archive_name",
    "dead_letter_queue_output",
    "function_name_output",
    "queue_depth",
    "redrive",
    "replay_archive",
    "replay_name",
]
