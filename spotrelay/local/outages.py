"""The control plane down, in a replay: a scenario's `outages_of_functions` windows, and Lambda's handling
of the asynchronous events that fail meanwhile (spotrelay.local.scenario, spotrelay.local.replay).

- `FunctionOutages` (an `InProcessLambdas.faults` hook): in a window, every invocation of every function
  fails before its handler runs, with Lambda.ServiceException, as the Lambda service fails it. A Step
  Functions task's synchronous invocation gets it as the task's error (the tasks' Retry waits it out:
  stacks/lifecycle_construct.SERVICE_RETRY_*); an asynchronous one (EventBridge's) is retried by Lambda
  twice, 1 and 2 minutes later (spotrelay.local.lambdas.AsynchronousInvocations), then goes to the
  function's DLQ. Outside the windows the hook it wraps (the chaos, if any) decides.
- `AsynchronousDeliveries` (a `patches.DeliveryFaults` hook, when no chaos delivers): each EventBridge
  delivery to a Lambda target is one asynchronous invocation, retried and dead-lettered as Lambda does.
- `dead_letters_to_sqs`: Lambda's delivery of a given-up event to the function's DLQ, an SQS message whose
  body is the event, with Lambda's `RequestID`, `ErrorCode` and `ErrorMessage` attributes. moto keeps no
  DeadLetterConfig from the template, so the DLQs come from the stack's outputs (spotrelay.aws.recovery).

The archive needs nothing here: EventBridge archives every matching event before any target sees it, and
StartReplay delivers the window's events again (spotrelay.local.patches: `Replay.replay_events`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from spotrelay.local.chaos import SERVICE_ERROR, function_name
from spotrelay.local.lambdas import AsynchronousInvocations, DeadLetter, InvocationFault, InvocationFaults

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

    from spotrelay.local.patches import Undeliverable

LAMBDA_DLQ_ERROR_CODE = "200"  # what Lambda puts in ErrorCode for a function error


class FunctionOutages:
    """Every invocation fails in a window (see the module docstring); `failed[function]` counts them."""

    def __init__(
        self,
        now: Callable[[], datetime],
        windows: Sequence[tuple[datetime, datetime]],
        *,
        otherwise: InvocationFaults | None = None,
    ) -> None:
        self.now = now
        self.windows = tuple(windows)
        self.otherwise = otherwise
        self.failed: Counter[str] = Counter()

    def down(self, when: datetime) -> bool:
        return any(start <= when < end for start, end in self.windows)

    def fault_for(self, function_name: str) -> InvocationFault | None:
        if self.down(self.now()):
            self.failed[function_name] += 1
            return InvocationFault(SERVICE_ERROR, after_handler=False)
        return self.otherwise.fault_for(function_name) if self.otherwise is not None else None


class AsynchronousDeliveries:
    """patches.DeliveryFaults: an EventBridge delivery to a Lambda target, as Lambda's asynchronous invocation."""

    def __init__(self, asynchronous: AsynchronousInvocations) -> None:
        self.asynchronous = asynchronous

    def deliver(
        self,
        rule: str,
        target_arn: str,
        event: Mapping[str, Any],
        send: Callable[[], str | None],
        undeliverable: Undeliverable,
    ) -> None:
        self.asynchronous.invoke(function_name(target_arn), send, dict(event))


def dead_letters_to_sqs(sqs: SQSClient, queues: Mapping[str, str]) -> DeadLetter:
    """Lambda's delivery of a given-up asynchronous event to its function's DLQ (`queues`: function name ->
    queue URL); a function without one: False (Lambda discards the event)."""
    sent = 0

    def dead_letter(function: str, event: Any, error: str) -> bool:
        nonlocal sent
        queue_url = queues.get(function)
        if queue_url is None:
            return False
        sent += 1
        sqs.send_message(
            QueueUrl=queue_url,
            MessageBody=json.dumps(event),
            MessageAttributes={
                "RequestID": {"DataType": "String", "StringValue": f"local-dead-letter-{sent:06d}"},
                "ErrorCode": {"DataType": "String", "StringValue": LAMBDA_DLQ_ERROR_CODE},
                "ErrorMessage": {"DataType": "String", "StringValue": error[:256] or "function error"},
            },
        )
        return True

    return dead_letter


__all__ = ["AsynchronousDeliveries", "FunctionOutages", "dead_letters_to_sqs"]
