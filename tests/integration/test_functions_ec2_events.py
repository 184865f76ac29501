"""The ec2_events function on moto, fed the recorded EventBridge events with `detail.instance-id`
bound to an instance the launch function started: what each event leaves in DynamoDB, and how the
job's real JobLifecycle execution (waiting in Run on the attempt's task token) ends."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from spotrelay.aws.store import attempt_sort_key, block_key, epoch_seconds, job_key
from spotrelay.models import JobState

from .aws_resources import TABLE
from .function_harness import BLOCK_MINUTES, Deployment, Launched, TaskFailures, event_time, recorded_event

# Place (in every launch) adds a metric only when it waits: Powertools warns about the empty flush.
pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish:UserWarning")

JOB = "resnet50-0000000000e1"
RECORDED_INSTANCE = "i-1234567890abcdef0"  # the placeholder id in the recorded events: no instance of ours


@pytest.fixture
def launched(deployment: Deployment) -> Launched:
    return deployment.launch_job(JOB)


@pytest.fixture
def task_failures(deployment: Deployment) -> TaskFailures:
    return TaskFailures(deployment.load("ec2_events").workflow.client)


def block_until(deployment: Deployment, launched: Launched) -> Decimal | None:
    """The `until` of the BLOCK item of the launched attempt's pool, in epoch seconds (None: no block)."""
    pool = deployment.store.get_attempt(launched.job_id, 1).pool
    item = deployment.item(f"BLOCK#{block_key(pool)}", "BLOCK")
    return None if item is None else Decimal(item["until_epoch"]["N"])


def interruptions_counted(deployment: Deployment, launched: Launched) -> int:
    pool = deployment.store.get_attempt(launched.job_id, 1).pool
    item = deployment.item(f"POOLSTATS#{pool.offering}", "STATS")
    return 0 if item is None else int(item["interruptions"]["N"])


def blocked_until(at: datetime) -> Decimal:
    return epoch_seconds(at + timedelta(minutes=BLOCK_MINUTES))


# --- the interruption warning ------------------------------------------------------------------------


@pytest.mark.parametrize("recording", ["spot-interruption-warning", "spot-interruption-warning-az-arn"])
def test_an_interruption_warning_blocks_the_pool_and_fails_the_run_task(
    deployment: Deployment, launched: Launched, task_failures: TaskFailures, recording: str
) -> None:
    # Given a running attempt whose execution waits in Run (the AZ-ARN recording names another instance
    # in `resources`: only detail.instance-id is ours)
    warning = recorded_event(recording, launched.instance_id)
    assert launched.instance_id not in str(warning["resources"])

    # When its spot interruption warning arrives
    outcome = deployment.invoke("ec2_events", warning)

    # Then the attempt is marked interrupted at the warning's time
    at = event_time(warning)
    assert (outcome["action"], outcome["job_id"], outcome["attempt"]) == ("interrupt", JOB, 1)
    assert deployment.store.get_attempt(JOB, 1).interrupted_at == at

    # And the pool is blocked until the warning's time + SPOTRELAY_BLOCK_MINUTES, with one interruption counted
    assert block_until(deployment, launched) == blocked_until(at)
    assert interruptions_counted(deployment, launched) == 1

    # And the Run task fails with SpotInterrupted, naming the instance, so the execution fails with it
    assert deployment.outcome(JOB) == ("FAILED", "SpotInterrupted")
    assert [(error, cause.get("instance_id")) for error, cause in task_failures.sent] == [
        ("SpotInterrupted", launched.instance_id)
    ]


def test_a_warning_delivered_twice_counts_once(deployment: Deployment, launched: Launched) -> None:
    # Given the warning was handled
    warning = recorded_event("spot-interruption-warning", launched.instance_id)
    deployment.invoke("ec2_events", warning)
    deployment.outcome(JOB)
    attempt = deployment.store.get_attempt(JOB, 1)

    # When EventBridge delivers it again
    again = deployment.invoke("ec2_events", warning)

    # Then it is acknowledged, and the interruption is still counted once, the block and the attempt unchanged
    assert again["action"] == "interrupt"
    assert interruptions_counted(deployment, launched) == 1
    assert block_until(deployment, launched) == blocked_until(event_time(warning))
    assert deployment.store.get_attempt(JOB, 1) == attempt
    assert deployment.outcome(JOB) == ("FAILED", "SpotInterrupted")


# --- state changes -----------------------------------------------------------------------------------


def test_the_running_state_change_marks_the_job_running(deployment: Deployment, launched: Launched) -> None:
    # Given a launched job / When its instance's `running` state change arrives
    running = recorded_event("instance-state-change-running", launched.instance_id)
    outcome = deployment.invoke("ec2_events", running)

    # Then the job is RUNNING and the attempt knows since when; the execution still waits in Run
    assert outcome["action"] == "running"
    assert deployment.job(JOB).state is JobState.RUNNING
    assert deployment.store.get_attempt(JOB, 1).running_at == event_time(running)
    assert deployment.execution(JOB)["status"] == "RUNNING"


def test_a_spot_instance_terminated_before_its_warning_is_an_interruption_and_the_late_warning_changes_nothing(
    deployment: Deployment, launched: Launched
) -> None:
    # Given EventBridge delivers the `terminated` state change before the interruption warning
    terminated = recorded_event("instance-state-change-terminated", launched.instance_id)
    warning = recorded_event("spot-interruption-warning", launched.instance_id)

    # When the state change is handled
    first = deployment.invoke("ec2_events", terminated)

    # Then a spot instance going away is handled as its interruption (not lost): the Run task fails with
    # SpotInterrupted, so Recover waits for the final checkpoint; the pool is blocked, one interruption counted
    assert (first["action"], first["reason"]) == ("interrupt", "terminated before any interruption warning")
    assert deployment.outcome(JOB) == ("FAILED", "SpotInterrupted")
    assert deployment.store.get_attempt(JOB, 1).interrupted_at == event_time(terminated)
    assert block_until(deployment, launched) == blocked_until(event_time(terminated))

    # When the warning arrives after it
    late = deployment.invoke("ec2_events", warning)

    # Then nothing more happens: the block stands, the interruption is counted once, the execution's end stands
    assert late["action"] == "interrupt"
    assert block_until(deployment, launched) == blocked_until(event_time(terminated))
    assert interruptions_counted(deployment, launched) == 1
    assert deployment.outcome(JOB) == ("FAILED", "SpotInterrupted")


def test_a_rebalance_recommendation_is_noted_and_the_job_runs_on(deployment: Deployment, launched: Launched) -> None:
    # Given a launched job / When a rebalance recommendation arrives for its instance
    rebalance = recorded_event("rebalance-recommendation", launched.instance_id)
    outcome = deployment.invoke("ec2_events", rebalance)

    # Then the attempt notes it, no pool is blocked, and the execution still waits in Run
    assert outcome["action"] == "rebalance"
    assert deployment.store.get_attempt(JOB, 1).rebalance_at == event_time(rebalance)
    assert block_until(deployment, launched) is None
    assert deployment.execution(JOB)["status"] == "RUNNING"


# --- events that are not ours, or not events ---------------------------------------------------------


def test_an_event_for_an_instance_spotrelay_does_not_know_is_ignored(
    deployment: Deployment, launched: Launched
) -> None:
    # Given a launched job, and a warning for some other instance
    table = deployment.table_items()

    # When the warning arrives
    outcome = deployment.invoke("ec2_events", recorded_event("spot-interruption-warning"))

    # Then it is acknowledged as ignored, and nothing changed
    assert (outcome["action"], outcome["instance_id"]) == ("ignore", RECORDED_INSTANCE)
    assert deployment.table_items() == table
    assert deployment.execution(JOB)["status"] == "RUNNING"


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(recorded_event("malformed-interruption-warning"), id="warning-without-instance-id"),
        pytest.param({"foo": 1}, id="not-an-eventbridge-event"),
    ],
)
def test_a_malformed_event_is_acknowledged_and_changes_nothing(
    deployment: Deployment, launched: Launched, event: dict[str, object]
) -> None:
    # Given a launched job whose execution waits in Run
    table = deployment.table_items()

    # When a malformed event arrives
    outcome = deployment.invoke("ec2_events", event)

    # Then it is acknowledged as malformed (not raised into a retry loop), and nothing changed
    assert outcome["action"] == "malformed"
    assert outcome["reason"]
    assert deployment.table_items() == table
    assert deployment.execution(JOB)["status"] == "RUNNING"


# --- records another version wrote -------------------------------------------------------------------


def rewrite_record(deployment: Deployment, pk: str, sk: str, change: Callable[[dict[str, Any]], None]) -> None:
    """Change a stored record's JSON in place, as another version of spotrelay would have written it."""
    item = deployment.item(pk, sk)
    assert item is not None
    record = json.loads(item["record"]["S"])
    change(record)
    deployment.dynamodb.update_item(
        TableName=TABLE,
        Key={"pk": {"S": pk}, "sk": {"S": sk}},
        UpdateExpression="SET #r = :r",
        ExpressionAttributeNames={"#r": "record"},
        ExpressionAttributeValues={":r": {"S": json.dumps(record)}},
    )


def test_records_a_newer_version_wrote_still_get_their_interruption_handled(
    deployment: Deployment, launched: Launched, task_failures: TaskFailures
) -> None:
    # Given a running attempt whose job and attempt records carry a field this version does not know
    # (written by a newer version of the functions, mid-deploy)
    rewrite_record(deployment, job_key(JOB), "JOB", lambda r: r.update(priority_boost=3))
    rewrite_record(deployment, job_key(JOB), attempt_sort_key(1), lambda r: r.update(gpu_temperature_c=71.5))

    # When its interruption warning arrives
    warning = recorded_event("spot-interruption-warning", launched.instance_id)
    outcome = deployment.invoke("ec2_events", warning)

    # Then it is handled as any interruption: the attempt marked, the pool blocked, the Run task failed
    assert (outcome["action"], outcome["job_id"], outcome["attempt"]) == ("interrupt", JOB, 1)
    assert deployment.store.get_attempt(JOB, 1).interrupted_at == event_time(warning)
    assert block_until(deployment, launched) == blocked_until(event_time(warning))
    assert [error for error, _ in task_failures.sent] == ["SpotInterrupted"]
    # And the newer version's fields are still in the records this version rewrote
    attempt_item = deployment.item(job_key(JOB), attempt_sort_key(1))
    job_item = deployment.item(job_key(JOB), "JOB")
    assert attempt_item is not None
    assert job_item is not None
    assert json.loads(attempt_item["record"]["S"])["gpu_temperature_c"] == 71.5
    assert json.loads(job_item["record"]["S"])["priority_boost"] == 3


def test_a_record_that_cannot_be_read_is_raised_for_a_retry_not_acknowledged_as_a_malformed_event(
    deployment: Deployment, launched: Launched
) -> None:
    # Given a running attempt whose record cannot be read (a known field holding what it cannot hold)
    rewrite_record(deployment, job_key(JOB), attempt_sort_key(1), lambda r: r.update(attempt="first"))
    table = deployment.table_items()

    # When its interruption warning arrives
    warning = recorded_event("spot-interruption-warning", launched.instance_id)

    # Then the function raises (Lambda retries the event; its rule's DLQ keeps it after that), changing nothing:
    # a real warning is never acknowledged as a malformed event
    with pytest.raises(ValidationError, match="attempt"):
        deployment.invoke("ec2_events", warning)
    assert deployment.table_items() == table
    assert deployment.execution(JOB)["status"] == "RUNNING"
