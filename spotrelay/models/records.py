"""What the scheduler records: pools, price quotes, jobs, attempts and checkpoint manifests.

Records are read forward-compatibly. During a deploy, and whenever two versions share a table (a CLI
older than the stack, a function not yet updated), one version reads what a newer one wrote: a field
it does not know is kept (pydantic's `extra="allow"`), carried through a read-modify-write unchanged,
and never makes the record unreadable. Checkpoint manifests are the exception (see
CheckpointManifest), and so is a job spec being *submitted*: an unknown field there is refused, naming
it (spotrelay.models.job_spec). In code, mypy's pydantic plugin still refuses a keyword these models
do not declare (`init_forbid_extra`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final, Self

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from spotrelay.models.job_spec import JobSpec
from spotrelay.models.spec_sections import MAX_KEEP_MINUTES
from spotrelay.models.state import JobState

KEEP_UNKNOWN_FIELDS: Final = "allow"  # see the module docstring


class Market(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class Pool(BaseModel):
    """Where an instance can run: an instance type in an availability zone, bought on a market."""

    # A value compared and hashed (blocked pools, a job's preferred pool): a field a newer version added is
    # left out when read, so the same pool is equal to itself whichever version wrote it.
    model_config = ConfigDict(frozen=True, extra="ignore")

    instance_type: str
    availability_zone: str
    market: Market = Market.SPOT

    @property
    def offering(self) -> str:
        """`g6.xlarge:us-east-1a` — the type x AZ key used by `--blocked` and the blocked-pool cache."""
        return f"{self.instance_type}:{self.availability_zone}"

    def __str__(self) -> str:
        return f"{self.instance_type} in {self.availability_zone} ({self.market})"


class PriceQuote(BaseModel):
    """The hourly price of one pool, as of `timestamp` (None: the price is not time-stamped)."""

    model_config = ConfigDict(frozen=True, extra=KEEP_UNKNOWN_FIELDS)

    pool: Pool
    usd_per_hour: float = Field(ge=0)
    timestamp: AwareDatetime | None = None


class AttemptOutcome(StrEnum):
    SUCCEEDED = "SUCCEEDED"  # the job exited 0
    FAILED = "FAILED"  # the user's code exited non-zero (JobFailed)
    INTERRUPTED = "INTERRUPTED"  # a spot interruption notice (SpotInterrupted)
    LOST = "LOST"  # the instance stopped or vanished without a notice, or stopped heartbeating
    LAUNCH_FAILED = "LAUNCH_FAILED"  # InsufficientInstanceCapacity, price above the cap, ...
    CANCELLED = "CANCELLED"
    MIGRATED = "MIGRATED"  # the control plane moved the job from on-demand back to spot (Migrating)


class Attempt(BaseModel):
    """One run of a job on one instance. Attempt numbers start at 1 and fence stale events."""

    model_config = ConfigDict(extra=KEEP_UNKNOWN_FIELDS)

    job_id: str
    attempt: int = Field(ge=1)
    pool: Pool
    hourly_price: float = Field(ge=0)
    instance_id: str | None = None
    started_at: AwareDatetime
    ended_at: AwareDatetime | None = None
    outcome: AttemptOutcome | None = None
    work_done_hours_at_start: float = Field(default=0, ge=0, description="reference-GPU hours restored")
    relative_speed: float = Field(default=1.0, gt=0, description="the GPU's speed vs the reference GPU")
    task_token: str | None = Field(default=None, description="the JobLifecycle Run task's token")
    heartbeat_timeout_seconds: int | None = Field(
        default=None, ge=1, description="the Run task's heartbeat timeout: the agent beats well within it"
    )
    running_at: AwareDatetime | None = None  # the instance reached `running`
    interrupted_at: AwareDatetime | None = None  # the spot interruption warning arrived
    rebalance_at: AwareDatetime | None = None  # a rebalance recommendation arrived
    # Migration back to spot is make-before-break. Reconcile launches a spot instance ahead, as a standby
    # attempt that names the attempt it replaces (`handover_from`) and has no task token yet. Once the standby
    # is running, the control plane asks the current attempt's agent to checkpoint and hand the job back
    # (`migrate_requested_at`); it answers like a spot notice, with the error Migrating. Launch then gives
    # the standby the next Run task's token and its agent restores the checkpoint.
    migrate_requested_at: AwareDatetime | None = None
    handover_from: int | None = Field(default=None, ge=1, description="the attempt this standby replaces")
    lost_work_hours: float = Field(default=0, ge=0, description="reference-GPU hours done and not checkpointed")
    # The job's code failed for good here and the job asked to keep the instance (recovery's
    # keep_failed_instance_minutes): it runs, billed, until then; reconcile terminates it after.
    kept_until: AwareDatetime | None = None
    # The bill (spotrelay.models.billing): it runs from the launch until EC2 stops billing the instance, the
    # earliest time the instance was reported gone (its state change, or reconcile), not the attempt's close.
    # Settled then: the price in effect over that time, integrated, so that reading a cost never calls EC2.
    billed_until: AwareDatetime | None = Field(default=None, description="when EC2 stopped billing the instance")
    cost_usd: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="the settled bill, launch to billed_until"
    )

    @property
    def kept_end(self) -> datetime | None:
        """Until when its instance is kept to debug the job's failure: `kept_until`, for a FAILED attempt, and
        never more than MAX_KEEP_MINUTES after its end (a record that says more is not believed)."""
        if self.kept_until is None or self.ended_at is None or self.outcome is not AttemptOutcome.FAILED:
            return None
        return min(self.kept_until, self.ended_at + timedelta(minutes=MAX_KEEP_MINUTES))

    def kept_at(self, now: datetime) -> bool:
        """Its instance is kept for debugging at `now` (the job failed there, and asked for it)."""
        end = self.kept_end
        return end is not None and now < end

    @property
    def is_live(self) -> bool:
        return self.outcome is None

    @property
    def is_settled(self) -> bool:
        """Its bill is final: settled at its instance's reported end, or it never had an instance."""
        return self.cost_usd is not None or self.instance_id is None

    @property
    def is_standby(self) -> bool:
        """Launched ahead of a handover and not yet given a Run task (no token): no Run task to fail."""
        return self.handover_from is not None and self.task_token is None and self.outcome is None

    def runtime_hours(self, now: datetime) -> float:
        end = self.ended_at or now
        return max(0.0, (end - self.started_at).total_seconds() / 3600)

    def billing_end(self, now: datetime) -> datetime:
        """Where the bill ends, as known at `now`: the instance's end once reported; until then the attempt's
        close (every step that closes an attempt terminates its instance), or `now` while it is live, or, for an
        instance kept to debug the job's failure, `now` while it is kept."""
        if self.billed_until is not None:
            return self.billed_until
        if self.ended_at is None:
            return now
        kept = self.kept_end
        if kept is not None and kept > self.ended_at:
            return max(self.ended_at, min(now, kept))
        return self.ended_at

    def billed_hours(self, now: datetime) -> float:
        return max(0.0, (self.billing_end(now) - self.started_at).total_seconds() / 3600)

    def cost(self, now: datetime) -> float:
        """USD: the settled bill; until it is settled, the billed hours so far at the launch price (the
        control plane's budget check integrates the prices in effect: spotrelay.models.billing.cost_so_far)."""
        if self.cost_usd is not None:
            return self.cost_usd
        return self.hourly_price * self.billed_hours(now)


class PlannedPool(BaseModel):
    """One entry of the ranking `place` hands to `launch`: try these pools in order."""

    model_config = ConfigDict(frozen=True, extra=KEEP_UNKNOWN_FIELDS)

    pool: Pool
    hourly_price: float = Field(ge=0)
    relative_speed: float = Field(gt=0)


# A job runs at most this many times (its first run and its resumes): `<job id>-run999` is 80 characters,
# the longest name Step Functions takes for an execution.
MAX_RUNS: Final = 999


class Job(BaseModel):
    """A submitted job and where it stands."""

    model_config = ConfigDict(extra=KEEP_UNKNOWN_FIELDS)

    job_id: str
    spec: JobSpec
    state: JobState = JobState.QUEUED
    submitted_at: AwareDatetime
    updated_at: AwareDatetime
    attempts: int = Field(default=0, ge=0, description="number of attempts started")
    interruptions: int = Field(default=0, ge=0)
    restarts: int = Field(default=0, ge=0, description="restarts after the user's code failed")
    work_done_hours: float = Field(default=0, ge=0, description="reference-GPU hours in the last checkpoint")
    cost_usd: float = Field(default=0, ge=0, description="the ended attempts' bills (Attempt.cost), derived")
    lost_work_hours: float = Field(default=0, ge=0)
    failure_reason: str | None = None
    placement: tuple[PlannedPool, ...] = Field(default=(), description="the latest ranking, best first")
    place_waits: int = Field(default=0, ge=0, description="placements in a row that found no pool")
    waiting_since: AwareDatetime | None = Field(
        default=None, description="the first placement that found no pool since the job's last launch"
    )
    waiting_reason: str | None = Field(default=None, description="why the latest placement found no pool")
    preferred_pool: Pool | None = Field(default=None, description="recovery asks to try this pool first")
    last_recovered_attempt: int = Field(default=0, ge=0, description="recovery applied up to this attempt")
    last_recovery: dict[str, Any] | None = Field(default=None, description="what that recovery decided")
    cancel_requested: bool = False
    ended_at: AwareDatetime | None = None
    run: int = Field(
        default=1, ge=1, le=MAX_RUNS, description="1, and one more each time `spotrelay resume` starts it again"
    )
    resumed_at: AwareDatetime | None = Field(default=None, description="when the latest run was resumed")
    previous_failure_reason: str | None = Field(
        default=None, description="how the run before this one ended (`run 1 ended FAILED: ...`), once resumed"
    )

    @property
    def execution_name(self) -> str:
        """The name of this run's Step Functions execution: the job id, then `<job id>-run<n>` for a resumed
        run (at most 80 characters: a job id has at most 73, and ends in 12 hex digits, so no other
        job's id is ever one of these)."""
        return self.job_id if self.run == 1 else f"{self.job_id}-run{self.run}"

    def remaining_work_hours(self) -> float | None:
        """Reference-GPU hours still to do, if the spec gives `work_hours`."""
        if self.spec.work_hours is None:
            return None
        return max(0.0, self.spec.work_hours - self.work_done_hours)

    def elapsed_hours(self, now: datetime) -> float:
        return max(0.0, (now - self.submitted_at).total_seconds() / 3600)


class CheckpointFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")  # as the manifest's

    path: str = Field(min_length=1, description="relative to checkpoint.dir, with no '..' part")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    key: str | None = Field(
        default=None,
        min_length=1,
        description="the S3 key of the bytes when an earlier checkpoint of the job uploaded them (incremental "
        "checkpoints reference unchanged files); None: `<this checkpoint's prefix>data/<path>`",
    )

    @field_validator("path")
    @classmethod
    def _inside_checkpoint_dir(cls, path: str) -> str:
        parts = path.split("/")
        if path.startswith("/") or ".." in parts or "" in parts:
            raise ValueError("must be a relative path inside checkpoint.dir, without '..' or empty parts")
        return path


class CheckpointManifest(BaseModel):
    """Written last, after every file it lists: a checkpoint without a manifest does not exist.

    Stored at `s3://<bucket>/jobs/<job_id>/checkpoints/<attempt>-<seq>/manifest.json`; checkpoints
    are ordered by (attempt, seq), and the job's pointer only ever moves forward in that order.
    A file's bytes are at `<prefix>data/<path>`, or, when an earlier checkpoint of the same job
    uploaded them, at that checkpoint's key (`CheckpointFile.key`; never outside the job's checkpoints).

    Unlike the table's records, a manifest with a field this version does not know is refused: it says
    how to read the bytes (a newer agent's field might be a compression or an encryption), and a
    restore that guessed would hand the job corrupt state.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    attempt: int = Field(ge=1)
    seq: int = Field(ge=0)
    created_at: AwareDatetime
    work_done_hours: float | None = Field(default=None, ge=0)
    files: tuple[CheckpointFile, ...]
    final: bool = Field(default=False, description="the attempt's last checkpoint, taken at its interruption notice")

    @model_validator(mode="after")
    def _unique_paths(self) -> Self:
        paths = [f.path for f in self.files]
        if len(paths) != len(set(paths)):
            raise ValueError("files: each path may appear once")
        outside = [f.key for f in self.files if f.key is not None and not f.key.startswith(self.job_prefix)]
        if outside:
            raise ValueError(f"files: keys must be under {self.job_prefix}, not {outside[0]!r}")
        return self

    @property
    def order(self) -> tuple[int, int]:
        return (self.attempt, self.seq)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def job_prefix(self) -> str:
        """Where every checkpoint of the job lives."""
        return f"jobs/{self.job_id}/checkpoints/"

    @property
    def prefix(self) -> str:
        return f"{self.job_prefix}{self.attempt}-{self.seq}/"

    def object_key(self, file: CheckpointFile) -> str:
        """The S3 key holding `file`'s bytes."""
        return file.key if file.key is not None else f"{self.prefix}data/{file.path}"
