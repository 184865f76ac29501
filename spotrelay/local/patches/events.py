"""EventBridge delivery: Lambda and Step Functions targets get the rule's events (`Rule.send_to_targets`,
`_deliver`, with the delivery hook `DeliveryFaults` and what becomes of an event never delivered,
`Undeliverable`), a replay delivers only its window's events, and a schedule rule fires when told to
(`fire_scheduled_rule`; moto runs no schedule). `aws_event` is an event in the shape AWS delivers.

Siblings: `lambda_tasks` runs the Lambda functions in-process; `installation` holds the installed state read here
(the delivery hook, the deliveries); `cloudformation` fixes the stack's archives.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, cast

from moto.awslambda.models import LambdaFunction
from moto.events.models import Archive, Rule
from moto.events.models import Replay as EventsReplay
from moto.stepfunctions import responses as sfn_responses

from spotrelay.local.patches import installation
from spotrelay.local.patches.canaries import Expected
from spotrelay.local.patches.installation import Delivery, _Patcher

logger = logging.getLogger("spotrelay.local.patches")  # the package's logger, as before the split

EXPECTED: tuple[Expected, ...] = (
    Expected(  # the replay's window: the events it delivers are `archive.events`, its times the request's
        EventsReplay,
        "replay_events",
        "(self, archive: 'Archive') -> 'None'",
        ("for event in archive.events:",),
    ),
    Expected(
        EventsReplay,
        "__init__",
        "(self, account_id: 'str', region_name: 'str', name: 'str', description: 'str', source_arn: 'str', "
        "start_time: 'str', end_time: 'str', destination: 'dict[str, Any]')",
        ("self.event_start_time = start_time", "self.event_end_time = end_time"),
    ),
    Expected(
        LambdaFunction,
        "invoke",
        "(self, body: 'str', request_headers: 'Any', response_headers: 'Any') -> 'str | bytes'",
        ("res, errored, logs = self._invoke_lambda(event=body)",),
    ),
    Expected(
        Rule, "send_to_targets", "(self, original_event: 'EventMessageType', transform_input: 'bool' = True) -> 'None'"
    ),
)


@dataclass(frozen=True)
class Undeliverable:
    """What EventBridge does with an event it could not deliver to a target after every retry of its
    RetryPolicy (MaximumRetryAttempts, MaximumEventAgeInSeconds; EventBridge's defaults are 185 and 24 h):
    `give_up()` sends it to the target's DeadLetterConfig queue, as AWS does, or drops it when the target has
    none (as AWS does: every target of the stack has one, tests/infrastructure/test_event_targets.py).
    `after_seconds`: when, at the latest, after the first try (the retries' backoff is not modelled)."""

    give_up: Callable[[str, str], None]  # (ERROR_CODE, ERROR_MESSAGE)
    after_seconds: float


class DeliveryFaults(Protocol):
    """What happens to an EventBridge delivery to a Lambda target instead of its being made once, now
    (spotrelay.local.chaos). `send()` makes it (and records it in `deliveries`) and returns the function
    error, if any; the hook may call it now, later on the clock, more than once, or never; a delivery it
    never makes it gives up on with `undeliverable.give_up` (the target DLQ)."""

    def deliver(
        self,
        rule: str,
        target_arn: str,
        event: Mapping[str, Any],
        send: Callable[[], str | None],
        undeliverable: Undeliverable,
    ) -> None: ...


# --- EventBridge -------------------------------------------------------------------------------------


def _event_time(value: Any) -> str:
    if isinstance(value, int | float) or (isinstance(value, str) and value.replace(".", "", 1).isdigit()):
        return datetime.fromtimestamp(float(value), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def aws_event(message: dict[str, Any]) -> dict[str, Any]:
    """moto's internal event message as EventBridge delivers it to a target."""
    keys = ("version", "id", "detail-type", "source", "account", "time", "region", "resources", "detail")
    event = {key: copy.deepcopy(message.get(key)) for key in keys}
    event["version"] = event["version"] or "0"
    event["resources"] = event["resources"] or []
    event["time"] = _event_time(message.get("time"))
    return event


def _target_input(target: dict[str, Any], event: dict[str, Any]) -> Any:
    """What a target receives: the event, or its Input / InputPath / InputTransformer."""
    if target.get("Input") is not None:
        return json.loads(target["Input"])
    if target.get("InputPath"):
        value: Any = event
        for part in str(target["InputPath"]).removeprefix("$").strip(".").split("."):
            if part:
                value = value.get(part) if isinstance(value, dict) else None
        return value
    transformer = target.get("InputTransformer")
    if transformer:
        from moto.events.utils import EventTemplateParser

        return EventTemplateParser.parse(
            input_template=transformer.get("InputTemplate"),
            input_paths_map=transformer.get("InputPathsMap", {}),
            event=cast(Any, event),
        )
    return event


def _patch_events(patcher: _Patcher, deliveries: list[Delivery]) -> None:
    original: Callable[..., None] = patcher.original(Rule, "send_to_targets")

    def send_to_targets(self: Rule, original_event: dict[str, Any], transform_input: bool = True) -> None:
        if self.state != "ENABLED":
            return
        if self.scheduled_expression and not self.event_pattern._pattern:
            return  # a schedule rule matches no event
        if not self.event_pattern.matches_event(cast(Any, original_event)):
            return
        others = _deliver(self, original_event, deliveries, transform_input)
        if others:
            rest = copy.copy(self)
            rest.targets = others
            original(rest, original_event, transform_input)

    patcher.replace(Rule, "send_to_targets", send_to_targets)

    original_replay: Callable[[EventsReplay, Archive], None] = patcher.original(EventsReplay, "replay_events")

    def replay_events(self: EventsReplay, archive: Archive) -> None:
        start, end = _epoch(self.event_start_time), _epoch(self.event_end_time)
        window = copy.copy(archive)  # the same archive, with only the window's events to go through
        window.events = [e for e in archive.events if start <= _epoch(e.get("time")) <= end]
        original_replay(self, window)

    patcher.replace(EventsReplay, "replay_events", replay_events)


def _epoch(value: Any) -> float:
    """A time as moto holds it (epoch seconds, as a number or text; ISO text) -> epoch seconds."""
    if isinstance(value, datetime):
        return value.timestamp()
    text = str(value)
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _deliver(
    rule: Rule, message: dict[str, Any], deliveries: list[Delivery], transform_input: bool = True
) -> list[dict[str, Any]]:
    """Deliver to the rule's Lambda and Step Functions targets (a Lambda target's through the delivery
    hook, if one is installed); returns the other targets."""
    others = []
    event = aws_event(message)
    current = installation._installed
    faults = current.delivery_faults if current is not None else None
    for target in rule.targets:
        arn = str(target["Arn"])
        service = arn.split(":")[2] if arn.count(":") >= 5 else ""
        if service not in ("lambda", "states"):
            others.append(target)
            continue

        def send(target: dict[str, Any] = target, arn: str = arn, service: str = service) -> str | None:
            error = None
            try:
                payload = _target_input(target, event) if transform_input else event
                if service == "lambda":
                    error = _deliver_to_lambda(arn, payload)
                else:
                    _deliver_to_state_machine(arn, payload)
            except Exception as e:  # EventBridge keeps going: one target's failure is not the others'
                error = f"{type(e).__name__}: {e}"
            if error is not None:
                logger.warning("EventBridge delivery failed", extra={"rule": rule.name, "target": arn, "error": error})
            deliveries.append(Delivery(rule=rule.name, target_arn=arn, event_id=str(event["id"]), error=error))
            return error

        if service == "lambda" and faults is not None:
            faults.deliver(rule.name, arn, event, send, _undeliverable(rule, target, event))
        else:
            send()
    return others


# EventBridge's RetryPolicy defaults ("Event retry policy and using dead-letter queues", EventBridge User Guide)
DEFAULT_MAXIMUM_EVENT_AGE_SECONDS = 86_400
DEFAULT_MAXIMUM_RETRY_ATTEMPTS = 185


def _undeliverable(rule: Rule, target: Mapping[str, Any], event: Mapping[str, Any]) -> Undeliverable:
    """What EventBridge does with `event` once every retry to `target` failed: to its DeadLetterConfig queue,
    with the attributes AWS sets (RULE_ARN, TARGET_ARN, ERROR_CODE, ERROR_MESSAGE, EXHAUSTED_RETRY_CONDITION,
    RETRY_ATTEMPTS: "Using dead-letter queues to process undelivered events", EventBridge User Guide), the
    event as the body."""
    policy = target.get("RetryPolicy") or {}
    retries = int(policy.get("MaximumRetryAttempts", DEFAULT_MAXIMUM_RETRY_ATTEMPTS))
    max_age = float(policy.get("MaximumEventAgeInSeconds", DEFAULT_MAXIMUM_EVENT_AGE_SECONDS))
    queue_arn = (target.get("DeadLetterConfig") or {}).get("Arn")

    def give_up(error_code: str, error_message: str) -> None:
        if not queue_arn:
            return
        from moto.sqs.models import sqs_backends

        _, _, _, region, account, queue_name = str(queue_arn).split(":", 5)
        attributes = {
            "RULE_ARN": rule.arn,
            "TARGET_ARN": str(target["Arn"]),
            "ERROR_CODE": error_code,
            "ERROR_MESSAGE": error_message[:256],
            "EXHAUSTED_RETRY_CONDITION": "MaximumEventAgeInSeconds",  # given up on after_seconds, the age
            "RETRY_ATTEMPTS": str(retries),
        }
        sqs_backends[account][region].send_message(
            queue_name,
            json.dumps(dict(event)),
            message_attributes={k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()},
        )

    return Undeliverable(give_up=give_up, after_seconds=max_age)


def fire_scheduled_rule(name: str, *, account_id: str, region: str, when: datetime, event_bus: str = "default") -> str:
    """What EventBridge does when a schedule rule fires: a `Scheduled Event` to each of its targets
    (moto runs no schedule). Lambda and Step Functions targets only; returns the event id."""
    from moto.events.models import events_backends
    from moto.moto_api._internal import mock_random

    current = installation._installed
    if current is None:
        raise RuntimeError("spotrelay.local patches are not installed")
    rule = events_backends[account_id][region].describe_rule(name, event_bus)
    message = {
        "version": "0",
        "id": str(mock_random.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": account_id,
        "time": when.timestamp(),
        "region": region,
        "resources": [rule.arn],
        "detail": {},
    }
    _deliver(rule, message, current.deliveries)
    return str(message["id"])


def _deliver_to_lambda(arn: str, payload: Any) -> str | None:
    """An asynchronous invocation, as EventBridge makes it; returns the function error, if any."""
    from moto.awslambda.utils import get_backend

    parts = arn.split(":")
    region, account = parts[3], parts[4]
    function = get_backend(account, region).get_function(arn)
    response_headers: dict[str, Any] = {}
    result = function.invoke(json.dumps(payload), {"x-amz-invocation-type": "Event"}, response_headers)
    if "x-amz-function-error" in response_headers:
        text = result.decode() if isinstance(result, bytes) else str(result)
        return f"function error: {text[:500]}"
    return None


def _deliver_to_state_machine(arn: str, payload: Any) -> None:
    from moto.moto_api._internal import mock_random

    parts = arn.split(":")
    region, account = parts[3], parts[4]
    backend = sfn_responses.get_backend(account, region)
    backend.start_execution(arn, name=str(mock_random.uuid4()), execution_input=json.dumps(payload))
