"""Resume a FAILED or CANCELLED job: queue it again under the same id, as a new run that starts from its
newest committed checkpoint (`spotrelay resume JOB`).

A resumed job is QUEUED once more, so it goes through admission like any other (quota, budget, max
concurrency, its priority, then its age: it keeps its submission time). The dispatcher starts the new
run's execution, named `<job id>-run<n>` (`Job.execution_name`); Place and Launch go on from the job's
checkpoint pointer and its attempt count, so the new run's first attempt restores the newest committed
checkpoint and is numbered after the earlier ones. What the earlier runs did stays: their attempts, their
cost (`cost_usd` keeps counting, so `limits.max_total_cost` spans every run), their lost work, and why the
last one ended (`previous_failure_reason`). What starts afresh is what a run is allowed:
`limits.max_interruptions` and `limits.max_restarts` count this run's interruptions and restarts.
`limits.deadline_hours` still counts from the submission: a resumed job whose deadline has passed runs as
a job behind schedule does (on-demand where allowed, Uniform Progress's rule 1), and the answer says so.

Refused, with the reason: a job that SUCCEEDED (nothing left to do); one that is still live (unless it is
a resumed run already: a repeated resume answers what the first did); a message that was never a valid
job (its record holds no spec to run); one that failed Unschedulable (no type of the stack fits it: it
would fail again at admission) or CheckpointCorrupt (its newest checkpoint failed verification: the new
run would restore it again); a job whose cost has reached its `max_total_cost`, or may have (a budgeted
job with an attempt whose bill is not settled yet: until EC2 reports its instance gone it counts at its
launch price, and a spot price that rose meanwhile is not in `cost_usd` yet; refused until the report is
ORPHAN_GRACE_SECONDS overdue, then the new run's reconcile settles it); one resumed
`MAX_RUNS - 1` times already; and one whose previous run is still ending: its execution still RUNNING, or
stopped or timed out less than RESUME_SETTLE_SECONDS after the job ended. Stopping an execution (what
cancel does) does not stop a step Lambda it had invoked: that step runs on for up to its function's
timeout, and would write onto the new run (a late Finalize would end it CANCELLED, a late Place would take
it out of the queue). Once the settle time has passed since the job ended, no step of the old run runs;
an execution that ended SUCCEEDED or FAILED has none left running at all.

Order of writes: a cancel note left before admission (`request_cancel_before_admission`) would make the
dispatcher cancel the resumed job at once, so it is removed first; then the job record is written
QUEUED (conditional on the version read: a concurrent change makes the resume read and decide again);
then the dispatcher is woken.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from spotrelay.config import ERROR_CHECKPOINT_CORRUPT, ORPHAN_GRACE_SECONDS
from spotrelay.control.dispatcher import INVALID_JOB, UNSCHEDULABLE
from spotrelay.control.jobs import update_job
from spotrelay.control.ports import Clock, JobStore, NotFoundError, Wakeup, Workflow
from spotrelay.models import Job, JobState
from spotrelay.models.records import MAX_RUNS
from spotrelay.models.state import RESUMABLE_STATES

# How long after a run ended (the job's `ended_at`) a step Lambda it invoked may still be running: above the
# longest timeout of the lifecycle's step functions (60 s, stacks/functions_construct.py DEFAULT_TIMEOUT;
# tests/infrastructure/test_functions.py holds them below it), with room for the stop that follows the end.
RESUME_SETTLE_SECONDS = 120
# Executions that end with a step perhaps still running: stopped (cancel, reconcile) or timed out. One that
# ended SUCCEEDED or FAILED reached its last state, every step it invoked returned.
CUT_SHORT = frozenset({"ABORTED", "TIMED_OUT"})


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
    notes: list[str] = Field(default_factory=list)  # what the user should know of the new run


class _Refused(Exception):
    pass


def resume_job(job_id: str, *, store: JobStore, workflow: Workflow, clock: Clock, wakeup: Wakeup) -> ResumeResult:
    try:
        job, _ = store.get_job(job_id)
    except NotFoundError:
        return ResumeResult(
            job_id=job_id,
            state=None,
            refused=(
                f"no record of job {job_id}: check the id (`spotrelay ls --all`); a job submitted a moment ago "
                "is recorded when the dispatcher reads its message"
            ),
        )
    now = clock.now()
    if job.state not in RESUMABLE_STATES:
        if not job.state.is_terminal and job.resumed_at is not None:
            return _answer(job, store, now, already=True)
        return _answer(job, store, now, refused=_why_not(job))
    try:
        _check_resumable(job, store, workflow, now)
    except _Refused as e:
        return _answer(job, store, now, refused=str(e))
    store.forget_cancel_before_admission(job_id)

    def change(fresh: Job) -> bool:
        if fresh.state not in RESUMABLE_STATES:  # resumed (or changed) meanwhile: nothing more to do here
            return False
        if fresh != job:  # changed since the checks above (a write that lost a race reads it again)
            _check_resumable(fresh, store, workflow, now)
        fresh.previous_failure_reason = f"run {fresh.run} ended {fresh.state}: {fresh.failure_reason or 'no reason'}"
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
        fresh.last_recovery = None  # the last run's (`last_recovered_attempt` stays: attempts go on numbering)
        return True

    try:
        final, resumed = update_job(store, job_id, change)
    except _Refused as e:
        return _answer(store.get_job(job_id)[0], store, now, refused=str(e))
    if not resumed:
        already = final.resumed_at is not None and not final.state.is_terminal
        return _answer(final, store, now, already=already)
    wakeup.wake_dispatcher(f"job {job_id} resumed (run {final.run})")
    return _answer(final, store, now, resumed=True)


def _why_not(job: Job) -> str:
    if job.state is JobState.SUCCEEDED:
        return "it SUCCEEDED: nothing is left to resume"
    return f"it is {job.state}: only a FAILED or CANCELLED job resumes (`spotrelay cancel` it first to restart it)"


def _check_resumable(job: Job, store: JobStore, workflow: Workflow, now: datetime) -> None:
    """Raise _Refused, saying why, for an ended job that cannot run again now."""
    reason = job.failure_reason or ""
    if reason.startswith(INVALID_JOB):
        raise _Refused("its message was never a valid job, so there is nothing to run: submit a corrected job file")
    if reason.startswith(UNSCHEDULABLE):
        raise _Refused(f"it failed {reason}: it would fail so again (submit it with resources this stack has)")
    if reason.startswith(ERROR_CHECKPOINT_CORRUPT):
        raise _Refused(
            f"it failed {reason}: a new run would restore the same checkpoint (submit it again to start afresh)"
        )
    limit = job.spec.limits.max_total_cost
    if limit is not None and job.cost_usd >= limit:
        raise _Refused(
            f"it has cost ${job.cost_usd:.2f} of its limits.max_total_cost ${limit:.2f}: nothing is left to spend "
            "(submit it again with a higher limit)"
        )
    if limit is not None:
        # Until its instance's end is reported, an ended attempt counts at its launch price (Attempt.cost): a
        # spot price that rose would let a job over its budget run again. The report is on its way for
        # ORPHAN_GRACE_SECONDS after the attempt ended; after that it was lost, and the resumed run's reconcile
        # settles the bill (`_settle_missed_bills`) and counts it in the budget at the prices in effect.
        reports_due = {
            a.attempt: a.ended_at + timedelta(seconds=ORPHAN_GRACE_SECONDS)
            for a in store.attempts(job.job_id)
            if a.outcome is not None and not a.is_settled and a.ended_at is not None
        }
        waiting = {number: due for number, due in reports_due.items() if now < due}
        if waiting:
            number = max(waiting)
            raise _Refused(
                f"the bill of its attempt {number} is not settled yet (EC2 has not reported its instance gone), "
                f"and limits.max_total_cost ${limit:.2f} needs it: try again after {max(waiting.values()):%H:%M:%S} UTC"
            )
    if job.run >= MAX_RUNS:
        raise _Refused(f"it has run {job.run} times, the most a job may")
    status = workflow.status(job.execution_name)
    if status == "RUNNING":
        raise _Refused(
            f"its run {job.run} is still ending (execution {job.execution_name} RUNNING): try again in a minute"
        )
    settled = job.ended_at + timedelta(seconds=RESUME_SETTLE_SECONDS) if job.ended_at is not None else None
    if status in CUT_SHORT and settled is not None and now < settled:
        raise _Refused(
            f"its run {job.run} is still ending (ended at {job.ended_at:%H:%M:%S} UTC; a step it started may still "
            f"be running): try again after {settled:%H:%M:%S} UTC"
        )


def _answer(
    job: Job,
    store: JobStore,
    now: datetime,
    *,
    resumed: bool = False,
    already: bool = False,
    refused: str | None = None,
) -> ResumeResult:
    pointer = store.get_checkpoint(job.job_id)
    notes: list[str] = []
    deadline = job.spec.limits.deadline_hours
    if resumed and deadline is not None and job.elapsed_hours(now) >= deadline:
        notes.append(
            f"its deadline (limits.deadline_hours {deadline:g}, from its submission) has passed: it runs as a job "
            "behind schedule does, on on-demand where its limits allow it"
        )
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
        notes=notes,
    )
