"""JobLifecycle: one Standard Step Functions execution per job (JSONPath; execution input
`{"job_id": str, "heartbeat_seconds": int}`).

    Place ─> PlaceChoice ─ launch ─> Run (.waitForTaskToken, heartbeat) ─> FinalizeSucceeded ─┐
      ^          ├─ wait ──> WaitForCapacity ─> Place                                          │
      │          └─ fail ──> PlaceFailed ───────────────────────────────────────────────────────┤
      │   Run retries LaunchThrottled (with backoff), then, as InsufficientInstanceCapacity,    │
      │   goes back to Place (which waits first after a throttled launch: WaitForCapacity);     │
      │   JobCancelled ─> FinalizeCancelled;                                                    │
      │   SpotInterrupted | Migrating | InstanceLost | JobFailed | heartbeat/timeout ─> Recover;│
      │   anything else ─> FinalizeFailed                                                      │
      └── relaunch ─ RecoverChoice <─ Recover                                                   │
                       ├─ wait_checkpoint ─> WaitForCheckpoint ─> Recover                       │
                       └─ fail ─> RecoverFailed ────────────────────────────────────────────────┤
    Finalize (the outcome in $.final) ─> Outcome: Succeeded | Cancelled (Fail) | Failed (Fail) <┘

Contract with the functions: place and recover return an object with all four keys `action`,
`wait_seconds`, `error`, `cause` (null where they do not apply; a missing key is a States.Runtime
error, which no Catch can handle); `wait_seconds` is a positive integer when action is a wait.
Backoff lives here (Wait states, Retry), never in sleeps inside a function.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from spotrelay.config import (
    ERROR_AWS_THROTTLED,
    ERROR_CANCELLED,
    ERROR_INSTANCE_LOST,
    ERROR_JOB_FAILED,
    ERROR_LAUNCH_THROTTLED,
    ERROR_MIGRATING,
    ERROR_NO_CAPACITY,
    ERROR_SPOT_INTERRUPTED,
    LAUNCH_THROTTLED_RETRY_ATTEMPTS,
    LAUNCH_THROTTLED_RETRY_BACKOFF,
    LAUNCH_THROTTLED_RETRY_FIRST_SECONDS,
    LAUNCH_THROTTLED_RETRY_MAX_SECONDS,
)
from stacks.suppressions import acknowledge, resource_finding

# State names (tests and the local runtime refer to them).
PLACE = "Place"
PLACE_CHOICE = "PlaceChoice"
WAIT_FOR_CAPACITY = "WaitForCapacity"
PLACE_FAILED = "PlaceFailed"
RUN = "Run"
RECOVER = "Recover"
RECOVER_CHOICE = "RecoverChoice"
WAIT_FOR_CHECKPOINT = "WaitForCheckpoint"
RECOVER_FAILED = "RecoverFailed"
FINALIZE_SUCCEEDED = "FinalizeSucceeded"
FINALIZE_FAILED = "FinalizeFailed"
FINALIZE_CANCELLED = "FinalizeCancelled"
FINALIZE = "Finalize"
OUTCOME = "Outcome"
SUCCEEDED = "Succeeded"
CANCELLED = "Cancelled"
FAILED = "Failed"
# A Standard workflow's execution lasts at most a year (AWS Step Functions service quotas): so does a run
RUN_TIMEOUT = Duration.days(365)
STATE_NAMES = (
    PLACE,
    PLACE_CHOICE,
    WAIT_FOR_CAPACITY,
    PLACE_FAILED,
    RUN,
    RECOVER,
    RECOVER_CHOICE,
    WAIT_FOR_CHECKPOINT,
    RECOVER_FAILED,
    FINALIZE_SUCCEEDED,
    FINALIZE_FAILED,
    FINALIZE_CANCELLED,
    FINALIZE,
    OUTCOME,
    SUCCEEDED,
    CANCELLED,
    FAILED,
)

# Actions place/recover return.
ACTION_LAUNCH = "launch"
ACTION_WAIT = "wait"
ACTION_FAIL = "fail"
ACTION_RELAUNCH = "relaunch"
ACTION_WAIT_CHECKPOINT = "wait_checkpoint"
# Outcomes in $.final.outcome.
OUTCOME_SUCCEEDED = "SUCCEEDED"
OUTCOME_FAILED = "FAILED"
OUTCOME_CANCELLED = "CANCELLED"

LAMBDA_SERVICE_ERRORS = (
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
    "Lambda.TooManyRequestsException",
)
# A task whose invocation the Lambda service fails (or our functions, all failing before their handlers
# run: the control plane down) waits it out rather than fail the job: 1, 2, 4, ... 32 s, then every
# SERVICE_RETRY_MAX_DELAY (60 s), SERVICE_RETRY_ATTEMPTS retries in all: 63 s + 54 x 60 s, 55 minutes
# (SERVICE_RETRY_COVERS_SECONDS) of an outage, and back within a minute of its end. No JitterStrategy:
# moto draws it from the process's global `random` (see the LaunchThrottled retry below), and the
# executions retrying at once are few (one per job), not a fleet of clients.
SERVICE_RETRY_INTERVAL = Duration.seconds(1)
SERVICE_RETRY_BACKOFF = 2
SERVICE_RETRY_MAX_DELAY = Duration.seconds(60)
SERVICE_RETRY_ATTEMPTS = 60


def service_retry_waits() -> list[float]:
    """The waits before each retry of SERVICE_RETRY, in seconds, as Step Functions computes them."""
    first, cap = SERVICE_RETRY_INTERVAL.to_seconds(), SERVICE_RETRY_MAX_DELAY.to_seconds()
    return [min(first * SERVICE_RETRY_BACKOFF**n, cap) for n in range(SERVICE_RETRY_ATTEMPTS)]


SERVICE_RETRY_COVERS_SECONDS = sum(service_retry_waits())
# An AWS call of a task function throttled past the SDK's retries (spotrelay.aws.errors): 1, 2, 4, 8, 16,
# then every 30 s, about two minutes in all, before the error counts as the step's failure
THROTTLED_RETRY_ATTEMPTS = 8
THROTTLED_RETRY_MAX_DELAY = Duration.seconds(30)
CONFLICT_ERROR = "ConflictError"  # spotrelay.control.ports.ConflictError: a conditional write lost a race
RECOVERABLE_RUN_ERRORS = (
    ERROR_SPOT_INTERRUPTED,
    ERROR_MIGRATING,
    ERROR_INSTANCE_LOST,
    ERROR_JOB_FAILED,
    sfn.Errors.HEARTBEAT_TIMEOUT,
    sfn.Errors.TIMEOUT,
)


def state_machine_name(stack: Stack) -> str:
    return f"{stack.stack_name}-JobLifecycle"


def state_machine_arn(stack: Stack) -> str:
    """The ARN built from the (fixed) name, not a reference: functions that start or stop executions
    need it, while the state machine needs some of those functions - a reference would be a cycle."""
    return stack.format_arn(
        service="states",
        resource="stateMachine",
        resource_name=state_machine_name(stack),
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )


class JobLifecycle(Construct):
    """`state_machine`, `state_machine_name`, `log_group`."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        place: lambda_.IFunction,
        launch: lambda_.IFunction,
        recover: lambda_.IFunction,
        finalize: lambda_.IFunction,
    ) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        self.state_machine_name = state_machine_name(stack)

        # Terminal part: record the outcome, then end the execution the way the job ended.
        succeeded = sfn.Succeed(self, SUCCEEDED)
        cancelled = sfn.Fail(self, CANCELLED, error=ERROR_CANCELLED, cause="The job was cancelled")
        failed = sfn.Fail(self, FAILED, error=ERROR_JOB_FAILED, cause="The job failed; see the Finalize input")
        outcome = (
            sfn.Choice.json_path(self, OUTCOME)
            .when(sfn.Condition.string_equals("$.final.outcome", OUTCOME_SUCCEEDED), succeeded)
            .when(sfn.Condition.string_equals("$.final.outcome", OUTCOME_CANCELLED), cancelled)
            .otherwise(failed)
        )
        finalize_task = tasks.LambdaInvoke.json_path(
            self,
            FINALIZE,
            lambda_function=finalize,
            payload=sfn.TaskInput.from_object(
                {"job_id": sfn.JsonPath.string_at("$.job_id"), "final": sfn.JsonPath.object_at("$.final")}
            ),
            result_path="$.finalized",
            retry_on_service_exceptions=False,
        )
        self._retry_service_errors(finalize_task)
        finalize_task.add_retry(
            errors=[CONFLICT_ERROR, sfn.Errors.TASKS_FAILED],
            interval=Duration.seconds(1),
            backoff_rate=2,
            max_attempts=6,
        )
        finalize_task.next(outcome)

        finalize_succeeded = sfn.Pass.json_path(
            self,
            FINALIZE_SUCCEEDED,
            result=sfn.Result.from_object({"outcome": OUTCOME_SUCCEEDED}),
            result_path="$.final",
        ).next(finalize_task)
        finalize_failed = sfn.Pass.json_path(
            self,
            FINALIZE_FAILED,
            parameters={"outcome": OUTCOME_FAILED, "error": sfn.JsonPath.object_at("$.error")},
            result_path="$.final",
        ).next(finalize_task)
        finalize_cancelled = sfn.Pass.json_path(
            self,
            FINALIZE_CANCELLED,
            parameters={"outcome": OUTCOME_CANCELLED, "error": sfn.JsonPath.object_at("$.error")},
            result_path="$.final",
        ).next(finalize_task)

        # Place: choose a pool, wait for capacity, or give up.
        place_task = self._decision_task(PLACE, place, {"job_id": sfn.JsonPath.string_at("$.job_id")}, "$.place")
        place_task.add_catch(finalize_failed, errors=[sfn.Errors.ALL], result_path="$.error")
        place_failed = self._failed_from(PLACE_FAILED, "$.place").next(finalize_task)
        wait_for_capacity = sfn.Wait.json_path(
            self, WAIT_FOR_CAPACITY, time=sfn.WaitTime.seconds_path("$.place.wait_seconds")
        ).next(place_task)

        # Run: launch the worker and wait for its task token (success, failure or silence).
        run_task = tasks.LambdaInvoke.json_path(
            self,
            RUN,
            lambda_function=launch,
            integration_pattern=sfn.IntegrationPattern.WAIT_FOR_TASK_TOKEN,
            payload=sfn.TaskInput.from_object(
                {
                    "job_id": sfn.JsonPath.string_at("$.job_id"),
                    "task_token": sfn.JsonPath.task_token,
                    # recorded with the attempt: the agent paces its heartbeats by it
                    "heartbeat_seconds": sfn.JsonPath.number_at("$.heartbeat_seconds"),
                }
            ),
            heartbeat_timeout=sfn.Timeout.at("$.heartbeat_seconds"),
            # Explicit, not the service's default: the States Language's is 60 s (moto applies it, so every
            # run would time out after a minute of wall time), AWS's is 99999999 s. An attempt runs as long
            # as its job needs; the heartbeat, not this, catches a silent worker.
            task_timeout=sfn.Timeout.duration(RUN_TIMEOUT),
            result_path="$.run",
            retry_on_service_exceptions=False,
        )
        # A throttled or failed *invocation* of launch is retried; what the worker reports is caught below.
        self._retry_service_errors(run_task)
        # EC2 throttled RunInstances (per account and Region, not per pool): launch again after 2, 4, 8, 16,
        # 30 and 30 s (90 s in all: spotrelay.config.LAUNCH_THROTTLED_RETRY_*), then go back to Place (the Catch
        # below), which waits before it plans again, longer each round up to 10 minutes, and fails the job
        # NoCapacity once its patience is spent (spotrelay.control.decisions.THROTTLED_WAIT_*): at most 7
        # RunInstances calls a round, 37 an hour, however long the throttling lasts. No JitterStrategy yet:
        # moto draws it from the process's global `random`, so a chaos seed that throttles a launch would no
        # longer replay the same way.
        run_task.add_retry(
            errors=[ERROR_LAUNCH_THROTTLED],
            interval=Duration.seconds(LAUNCH_THROTTLED_RETRY_FIRST_SECONDS),
            backoff_rate=LAUNCH_THROTTLED_RETRY_BACKOFF,
            max_attempts=LAUNCH_THROTTLED_RETRY_ATTEMPTS,
            max_delay=Duration.seconds(LAUNCH_THROTTLED_RETRY_MAX_SECONDS),
        )

        # Recover: after an interruption, a lost instance or a failed run.
        recover_task = self._decision_task(
            RECOVER,
            recover,
            {"job_id": sfn.JsonPath.string_at("$.job_id"), "error": sfn.JsonPath.object_at("$.error")},
            "$.recover",
        )
        recover_task.add_catch(finalize_failed, errors=[sfn.Errors.ALL], result_path="$.error")
        recover_failed = self._failed_from(RECOVER_FAILED, "$.recover").next(finalize_task)
        wait_for_checkpoint = sfn.Wait.json_path(
            self, WAIT_FOR_CHECKPOINT, time=sfn.WaitTime.seconds_path("$.recover.wait_seconds")
        ).next(recover_task)
        recover_task.next(
            sfn.Choice.json_path(self, RECOVER_CHOICE)
            .when(sfn.Condition.string_equals("$.recover.action", ACTION_RELAUNCH), place_task)
            .when(sfn.Condition.string_equals("$.recover.action", ACTION_WAIT_CHECKPOINT), wait_for_checkpoint)
            .when(sfn.Condition.string_equals("$.recover.action", ACTION_FAIL), recover_failed)
            # An action this definition does not know must still end in Finalize (which terminates the worker).
            .otherwise(recover_failed)
        )

        run_task.add_catch(place_task, errors=[ERROR_NO_CAPACITY, ERROR_LAUNCH_THROTTLED], result_path="$.error")
        run_task.add_catch(finalize_cancelled, errors=[ERROR_CANCELLED], result_path="$.error")
        run_task.add_catch(recover_task, errors=list(RECOVERABLE_RUN_ERRORS), result_path="$.error")
        run_task.add_catch(finalize_failed, errors=[sfn.Errors.ALL], result_path="$.error")
        run_task.next(finalize_succeeded)

        place_task.next(
            sfn.Choice.json_path(self, PLACE_CHOICE)
            .when(sfn.Condition.string_equals("$.place.action", ACTION_LAUNCH), run_task)
            .when(sfn.Condition.string_equals("$.place.action", ACTION_WAIT), wait_for_capacity)
            .when(sfn.Condition.string_equals("$.place.action", ACTION_FAIL), place_failed)
            .otherwise(place_failed)
        )

        self.log_group = logs.LogGroup(
            self,
            "Logs",
            # The /aws/vendedlogs/ prefix keeps the CloudWatch Logs resource policy small.
            log_group_name=f"/aws/vendedlogs/states/{self.state_machine_name}",
            retention=logs.RetentionDays.ONE_MONTH,
        )
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_name=self.state_machine_name,
            state_machine_type=sfn.StateMachineType.STANDARD,
            comment="spotrelay: one execution per job, named by the job id",
            definition_body=sfn.DefinitionBody.from_chainable(place_task),
            # Every event, without its data: a task's input and parameters hold the Run task's token, which
            # a reader of the log group could complete (or fail) any job's run with. The data stays in the
            # execution history, behind states:GetExecutionHistory.
            logs=sfn.LogOptions(destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=False),
            tracing_enabled=True,
        )
        invoke_findings = [
            resource_finding(stack, f"{function.function_arn}:*") for function in (place, launch, recover, finalize)
        ]
        for finding in invoke_findings:
            acknowledge(
                self.state_machine.role,
                f"IAM5[{finding}]",
                "CDK's LambdaInvoke grants lambda:InvokeFunction on the function and on '<function ARN>:*' "
                "(its versions and aliases): the same function, no other.",
            )
        acknowledge(
            self.state_machine.role,
            "IAM5[Resource::*]",
            "Logging to CloudWatch Logs (logs:CreateLogDelivery and the other log-delivery APIs) and X-Ray "
            "tracing (xray:PutTraceSegments, GetSamplingRules, ...) support no resource-level permissions.",
        )

    def _decision_task(
        self, name: str, function: lambda_.IFunction, payload: dict[str, object], result_path: str
    ) -> tasks.LambdaInvoke:
        task = tasks.LambdaInvoke.json_path(
            self,
            name,
            lambda_function=function,
            payload=sfn.TaskInput.from_object(payload),
            result_selector={
                "action": sfn.JsonPath.string_at("$.Payload.action"),
                "wait_seconds": sfn.JsonPath.string_at("$.Payload.wait_seconds"),
                "error": sfn.JsonPath.string_at("$.Payload.error"),
                "cause": sfn.JsonPath.string_at("$.Payload.cause"),
            },
            result_path=result_path,
            retry_on_service_exceptions=False,
        )
        self._retry_service_errors(task)
        task.add_retry(errors=[CONFLICT_ERROR], interval=Duration.seconds(1), backoff_rate=2, max_attempts=5)
        return task

    @staticmethod
    def _retry_service_errors(task: tasks.LambdaInvoke) -> None:
        """The task's first Retries: its invocation failed by the Lambda service (SERVICE_RETRY_*), and an
        AWS call of its function throttled (THROTTLED_RETRY_*; every step is idempotent)."""
        task.add_retry(
            errors=list(LAMBDA_SERVICE_ERRORS),
            interval=SERVICE_RETRY_INTERVAL,
            backoff_rate=SERVICE_RETRY_BACKOFF,
            max_delay=SERVICE_RETRY_MAX_DELAY,
            max_attempts=SERVICE_RETRY_ATTEMPTS,
        )
        task.add_retry(
            errors=[ERROR_AWS_THROTTLED],
            interval=Duration.seconds(1),
            backoff_rate=2,
            max_delay=THROTTLED_RETRY_MAX_DELAY,
            max_attempts=THROTTLED_RETRY_ATTEMPTS,
        )

    def _failed_from(self, name: str, decision_path: str) -> sfn.Pass:
        return sfn.Pass.json_path(
            self,
            name,
            parameters={
                "outcome": OUTCOME_FAILED,
                "error": {
                    "Error": sfn.JsonPath.string_at(f"{decision_path}.error"),
                    "Cause": sfn.JsonPath.string_at(f"{decision_path}.cause"),
                },
            },
            result_path="$.final",
        )
