"""The reconcile (schedule) and cancel (user) functions on moto: orphan instances terminated, attempts
whose instance vanished failed with InstanceLost, a cancelled job stopped everywhere."""

from __future__ import annotations

import json
from datetime import UTC, timedelta

import pytest

from spotrelay.config import TAG_MANAGED
from spotrelay.models import AttemptOutcome, JobState

from .aws_resources import IMAGE_ID
from .function_harness import HEARTBEAT_SECONDS, Deployment, TaskFailures, recorded_event

# Place (in every launch) adds a metric only when it waits: Powertools warns about the empty flush.
pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish:UserWarning")

JOB = "resnet50-0000000000c1"


def untracked_managed_instance(deployment: Deployment) -> str:
    """An instance tagged spotrelay:managed that no attempt knows (its launch was never recorded)."""
    reservation = deployment.ec2.run_instances(
        ImageId=IMAGE_ID,
        MinCount=1,
        MaxCount=1,
        InstanceType="g6.xlarge",
        SubnetId=deployment.network.subnets["us-east-1a"],
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": TAG_MANAGED, "Value": "true"}]}],
    )
    return reservation["Instances"][0]["InstanceId"]


# --- reconcile ---------------------------------------------------------------------------------------


def test_reconcile_terminates_an_orphan_past_its_grace_and_keeps_tracked_instances(deployment: Deployment) -> None:
    # Given an untracked managed instance, and a tracked job's instance launched at the same time
    # (moto stamps LaunchTime with the wall clock: the fake clock starts from it)
    orphan = untracked_managed_instance(deployment)
    deployment.clock.current = deployment.launched_at(orphan).astimezone(UTC)
    tracked = deployment.launch_job(JOB)

    # When reconcile runs six minutes later (past the five-minute grace)
    deployment.clock.advance(timedelta(minutes=6))
    report = deployment.invoke("reconcile", {"source": "aws.scheduler"})

    # Then the orphan is terminated and the tracked instance keeps running its attempt
    assert report["terminated_orphans"] == [orphan]
    assert deployment.instance_state(orphan) in {"shutting-down", "terminated"}
    assert deployment.instance_state(tracked.instance_id) in {"pending", "running"}
    assert report["lost_attempts"] == []
    assert deployment.execution(JOB)["status"] == "RUNNING"


def test_reconcile_leaves_a_fresh_untracked_instance_alone(deployment: Deployment) -> None:
    # Given an untracked managed instance launched a minute ago (its launch may not be recorded yet)
    fresh = untracked_managed_instance(deployment)
    deployment.clock.current = deployment.launched_at(fresh).astimezone(UTC) + timedelta(minutes=1)

    # When reconcile runs / Then the instance is left running
    report = deployment.invoke("reconcile", {"source": "aws.scheduler"})
    assert report["terminated_orphans"] == []
    assert deployment.instance_state(fresh) in {"pending", "running"}


def test_reconcile_fails_the_run_task_of_an_instance_terminated_out_of_band(deployment: Deployment) -> None:
    # Given a live spot attempt whose instance was terminated without any event reaching spotrelay
    launched = deployment.launch_job(JOB)
    deployment.ec2.terminate_instances(InstanceIds=[launched.instance_id])
    failures = TaskFailures(deployment.load("reconcile").workflow.client)

    # When reconcile runs
    report = deployment.invoke("reconcile", {"source": "aws.scheduler"})

    # Then, as the state-change event would have, a spot instance gone before any warning is taken for an
    # interruption: its Run task fails with SpotInterrupted (Recover waits for a final checkpoint), so the
    # execution does
    assert (report["interrupted_attempts"], report["lost_attempts"]) == ([f"{JOB}#1"], [])
    assert deployment.outcome(JOB) == ("FAILED", "SpotInterrupted")
    assert [(error, cause.get("instance_id")) for error, cause in failures.sent] == [
        ("SpotInterrupted", launched.instance_id)
    ]


def test_reconcile_fails_a_job_whose_execution_ended_without_it(deployment: Deployment) -> None:
    # Given a launched job whose execution ended without finalizing it (its Run task failed, and the
    # test's one-state machine has no Recover or Finalize to catch that)
    launched = deployment.launch_job(JOB)
    deployment.sfn.send_task_failure(taskToken=launched.task_token, error="States.Runtime", cause="lost")
    assert deployment.outcome(JOB) == ("FAILED", "States.Runtime")

    # When reconcile runs
    report = deployment.invoke("reconcile", {"source": "aws.scheduler"})

    # Then the job is FAILED with the reason, its attempt closed LOST and its instance terminated
    assert report["repaired_jobs"] == [JOB]
    job = deployment.job(JOB)
    assert job.state is JobState.FAILED
    assert job.failure_reason is not None
    assert "ExecutionEnded" in job.failure_reason
    assert "FAILED" in job.failure_reason
    assert deployment.store.get_attempt(JOB, 1).outcome is AttemptOutcome.LOST
    assert deployment.instance_state(launched.instance_id) in {"shutting-down", "terminated"}


def test_reconcile_starts_the_missing_execution_of_an_admitted_job(deployment: Deployment) -> None:
    # Given an admitted job whose execution was never started (the dispatcher crashed in between)
    deployment.create_job(JOB, state=JobState.PLACING)

    # When reconcile runs
    report = deployment.invoke("reconcile", {"source": "aws.scheduler"})

    # Then the job's execution exists, started with the dispatcher's input
    assert report["restarted_executions"] == [JOB]
    assert deployment.executions() == [JOB]
    assert json.loads(deployment.execution(JOB)["input"]) == {"job_id": JOB, "heartbeat_seconds": HEARTBEAT_SECONDS}


# --- cancel ------------------------------------------------------------------------------------------


def test_cancelling_a_running_job_stops_it_everywhere(deployment: Deployment) -> None:
    # Given a running job: its instance is up and its execution waits in Run
    launched = deployment.launch_job(JOB)
    deployment.invoke("ec2_events", recorded_event("instance-state-change-running", launched.instance_id))
    assert deployment.job(JOB).state is JobState.RUNNING
    deployment.let_task_failures_land(deployment.load("cancel"), JOB)

    # When the user cancels it
    result = deployment.invoke("cancel", {"job_id": JOB})

    # Then its instance is terminated, its attempt closed and the job CANCELLED
    expected = ("CANCELLED", [launched.instance_id], False)
    assert (result["state"], result["terminated"], result["already_ended"]) == expected
    assert deployment.instance_state(launched.instance_id) in {"shutting-down", "terminated"}
    job = deployment.job(JOB)
    assert job.state is JobState.CANCELLED
    assert job.failure_reason == "JobCancelled: cancelled by the user"
    assert deployment.store.get_attempt(JOB, 1).outcome is AttemptOutcome.CANCELLED

    # And the Run task fails with JobCancelled, so the execution does
    assert deployment.outcome(JOB) == ("FAILED", "JobCancelled")


def test_cancelling_a_cancelled_job_says_it_already_ended(deployment: Deployment) -> None:
    # Given a cancelled job
    deployment.launch_job(JOB)
    deployment.let_task_failures_land(deployment.load("cancel"), JOB)
    deployment.invoke("cancel", {"job_id": JOB})
    table = deployment.table_items()

    # When it is cancelled again
    again = deployment.invoke("cancel", {"job_id": JOB})

    # Then the answer says it had already ended, and nothing changed
    assert (again["state"], again["terminated"], again["already_ended"]) == ("CANCELLED", [], True)
    assert deployment.table_items() == table
