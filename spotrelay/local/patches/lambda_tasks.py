"""Lambda and task tokens: Lambda code runs in-process (`LambdaFunction._invoke_lambda`), SendTaskFailure keeps
its cause, and a task token whose task has its outcome is closed (see the package's docstring, "Lambda and
EventBridge"). Siblings: `events` delivers EventBridge events to these functions; `installation` runs the patches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from moto.awslambda.models import LambdaFunction
from moto.core.responses import EmptyResult
from moto.stepfunctions import responses as sfn_responses
from moto.stepfunctions.parser.api import TaskTimedOut as SfnTaskTimedOut
from moto.stepfunctions.parser.asl.eval.callback import callback
from moto.stepfunctions.parser.models import StepFunctionsParserBackend

from spotrelay.local.lambdas import InProcessLambdas, LambdaFunctionLike
from spotrelay.local.patches.canaries import Expected
from spotrelay.local.patches.installation import _Patcher

EXPECTED: tuple[Expected, ...] = (
    Expected(LambdaFunction, "_invoke_lambda", "(self, event: 'str | None' = None) -> 'tuple[str, bool, str]'"),
    Expected(  # the response handler passes the error only; the executing backend takes the cause too
        sfn_responses.StepFunctionResponse,
        "send_task_failure",
        "(self) -> moto.core.responses.ActionResult",
        ("self.stepfunction_backend.send_task_failure(task_token, error=error)",),
    ),
    Expected(  # an endpoint keeps its outcome once answered, and is notified again by a later answer
        callback.CallbackPoolManager,
        "notify",
        "(self, callback_id: str, outcome: moto.stepfunctions.parser.asl.eval.callback.callback.CallbackOutcome) "
        "-> bool",
        ("callback_endpoint.notify(outcome=outcome)",),
    ),
    Expected(callback.CallbackPoolManager, "heartbeat", "(self, callback_id: str) -> bool"),
    Expected(
        callback.CallbackEndpoint,
        "get_outcome",
        "(self) -> moto.stepfunctions.parser.asl.eval.callback.callback.CallbackOutcome | None",
    ),
    Expected(
        SfnTaskTimedOut,
        "__init__",
        "(self, message: str, exception_type: str | None = None, status: int | None = None)",
    ),
    Expected(
        StepFunctionsParserBackend,
        "send_task_failure",
        "(self, task_token: str, error: str = None, cause: str = None) -> "
        "moto.stepfunctions.parser.api.SendTaskFailureOutput",
    ),
)


def _patch_task_failure(patcher: _Patcher) -> None:
    """SendTaskFailure keeps its `cause`, as Step Functions does: moto's response handler passed only the error
    on, so a task failed by the agent (JobFailed with the exit code and the job's last lines) reached Recover
    with no cause, and `status` said "exited with code None"."""

    def send_task_failure(self: sfn_responses.StepFunctionResponse) -> Any:
        task_token = self._get_param("taskToken")
        backend: Any = self.stepfunction_backend
        backend.send_task_failure(task_token, error=self._get_param("error"), cause=self._get_param("cause"))
        return EmptyResult()

    patcher.replace(sfn_responses.StepFunctionResponse, "send_task_failure", send_task_failure)

    # A token whose task has its outcome is closed: Step Functions answers TaskTimedOut ("the task associated
    # with the token has already been closed") to a later SendTaskSuccess, SendTaskFailure or heartbeat. moto
    # kept the token open and took the second answer silently, so an agent reporting after ec2_events had
    # failed its task (a warning handled before the agent's next IMDS poll) believed it had been heard
    pool = callback.CallbackPoolManager
    original_notify: Callable[..., bool] = patcher.original(pool, "notify")
    original_heartbeat: Callable[..., bool] = patcher.original(pool, "heartbeat")

    def refuse_if_answered(manager: Any, callback_id: str) -> None:
        # (raised here with its code: the backend's own `TaskTimedOut()` lacks the message it needs)
        endpoint = manager.get(callback_id)
        if endpoint is not None and endpoint.consumer_error is None and endpoint.get_outcome() is not None:
            raise SfnTaskTimedOut("Task Timed Out: 'Provided task does not exist anymore'", "TaskTimedOut", 400)

    def notify(self: Any, callback_id: str, outcome: Any) -> bool:
        refuse_if_answered(self, callback_id)
        return original_notify(self, callback_id, outcome)

    def heartbeat(self: Any, callback_id: str) -> bool:
        refuse_if_answered(self, callback_id)
        return original_heartbeat(self, callback_id)

    patcher.replace(pool, "notify", notify)
    patcher.replace(pool, "heartbeat", heartbeat)


def _patch_lambda(patcher: _Patcher, lambdas: InProcessLambdas) -> None:
    def _invoke_lambda(self: LambdaFunction, event: str | None = None) -> tuple[str, bool, str]:
        return lambdas.invoke(cast(LambdaFunctionLike, self), event)

    patcher.replace(LambdaFunction, "_invoke_lambda", _invoke_lambda)
