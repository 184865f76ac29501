"""Throttling past the SDK's retries is one error name, AwsThrottled, which the state machine retries
(stacks/lifecycle_construct.py); every other error of a task function keeps its own."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from spotrelay.aws.errors import AwsThrottled, named_throttling
from spotrelay.config import ERROR_AWS_THROTTLED


def _error(code: str, status: int = 400) -> ClientError:
    response: Any = {"Error": {"Code": code, "Message": "slow down"}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "PutItem")


def _raising(error: Exception) -> Any:
    @named_throttling
    def handler(event: dict[str, Any], context: object) -> dict[str, Any]:
        raise error

    return handler


@pytest.mark.parametrize(
    ("code", "status"),
    [("ProvisionedThroughputExceededException", 400), ("RequestLimitExceeded", 503), ("Anything", 429)],
)
def test_a_throttled_call_is_named_aws_throttled_for_the_state_machines_retry(code: str, status: int) -> None:
    with pytest.raises(AwsThrottled) as raised:
        _raising(_error(code, status))({}, None)
    assert type(raised.value).__name__ == ERROR_AWS_THROTTLED  # what Lambda reports as the errorType
    assert str(raised.value) == f"{code} (PutItem): slow down"
    assert isinstance(raised.value.__cause__, ClientError)


def test_every_other_error_is_raised_as_it_was() -> None:
    validation = _error("ValidationException")
    with pytest.raises(ClientError) as raised:
        _raising(validation)({}, None)
    assert raised.value is validation
    with pytest.raises(KeyError):
        _raising(KeyError("x"))({}, None)


def test_a_handler_that_returns_is_untouched() -> None:
    @named_throttling
    def handler(event: dict[str, Any], context: object) -> dict[str, Any]:
        return {"ok": event["n"]}

    assert handler({"n": 1}, None) == {"ok": 1}
    assert handler.__name__ == "handler"
