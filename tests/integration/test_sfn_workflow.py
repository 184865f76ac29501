"""StepFunctionsWorkflow on moto, which runs the state machine for real: executions named after the
job, task tokens that close once, and a stop that tolerates executions that never started."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import boto3
import pytest
from botocore.stub import Stubber
from waiting import eventually

from spotrelay.aws.workflow import StepFunctionsWorkflow, execution_arn

from .aws_resources import REGION, Lifecycle
from .moto_progress import MOTO_PROGRESS

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_stepfunctions import SFNClient


def start(workflow: StepFunctionsWorkflow, lifecycle: Lifecycle, job_id: str) -> bool:
    return workflow.start(job_id, {"job_id": job_id, "token_queue_url": lifecycle.token_queue_url})


def task_token(sqs: SQSClient, lifecycle: Lifecycle, job_id: str) -> str:
    """The token the execution's Run state handed out (the launch function's part on AWS)."""

    def receive() -> str | None:
        for m in sqs.receive_message(QueueUrl=lifecycle.token_queue_url, MaxNumberOfMessages=10).get("Messages", []):
            body = json.loads(m.get("Body", "{}"))
            if body.get("job_id") == job_id:
                return str(body["task_token"])
        return None

    return eventually(receive, f"the Run task token of {job_id}", on=MOTO_PROGRESS)


def status_becomes(workflow: StepFunctionsWorkflow, job_id: str, wanted: str) -> str:
    return eventually(
        lambda: wanted if workflow.status(job_id) == wanted else None, f"{job_id} {wanted}", on=MOTO_PROGRESS
    )


def test_starting_a_job_twice_starts_one_execution(workflow: StepFunctionsWorkflow, lifecycle: Lifecycle) -> None:
    # Given a job whose execution was started
    assert start(workflow, lifecycle, "job-1") is True

    # When it is started again with the same input (a redelivered event), and with another input
    again = start(workflow, lifecycle, "job-1")
    changed = workflow.start("job-1", {"job_id": "job-1", "token_queue_url": lifecycle.token_queue_url, "x": 1})

    # Then both repeats answer False, and the job has one running execution
    assert (again, changed) == (False, False)
    assert workflow.status("job-1") == "RUNNING"


def test_a_job_without_an_execution_has_no_status(workflow: StepFunctionsWorkflow) -> None:
    # Given no execution / When its status is asked for / Then None
    assert workflow.status("never-started") is None


def test_a_task_token_closes_once(workflow: StepFunctionsWorkflow, lifecycle: Lifecycle, sqs: SQSClient) -> None:
    # Given a job's execution waiting in Run with its task token
    start(workflow, lifecycle, "job-1")
    token = task_token(sqs, lifecycle, "job-1")

    # When the task succeeds, and then its token is used again (a duplicate agent report)
    first = workflow.succeed_task(token, {"exit_code": 0})
    status_becomes(workflow, "job-1", "SUCCEEDED")
    second = workflow.succeed_task(token, {"exit_code": 0})

    # Then the first closes the task and the execution succeeds; the repeat answers False
    assert (first, second) == (True, False)


def test_failing_a_task_fails_the_execution(
    workflow: StepFunctionsWorkflow, lifecycle: Lifecycle, sqs: SQSClient
) -> None:
    # Given a job's execution waiting in Run
    start(workflow, lifecycle, "job-1")
    token = task_token(sqs, lifecycle, "job-1")

    # When its task fails with SpotInterrupted
    failed = workflow.fail_task(token, "SpotInterrupted", "instance-action terminate")

    # Then the execution fails (the real JobLifecycle catches the error and recovers)
    assert failed is True
    status_becomes(workflow, "job-1", "FAILED")


def test_a_token_step_functions_never_issued_is_closed(workflow: StepFunctionsWorkflow) -> None:
    # Given a token no execution handed out
    # When a task is failed or succeeded with it / Then both answer False (InvalidToken)
    assert workflow.fail_task("not-a-token", "SpotInterrupted", "late event") is False
    assert workflow.succeed_task("not-a-token", {}) is False


def test_moto_accepts_a_failure_on_a_closed_token(
    workflow: StepFunctionsWorkflow, lifecycle: Lifecycle, sqs: SQSClient, sfn: SFNClient
) -> None:
    """AWS answers SendTaskFailure on a closed token with TaskTimedOut/InvalidToken; moto 5.2.5 looks
    the token up in every execution, running or not, and accepts it. This canary fails when moto
    matches AWS; the local runtime must not rely on a False from fail_task until then."""
    # Given a task that already succeeded
    start(workflow, lifecycle, "job-1")
    token = task_token(sqs, lifecycle, "job-1")
    workflow.succeed_task(token, {})
    status_becomes(workflow, "job-1", "SUCCEEDED")

    # When it is failed afterwards / Then moto accepts it, and the execution stays SUCCEEDED
    sfn.send_task_failure(taskToken=token, error="SpotInterrupted", cause="late")
    assert workflow.status("job-1") == "SUCCEEDED"


def test_stopping_a_job_stops_its_execution_with_the_cause(lifecycle: Lifecycle) -> None:
    """Checked on the request: moto 5.2.5 does not stop an execution waiting for a task token."""
    # Given a job's workflow
    client = boto3.client("stepfunctions", region_name=REGION)
    workflow = StepFunctionsWorkflow(client, lifecycle.state_machine_arn)
    with Stubber(client) as stub:
        stub.add_response(
            "stop_execution",
            {"stopDate": datetime.now(UTC)},
            {"executionArn": workflow.execution_arn("job-1"), "cause": "cancelled by the user"},
        )

        # When the job is stopped
        workflow.stop("job-1", "cancelled by the user")

        # Then StopExecution went to the job's execution, with the cause
        stub.assert_no_pending_responses()


def test_stopping_a_job_that_never_started_is_not_an_error(workflow: StepFunctionsWorkflow) -> None:
    # Given no execution for the job / When it is stopped / Then nothing is raised and there is still none
    workflow.stop("never-started", "cancelled by the user")
    assert workflow.status("never-started") is None


def test_execution_arns_are_built_from_the_state_machine_arn() -> None:
    # Given a state machine ARN / When an execution ARN is built / Then it names the execution
    sm = "arn:aws:states:eu-west-1:123456789012:stateMachine:JobLifecycle"
    assert execution_arn(sm, "job-1") == "arn:aws:states:eu-west-1:123456789012:execution:JobLifecycle:job-1"
    with pytest.raises(ValueError, match="not a state machine ARN"):
        execution_arn("arn:aws:lambda:eu-west-1:123456789012:function:place", "job-1")


def test_losing_a_start_race_is_already_started(lifecycle: Lifecycle) -> None:
    # Given another handler starting the same job between our look and our start
    client = boto3.client("stepfunctions", region_name=REGION)
    workflow = StepFunctionsWorkflow(client, lifecycle.state_machine_arn)
    with Stubber(client) as stub:
        stub.add_client_error("describe_execution", service_error_code="ExecutionDoesNotExist")
        stub.add_client_error("start_execution", service_error_code="ExecutionAlreadyExists")

        # When this one starts it / Then it answers False
        assert workflow.start("job-1", {"job_id": "job-1"}) is False
