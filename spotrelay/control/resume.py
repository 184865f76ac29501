"""Resume a FAILED or CANCELLED job: queue it again under the same id, as a new run that starts from its
newest committed checkpoint (`spotrelay resume JOB`).

A resumed job is QUEUED once more, so it goes through admission like any other (quota, budget, max
concurrency, its priority, then its age: it keeps its submission time). The dispatcher starts the new
run's execution, named `<job id>-run<n>` (`Job.execution_name`); Place and Launch go on from the job's
checkpoint pointer and its attempt count, so the new run's first attempt restores the newest committed
checkpoint and is numbered after the earlier ones. What the earlier runs did stays: their attempts, their
cost (`cost_usd` keeps counting, so `limits.max_total_cost` spans every run), their lost work. What
starts afresh is what a run is allowed: `limits.max_interruptions` and `limits.max_restarts` count this
run's interruptions and restarts. `limits.deadline_hours` still counts from the submission.

Refused, with the reason: a job that SUCCEEDED (nothing left to do), one that is still live (unless it is
a resumed run already: a repeated resume answers what the first did), a message that was never a valid
job (its record holds no spec to run), a job whose cost has reached its `max_total_cost`, one whose
previous run's execution is still ending (Finalize has not run yet: try again in a minute), and one
resumed `MAX_RUNS - 1` times already.

Order of writes: a cancel note left before admission (`request_cancel_before_admission`) would make the
dispatcher cancel the resumed job at once, so it is removed first; then the job record is written
QUEUED (conditional on the version read: a concurrent change makes the resume read and decide again);
then the dispatcher is woken.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from spotrelay.control.dispatcher import INVALID_JOB
from spotrelay.control.jobs import update_job
from spotrelay.control.ports import Clock, JobStore, NotFoundError, Wakeup, Workflow
from spotrelay.models import Job, JobState
from spotrelay.models.records import MAX_RUNS
from spotrelay.models.state import RESUMABLE_STATES


class ResumeResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    job_id: str
    state: JobState | None  # None: no such job
    run: int | None = None  # the run now (the new one once resumed)
    resumed: bool = False  # this call queued the job again
    already: bool = False  # a resumed run was live already: a repeated resume
    refused: str | None = None  # why the job was not resumed
    checkpoint: str | None = None  # what the new run restores: "attempt 2, seq 5"; None: it starts afresh
    work_done_hours: float = 0.0
    cost_usd: float = 0.0


class _Refused(Exception):
    pass


def resume_job(job_id: str, *, store: JobStore, workflow: Workflow, clock: Clock, wakeup: Wakeup) -> ResumeResult:
    try:
        job, _ = store.get_job(job_id)
    except NotFoundError:
        return ResumeResult(job_id=job_id, state=None, refused=f"no job {job_id} (check the id `spotrelay ls` shows)")
    if job.state not in RESUMABLE_STATES:
        if not job.state.is_terminal and job.resumed_at is not None:
            return _answer(job, store, already=True)
        return _answer(job, store, refused=_why_not(job))
    try:
        _check_resumable(job, workflow)
    except _Refused as e:
        return _answer(job, store, refused=str(e))
    store.forget_cancel_before_admission(job_id)
    now = clock.now()

    def change(fresh: Job) -> bool:
        if fresh.state not in RESUMABLE_STATES:  # resumed (or changed) meanwhile: nothing more to do here
            return False
        _check_resumable(fresh, workflow)
        fresh.state = JobState.QUEUED  # the one way out of a terminal state (spotrelay.models.state)
        fresh.run += 1
        fresh.resumed_at = fresh.updated_at = now
        fresh.restarts = fresh.interruptions = 0
        fresh.failure_reason = None
        fresh.ended_at = None
        fresh.cancel_requested = False
        fresh.place_waits = 0
        fresh.waiting_since = None
        fresh.waiting_reason = None
        fresh.placement = ()
        fresh.preferred_pool = None
        return True

    try:
        final, resumed = update_job(store, job_id, change)
    except _Refused as e:
        return _answer(store.get_job(job_id)[0], store, refused=str(e))
    if not resumed:
        return _answer(final, store, already=final.resumed_at is not None and not final.state.is_terminal)
    wakeup.wake_dispatcher(f"job {job_id} resumed (run {final.run})")
    return _answer(final, store, resumed=True)


def _why_not(job: Job) -> str:
    if job.state is JobState.SUCCEEDED:
        return "it SUCCEEDED: nothing is left to resume"
    return f"it is {job.state}: only a FAILED or CANCELLED job resumes (`spotrelay cancel` it first to restart it)"


def _check_resumable(job: Job, workflow: Workflow) -> None:
    """Raise _Refused, saying why, for an ended job that cannot run again now."""
    if (job.failure_reason or "").startswith(INVALID_JOB):
        raise _Refused("its message was never a valid job, so there is nothing to run: submit a corrected job file")
    limit = job.spec.limits.max_total_cost
    if limit is not None and job.cost_usd >= limit:
        raise _Refused(
            f"it has cost ${job.cost_usd:.2f} of its limits.max_total_cost ${limit:.2f}: nothing is left to spend "
            "(submit it again with a higher limit)"
        )
    if job.run >= MAX_RUNS:
        raise _Refused(f"it has run {job.run} times, the most a job may")
    status = workflow.status(job.execution_name)
    if status == "RUNNING":
        raise _Refused(
            f"its run {job.run} is still ending (execution {job.execution_name} RUNNING): try again in a minute"
        )


def _answer(
    job: Job, store: JobStore, *, resumed: bool = False, already: bool = False, refused: str | None = None
) -> ResumeResult:
    pointer = store.get_checkpoint(job.job_id)
    return ResumeResult(
        job_id=job.job_id,
        state=job.state,
        run=job.run,
        resumed=resumed,
        already=already,
        refused=refused,
        checkpoint=None if pointer is None else f"attempt {pointer.attempt}, seq {pointer.seq}",
        work_done_hours=job.work_done_hours,
        cost_usd=job.cost_usd,
    )
