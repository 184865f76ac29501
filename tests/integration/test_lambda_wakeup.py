"""LambdaWakeup: an asynchronous invocation of the dispatcher, best effort. moto invokes Lambda code
only in Docker, so the request itself is checked with botocore's Stubber, and the failure path on moto."""

from __future__ import annotations

import json
import logging

import boto3
import pytest
from botocore.stub import Stubber

from spotrelay.aws.wakeup import LambdaWakeup

from .aws_resources import REGION


def test_waking_the_dispatcher_invokes_it_asynchronously(aws: None) -> None:
    # Given the dispatcher function's name
    client = boto3.client("lambda", region_name=REGION)
    wakeup = LambdaWakeup(client, "spotrelay-dispatcher")
    payload = json.dumps({"source": "spotrelay.wakeup", "reason": "job-1 finished"}).encode("utf-8")
    with Stubber(client) as stub:
        stub.add_response(
            "invoke",
            {"StatusCode": 202},
            {"FunctionName": "spotrelay-dispatcher", "InvocationType": "Event", "Payload": payload},
        )

        # When it is woken
        wakeup.wake_dispatcher("job-1 finished")

        # Then exactly that invocation was made: an Event with the source and the reason
        stub.assert_no_pending_responses()


def test_a_failed_wakeup_is_logged_not_raised(aws: None, caplog: pytest.LogCaptureFixture) -> None:
    # Given a dispatcher function that does not exist
    wakeup = LambdaWakeup(boto3.client("lambda", region_name=REGION), "no-such-function")

    # When it is woken
    with caplog.at_level(logging.WARNING, logger="spotrelay.aws.wakeup"):
        wakeup.wake_dispatcher("queue depth alarm")

    # Then nothing is raised, and a warning names the function
    (record,) = [r for r in caplog.records if r.name == "spotrelay.aws.wakeup"]
    assert record.getMessage() == "could not wake the dispatcher"
    assert getattr(record, "function_name", None) == "no-such-function"
