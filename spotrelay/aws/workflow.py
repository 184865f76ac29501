"""`Workflow` on Step Functions: one JobLifecycle execution per job, named after the job id."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from mypy_boto3_stepfunctions import SFNClient

# SendTaskSuccess/SendTaskFailure errors that mean "this token is no longer open".
CLOSED_TOKEN_CODES = frozenset({"TaskDoesNotExist", "TaskTimedOut", "InvalidToken"})
NO_EXECUTION = "ExecutionDoesNotExist"
MAX_ERROR_CHARS = 256  # Step Functions' limits on `error` and `cause`
MAX_CAUSE_CHARS = 32_768


def _error_code(error: ClientError) -> str:
    return error.response.get("Error", {}).get("Code", "")


def execution_arn(state_machine_arn: str, execution_name: str) -> str:
    """`arn:aws:states:<region>:<account>:stateMachine:<name>` -> `...:execution:<name>:<execution_name>`."""
    parts = state_machine_arn.split(":")
    if len(parts) != 7 or parts[2] != "states" or parts[5] != "stateMachine":
        raise ValueError(f"not a state machine ARN: {state_machine_arn!r}")
    return ":".join([*parts[:5], "execution", parts[6], execution_name])


class StepFunctionsWorkflow:
    def __init__(self, client: SFNClient, state_machine_arn: str) -> None:
        self.client = client
        self.state_machine_arn = state_machine_arn

    def execution_arn(self, execution: str) -> str:
        return execution_arn(self.state_machine_arn, execution)

    def start(self, execution: str, payload: dict[str, object]) -> bool:
        # StartExecution is itself idempotent for a running execution with the same name and input:
        # it answers with the existing execution instead of an error. Ask first, so that a repeat
        # reads as "exists already"; ExecutionAlreadyExists covers a different input or a closed one.
        if self.status(execution) is not None:
            return False
        try:
            self.client.start_execution(
                stateMachineArn=self.state_machine_arn, name=execution, input=json.dumps(payload, sort_keys=True)
            )
        except ClientError as e:
            if _error_code(e) == "ExecutionAlreadyExists":
                return False
            raise
        return True

    def succeed_task(self, task_token: str, output: dict[str, object]) -> bool:
        return send_task_success(self.client, task_token, output)

    def fail_task(self, task_token: str, error: str, cause: str) -> bool:
        return send_task_failure(self.client, task_token, error, cause)

    def status(self, execution: str) -> str | None:
        try:
            return self.client.describe_execution(executionArn=self.execution_arn(execution))["status"]
        except ClientError as e:
            if _error_code(e) == NO_EXECUTION:
                return None
            raise

    def stop(self, execution: str, cause: str) -> None:
        try:
            self.client.stop_execution(executionArn=self.execution_arn(execution), cause=cause[:MAX_CAUSE_CHARS])
        except ClientError as e:
            if _error_code(e) != NO_EXECUTION:
                raise


# --- a task token's calls, as the control plane and the agent (spotrelay.aws.task_tokens) make them: each
# answers False when the token is closed already (CLOSED_TOKEN_CODES), which is no error ------------------


def send_task_heartbeat(client: SFNClient, task_token: str) -> bool:
    return _unless_closed(lambda: client.send_task_heartbeat(taskToken=task_token))


def send_task_success(client: SFNClient, task_token: str, output: Mapping[str, Any]) -> bool:
    return _unless_closed(
        lambda: client.send_task_success(taskToken=task_token, output=json.dumps(output, sort_keys=True))
    )


def send_task_failure(client: SFNClient, task_token: str, error: str, cause: str) -> bool:
    return _unless_closed(
        lambda: client.send_task_failure(
            taskToken=task_token, error=error[:MAX_ERROR_CHARS], cause=cause[:MAX_CAUSE_CHARS]
        )
    )


def _unless_closed(call: Callable[[], object]) -> bool:
    try:
        call()
    except ClientError as e:
        if _error_code(e) in CLOSED_TOKEN_CODES:
            return False
        raise
    return True
