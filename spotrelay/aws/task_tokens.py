"""The Run task's token on Step Functions: heartbeats, success, failure.

The control plane may close the token first: ec2_events fails it with `SpotInterrupted` when the
interruption warning reaches EventBridge (often before the agent's next IMDS poll), and a cancel or
a heartbeat timeout ends the task. Step Functions then answers TaskDoesNotExist, TaskTimedOut or
InvalidToken, which is not an error here: the method returns False and the agent logs it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from spotrelay.aws.workflow import CLOSED_TOKEN_CODES, MAX_CAUSE_CHARS, MAX_ERROR_CHARS

if TYPE_CHECKING:
    from mypy_boto3_stepfunctions import SFNClient


def _closed(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code", "") in CLOSED_TOKEN_CODES


class StepFunctionsTaskTokens:
    def __init__(self, client: SFNClient) -> None:
        self.client = client

    def heartbeat(self, task_token: str) -> bool:
        try:
            self.client.send_task_heartbeat(taskToken=task_token)
        except ClientError as e:
            if _closed(e):
                return False
            raise
        return True

    def succeed(self, task_token: str, output: dict[str, Any]) -> bool:
        try:
            self.client.send_task_success(taskToken=task_token, output=json.dumps(output, sort_keys=True))
        except ClientError as e:
            if _closed(e):
                return False
            raise
        return True

    def fail(self, task_token: str, error: str, cause: str) -> bool:
        try:
            self.client.send_task_failure(
                taskToken=task_token, error=error[:MAX_ERROR_CHARS], cause=cause[:MAX_CAUSE_CHARS]
            )
        except ClientError as e:
            if _closed(e):
                return False
            raise
        return True
