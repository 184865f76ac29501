"""The Run task's token on Step Functions: heartbeats, success, failure.

The control plane may close the token first: ec2_events fails it with `SpotInterrupted` when the
interruption warning reaches EventBridge (often before the agent's next IMDS poll), and a cancel or
a heartbeat timeout ends the task. Step Functions then answers TaskDoesNotExist, TaskTimedOut or
InvalidToken, which is not an error here: the method returns False and the agent logs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spotrelay.aws.workflow import send_task_failure, send_task_heartbeat, send_task_success

if TYPE_CHECKING:
    from mypy_boto3_stepfunctions import SFNClient


class StepFunctionsTaskTokens:
    def __init__(self, client: SFNClient) -> None:
        self.client = client

    def heartbeat(self, task_token: str) -> bool:
        return send_task_heartbeat(self.client, task_token)

    def succeed(self, task_token: str, output: dict[str, Any]) -> bool:
        return send_task_success(self.client, task_token, output)

    def fail(self, task_token: str, error: str, cause: str) -> bool:
        return send_task_failure(self.client, task_token, error, cause)
