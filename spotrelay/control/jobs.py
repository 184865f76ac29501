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

    def decide(job: Job) -> tuple[Job, T]:
        copy = job.model_copy(deep=True)
        return copy, change(copy)

    job, result, _ = _write_unless_raced(lambda: store.get_job(job_id), decide, store.put_job)
    return job, result


def update_attempt(
    store: JobStore, job_id: str, number: int, change: Callable[[Attempt], Attempt | None]
) -> tuple[Attempt, bool]:
    """Apply `change` to a fresh read of attempt `number` and write its result back if nobody wrote in
    between; (the attempt as stored, whether this call changed it). `change` returns the new attempt,
    or None (or the same) to leave it; it runs again on a fresh read when the write loses a race, so it
    must decide from the attempt it is given. NotFoundError if the attempt does not exist."""
    attempt, _, changed = _write_unless_raced(
        lambda: store.get_attempt_versioned(job_id, number),
        lambda fresh: (change(fresh.model_copy(deep=True)), None),
        store.put_attempt,
    )
    return attempt, changed


R = TypeVar("R", Job, Attempt)


def _write_unless_raced(
    read: Callable[[], tuple[R, int]],
    decide: Callable[[R], tuple[R | None, T]],
    write: Callable[[R, int], object],
) -> tuple[R, T, bool]:
    """The optimistic write both records use: read (record, version), decide the new record (None or an
    equal one: nothing to write) and a result, write it if the version still holds; on a lost race, all
    again on a fresh read, MAX_WRITE_ATTEMPTS times at most (then ConflictError). (The record as stored,
    the result, whether this call wrote it.)"""
    for tries_left in reversed(range(MAX_WRITE_ATTEMPTS)):
        current, version = read()
        new, result = decide(current)
        if new is None or new == current:
            return current, result, False
        try:
            write(new, version)
        except ConflictError:
            if tries_left == 0:
                raise
            continue
        return new, result, True
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
