"""Cancel a job wherever it is: mark it, terminate its instance, close its attempt, stop its execution.

A job still in the queue has no record yet (the dispatcher writes it when it reads the message): cancel
leaves a note under the job id, and the dispatcher's intake records such a job CANCELLED. Each side
writes first and reads the other's write second (consistent reads), so at least one of them sees the
other: cancel finds the record (and cancels it as any other), or intake finds the note.

Cancel does the whole job itself, and wakes the dispatcher as Finalize would, rather than trusting the
execution to notice: on AWS stopping an execution skips its Finalize. Like Finalize it terminates the
instance of every attempt it finds, closed ones too. Terminating is idempotent, and a step that closed
an attempt before terminating its instance may have stopped in between. It also fails the Run task with
JobCancelled, so an execution that is still waiting on it (moto cannot stop a waiting execution)
finalizes as cancelled; Finalize keeps the CANCELLED state because it never overwrites a terminal one.

A cancel racing a Launch is handled the same way as intake. Cancel writes `cancel_requested` first and
reads the attempts second. Launch writes its attempt first and reads the job second
(spotrelay.control.lifecycle). At least one of them sees the other: cancel terminates and closes the
attempt, or Launch terminates its own instance, closes its attempt and raises JobCancelled. Whichever
closes last, the job's total counts every closed attempt. Cancel's final write and Launch's (after its
close) each total the attempts read after the job version they overwrite.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from spotrelay.config import ERROR_CANCELLED
from spotrelay.control.accounting import account, close_attempt
from spotrelay.control.ec2_events import end_billing
from spotrelay.control.jobs import update_attempt, update_job
from spotrelay.control.ports import Clock, Compute, JobStore, NotFoundError, Wakeup, Workflow
from spotrelay.models import AttemptOutcome, Job, JobState, ensure_transition


class CancelResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    job_id: str
    state: JobState | None  # None: no record yet (still in the queue, or no such job)
    terminated: list[str]
    already_ended: bool
    before_admission: bool = False  # the dispatcher records the job CANCELLED when it reads its message


def cancel_job(
    job_id: str, *, store: JobStore, compute: Compute, workflow: Workflow, clock: Clock, wakeup: Wakeup
) -> CancelResult:
    now = clock.now()
    try:
        job, _ = store.get_job(job_id)
    except NotFoundError:
        store.request_cancel_before_admission(job_id)
        try:
            job, _ = store.get_job(job_id)  # recorded meanwhile: cancel it as any other
        except NotFoundError:
            return CancelResult(job_id=job_id, state=None, terminated=[], already_ended=False, before_admission=True)
    if job.state.is_terminal:
        # An ended job's instance kept to debug its failure: cancel is how the user says they are done with it
        released = release_kept(store, compute, job_id, now)
        return CancelResult(job_id=job_id, state=job.state, terminated=released, already_ended=True)
    update_job(store, job_id, _request_cancel)
    attempts = store.attempts(job_id)
    pointer = store.get_checkpoint(job_id)
    terminated: list[str] = []
    tokens: list[str] = []
    for attempt in attempts:
        if attempt.outcome is None:
            if attempt.instance_id is not None:
                terminated.append(attempt.instance_id)
            if attempt.task_token is not None:
                tokens.append(attempt.task_token)
            update_attempt(
                store,
                job_id,
                attempt.attempt,
                lambda fresh: close_attempt(fresh, AttemptOutcome.CANCELLED, now, pointer),
            )
    instance_ids = [a.instance_id for a in attempts if a.instance_id is not None]
    if instance_ids:
        compute.terminate(instance_ids)

    def change(fresh: Job) -> None:
        # Totalled from a fresh read: a Launch that lost the race may have closed its attempt meanwhile.
        account(fresh, store.attempts(job_id), pointer, now)
        if not fresh.state.is_terminal:
            fresh.state = ensure_transition(fresh.state, JobState.CANCELLED)
            fresh.failure_reason = "JobCancelled: cancelled by the user"
            fresh.ended_at = fresh.updated_at = now

    final, _ = update_job(store, job_id, change)
    for token in tokens:
        workflow.fail_task(token, ERROR_CANCELLED, "cancelled by the user")
    if workflow.status(final.execution_name) == "RUNNING":
        workflow.stop(final.execution_name, "cancelled by the user")
    wakeup.wake_dispatcher(f"job {job_id} cancelled")  # its slot is free for the next queued job
    return CancelResult(job_id=job_id, state=final.state, terminated=terminated, already_ended=False)


def _request_cancel(job: Job) -> None:
    job.cancel_requested = True


def release_kept(store: JobStore, compute: Compute, job_id: str, now: datetime) -> list[str]:
    """Terminate the instances kept to debug the job's failures (`recovery.keep_failed_instance_minutes`) now,
    their keep ended at `now` and their bills settled to it; returns their ids."""
    kept = [a for a in store.attempts(job_id) if a.instance_id is not None and a.kept_at(now)]
    for attempt in kept:
        update_attempt(store, job_id, attempt.attempt, lambda fresh: fresh.model_copy(update={"kept_until": now}))
    ids = [a.instance_id for a in kept if a.instance_id is not None]
    if ids:
        compute.terminate(ids)
        for attempt in kept:
            end_billing(store, compute, attempt, now)
    return ids
