"""Read-modify-write of job and attempt records under optimistic locking."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

from spotrelay.control.ports import ConflictError, JobStore
from spotrelay.models import Attempt, Job

T = TypeVar("T")

# Attempts at a conditional write before giving up; the Lambda's own retry (and the state machine's
# Retry on ConflictError) takes over after that.
MAX_WRITE_ATTEMPTS = 3


def update_job(store: JobStore, job_id: str, change: Callable[[Job], T]) -> tuple[Job, T]:
    """Apply `change` to a fresh copy of the job and write it back if nobody wrote in between.

    `change` mutates the copy it is given and returns a result; it runs again on a fresh read when
    the write loses a race, so it must decide from the job it is given, not from earlier reads.
    """
    for tries_left in reversed(range(MAX_WRITE_ATTEMPTS)):
        job, version = store.get_job(job_id)
        copy = job.model_copy(deep=True)
        result = change(copy)
        if copy == job:
            return job, result
        try:
            store.put_job(copy, version)
        except ConflictError:
            if tries_left == 0:
                raise
            continue
        return copy, result
    raise AssertionError("unreachable")


def update_attempt(
    store: JobStore, job_id: str, number: int, change: Callable[[Attempt], Attempt | None]
) -> tuple[Attempt, bool]:
    """Apply `change` to a fresh read of attempt `number` and write its result back if nobody wrote in
    between; (the attempt as stored, whether this call changed it). `change` returns the new attempt,
    or None (or the same) to leave it; it runs again on a fresh read when the write loses a race, so it
    must decide from the attempt it is given. NotFoundError if the attempt does not exist."""
    for tries_left in reversed(range(MAX_WRITE_ATTEMPTS)):
        attempt, version = store.get_attempt_versioned(job_id, number)
        changed = change(attempt.model_copy(deep=True))
        if changed is None or changed == attempt:
            return attempt, False
        try:
            store.put_attempt(changed, version)
        except ConflictError:
            if tries_left == 0:
                raise
            continue
        return changed, True
    raise AssertionError("unreachable")


def ask_handover(at: datetime) -> Callable[[Attempt], Attempt | None]:
    """A change for `update_attempt`: ask the attempt's agent to checkpoint and hand its job back (once;
    not to an attempt that has ended or is already stopping for a spot notice)."""

    def change(fresh: Attempt) -> Attempt | None:
        if fresh.outcome is not None or fresh.migrate_requested_at is not None or fresh.interrupted_at is not None:
            return None
        return fresh.model_copy(update={"migrate_requested_at": at})

    return change


def withdraw_handover(fresh: Attempt) -> Attempt | None:
    """A change for `update_attempt`: take back a handover request (its standby is gone); an agent that
    has already acted on it hands the job back anyway, and Place places it as after any handover."""
    if fresh.outcome is not None or fresh.migrate_requested_at is None:
        return None
    return fresh.model_copy(update={"migrate_requested_at": None})


def mark_running(at: datetime) -> Callable[[Attempt], Attempt | None]:
    """A change for `update_attempt`: the instance reached `running` at `at` (once; not after it ended)."""

    def change(fresh: Attempt) -> Attempt | None:
        if fresh.outcome is not None or fresh.running_at is not None:
            return None
        return fresh.model_copy(update={"running_at": at})

    return change
