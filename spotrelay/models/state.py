"""The job state enum and its allowed transitions, enforced here and nowhere else."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "QUEUED"  # accepted, waiting for admission (quota, budget, concurrency)
    PLACING = "PLACING"  # choosing a pool
    WAITING = "WAITING"  # no feasible pool right now; backing off before placing again
    LAUNCHING = "LAUNCHING"  # an instance was requested in the chosen pool
    RUNNING = "RUNNING"  # the agent reports the job running
    RECOVERING = "RECOVERING"  # the instance was lost; final checkpoint, then place again
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

_ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.PLACING}),
    JobState.PLACING: frozenset({JobState.LAUNCHING, JobState.WAITING}),
    JobState.WAITING: frozenset({JobState.PLACING}),
    # An instance that cannot be had (InsufficientInstanceCapacity, price above the cap) sends the job
    # back to placement with that pool excluded; one lost before it ever ran goes through recovery.
    JobState.LAUNCHING: frozenset({JobState.RUNNING, JobState.PLACING, JobState.RECOVERING}),
    # RUNNING -> PLACING: the user's code failed and the job restarts (max_restarts).
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.RECOVERING, JobState.PLACING}),
    JobState.RECOVERING: frozenset({JobState.PLACING}),
}
# Any live job can fail or be cancelled; nothing leaves a terminal state but `resume` (below).
for _state in JobState:
    if not _state.is_terminal:
        _ALLOWED[_state] = _ALLOWED[_state] | {JobState.FAILED, JobState.CANCELLED}

# `spotrelay resume` queues a FAILED or CANCELLED job again, as a new run of it (spotrelay.control.resume):
# the one way out of a terminal state, and never through `ensure_transition`, so that no late or repeated
# event can revive an ended job. A SUCCEEDED job has nothing left to do.
RESUMABLE_STATES = frozenset({JobState.FAILED, JobState.CANCELLED})


class InvalidTransition(ValueError):
    def __init__(self, current: JobState, target: JobState) -> None:
        allowed = ", ".join(sorted(_ALLOWED.get(current, frozenset()))) or "none (terminal)"
        super().__init__(f"job state {current} cannot become {target}; allowed from {current}: {allowed}")
        self.current = current
        self.target = target


def allowed_next(current: JobState) -> frozenset[JobState]:
    return _ALLOWED.get(current, frozenset())


def ensure_transition(current: JobState, target: JobState) -> JobState:
    """Return `target` if `current -> target` is allowed, else raise InvalidTransition.

    A repeated transition (`current == target`) is allowed: events arrive at least once, and the
    second delivery of "RUNNING" must not fail the handler that applies it.
    """
    if current == target or target in allowed_next(current):
        return target
    raise InvalidTransition(current, target)
