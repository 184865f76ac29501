"""The JobLifecycle step functions on moto: place, launch, recover and finalize, as the state machine
calls them, with what each leaves in DynamoDB and EC2.

moto quotes every spot pool at the same price (0.00001 $/h), so placement's order among equally fast
pools is its tie-break; the tests assert where the plan may go, not which pool wins.
"""

from __future__ import annotations

import io
import json
import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from spotrelay.catalog import family_of
from spotrelay.config import TAG_ATTEMPT, TAG_JOB_ID, TAG_MANAGED
from spotrelay.models import Attempt, AttemptOutcome, JobState, Market, Pool
from spotrelay.policy import BlockedPool

from .function_harness import (
    ALLOWED_FAMILIES,
    BLOCK_MINUTES,
    Deployment,
    event_time,
    recorded_event,
)

if TYPE_CHECKING:
    from mypy_boto3_ec2.type_defs import InstanceTypeDef

# Place adds a metric only when it waits, and recover none: Powertools warns about the empty flush.
pytestmark = pytest.mark.filterwarnings("ignore:No application metrics to publish:UserWarning")

JOB = "resnet50-0000000000a1"
MOTO_SPOT_PRICE = 0.00001


def tags_of(instance: InstanceTypeDef) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


# --- place + launch ---------------------------------------------------------------------------------


def test_place_plans_pools_in_the_deployments_zones_and_families(deployment: Deployment) -> None:
    # Given an admitted job
    deployment.create_job(JOB, state=JobState.PLACING)

    # When Place runs
    result = deployment.invoke("place", {"job_id": JOB})

    # Then it asks for a launch, and the job is LAUNCHING with a plan of spot pools only in zones with a
    # subnet and only of the allowed families (resnet50 also fits g4dn, gr6, p3 and p4d)
    assert result["action"] == "launch"
    job = deployment.job(JOB)
    assert job.state is JobState.LAUNCHING
    assert job.placement
    assert {p.pool.availability_zone for p in job.placement} <= set(deployment.network.subnets)
    assert {family_of(p.pool.instance_type) for p in job.placement} <= set(ALLOWED_FAMILIES)
    assert all(p.pool.market is Market.SPOT and p.hourly_price == MOTO_SPOT_PRICE for p in job.placement)


def test_launch_starts_one_tagged_spot_instance_in_the_first_planned_pool(deployment: Deployment) -> None:
    # Given a placed job whose execution waits in Run with its task token
    deployment.create_job(JOB, state=JobState.PLACING)
    token = deployment.start_waiting_execution(JOB)
    deployment.invoke("place", {"job_id": JOB})
    first = deployment.job(JOB).placement[0].pool

    # When Launch runs with the token
    launched = deployment.invoke("launch", {"job_id": JOB, "task_token": token})

    # Then EC2 has one spot instance of the first planned pool's type, in its zone's subnet, tagged for attempt 1
    instance_id = launched["instance_id"]
    assert [i["InstanceId"] for i in deployment.all_instances()] == [instance_id]
    instance = deployment.instance(instance_id)
    assert instance["InstanceType"] == first.instance_type
    assert instance.get("Placement", {}).get("AvailabilityZone") == first.availability_zone
    assert instance.get("SubnetId") == deployment.network.subnets[first.availability_zone]
    assert instance.get("InstanceLifecycle") == "spot"  # moto records the spot market request only as this
    assert tags_of(instance).items() >= {TAG_MANAGED: "true", TAG_JOB_ID: JOB, TAG_ATTEMPT: "1"}.items()

    # And the attempt record carries the token and the instance, and the instance maps back to the attempt
    attempt = deployment.store.get_attempt(JOB, 1)
    assert (attempt.task_token, attempt.instance_id, attempt.pool) == (token, instance_id, first)
    assert deployment.job(JOB).attempts == 1
    ref = deployment.store.get_instance_ref(instance_id)
    assert ref is not None
    assert (ref.job_id, ref.attempt) == (JOB, 1)


def test_a_warm_function_logs_no_key_of_the_job_it_ran_before(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    # The functions' lines as Powertools formats them (with the keys a handler appended), whatever stream
    # an earlier test left its handler on, at INFO whatever level it left
    caplog.set_level(logging.INFO, logger="spotrelay")
    written = io.StringIO()
    lines = logging.StreamHandler(written)
    lines.setFormatter(deployment.load("place").logger.registered_formatter)
    logging.getLogger("spotrelay").addHandler(lines)
    try:
        # Given a job launched (Launch's lines carry its job id and attempt 1)
        deployment.launch_job(JOB)
        other = "resnet50-0000000000b2"
        deployment.create_job(other, state=JobState.PLACING)
        written.truncate(0)
        written.seek(0)

        # When Place and Launch then run for another job in the same (warm) processes
        deployment.invoke("place", {"job_id": other})
        place_lines = log_lines(written.getvalue())
        written.truncate(0)
        written.seek(0)
        token = deployment.start_waiting_execution(other)
        deployment.invoke("launch", {"job_id": other, "task_token": token})
        launch_lines = log_lines(written.getvalue())
    finally:
        logging.getLogger("spotrelay").removeHandler(lines)

    # Then every line is about that job: no job id or attempt of the first (Powertools keeps appended keys
    # across invocations unless told to clear them)
    assert place_lines
    assert launch_lines
    assert {line.get("job_id") for line in place_lines + launch_lines} == {other}
    assert all("attempt" not in line for line in place_lines)
    assert {line["attempt"] for line in launch_lines if "attempt" in line} <= {1}


def log_lines(output: str) -> list[dict[str, Any]]:
    """The functions' Powertools log lines in `output` (not their metrics)."""
    return [line for text in output.splitlines() if text.startswith("{") and "message" in (line := json.loads(text))]


def test_a_retried_launch_with_the_same_token_launches_nothing_more(deployment: Deployment) -> None:
    # Given a job launched with a task token
    launched = deployment.launch_job(JOB)

    # When Launch is invoked again with that token (Step Functions retried the invocation)
    again = deployment.invoke("launch", {"job_id": JOB, "task_token": launched.task_token})

    # Then it answers with the same instance, and EC2 still has only that one (moto ignores ClientToken:
    # the dedup is the attempt record's, not EC2's)
    assert again == launched.result
    assert [i["InstanceId"] for i in deployment.all_instances()] == [launched.instance_id]
    assert [a.attempt for a in deployment.store.attempts(JOB)] == [1]


def test_launch_with_every_planned_pool_blocked_fails_with_the_error_the_state_machine_catches(
    deployment: Deployment,
) -> None:
    # Given a placed job whose every planned pool was blocked since (interruptions elsewhere)
    deployment.create_job(JOB, state=JobState.PLACING)
    token = deployment.start_waiting_execution(JOB)
    deployment.invoke("place", {"job_id": JOB})
    until = deployment.clock.now() + timedelta(minutes=30)
    for planned in deployment.job(JOB).placement:
        deployment.store.block_pool(BlockedPool(pool=planned.pool, until=until, reason="test"))

    # When Launch runs
    launch = deployment.load("launch")
    with pytest.raises(launch.InsufficientInstanceCapacity) as refused:
        deployment.invoke("launch", {"job_id": JOB, "task_token": token})

    # Then it fails with InsufficientInstanceCapacity (the Lambda error name the Run task's Catch sends back
    # to Place), and nothing was launched or recorded
    assert type(refused.value).__name__ == "InsufficientInstanceCapacity"
    assert deployment.all_instances() == []
    assert deployment.store.attempts(JOB) == []


# --- recover ----------------------------------------------------------------------------------------

INTERRUPTED = {"Error": "SpotInterrupted", "Cause": "{}"}


def interrupted_job(deployment: Deployment) -> tuple[str, Pool]:
    """A job launched at the fake clock's start and warned at the recorded warning's time; the clock
    is at the warning. Returns (instance id, pool)."""
    launched = deployment.launch_job(JOB)
    warning = recorded_event("spot-interruption-warning", launched.instance_id)
    assert deployment.invoke("ec2_events", warning)["action"] == "interrupt"
    deployment.clock.current = event_time(warning)
    return launched.instance_id, deployment.store.get_attempt(JOB, 1).pool


def test_recover_waits_for_the_final_checkpoint_then_relaunches(deployment: Deployment) -> None:
    # Given an attempt that got its spot interruption warning just now (no checkpoint of it yet)
    started = deployment.clock.now()
    instance_id, pool = interrupted_job(deployment)
    warned_at = deployment.clock.now()
    assert deployment.outcome(JOB) == ("FAILED", "SpotInterrupted")

    # When Recover runs at once
    first = deployment.invoke("recover", {"job_id": JOB, "error": INTERRUPTED})

    # Then it asks to wait for the final checkpoint, and the attempt stays open
    assert first["action"] == "wait_checkpoint"
    assert deployment.store.get_attempt(JOB, 1).outcome is None

    # When it runs again three minutes later (past the two-minute notice)
    deployment.clock.advance(timedelta(minutes=3))
    second = deployment.invoke("recover", {"job_id": JOB, "error": INTERRUPTED})

    # Then it relaunches: the attempt is closed INTERRUPTED with its cost, the instance is terminated,
    # the job is RECOVERING with one interruption and its cost, and the lost pool is blocked
    now = deployment.clock.now()
    assert second["action"] == "relaunch"
    attempt = deployment.store.get_attempt(JOB, 1)
    assert (attempt.outcome, attempt.ended_at) == (AttemptOutcome.INTERRUPTED, now)
    expected_cost = MOTO_SPOT_PRICE * (now - started).total_seconds() / 3600
    assert attempt.cost(now) == pytest.approx(expected_cost)
    assert deployment.instance_state(instance_id) in {"shutting-down", "terminated"}
    job = deployment.job(JOB)
    assert (job.state, job.interruptions) == (JobState.RECOVERING, 1)
    assert job.cost_usd == pytest.approx(expected_cost)
    assert job.cost_usd > 0
    # eager-next-pool blocks the lost pool for the job's recovery.block_minutes from now, and the warning
    # blocked it for the deployment's BLOCK_MINUTES from the notice: a block is only ever extended, so
    # the later of the two stands
    blocks = {b.pool: b.until for b in deployment.store.blocked_pools(now)}
    recovery_block = now + timedelta(minutes=job.spec.recovery.block_minutes)
    warning_block = warned_at + timedelta(minutes=BLOCK_MINUTES)
    assert recovery_block < warning_block
    assert blocks[pool] == warning_block
    # the warning counted the interruption; recovery adds the instance-hours, not a second interruption
    stats = deployment.store.pool_observations()[pool.offering]
    assert stats.interruptions == 1
    assert stats.instance_hours == pytest.approx((now - started).total_seconds() / 3600)

    # When Recover is invoked again (a retried invocation)
    table = deployment.table_items()
    third = deployment.invoke("recover", {"job_id": JOB, "error": INTERRUPTED})

    # Then it gives the same answer and records nothing more
    assert third == second
    assert deployment.table_items() == table

    # When the state machine goes back to Place
    placed = deployment.invoke("place", {"job_id": JOB})

    # Then the job moves on through PLACING to LAUNCHING, with the lost pool out of its plan
    assert placed["action"] == "launch"
    job = deployment.job(JOB)
    assert job.state is JobState.LAUNCHING
    assert pool not in {p.pool for p in job.placement}


# --- finalize ---------------------------------------------------------------------------------------


def test_finalize_terminates_and_totals_the_cost_of_every_attempt(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    # The warning is wanted whatever level an earlier test in this process left on the `spotrelay` logger
    # (a Powertools Logger of that service sets it from its environment)
    caplog.set_level(logging.WARNING, logger="spotrelay.aws.wakeup")
    # Given a job whose first attempt was interrupted after an hour at $0.50/h (a recorded history),
    # and whose second attempt was launched and is running
    start = deployment.clock.now()
    deployment.create_job(JOB, state=JobState.RECOVERING)
    job, version = deployment.store.get_job(JOB)
    deployment.store.put_job(job.model_copy(update={"attempts": 1, "interruptions": 1}), version)
    lost_pool = Pool(instance_type="g5.xlarge", availability_zone="us-east-1b")
    deployment.store.put_attempt(
        Attempt(
            job_id=JOB,
            attempt=1,
            pool=lost_pool,
            hourly_price=0.5,
            instance_id="i-00000000000000001",
            started_at=start - timedelta(hours=2),
            ended_at=start - timedelta(hours=1),
            outcome=AttemptOutcome.INTERRUPTED,
        )
    )
    token = deployment.start_waiting_execution(JOB)
    assert deployment.invoke("place", {"job_id": JOB})["action"] == "launch"
    launched = deployment.invoke("launch", {"job_id": JOB, "task_token": token})
    assert launched["attempt"] == 2
    deployment.invoke("ec2_events", recorded_event("instance-state-change-running", launched["instance_id"]))

    # When the job succeeds two hours later and Finalize runs (the dispatcher it wakes does not exist in moto)
    deployment.clock.advance(timedelta(hours=2))
    summary = deployment.invoke("finalize", {"job_id": JOB, "final": {"outcome": "SUCCEEDED"}})

    # Then the instance is terminated, the job SUCCEEDED, and its cost is both attempts' together
    assert deployment.instance_state(launched["instance_id"]) in {"shutting-down", "terminated"}
    expected = 0.5 * 1 + MOTO_SPOT_PRICE * 2
    job = deployment.job(JOB)
    assert job.state is JobState.SUCCEEDED
    assert job.ended_at == deployment.clock.now()
    assert job.cost_usd == pytest.approx(expected)
    assert job.work_done_hours == job.spec.work_hours
    assert summary["state"] == "SUCCEEDED"
    assert summary["cost_usd"] == pytest.approx(expected, abs=1e-6)
    assert deployment.store.get_attempt(JOB, 2).outcome is AttemptOutcome.SUCCEEDED
    # the dispatcher's wake-up was tried, failed (no such function in moto) and did not fail Finalize
    assert "could not wake the dispatcher" in [r.getMessage() for r in caplog.records]

    # When Finalize runs again (a retried invocation), later
    table = deployment.table_items()
    deployment.clock.advance(timedelta(minutes=5))
    again = deployment.invoke("finalize", {"job_id": JOB, "final": {"outcome": "SUCCEEDED"}})

    # Then it answers the same and changes nothing
    assert again == summary
    assert deployment.table_items() == table


def test_finalize_of_a_failed_job_keeps_the_error_as_the_reason(deployment: Deployment) -> None:
    # Given a launched job
    launched = deployment.launch_job(JOB)

    # When the state machine finalizes it as FAILED with the error it caught
    summary = deployment.invoke(
        "finalize",
        {"job_id": JOB, "final": {"outcome": "FAILED", "error": {"Error": "TooManyInterruptions", "Cause": "21"}}},
    )

    # Then the job is FAILED with that reason, its attempt closed FAILED and its instance terminated
    job = deployment.job(JOB)
    assert job.state is JobState.FAILED
    assert job.failure_reason == "TooManyInterruptions: 21"
    assert summary["failure_reason"] == "TooManyInterruptions: 21"
    assert deployment.store.get_attempt(JOB, 1).outcome is AttemptOutcome.FAILED
    assert deployment.instance_state(launched.instance_id) in {"shutting-down", "terminated"}
