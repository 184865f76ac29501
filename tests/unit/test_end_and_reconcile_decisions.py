"""Finalize's and reconcile's decisions (spotrelay.control.decisions.ending / .reconciling), on their own:
what each answers for the records a step has read."""

from __future__ import annotations

from datetime import timedelta

import pytest
from control_builders import T0, ZONE_A, make_job

from spotrelay.config import ORPHAN_GRACE_SECONDS
from spotrelay.control.decisions import (
    STANDBY_BOOT_SECONDS,
    STANDBY_HANDOVER_SECONDS,
    STANDBY_RETRY_SECONDS,
    AskHandover,
    DropStandby,
    Untracked,
    bill_overdue,
    closing_outcome,
    end_job,
    final_outcome,
    handover_seconds,
    instance_gone,
    moves_back_considered,
    standby_retry_at,
    supervise_standby,
    untracked_instance,
)
from spotrelay.models import Attempt, AttemptOutcome, JobState, Market, Pool


def _attempt(number: int = 1, **fields: object) -> Attempt:
    values: dict[str, object] = {
        "job_id": "train-1",
        "attempt": number,
        "pool": Pool(instance_type="g6.xlarge", availability_zone=ZONE_A),
        "hourly_price": 0.3,
        "instance_id": f"i-{number:017x}",
        "started_at": T0,
    }
    return Attempt.model_validate(values | fields)


GRACE = timedelta(seconds=ORPHAN_GRACE_SECONDS)


# --- Finalize -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("final", "state", "outcome"),
    [
        ({"outcome": "SUCCEEDED"}, JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED),
        ({"outcome": "CANCELLED", "error": {"Error": "JobCancelled"}}, JobState.CANCELLED, AttemptOutcome.CANCELLED),
        ({"outcome": "FAILED", "error": {"Error": "JobFailed"}}, JobState.FAILED, AttemptOutcome.FAILED),
        # a newer state machine's outcome, or none: the job still ends, as a failure
        ({"outcome": "PAUSED"}, JobState.FAILED, AttemptOutcome.FAILED),
        ({}, JobState.FAILED, AttemptOutcome.FAILED),
    ],
)
def test_the_final_input_names_the_jobs_end(final: dict[str, object], state: JobState, outcome: AttemptOutcome) -> None:
    ending = final_outcome(final)
    assert (ending.state, ending.attempt_outcome) == (state, outcome)
    assert ending.error == final.get("error", {})


def test_an_error_that_is_not_a_map_is_no_error() -> None:
    assert final_outcome({"outcome": "FAILED", "error": "boom"}).error == {}


def test_a_standby_never_given_the_job_closes_cancelled_whatever_the_end() -> None:
    standby = _attempt(2, handover_from=1)
    assert closing_outcome(standby, AttemptOutcome.SUCCEEDED) is AttemptOutcome.CANCELLED
    assert closing_outcome(_attempt(), AttemptOutcome.SUCCEEDED) is AttemptOutcome.SUCCEEDED


def test_success_before_the_running_event_goes_through_running_and_counts_the_work() -> None:
    job = make_job(state=JobState.LAUNCHING, work_hours=3.0)
    end_job(job, JobState.SUCCEEDED, None, T0)
    assert (job.state, job.work_done_hours, job.ended_at, job.failure_reason) == (JobState.SUCCEEDED, 3.0, T0, None)


def test_the_first_end_stands_and_a_recorded_reason_is_kept_unless_replaced() -> None:
    # Given a job the user cancelled (its reason recorded) that then fails
    job = make_job(state=JobState.RUNNING)
    job.failure_reason = "JobCancelled: cancelled by the user"
    end_job(job, JobState.FAILED, "JobFailed: exit 1", T0)
    assert (job.state, job.failure_reason) == (JobState.FAILED, "JobCancelled: cancelled by the user")
    # Then a second end changes nothing
    end_job(job, JobState.SUCCEEDED, None, T0 + GRACE)
    assert (job.state, job.ended_at) == (JobState.FAILED, T0)
    # And reconcile's repair replaces the reason with its own
    other = make_job(state=JobState.RUNNING)
    other.failure_reason = "stale"
    end_job(other, JobState.FAILED, "ExecutionEnded: ...", T0, keep_recorded_reason=False)
    assert other.failure_reason == "ExecutionEnded: ..."


# --- Reconcile ------------------------------------------------------------------------------------------


def test_an_instance_no_attempt_knows_is_an_orphan_once_past_the_grace() -> None:
    assert not untracked_instance(T0, T0 + GRACE).terminate  # Launch records its attempt just after
    assert untracked_instance(T0, T0 + GRACE + timedelta(seconds=1)).terminate
    assert untracked_instance(None, T0).terminate  # no launch time: nothing to wait for


def test_an_instance_of_an_ended_attempt_or_job_is_an_orphan_at_once() -> None:
    live, job = _attempt(), make_job(state=JobState.RUNNING)
    assert not untracked_instance(T0, T0, live, job).terminate
    ended = _attempt(outcome=AttemptOutcome.SUCCEEDED, ended_at=T0)
    assert untracked_instance(T0, T0, ended, job) == Untracked(terminate=True, close_attempt=False)
    # an attempt left open on an ended job (a standby recorded while Finalize ran): closed, then terminated
    assert untracked_instance(T0, T0, live, make_job(state=JobState.SUCCEEDED)) == Untracked(True, close_attempt=True)


@pytest.mark.parametrize(
    ("state", "age", "gone"),
    [
        ("running", GRACE * 10, False),
        ("pending", GRACE * 10, False),
        ("stopping", timedelta(0), True),
        ("terminated", timedelta(0), True),
        ("unknown", GRACE - timedelta(seconds=1), False),  # just launched: EC2 may not list it yet
        ("unknown", GRACE, True),
    ],
)
def test_an_instance_is_gone_when_ec2_says_so_or_forgot_it(state: str, age: timedelta, gone: bool) -> None:
    assert instance_gone(state, T0, T0 + age) is gone


def test_a_bill_is_overdue_once_its_state_change_is_late() -> None:
    ended = _attempt(outcome=AttemptOutcome.SUCCEEDED, ended_at=T0)
    assert not bill_overdue(ended, T0 + GRACE - timedelta(seconds=1))
    assert bill_overdue(ended, T0 + GRACE)
    assert not bill_overdue(ended.model_copy(update={"cost_usd": 1.0}), T0 + GRACE)  # settled
    assert not bill_overdue(_attempt(), T0 + GRACE)  # live


def test_only_a_running_on_demand_attempt_with_a_deadline_may_move_back() -> None:
    on_demand = _attempt(
        pool=Pool(instance_type="g6.xlarge", availability_zone=ZONE_A, market=Market.ON_DEMAND), running_at=T0
    )
    with_deadline = make_job(state=JobState.RUNNING, work_hours=4, limits={"deadline_hours": 10})
    assert moves_back_considered(with_deadline, on_demand)
    assert not moves_back_considered(make_job(state=JobState.RUNNING), on_demand)  # no deadline
    assert not moves_back_considered(with_deadline, on_demand.model_copy(update={"running_at": None}))
    assert not moves_back_considered(with_deadline, on_demand.model_copy(update={"migrate_requested_at": T0}))
    assert not moves_back_considered(with_deadline, _attempt(running_at=T0))  # spot


def test_the_next_standby_waits_longer_after_each_failed_one() -> None:
    assert standby_retry_at([]) is None
    assert standby_retry_at([_attempt(2, handover_from=1)]) is None  # still a standby
    first = _attempt(2, handover_from=1, outcome=AttemptOutcome.LAUNCH_FAILED, ended_at=T0)
    assert standby_retry_at([first]) == T0 + timedelta(seconds=STANDBY_RETRY_SECONDS)
    second = _attempt(3, handover_from=1, outcome=AttemptOutcome.LOST, ended_at=T0 + GRACE)
    assert standby_retry_at([first, second]) == T0 + GRACE + timedelta(seconds=2 * STANDBY_RETRY_SECONDS)


def test_a_standby_is_waited_for_asked_to_take_over_or_dropped() -> None:
    job = make_job(state=JobState.RUNNING)
    standby = _attempt(2, handover_from=1)
    booting = T0 + timedelta(seconds=STANDBY_BOOT_SECONDS)
    # booting: waited for, until its boot time is up
    assert supervise_standby(job, standby, "pending", booting) is None
    late = booting + timedelta(seconds=1)
    assert supervise_standby(job, standby, "pending", late) == DropStandby(AttemptOutcome.LAUNCH_FAILED)
    # gone in time: LOST; gone and late: it never took the job over
    assert supervise_standby(job, standby, "terminated", T0) == DropStandby(AttemptOutcome.LOST)
    assert supervise_standby(job, standby, "terminated", late) == DropStandby(AttemptOutcome.LAUNCH_FAILED)
    # running, its event missed: recorded running now, and the handover asked for
    assert supervise_standby(job, standby, "running", booting) == AskHandover(running_at=booting, record_running=True)
    ran = standby.model_copy(update={"running_at": T0})
    assert supervise_standby(job, ran, "running", T0) == AskHandover(running_at=T0, record_running=False)
    # not adopted within its handover time of running: dropped
    adopted_by = T0 + timedelta(seconds=handover_seconds(job))
    assert isinstance(supervise_standby(job, ran, "running", adopted_by), AskHandover)
    dropped = supervise_standby(job, ran, "running", adopted_by + timedelta(seconds=1))
    assert dropped == DropStandby(AttemptOutcome.LAUNCH_FAILED)


def test_a_job_that_saves_only_on_its_schedule_gets_its_interval_more_to_hand_over() -> None:
    saves_at_notice = make_job(state=JobState.RUNNING)
    on_schedule = make_job(state=JobState.RUNNING, checkpoint={"interval_minutes": 20, "grace_seconds": 0})
    assert handover_seconds(saves_at_notice) == STANDBY_HANDOVER_SECONDS
    assert handover_seconds(on_schedule) == STANDBY_HANDOVER_SECONDS + 20 * 60
