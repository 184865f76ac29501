"""How a job ends: Finalize's decision, and reconcile's for an execution that ended before its job did.

- `final_outcome(final)`: the state machine's final input (`{"outcome", "error"}`) as the job's terminal
  state, the outcome its still-open attempts close with, and the error that is its reason. An outcome
  this version does not know is a failure (a newer state machine's, say): the job is never left open.
- `closing_outcome(attempt, outcome)`: a standby never given the job (launched ahead of a handover that
  did not happen) closes CANCELLED, whatever the job's end; any other open attempt with the job's outcome.
- `end_job(job, state, reason, now)`: the job's terminal state, reason and end, unless it has ended
  already (a cancel wins over a late failure: the first end stands). SUCCEEDED is reached through
  RUNNING (an agent that reported success before its instance's `running` event was handled).
- `execution_ended_reason(status)`: why reconcile fails a job whose JobLifecycle execution ended first.
- `keep_failed_until(job, result, hourly_price, now)`: until when the instance of an attempt whose code failed
  is kept, when Recover's answer fails the job JobFailed (Recover asks before it terminates the instance): the
  job's `recovery.keep_failed_instance_minutes`, within its budget left (a budget or a loss never keeps one).
- `instances_to_terminate(attempts, current, now)`: what Finalize terminates: every attempt's instance but the
  one kept for the failure that ends the job now (an earlier run's kept one goes too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from spotrelay.config import ERROR_JOB_FAILED
from spotrelay.control.decisions.placing import StepResult
from spotrelay.models import Attempt, AttemptOutcome, Job, JobState, ensure_transition

_FINAL = {
    "SUCCEEDED": (JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED),
    "FAILED": (JobState.FAILED, AttemptOutcome.FAILED),
    "CANCELLED": (JobState.CANCELLED, AttemptOutcome.CANCELLED),
}


@dataclass(frozen=True)
class FinalOutcome:
    state: JobState
    attempt_outcome: AttemptOutcome
    error: Mapping[str, Any]  # what the state machine caught ({"Error", "Cause"}); empty for a success


def final_outcome(final: Mapping[str, Any]) -> FinalOutcome:
    state, outcome = _FINAL.get(str(final.get("outcome")), _FINAL["FAILED"])
    error = final.get("error")
    return FinalOutcome(state, outcome, error if isinstance(error, Mapping) else {})


def closing_outcome(attempt: Attempt, outcome: AttemptOutcome) -> AttemptOutcome:
    return AttemptOutcome.CANCELLED if attempt.is_standby else outcome


def end_job(job: Job, state: JobState, reason: str | None, now: datetime, *, keep_recorded_reason: bool = True) -> None:
    """Record the end on `job` (a fresh read, inside the step's conditional write). `reason` is for a job
    that did not succeed; a reason recorded already (the cancel's, say) stays, unless told otherwise."""
    if job.state.is_terminal:
        return
    current = job.state
    if state is JobState.SUCCEEDED and current is JobState.LAUNCHING:
        current = ensure_transition(current, JobState.RUNNING)
    job.state = ensure_transition(current, state)
    if state is JobState.SUCCEEDED and job.spec.work_hours is not None:
        job.work_done_hours = job.spec.work_hours
    if state is not JobState.SUCCEEDED:
        job.failure_reason = (job.failure_reason or reason) if keep_recorded_reason else reason
    job.ended_at = job.updated_at = now


def execution_ended_reason(status: str) -> str:
    return f"ExecutionEnded: the JobLifecycle execution ended {status} before the job did"


def keep_failed_until(job: Job, result: StepResult, hourly_price: float, now: datetime) -> datetime | None:
    """`result`: Recover's answer for the job (accounted, its cost counting the closed attempt). Kept only when
    it fails the job JobFailed; never past what its `limits.max_total_cost` leaves at the instance's price."""
    minutes = job.spec.recovery.keep_failed_instance_minutes
    if minutes <= 0 or result.action != "fail" or result.error != ERROR_JOB_FAILED:
        return None
    until = now + timedelta(minutes=minutes)
    cap = job.spec.limits.max_total_cost
    if cap is not None:
        left = cap - job.cost_usd
        if left <= 0:
            return None
        if hourly_price > 0:
            until = min(until, now + timedelta(hours=left / hourly_price))
    return until


def instances_to_terminate(attempts: Sequence[Attempt], current: int, now: datetime) -> list[str]:
    """`current`: the job's attempt whose failure ends it now; an earlier run's kept instance goes now too."""
    return [
        a.instance_id for a in attempts if a.instance_id is not None and not (a.attempt == current and a.kept_at(now))
    ]
