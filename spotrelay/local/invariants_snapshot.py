"""The replay's invariants (spotrelay.local.invariants): the state snapshot they are checked on.

What moto holds at one instant (`Observed`: the table's records, the managed instances, the executions),
what the checks look at (`Snapshot`: that state plus what the replay has seen so far: the checkpoints
committed, the starts of a job by an agent, the terminal state each job first reached) and what a check
reports (`Violation`). Siblings: spotrelay.local.invariants_checks (the checks of a `Snapshot`),
spotrelay.local.invariants_reads (reading an `Observed` from moto), spotrelay.local.invariants (the monitor).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from spotrelay.config import ORPHAN_GRACE_SECONDS, SCHEDULE_MINUTES
from spotrelay.control.ports import CheckpointPointer
from spotrelay.models import Attempt, Job, JobState

if TYPE_CHECKING:
    from spotrelay.market import SpotMarket

RUNNING_STATES = frozenset({"pending", "running"})  # an instance that is billed (and could run a job)
WORK_EPSILON = 1e-9  # reference-GPU hours: floats that round-trip through JSON exactly, compared with slack


@dataclass(frozen=True)
class InstanceView:
    """A managed instance as EC2 describes it."""

    instance_id: str
    state: str
    launched_at: datetime
    job_id: str | None = None  # its tags
    attempt: int | None = None


@dataclass(frozen=True)
class UnreadableRecord:
    pk: str
    sk: str
    error: str


@dataclass(frozen=True)
class CommittedCheckpoint:
    job_id: str
    attempt: int
    seq: int
    work_done_hours: float | None
    at: datetime

    @property
    def order(self) -> tuple[int, int]:
        return (self.attempt, self.seq)


@dataclass(frozen=True)
class JobStart:
    """An agent started the job: resuming from `restored` (attempt, seq), or from nothing."""

    job_id: str
    attempt: int
    at: datetime
    restored: tuple[int, int] | None


@dataclass(frozen=True)
class Observed:
    """What moto holds at one instant: the table's records, the managed instances, the executions."""

    jobs: Mapping[str, Job]
    attempts: Mapping[str, Sequence[Attempt]]  # by job id, in attempt order
    pointers: Mapping[str, CheckpointPointer]  # by job id
    instances: Sequence[InstanceView]  # pending or running
    executions: Mapping[str, str]  # execution name (`Job.execution_name`) -> status
    unreadable: Sequence[UnreadableRecord] = ()


@dataclass(frozen=True)
class Snapshot:
    """What the checks look at: the state now and what the replay has seen so far."""

    now: datetime
    jobs: Mapping[str, Job]
    attempts: Mapping[str, Sequence[Attempt]]
    instances: Sequence[InstanceView] = ()
    executions: Mapping[str, str] = field(default_factory=dict)
    unreadable: Sequence[UnreadableRecord] = ()
    commits: Sequence[CommittedCheckpoint] = ()  # every checkpoint committed so far
    starts: Sequence[JobStart] = ()  # every start of the job by an agent so far
    # the terminal state each job reached, with the run it ended (`spotrelay resume` starts a new run)
    first_terminal: Mapping[str, tuple[int, JobState]] = field(default_factory=dict)
    finished: bool = False  # the end of a replay in which every job ended
    final: bool = False  # the end of the replay, every job ended or not
    submitted: Mapping[str, datetime] = field(default_factory=dict)  # job id -> when SQS accepted its message
    reconcile_period: timedelta = timedelta(minutes=SCHEDULE_MINUTES)
    orphan_grace: timedelta = timedelta(seconds=ORPHAN_GRACE_SECONDS)
    market: SpotMarket | None = None  # the scenario's: the prices a bill is checked against (None: not checked)


@dataclass(frozen=True)
class Violation:
    kind: str
    job_id: str | None
    detail: str
    at: datetime  # the snapshot that showed it
    instance_id: str | None = None
    attempt: int | None = None
    subject: str = ""  # what else tells two violations of a kind apart (a record's keys, a start's time)

    @property
    def key(self) -> tuple[str, str | None, str | None, int | None, str]:
        """One broken invariant, whatever step shows it again."""
        return (self.kind, self.job_id, self.instance_id, self.attempt, self.subject)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "job_id": self.job_id,
            "instance_id": self.instance_id,
            "attempt": self.attempt,
            "detail": self.detail,
            "at": _iso(self.at),
        }


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


__all__ = [
    "RUNNING_STATES",
    "WORK_EPSILON",
    "CommittedCheckpoint",
    "InstanceView",
    "JobStart",
    "Observed",
    "Snapshot",
    "UnreadableRecord",
    "Violation",
]
