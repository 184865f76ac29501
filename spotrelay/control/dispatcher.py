"""The dispatcher: turn queue messages into job records, then admit queued jobs by priority and age.

Runs on the queue-depth alarm, on the schedule, and when a job finishes. It is the only writer of
admissions (the function has a reserved concurrency of 1), and every step is idempotent:
- a message becomes the job `<name>-<12 hex of the SQS message id>` (of the submission id, when
  `spotrelay submit` sent it: a message sent twice by an SDK retry is one job); a redelivered message
  finds the job already there and is just deleted;
- a job `spotrelay cancel` reached before its message was read is recorded CANCELLED
  (`spotrelay.control.cancel`);
- a message that is not a valid job becomes a FAILED job record carrying the validation error, and
  the message is kept in the DLQ — nothing is silently dropped. Whatever the body holds (too big,
  nested too deep, a number of thousands of digits, an unpaired surrogate, a value echoed into a huge
  error), it is read within bounds (`read_submission` never raises) and the reason is short and printable;
- each message is handled on its own: one that meets an unexpected error (the store, SQS) is logged,
  left on the queue for SQS to deliver again (its redrive policy dead-letters it in the end), and
  reported in `errors`, and the others are recorded all the same;
- admission starts the execution named by the job id first (a second start is a no-op), then marks
  the job PLACING; a crash in between leaves a QUEUED job with a running execution, which the
  execution's own Place step moves on;
- each queued job is admitted (or failed as unschedulable, or noted as held) on its own too: an error of
  that job's own record (a write that kept losing its race, the record gone, or one that does not read
  back) is logged and reported in `admission_errors`, the job is left as it is to be tried again next
  run, and the others go on. The plan is not made again without it: the room it was given stays taken
  for this run (its execution may have started), so priority order, quotas and the budget hold. An error
  of the services themselves (throttling, an outage) stops the run: every job would meet it.
- given EC2 (`compute`), the budget counts each active job's live instances at the spot price in effect
  now where that is more than its estimate (spotrelay.control.admission): its attempts are read, and the
  spot prices of their pools are read once a run (one DescribeSpotPriceHistory for all of them, not one per
  attempt). A job whose attempts do not read back counts at its estimate; prices that cannot be read
  leave the live instances at their launch prices (logged): admission goes on either way.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from spotrelay.control.admission import AdmissionLimits, AdmissionPlan, admit, live_usd_per_hour
from spotrelay.control.jobs import update_job
from spotrelay.control.ports import (
    Clock,
    Compute,
    ConflictError,
    JobQueue,
    JobStore,
    NotFoundError,
    QueueMessage,
    UnreadableRecordError,
    Workflow,
)
from spotrelay.field_problems import Loc, field_path
from spotrelay.models import Attempt, Job, JobSpec, JobSpecError, JobState, Market, ensure_transition, parse_job_spec
from spotrelay.models.billing import SeriesKey, series_key
from spotrelay.models.job_spec import JOB_SPEC_LIMITS, decode_json

logger = logging.getLogger(__name__)

MAX_MESSAGES_PER_RUN = 100
INVALID_JOB = "InvalidJob"  # the failure reason's prefix of a message that is no valid job
UNSCHEDULABLE = "Unschedulable"  # the failure reason's prefix of a job no type of the stack fits
# Each run reads at most this many queued jobs, the head of the queue in admission order (the index is sorted
# by it): a run's work is bounded by it and MAX_MESSAGES_PER_RUN, whatever the depth of the queue, and a job
# further back is considered once those ahead of it move. Backfill (a job that fits behind one that does
# not) looks this far. A much longer head would have a load of many jobs spend much of its time reading and
# parsing the queue's head after every job's end (`make load`).
MAX_QUEUED_CONSIDERED = 100
# Bounds on what a message may hand us, checked before (or while) it is parsed:
MAX_BODY_BYTES = 262_144  # SQS's default maximum message size (256 KiB); the stack sets no other
# depth, nodes and digits as for a job spec file (spotrelay.models.job_spec), within SQS's size
MESSAGE_LIMITS = replace(JOB_SPEC_LIMITS, max_bytes=MAX_BODY_BYTES)
# A refused message's reason, in its FAILED job's failure_reason and in the DLQ's error attribute: enough
# to name every field and what is allowed there, far below DynamoDB's 400 KB item and SQS's 256 KiB message.
MAX_REASON_CHARS = 2_000
MAX_PROBLEM_CHARS = 400  # one field's problem: a huge value it echoes cannot crowd out the others
MAX_ERROR_CHARS = 500  # an unexpected error's text in the report
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_SUBMISSION_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")  # a UUID, lower case
_SEPARATORS = "\u2028\u2029"
_SURROGATE = re.compile("[\ud800-\udfff]")  # in decoded text, only ever unpaired (a pair decodes to one character)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


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
    # Messages that met an unexpected error (message id -> the error), left on the queue to be delivered again
    errors: dict[str, str] = {}
    # Queued jobs whose admission (or failing, or noting why held) met an error of their own record (job id
    # -> the error): left as they were, tried again next run
    admission_errors: dict[str, str] = {}


@dataclass(frozen=True)
class Refusal:
    """Why a message is no job spec: `reason` is short and printable; `name` is the spec's `name` if it
    gave one (the FAILED job's id is made from it)."""

    reason: str
    name: str | None = None


def job_id_for(name: str, message_id: str) -> str:
    """A Step Functions execution name: <= 80 characters of [A-Za-z0-9_-]."""
    suffix = message_id.replace("-", "")[:12]
    return f"{_UNSAFE.sub('-', name)[:60]}-{suffix}"


def submission_key(message: QueueMessage) -> str:
    """What the job id is made from: `spotrelay submit`'s submission id (a UUID; the same for a message
    sent twice), else the SQS message id (a plain `aws sqs send-message`)."""
    submitted = (message.submission_id or "").lower()  # macOS's uuidgen prints upper case
    return submitted if _SUBMISSION_ID.fullmatch(submitted) else message.message_id


def printable(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """`text` in at most `limit` characters (cut with an ellipsis), control characters, line breaks and
    unpaired surrogates replaced by U+FFFD: safe in a DynamoDB string, an SQS attribute, a terminal."""
    if len(text) > limit:
        text = text[: max(0, limit - 1)] + "…"
    # Unicode's "other" categories (controls, formats such as bidirectional overrides and zero-width
    # characters, surrogates, private use, unassigned code points such as U+FFFF) and the line and paragraph
    # separators become U+FFFD
    return "".join("\ufffd" if unicodedata.category(c)[0] == "C" or c in _SEPARATORS else c for c in text)


# --- deciding what a message is ---------------------------------------------------------------------


class _Unreadable(ValueError):
    """The body is refused before it is a job spec (the message says why)."""


def read_submission(message: QueueMessage) -> JobSpec | Refusal:
    """The job spec a message carries, or why it carries none. Never raises: whatever the body holds,
    it is refused within the bounds above, with a reason that names the field when a field is wrong."""
    source = f"message {message.message_id}"
    data: Any = None
    try:
        data = _decode(message.body, source)
        _refuse_unstorable_text(message.body, data)
        spec = parse_job_spec(data, source)
    except _Unreadable as e:
        return Refusal(printable(f"{source}: {e}"), _name_in(data))
    except JobSpecError as e:
        problems = "; ".join(printable(p, MAX_PROBLEM_CHARS) for p in e.problems)
        return Refusal(printable(f"{source}: {problems}"), _name_in(data))
    except Exception as e:  # a body no bound above foresaw: refused (kept in the DLQ), not retried forever
        logger.warning("message body could not be read", extra={"message_id": message.message_id}, exc_info=True)
        return Refusal(printable(f"{source}: cannot be read as a job spec ({type(e).__name__}: {e})"), _name_in(data))
    return spec


def _decode(body: str, source: str) -> Any:
    """The body as JSON, within the bounds of a queue message (spotrelay.models.job_spec.decode_json:
    depth, nodes, digits, keys given twice; JobSpecError naming the problem)."""
    size = len(body.encode("utf-8", errors="surrogatepass"))
    if size > MAX_BODY_BYTES:
        raise _Unreadable(
            f"the body is {size} bytes; a job spec is at most {MAX_BODY_BYTES} bytes (SQS's message size limit)"
        )
    return decode_json(body, source, MESSAGE_LIMITS)


def _refuse_unstorable_text(body: str, data: Any) -> None:
    """Refuse (`_Unreadable`) text no record can store: an unpaired surrogate (a lone \\udXXX escape)."""
    if not (_SURROGATE.search(body) or _SURROGATE_ESCAPE.search(body)):
        return
    loc = _unpaired_surrogate_at(data, ())
    if loc is not None:
        where = f"{field_path(loc)}: " if loc else ""  # no path: the body is one JSON string
        raise _Unreadable(
            f"{where}holds an unpaired UTF-16 surrogate (a lone \\ud800-\\udfff escape), which no record can "
            "store; use valid Unicode text (a character beyond U+FFFF is escaped as a pair, e.g. \\ud83d\\ude00)"
        )


def _unpaired_surrogate_at(value: Any, loc: Loc) -> Loc | None:
    """Where (as a spec error names a field) the first key or text with an unpaired surrogate is."""
    if isinstance(value, str):
        return loc if _SURROGATE.search(value) else None
    items: list[tuple[Loc, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if _SURROGATE.search(str(key)):
                return (*loc, str(key))
            items.append(((*loc, str(key)), item))
    elif isinstance(value, list):
        items = [((*loc, i), item) for i, item in enumerate(value)]
    for where, item in items:
        found = _unpaired_surrogate_at(item, where)
        if found is not None:
            return found
    return None


def _name_in(data: Any) -> str | None:
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name else None


# --- recording it -----------------------------------------------------------------------------------


def intake(
    message: QueueMessage, *, store: JobStore, queue: JobQueue, clock: Clock
) -> tuple[str, Literal["accepted", "rejected", "conflict"]]:
    """Record one message as a QUEUED job (or a FAILED one); returns (job id, what became of it)."""
    now = clock.now()
    submitted = read_submission(message)
    if isinstance(submitted, Refusal):
        return _reject(message, submitted, store=store, queue=queue, now=now)
    spec = submitted
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
            reason = printable(
                f"message {message.message_id}: submission id {message.submission_id} already names job {job_id}, "
                "submitted with another spec; give each job its own (spotrelay submit does)"
            )
            queue.dead_letter(message, reason)
            return job_id, "conflict"
    queue.delete(message)
    return job_id, "accepted"


def _reject(
    message: QueueMessage, refusal: Refusal, *, store: JobStore, queue: JobQueue, now: datetime
) -> tuple[str, Literal["accepted", "rejected"]]:
    job_id = job_id_for(refusal.name or "invalid", submission_key(message))
    if not store.create_job(_failed_job(job_id, refusal.reason, now)):
        existing, _ = store.get_job(job_id)
        if not (existing.failure_reason or "").startswith(INVALID_JOB):
            # A message already recorded as a job (by a deployment whose rules admitted it) that these rules
            # refuse, delivered again (SQS is at least once): the job stands, the message is done.
            queue.delete(message)
            return job_id, "accepted"
    queue.dead_letter(message, refusal.reason)
    return job_id, "rejected"


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
    compute: Compute | None = None,
) -> DispatchReport:
    accepted: list[str] = []
    rejected: list[str] = []
    conflicts: list[str] = []
    errors: dict[str, str] = {}
    messages = queue.receive(MAX_MESSAGES_PER_RUN)
    for message in messages:
        try:
            job_id, became = intake(message, store=store, queue=queue, clock=clock)
        except Exception as e:  # this message's trouble (a store or SQS error): the others are recorded all the same
            error = printable(f"{type(e).__name__}: {e}", MAX_ERROR_CHARS)
            logger.warning(
                "message left on the queue to be delivered again",
                extra={"message_id": message.message_id, "error": error},
                exc_info=True,
            )
            errors[message.message_id] = error
            continue
        if became == "conflict":
            conflicts.append(message.message_id)
        else:
            (accepted if became == "accepted" else rejected).append(job_id)

    queued = store.queued_jobs(MAX_QUEUED_CONSIDERED)
    if queued:
        active = store.active_jobs()
        live_spend = None if compute is None else _live_spend(active, store=store, compute=compute, clock=clock)
        plan = admit(queued, active, limits, live_spend)
    else:  # most scheduled runs: nothing waits, so what runs (its records, its pools' prices) is not read
        plan = AdmissionPlan(admitted=(), held=(), impossible=())
    admitted: list[str] = []
    admission_errors: dict[str, str] = {}
    for job in plan.admitted:
        try:
            # Again here: a run that stopped between recording the job and reading the note left it QUEUED
            if _cancel_if_noted(store, job.job_id, clock.now()):
                continue
            workflow.start(job.execution_name, {"job_id": job.job_id, "heartbeat_seconds": heartbeat_seconds})
            update_job(store, job.job_id, _mark_admitted(clock))
        except _JOB_RECORD_ERRORS as e:
            admission_errors[job.job_id] = _admission_error(job.job_id, "admit", e)
            continue
        admitted.append(job.job_id)
    failed: list[str] = []
    for held in plan.impossible:
        try:
            update_job(store, held.job.job_id, _mark_impossible(held.reason, clock))
        except _JOB_RECORD_ERRORS as e:
            admission_errors[held.job.job_id] = _admission_error(held.job.job_id, "fail as unschedulable", e)
            continue
        failed.append(held.job.job_id)
    for held in plan.held:  # `spotrelay status` says why a queued job waits (written only when it changes)
        reason = f"held in the queue: {held.reason}"
        if held.job.waiting_reason != reason:
            try:
                update_job(store, held.job.job_id, _note_held(reason))
            except _JOB_RECORD_ERRORS as e:  # still held: only the note is missing
                admission_errors[held.job.job_id] = _admission_error(held.job.job_id, "note why held", e)
    return DispatchReport(
        received=len(messages),
        accepted=accepted,
        rejected=rejected,
        admitted=admitted,
        held={h.job.job_id: h.reason for h in plan.held},
        failed=failed,
        conflicts=conflicts,
        errors=errors,
        admission_errors=admission_errors,
    )


def _live_spend(active: Sequence[Job], *, store: JobStore, compute: Compute, clock: Clock) -> dict[str, float]:
    """Active job id -> what its live instances cost per hour now (`admission.live_usd_per_hour`): its spot
    attempts at the latest quote of their pools, read in one call for every pool of this run."""
    live: dict[str, list[Attempt]] = {}
    for job in active:
        try:
            attempts = store.attempts(job.job_id)
        except UnreadableRecordError as e:  # this job's trouble: it counts at its estimate, the others as they are
            logger.warning(
                "attempts unreadable: the job counts at its estimate", extra={"job_id": job.job_id, "error": str(e)}
            )
            continue
        live[job.job_id] = [a for a in attempts if a.is_live and a.instance_id is not None]
    pools = {series_key(a.pool) for attempts in live.values() for a in attempts if a.pool.market is Market.SPOT}
    prices: dict[SeriesKey, float] = {}
    if pools:
        types, zones = sorted({t for t, _ in pools}), sorted({z for _, z in pools})
        try:
            quotes = compute.spot_prices(types, zones, clock.now())
        except Exception as e:  # admission goes on: the live instances count at their launch prices
            logger.warning(
                "spot prices not read: live instances count at their launch prices",
                extra={"error": printable(f"{type(e).__name__}: {e}", MAX_ERROR_CHARS)},
                exc_info=True,
            )
            quotes = []
        prices = {series_key(q.pool): q.usd_per_hour for q in quotes if series_key(q.pool) in pools}
    return {job_id: live_usd_per_hour(attempts, prices) for job_id, attempts in live.items()}


# One job's own trouble in admission: its record kept changing under the write (ConflictError after
# update_job's tries), is gone, or does not read back (UnreadableRecordError, a ValidationError).
_JOB_RECORD_ERRORS = (ConflictError, NotFoundError, ValidationError)


def _admission_error(job_id: str, step: str, error: Exception) -> str:
    text = printable(f"{type(error).__name__}: {error}", MAX_ERROR_CHARS)
    logger.warning(
        "queued job left as it was after an error; tried again next run",
        extra={"job_id": job_id, "step": step, "error": text},
        exc_info=True,
    )
    return text


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
            job.failure_reason = f"{UNSCHEDULABLE}: {reason}"
            job.updated_at = job.ended_at = clock.now()

    return change
