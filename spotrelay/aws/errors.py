"""AWS throttling, as one error name a Step Functions Retry can match.

A task's Lambda error is named by the exception's class: a throttled DynamoDB call raises the modeled
`ProvisionedThroughputExceededException`, a throttled EC2 or SQS call a bare `ClientError`, which also
names every error that no retry would mend. Past the SDK's own retries, the task functions raise
`AwsThrottled` for any of them instead (`named_throttling`), and the state machine retries that name with
backoff (stacks/lifecycle_construct.py): a burst of throttling delays a job, it never fails one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from botocore.exceptions import ClientError

# The error codes botocore's standard retry mode counts as throttling
# (botocore/retries/standard.py, ThrottledRetryableChecker._THROTTLED_ERROR_CODES, botocore 1.3x)
THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
    }
)


class AwsThrottled(Exception):
    """An AWS call throttled past the SDK's retries (the message: its code, operation and message). Its
    class name is the error the state machine's Retry matches (spotrelay.config.ERROR_AWS_THROTTLED)."""


def throttling_code(error: ClientError) -> str | None:
    code = str(error.response.get("Error", {}).get("Code", ""))
    status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code if code in THROTTLING_CODES or status == 429 else None


P = ParamSpec("P")
R = TypeVar("R")


def named_throttling(handler: Callable[P, R]) -> Callable[P, R]:
    """The handler, raising AwsThrottled for a throttled AWS call (and every other error as it was)."""

    @functools.wraps(handler)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return handler(*args, **kwargs)
        except ClientError as e:
            code = throttling_code(e)
            if code is None:
                raise
            raise AwsThrottled(f"{code} ({e.operation_name}): {e.response.get('Error', {}).get('Message', '')}") from e

    return wrapped
