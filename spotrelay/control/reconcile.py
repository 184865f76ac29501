"""Reconcile (on the schedule): make the world agree with the table when an event was missed.

- An instance tagged spotrelay:managed whose attempt is not live (or that no attempt knows) is
  terminated: it costs money and runs nothing we track.
- A live attempt whose instance is gone (terminated, stopped, or unknown to EC2) fails its Run task
  with InstanceLost, as the state-change event would have.
- A running job whose spend reached `limits.max_total_cost` has its Run task failed with
  BudgetExhausted (the state machine finalizes it as FAILED and terminates the instance).
- An admitted job whose execution has ended (or never started) without reaching a terminal state is
  repaired: an ended execution fails the job with the reason; a missing one is started.
"""

from __future__ import annotations

import json
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from spotrelay.config import ERROR_BUDGET_EXHAUSTED, ERROR_INSTANCE_LOST
from spotrelay.control.jobs import update_attempt, update_job
from spotrelay.control.lifecycle import account, close_attempt
from spotrelay.control.ports import Clock, Compute, JobStore, Workflow
from spotrelay.models import Attempt, AttemptOutcome, Job, JobState, ensure_transition

GONE_STATES = frozenset({"stopping", "stopped", "shutting-down", "terminated"})
# A launch is recorded a moment after RunInstances returns; don't call a fresh instance an orphan.
ORPHAN_GRACE_SECONDS = 300


class ReconcileReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    terminated_orphans: list[str] = []
    lost_attempts: list[str] = []
    over_budget: list[str] = []  # jobs whose Run task was failed with BudgetExhausted
    repaired_jobs: list[str] = []
    restarted_executions: list[str] = []


def reconcile(
    *, store: JobStore, compute: Compute, workflow: Workflow, clock: Clock, heartbeat_seconds: int
) -> ReconcileReport:
    now = clock.now()
    orphans: list[str] = []
    for instance in compute.managed_instances():
        ref = store.get_instance_ref(instance.instance_id)
        if ref is None:
            if instance.launched_at is None or (now - instance.launched_at).total_seconds() > ORPHAN_GRACE_SECONDS:
                orphans.append(instance.instance_id)
            continue
        attempt = store.get_attempt(ref.job_id, ref.attempt)
        job, _ = store.get_job(ref.job_id)
        if attempt.outcome is not None or job.state.is_terminal:
            orphans.append(instance.instance_id)
    if orphans:
        compute.terminate(orphans)

    lost: list[str] = []
    over_budget: list[str] = []
    repaired: list[str] = []
    restarted: list[str] = []
    for job in store.active_jobs():
        status = workflow.status(job.job_id)
        if status is None:
            workflow.start(job.job_id, {"job_id": job.job_id, "heartbeat_seconds": heartbeat_seconds})
            restarted.append(job.job_id)
            continue
        if status != "RUNNING":
            _repair(store, compute, job.job_id, status, now)
            repaired.append(job.job_id)
            continue
        live = [a for a in store.attempts(job.job_id) if a.outcome is None and a.attempt == job.attempts]
        for attempt in live:
            if attempt.instance_id is None or attempt.task_token is None or attempt.interrupted_at is not None:
                continue
            if _over_budget(job, attempt, now):
                spent = job.cost_usd + attempt.cost(now)
                cause = json.dumps({"spent_usd": round(spent, 4), "max_total_cost": job.spec.limits.max_total_cost})
                workflow.fail_task(attempt.task_token, ERROR_BUDGET_EXHAUSTED, cause)
                over_budget.append(job.job_id)
                continue
            state = compute.instance_states([attempt.instance_id]).get(attempt.instance_id, "unknown")
            young = (now - attempt.started_at).total_seconds() < ORPHAN_GRACE_SECONDS
            if state in GONE_STATES or (state == "unknown" and not young):
                cause = json.dumps({"instance_id": attempt.instance_id, "state": state, "by": "reconcile"})
                workflow.fail_task(attempt.task_token, ERROR_INSTANCE_LOST, cause)
                lost.append(f"{job.job_id}#{attempt.attempt}")
    return ReconcileReport(
        terminated_orphans=orphans,
        lost_attempts=lost,
        over_budget=over_budget,
        repaired_jobs=repaired,
        restarted_executions=restarted,
    )


def _over_budget(job: Job, attempt: Attempt, now: datetime) -> bool:
    cap = job.spec.limits.max_total_cost
    return cap is not None and job.cost_usd + attempt.cost(now) >= cap


def _repair(store: JobStore, compute: Compute, job_id: str, status: str, now: datetime) -> None:
    """The execution ended without finalizing the job: close its live attempts, terminate their
    instances and fail the job with the reason."""
    attempts = store.attempts(job_id)
    pointer = store.get_checkpoint(job_id)
    ended = []
    instance_ids = []
    for attempt in attempts:
        if attempt.outcome is None:
            if attempt.instance_id is not None:
                instance_ids.append(attempt.instance_id)
            attempt, _ = update_attempt(
                store, job_id, attempt.attempt, lambda fresh: close_attempt(fresh, AttemptOutcome.LOST, now, pointer)
            )
        ended.append(attempt)
    if instance_ids:
        compute.terminate(instance_ids)

    def change(job: Job) -> None:
        account(job, ended, pointer, now)
        if job.state.is_terminal:
            return
        job.state = ensure_transition(job.state, JobState.FAILED)
        job.failure_reason = f"ExecutionEnded: the JobLifecycle execution ended {status} before the job did"
        job.ended_at = job.updated_at = now

    update_job(store, job_id, change)
