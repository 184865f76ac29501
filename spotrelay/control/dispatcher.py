"""The dispatcher: turn queue messages into job records, then admit queued jobs by priority and age.

Runs on the queue-depth alarm, on the schedule, and when a job finishes. It is the only writer of
admissions (the function has a reserved concurrency of 1), and every step is idempotent:
- a message becomes the job `<name>-<12 hex of the SQS message id>` (of the submission id, when
  `spotrelay submit` sent it: a message sent twice by an SDK retry is one job); a redelivered message
  finds the job already there and is just deleted;
- a job `spotrelay cancel` reached before its message was read is recorded CANCELLED
  (`spotrelay.control.cancel`);
- a message that is not a valid job becomes a FAILED job record carrying the validation error, and
  the message is kept in the DLQ — nothing is silently dropped;
- admission starts the execution named by the job id first (a second start is a no-op), then marks
  the job PLACING; a crash in between leaves a QUEUED job with a running execution, which the
  execution's own Place step moves on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from spotrelay.control.admission import AdmissionLimits, admit
from spotrelay.control.jobs import update_job
from spotrelay.control.ports import Clock, JobQueue, JobStore, QueueMessage, Workflow
from spotrelay.models import Job, JobSpecError, JobState, ensure_transition, parse_job_spec

MAX_MESSAGES_PER_RUN = 100
INVALID_JOB = "InvalidJob"  # the failure reason's prefix of a message that is no valid job
MAX_QUEUED_CONSIDERED = 500
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_SUBMISSION_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")  # a UUID, lower case


class DispatchReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    received: int = 0
    accepted: list[str] = []
    rejected: list[str] = []
    admitted: list[str] = []
    held: dict[str, str] = {}
    failed: list[str] = []
    # Messages kept in the DLQ because their submission id already names another job (message ids)
    conflicts: list[str] = []


def job_id_for(name: str, message_id: str) -> str:
    """A Step Functions execution name: <= 80 characters of [A-Za-z0-9_-]."""
    suffix = message_id.replace("-", "")[:12]
    return f"{_UNSAFE.sub('-', name)[:60]}-{suffix}"


def submission_key(message: QueueMessage) -> str:
    """What the job id is made from: `spotrelay submit`'s submission id (a UUID; the same for a message
    sent twice), else the SQS message id (a plain `aws sqs send-message`)."""
    submitted = (message.submission_id or "").lower()  # macOS's uuidgen prints upper case
    return submitted if _SUBMISSION_ID.fullmatch(submitted) else message.message_id


def intake(
    message: QueueMessage, *, store: JobStore, queue: JobQueue, clock: Clock
) -> tuple[str, Literal["accepted", "rejected", "conflict"]]:
    """Record one message as a QUEUED job (or a FAILED one); returns (job id, what became of it)."""
    now = clock.now()
    source = f"message {message.message_id}"
    data: Any = None
    try:
        data = json.loads(message.body)
        spec = parse_job_spec(data, source)
    except (json.JSONDecodeError, JobSpecError) as e:
        reason = str(e) if isinstance(e, JobSpecError) else f"{source}: line {e.lineno}: not valid JSON ({e.msg})"
        name = data.get("name") if isinstance(data, dict) else None
        job_id = job_id_for(name if isinstance(name, str) and name else "invalid", submission_key(message))
        if not store.create_job(_failed_job(job_id, reason, now)):
            existing, _ = store.get_job(job_id)
            if not (existing.failure_reason or "").startswith(INVALID_JOB):
                # A message this dispatcher recorded as a job under rules a later version tightened, delivered
                # again (SQS is at least once): the job stands, the message is done.
                queue.delete(message)
                return job_id, "accepted"
        queue.dead_letter(message, reason)
        return job_id, "rejected"
    job_id = job_id_for(spec.name, submission_key(message))
    if store.create_job(Job(job_id=job_id, spec=spec, submitted_at=now, updated_at=now)):
        _cancel_if_noted(store, job_id, now)  # `spotrelay cancel` came before this message
    else:
        # Recorded already: this message again (a redelivery, a resend), or another job under a reused
        # submission id, which must not vanish into the first.
        existing, _ = store.get_job(job_id)
        if existing.state is JobState.QUEUED and existing.spec == spec:
            _cancel_if_noted(store, job_id, now)  # a run that stopped before it read the note
        if existing.spec != spec:
            reason = (
                f"{source}: submission id {message.submission_id} already names job {job_id}, submitted with "
                "another spec; give each job its own (spotrelay submit does)"
            )
            queue.dead_letter(message, reason)
            return job_id, "conflict"
    queue.delete(message)
    return job_id, "accepted"


def _cancel_if_noted(store: JobStore, job_id: str, now: datetime) -> bool:
    """Record the job CANCELLED if `spotrelay cancel` left a note for it and it is still QUEUED (never
    admitted: nothing to stop). True if it is cancelled now."""
    if not store.cancel_requested_before_admission(job_id):
        return False

    def change(job: Job) -> bool:
        if job.state is not JobState.QUEUED:  # admitted meanwhile (a stale index): `cancel_job`'s to stop
            return job.state is JobState.CANCELLED
        job.state = ensure_transition(job.state, JobState.CANCELLED)
        job.cancel_requested = True
        job.failure_reason = "JobCancelled: cancelled by the user before it was admitted"
        job.ended_at = job.updated_at = now
        return True

    _, cancelled = update_job(store, job_id, change)
    return cancelled


def _failed_job(job_id: str, reason: str, now: datetime) -> Job:
    # The spec was invalid, so there is none to keep: a placeholder that cannot run records the failure.
    placeholder = parse_job_spec({"name": "invalid", "run": {"command": "false"}, "resources": {"gpus": 1}})
    return Job(
        job_id=job_id,
        spec=placeholder,
        state=JobState.FAILED,
        submitted_at=now,
        updated_at=now,
        failure_reason=f"{INVALID_JOB}: {reason}",
        ended_at=now,
    )


def dispatch(
    *,
    store: JobStore,
    queue: JobQueue,
    workflow: Workflow,
    clock: Clock,
    limits: AdmissionLimits,
    heartbeat_seconds: int,
) -> DispatchReport:
    accepted: list[str] = []
    rejected: list[str] = []
    conflicts: list[str] = []
    messages = queue.receive(MAX_MESSAGES_PER_RUN)
    for message in messages:
        job_id, became = intake(message, store=store, queue=queue, clock=clock)
        if became == "conflict":
            conflicts.append(message.message_id)
        else:
            (accepted if became == "accepted" else rejected).append(job_id)

    plan = admit(store.queued_jobs(MAX_QUEUED_CONSIDERED), store.active_jobs(), limits)
    admitted: list[str] = []
    for job in plan.admitted:
        # Again here: a run that stopped between recording the job and reading the note left it QUEUED
        if _cancel_if_noted(store, job.job_id, clock.now()):
            continue
        workflow.start(job.job_id, {"job_id": job.job_id, "heartbeat_seconds": heartbeat_seconds})
        update_job(store, job.job_id, _mark_admitted(clock))
        admitted.append(job.job_id)
    failed: list[str] = []
    for held in plan.impossible:
        update_job(store, held.job.job_id, _mark_impossible(held.reason, clock))
        failed.append(held.job.job_id)
    for held in plan.held:  # `spotrelay status` says why a queued job waits (written only when it changes)
        reason = f"held in the queue: {held.reason}"
        if held.job.waiting_reason != reason:
            update_job(store, held.job.job_id, _note_held(reason))
    return DispatchReport(
        received=len(messages),
        accepted=accepted,
        rejected=rejected,
        admitted=admitted,
        held={h.job.job_id: h.reason for h in plan.held},
        failed=failed,
        conflicts=conflicts,
    )


def _note_held(reason: str) -> Callable[[Job], None]:
    def change(job: Job) -> None:
        if job.state is JobState.QUEUED:
            job.waiting_reason = reason

    return change


def _mark_admitted(clock: Clock) -> Callable[[Job], None]:
    def change(job: Job) -> None:
        if job.state is JobState.QUEUED:
            job.state = ensure_transition(job.state, JobState.PLACING)
            job.waiting_reason = None
            job.updated_at = clock.now()

    return change


def _mark_impossible(reason: str, clock: Clock) -> Callable[[Job], None]:
    def change(job: Job) -> None:
        if job.state is JobState.QUEUED:
            job.state = ensure_transition(job.state, JobState.FAILED)
            job.failure_reason = f"Unschedulable: {reason}"
            job.updated_at = job.ended_at = clock.now()

    return change
