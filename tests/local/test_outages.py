"""The control plane down, in a replay (spotrelay.local.outages), and Lambda's asynchronous retries and
dead letters (spotrelay.local.lambdas.AsynchronousInvocations): on a fake agenda, no replay. The scenario
sections that ask for them (spotrelay.local.scenario) and the operator's recovery (spotrelay.aws.recovery)
against moto's SQS, Lambda-free."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from spotrelay.aws import recovery
from spotrelay.local.chaos import SERVICE_ERROR
from spotrelay.local.lambdas import ASYNC_RETRY_WAITS, AsynchronousInvocations, InvocationFault
from spotrelay.local.outages import AsynchronousDeliveries, FunctionOutages, dead_letters_to_sqs
from spotrelay.local.patches import Undeliverable
from spotrelay.local.scenario import ScenarioError, parse_scenario

from .conftest import START
from .test_chaos import Agenda, Sends

EVENT = {"detail-type": "EC2 Spot Instance Interruption Warning", "detail": {"instance-id": "i-0abc"}}
ARN = "arn:aws:lambda:us-east-1:123456789012:function:SpotRelay-ec2_events-X"


class Always:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def fault_for(self, function_name: str) -> InvocationFault | None:
        self.asked.append(function_name)
        return InvocationFault("Runtime.ExitError", after_handler=True)


def test_in_an_outage_every_invocation_fails_before_its_handler_and_outside_it_the_other_hook_decides() -> None:
    # Given an outage from 30m to 60m over another fault hook
    agenda, other = Agenda(), Always()
    outages = FunctionOutages(
        agenda.now, [(START + timedelta(minutes=30), START + timedelta(minutes=60))], otherwise=other
    )
    # When invocations come before, in and after it
    agenda.at = START + timedelta(minutes=29)
    before = outages.fault_for("place")
    agenda.at = START + timedelta(minutes=30)
    during = outages.fault_for("place")
    agenda.at = START + timedelta(minutes=60)
    after = outages.fault_for("place")
    # Then only the one in the window fails, before its handler, with the service error the tasks retry
    assert during == InvocationFault(SERVICE_ERROR, after_handler=False)
    assert before == after == InvocationFault("Runtime.ExitError", after_handler=True)
    assert other.asked == ["place", "place"]
    assert outages.failed == {"place": 1}


def test_a_failed_asynchronous_event_is_retried_twice_then_dead_lettered() -> None:
    # Given Lambda's asynchronous invocations with a DLQ for the function
    agenda = Agenda()
    asynchronous = AsynchronousInvocations(agenda, who=lambda name: "ec2_events")
    dead: list[tuple[str, Any, str]] = []

    def dead_letter(name: str, event: Any, error: str) -> bool:
        dead.append((name, event, error))
        return True

    asynchronous.dead_letter = dead_letter
    failing = Sends(agenda, failures=10)
    # When an EventBridge delivery fails every time
    AsynchronousDeliveries(asynchronous).deliver(
        "rule", ARN, EVENT, failing, Undeliverable(give_up=lambda code, message: None, after_seconds=3600)
    )
    agenda.run()
    # Then three attempts, 1 and then 2 minutes apart, and the event in the DLQ with the last error
    first, second = ASYNC_RETRY_WAITS
    assert failing.at == [0.0, first, first + second]
    assert dead == [("SpotRelay-ec2_events-X", EVENT, "function error: boom")]
    assert asynchronous.given_up[0][1:] == ("ec2_events", True)
    assert "sends the event to its DLQ" in agenda.notes[-1]


def test_without_a_dlq_the_event_is_discarded() -> None:
    agenda = Agenda()
    asynchronous = AsynchronousInvocations(agenda)
    asynchronous.invoke("reconcile", Sends(agenda, failures=10), EVENT)
    agenda.run()
    assert asynchronous.given_up[0][1:] == ("reconcile", False)
    assert "discards the event" in agenda.notes[-1]


@pytest.fixture
def sqs() -> Any:
    with mock_aws():
        yield boto3.client("sqs", region_name="us-east-1")


def test_dead_letters_go_to_the_functions_dlq_with_lambdas_attributes_and_are_redriven(sqs: Any) -> None:
    # Given ec2_events' DLQ, and Lambda dead-lettering two events to it
    url = sqs.create_queue(QueueName="ec2-events-dlq")["QueueUrl"]
    dead_letter = dead_letters_to_sqs(sqs, {"fn": url})
    assert dead_letter("fn", EVENT, "function error: down")
    [sent] = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"], VisibilityTimeout=0)["Messages"]
    assert json.loads(sent["Body"]) == EVENT
    assert set(sent["MessageAttributes"]) == {"RequestID", "ErrorCode", "ErrorMessage"}
    assert dead_letter("fn", {**EVENT, "id": "2"}, "function error: down")
    assert not dead_letter("other", EVENT, "x")  # a function without a DLQ: discarded
    assert recovery.queue_depth(sqs, url) == 2

    # When the operator redrives it, the function failing the second event once
    class Lambda:
        def __init__(self) -> None:
            self.payloads: list[Any] = []

        def invoke(self, FunctionName: str, InvocationType: str, Payload: str) -> dict[str, Any]:
            self.payloads.append(json.loads(Payload))
            if len(self.payloads) == 2:
                return {"FunctionError": "Unhandled", "Payload": _Body(b'{"errorType": "Boom"}')}
            return {"Payload": _Body(b"{}")}

    fake = Lambda()
    done = recovery.redrive(sqs, fake, queue_url=url, function_name="fn")  # type: ignore[arg-type]
    # Then the handled event is deleted, the failed one stays (counted, its error kept)
    assert (done.found, done.handled, done.failed, done.complete) == (2, 1, 1, False)
    assert done.errors == ['{"errorType": "Boom"}']
    assert fake.payloads[0] == EVENT
    assert recovery.queue_depth(sqs, url) == 1


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self) -> bytes:
        return self.data


def test_the_runbooks_outputs_and_archive_name() -> None:
    assert recovery.dead_letter_queue_output("ec2_events") == "Ec2EventsDeadLetterQueueUrl"
    assert recovery.function_name_output("ec2_events") == "Ec2EventsFunctionName"
    arn = "arn:aws:events:us-east-1:123456789012:archive/SpotRelay-Ec2EventArchive-abc"
    assert (
        recovery.archive_name({"EventArchiveArn": arn, "EventArchiveName": "<object>"})
        == "SpotRelay-Ec2EventArchive-abc"
    )
    assert recovery.archive_name({"EventArchiveName": "name"}) == "name"


BASE = {"name": "x", "start": "2026-11-30T00:00:00Z"}


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"outages_of_functions": [{"from": "60m", "to": "30m"}]}, "to (0.5 h) must come after from (1 h)"),
        ({"outages_of_functions": [{"from": "30m"}]}, "outages_of_functions[0].to: required"),
        ({"outages_of_functions": [{"from": "30m", "to": "1e9h"}]}, "is not a duration"),
        ({"outages_of_functions": [{"from": "30m", "to": 1e9}]}, "less than or equal to"),
        ({"operator": [{"at": "1h", "run": "replay-archive"}]}, "replay-archive needs from and to"),
        ({"operator": [{"at": "1h", "run": "redrive-dlq", "from": "1m"}]}, "redrive-dlq takes no from/to"),
        (
            {"operator": [{"at": "1h", "run": "nap"}]},
            "operator[0].run: Input should be 'redrive-dlq' or 'replay-archive'",
        ),
        ({"operator": [{"at": "30m", "run": "replay-archive", "from": "10m", "to": "40m"}]}, "not archived yet"),
    ],
)
def test_bad_outage_and_operator_sections_get_a_clear_error(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as raised:
        parse_scenario({**BASE, **section}, Path("."))
    assert message in str(raised.value)


def test_the_sections_parse() -> None:
    scenario = parse_scenario(
        {
            **BASE,
            "outages_of_functions": [{"from": "30m", "to": "60m"}],
            "operator": [
                {"at": "70m", "run": "redrive-dlq"},
                {"at": "70m", "run": "replay-archive", "from": "30m", "to": "1h"},
            ],
        },
        Path("."),
    )
    assert [(o.start, o.end) for o in scenario.outages_of_functions] == [(0.5, 1.0)]
    assert [(str(s.run), s.start, s.end) for s in scenario.operator] == [
        ("redrive-dlq", None, None),
        ("replay-archive", 0.5, 1.0),
    ]
