"""Ports: what the control-plane core needs from the outside world, as typing.Protocols.

`spotrelay.aws` implements them with boto3 (DynamoDB, EC2, Step Functions, SQS, Lambda);
tests use in-memory fakes (`tests/fakes.py`) that can also inject faults. Every method that writes
is idempotent or conditional, because every caller may run twice for one event.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from spotrelay.clock import Clock as Clock  # the port, re-exported for the core's modules
from spotrelay.field_problems import Loc, SpecFieldError, field_problems
from spotrelay.models import Attempt, Job, Pool, PriceQuote
from spotrelay.policy import BlockedPool, PoolObservation


class ConflictError(Exception):
    """A conditional write lost: the record changed since it was read (retry from a fresh read)."""


class NotFoundError(Exception):
    pass


class UnreadableRecordError(ValidationError):
    """A record is in the store but does not read back as this version's model: garbage, a field missing, a
    value out of range (a NaN price), written by hand, by a bug, or by a version with other rules. The reads
    of one record (a job, an attempt, a checkpoint pointer, an instance ref) and of one job's attempts raise
    it: its caller cannot decide for that job without it, and says so for that job alone.

    Not a NotFoundError: the record is there, and what a caller does with a missing one (ignore the event,
    note a cancel before admission, wait for the record to appear) would be wrong with it. A ValidationError,
    with what pydantic found (`errors()`), so a caller that handled an unreadable record as one before still
    does. `str()` is one line naming the record; `record` names it alone ("attempt 2 of job train-1").
    """

    @classmethod
    def of(cls, record: str, error: ValidationError) -> UnreadableRecordError:
        """`record` (what it is) does not read back, as `error` (pydantic's, reading it) says."""
        # a validator's SpecFieldError names a field below the error's own: kept in the location, as the
        # error itself (the context) is not
        lines: list[InitErrorDetails] = [
            {"type": PydanticCustomError(e["type"], e["msg"]), "loc": (*e["loc"], *_below(e)), "input": e["input"]}
            for e in error.errors(include_url=False)
        ]
        return cls.from_exception_data(record, lines, hide_input=True)

    @classmethod
    def problem(cls, record: str, field: str, message: str) -> UnreadableRecordError:
        """`record` does not read back: its `field` (an attribute of the item) is wrong, as `message` says."""
        line: InitErrorDetails = {"type": PydanticCustomError("unreadable", message), "loc": (field,), "input": None}
        return cls.from_exception_data(record, [line], hide_input=True)

    @property
    def record(self) -> str:
        return self.title

    def __str__(self) -> str:
        return f"{self.title} does not read back ({'; '.join(field_problems(self, at_most=3))})"


def _below(error: ErrorDetails) -> Loc:
    found = error.get("ctx", {}).get("error")
    return found.below if isinstance(found, SpecFieldError) else ()


class CheckpointPointer(BaseModel):
    """The latest complete checkpoint of a job; it only ever moves forward in (attempt, seq) order."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    attempt: int
    seq: int
    manifest_key: str
    work_done_hours: float
    committed_at: AwareDatetime
    final: bool = False  # the attempt's last checkpoint, taken at its interruption notice


class InstanceRef(BaseModel):
    """Which job attempt an EC2 instance belongs to (written by launch, read by ec2_events)."""

    model_config = ConfigDict(frozen=True)

    instance_id: str
    job_id: str
    attempt: int


class JobStore(Protocol):
    """The DynamoDB table. Writes of a Job are conditional on `expected_version` (optimistic locking)."""

    def create_job(self, job: Job) -> bool:
        """Insert; False (and no change) if a job with this id exists already."""

    def get_job(self, job_id: str) -> tuple[Job, int]:
        """The job and its version. Raises NotFoundError, or UnreadableRecordError."""

    def put_job(self, job: Job, expected_version: int) -> int:
        """Replace the job if its version is still `expected_version`; returns the new version.
        Raises ConflictError otherwise. Keeps the queued/active indexes in step with `job.state`."""

    def queued_jobs(self, limit: int) -> list[Job]:
        """QUEUED jobs, highest priority first, then oldest first."""

    def request_cancel_before_admission(self, job_id: str) -> None:
        """Remember that the job is to be cancelled when its message is read (it has no record yet)."""

    def cancel_requested_before_admission(self, job_id: str) -> bool:
        """Whether `request_cancel_before_admission` was called for the job (a consistent read)."""

    def forget_cancel_before_admission(self, job_id: str) -> None:
        """Remove that note (a resumed job must not be cancelled again by it); no note is no error."""

    def active_jobs(self) -> list[Job]:
        """Admitted jobs that are not in a terminal state."""

    def put_attempt(self, attempt: Attempt, expected_version: int | None = None) -> int:
        """Insert or replace attempt (job_id, attempt); returns its new version. With `expected_version`,
        only if the stored record is still at that version (0: none, or one written before versions),
        else ConflictError: concurrent writers (two EC2 events of one instance, Recover and a late
        event) go through `spotrelay.control.jobs.update_attempt` and never drop each other's fields."""

    def get_attempt(self, job_id: str, attempt: int) -> Attempt:
        """Raises NotFoundError, or UnreadableRecordError."""

    def get_attempt_versioned(self, job_id: str, attempt: int) -> tuple[Attempt, int]:
        """The attempt and its version (see `put_attempt`). Raises NotFoundError, or UnreadableRecordError."""

    def attempts(self, job_id: str) -> list[Attempt]:
        """All attempts of a job, in attempt order. UnreadableRecordError if one does not read back: every
        caller decides from all of them (the job's cost, its budget, which instances to terminate, the next
        attempt's number), and a decision from part of them would be wrong for that job."""

    def put_instance_ref(self, ref: InstanceRef) -> None: ...

    def get_instance_ref(self, instance_id: str) -> InstanceRef | None:
        """None if the instance is not ours. Raises UnreadableRecordError."""

    def block_pool(self, block: BlockedPool) -> None:
        """Remember a pool as unavailable until `block.until` (stored with a TTL)."""

    def blocked_pools(self, now: datetime) -> list[BlockedPool]:
        """Blocks still in force at `now`. One that does not read back is skipped (and logged): the pool is
        not blocked (spotrelay.aws.store says why that is the safe side)."""

    def record_pool_usage(self, pool: Pool, instance_hours: float, interruptions: int) -> None:
        """Add to the pool's observed instance-hours and interruptions (atomic counters)."""

    def pool_observations(self) -> dict[str, PoolObservation]:
        """offering 'type:az' -> what we observed there (a record that does not read back is skipped: the
        pool has the prior's rate alone)."""

    def advance_checkpoint(self, pointer: CheckpointPointer) -> bool:
        """Move the job's pointer to `pointer` if it is newer in (attempt, seq); False if not."""

    def get_checkpoint(self, job_id: str) -> CheckpointPointer | None:
        """None if the job has no checkpoint yet. Raises UnreadableRecordError: a pointer that cannot be read
        is not "no checkpoint" (a job resumed from nothing would redo its work, and its next checkpoint
        would move the pointer past the progress it lost)."""


class LaunchRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    job_id: str
    job_name: str
    attempt: int
    pool: Pool
    subnet_id: str
    max_price: float | None  # spot only: the job's cap
    client_token: str  # EC2 idempotency token: the same (job, attempt, pool) never launches twice
    # The job spec's `tags`, put on the instance and its volumes after spotrelay's own (the spec refuses
    # `spotrelay:` and `aws:` keys and holds them within EC2's rules: spotrelay.models.job_spec)
    tags: dict[str, str] = {}


class LaunchRefused(Exception):
    """EC2 would not give us this pool now (InsufficientInstanceCapacity, price above the cap, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class InstanceState(BaseModel):
    model_config = ConfigDict(frozen=True)

    instance_id: str
    state: str  # pending | running | stopping | stopped | shutting-down | terminated
    tags: dict[str, str]
    launched_at: AwareDatetime | None = None


class Compute(Protocol):
    """EC2."""

    def spot_prices(self, instance_types: Sequence[str], zones: Sequence[str], now: datetime) -> list[PriceQuote]:
        """Current Linux spot price per (type, zone) among those asked for (DescribeSpotPriceHistory)."""

    def spot_price_history(self, pool: Pool, start: datetime, end: datetime) -> list[PriceQuote]:
        """The Linux spot price of `pool` over [start, end], oldest first: the price in effect at `start`
        (stamped when it took effect) and every change up to `end` (DescribeSpotPriceHistory, which keeps 90
        days: what an attempt's bill integrates, spotrelay.models.billing)."""

    def launch(self, request: LaunchRequest) -> str:
        """Start one instance; returns its id. Raises LaunchRefused when the pool cannot serve now."""

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Terminate; instances already gone are not an error."""

    def managed_instances(self) -> list[InstanceState]:
        """Every instance tagged spotrelay:managed that is not terminated."""

    def instance_states(self, instance_ids: Sequence[str]) -> dict[str, str]:
        """instance id -> state; ids EC2 no longer knows are absent."""


class Workflow(Protocol):
    """Step Functions: the JobLifecycle executions and their task tokens."""

    def start(self, execution: str, payload: dict[str, object]) -> bool:
        """Start the execution named `execution` (a job's run: `Job.execution_name`); False if it exists
        already (idempotent)."""

    def succeed_task(self, task_token: str, output: dict[str, object]) -> bool:
        """False if the token is no longer open (already closed, timed out)."""

    def fail_task(self, task_token: str, error: str, cause: str) -> bool:
        """False if the token is no longer open."""

    def status(self, execution: str) -> str | None:
        """The named execution's RUNNING | SUCCEEDED | FAILED | TIMED_OUT | ABORTED, or None if there is none."""

    def stop(self, execution: str, cause: str) -> None: ...


class QueueMessage(BaseModel):
    model_config = ConfigDict(frozen=True)

    message_id: str
    receipt_handle: str
    body: str
    # `spotrelay submit`'s id for the submission (the message attribute SUBMISSION_ATTRIBUTE): the job id
    # comes from it, so a resent message (an SDK retry after a timeout) is the same job, not a second one
    submission_id: str | None = None


class JobQueue(Protocol):
    """The SQS job queue and its dead-letter queue."""

    def receive(self, max_messages: int) -> list[QueueMessage]: ...

    def delete(self, message: QueueMessage) -> None: ...

    def dead_letter(self, message: QueueMessage, reason: str) -> None:
        """Keep the message in the DLQ (with `reason` as an attribute), then delete it from the queue."""


class Wakeup(Protocol):
    def wake_dispatcher(self, reason: str) -> None:
        """Ask the dispatcher to run soon (asynchronously); best effort, the schedule is the safety net."""
