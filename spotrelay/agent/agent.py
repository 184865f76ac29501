"""The worker agent: one job attempt on one instance, from restore to the report on the task token.

    state file says reported?  -> nothing to do
    attempt record (task token) -> heartbeats start (a thread: a quarter of the Run task's heartbeat timeout)
      (a standby attempt waits up to standby_wait_seconds for its token; closed first -> stale, no job)
    job not started yet:
        previous attempt interrupted and its final checkpoint not committed? -> wait (bounded)
        restore the pointer's checkpoint into checkpoint.dir (verified) -> SPOTRELAY_RESUMED=1|0
        start the job (its own process group, under the supervisor) -> state file
    job started by an earlier run of the agent -> re-attach (watch its pid and exit file)
    every `poll_seconds`:
        the job exited?              -> 0: SendTaskSuccess {"exit_code": 0}
                                        n: SendTaskFailure JobFailed {"exit_code": n, "log_tail": ...}
        spot/instance-action?        -> SIGTERM to the job's group, wait up to grace_seconds, SIGKILL,
                                        final checkpoint (committed), SendTaskFailure SpotInterrupted
                                        {"attempt", "checkpoint_seq", "committed", ...}
        migrate_requested_at set?    -> the same stop and final checkpoint, SendTaskFailure Migrating
          (the attempt record, read     {"attempt", "checkpoint_seq", "committed", "exit_code",
          every migrate_poll_seconds)    "reason": "migrate", "requested_at"}
        rebalance recommendation?    -> a checkpoint now (once per recommendation)
        interval_minutes passed?     -> a periodic (incremental) checkpoint
    a restore that fails verification -> SendTaskFailure CheckpointCorrupt; the job is not started
    a restore that cannot complete (the job tampered with the restore's dirs) -> SendTaskFailure JobFailed;
        the job is not started, neither from a partial restore nor from scratch (`Checkpointer.restore`)

Periodic and rebalance checkpoints run on a background thread, so the loop keeps polling IMDS while
a large upload is in flight; a notice cancels such an upload (what it finished stays reusable) and
the final checkpoint uploads only what is still missing.

Migration back to spot: the control plane (reconcile) sets `migrate_requested_at` on the attempt record
of a job it wants off its on-demand instance. The agent of an on-demand attempt (only those are ever
asked) reads the record every `migrate_poll_seconds`
on a thread of its own (a slow DynamoDB never holds up the IMDS poll) and answers like a spot notice,
recorded in the state file the same way (`reason: migrate`), so a restarted agent finishes the stop
instead of watching the job; the task fails with `Migrating`, and Recover closes the attempt and
terminates the instance. IMDS is checked first in each poll, so a spot notice seen in the same poll
wins. A read that fails is logged and tried again `migrate_poll_seconds` later.

A job given no grace at a notice (`checkpoint.grace_seconds: 0`: it saves only on its own schedule) would
lose everything since its last save if stopped at once. A migration has no two-minute deadline, so the
agent hands such a job over right after its next save instead. It scans the checkpoint dir every
`handover_scan_seconds` (names, sizes, mtimes; not the progress file) and hands over once the dir has
changed and then stayed still for `handover_quiet_seconds`, or, if the job does not save, after
`checkpoint.interval_minutes` + HANDOVER_SAVE_SLACK_SECONDS (not while the dir is changing, unless it
never stops: then HANDOVER_SAVE_SLACK_SECONDS later, within reconcile's handover limit). The final
checkpoint is taken of the dir as the job saved it, and only then is the job killed: a SIGTERM would set
it writing with no grace to finish. The job keeps working meanwhile; a request withdrawn meanwhile (the
standby went away) is dropped and the job goes on.

The migration is make-before-break: reconcile first launches the spot instance as a standby attempt
(its record names the attempt it replaces in `handover_from` and has no task token), and asks the
old attempt to migrate only once the standby is running. The standby's agent waits for the token
longer than a fresh launch's `attempt_record_wait_seconds`: up to `standby_wait_seconds` from when it
first saw the standby record (the control plane gives up on a standby 30 minutes after it is running).
Launch writes the token once Recover has closed the old attempt, which happens only after its agent
failed the task with Migrating, and that agent commits its final checkpoint before it fails the task:
so when the token appears, the pointer already names the old attempt's final checkpoint and the
standby restores it as any new attempt does (no wait on the previous attempt: it was not interrupted).
A standby whose record is closed while it waits (the control plane gave up on it) never starts the job.

Racing attempts: the pointer only moves forward in (attempt, seq), so an old instance's late upload
never moves it back. And before it restores, a new attempt waits while the previous attempt is
interrupted (`interrupted_at` set) and its final checkpoint is not committed - the pointer is older
than that attempt, or names one of its periodic checkpoints (manifests of final checkpoints say
`final: true`) - up to `previous_checkpoint_wait_seconds` after the notice (the old instance is gone
two minutes after it), so it resumes from the final checkpoint, not from the one before.

The agent takes its collaborators as arguments (the DynamoDB store, the S3 storage, the task-token
reporter, the instance metadata, the job runner), so tests drive it with moto and an IMDS stub.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from spotrelay.agent.checkpointer import (
    CheckpointCancelled,
    Checkpointer,
    CheckpointerState,
    CheckpointResult,
    CheckpointTampered,
    CheckpointUnstable,
)
from spotrelay.agent.checkpoints import (
    DEFAULT_REFRESH_AFTER,
    PROGRESS_FILE_NAME,
    scan_checkpoint_dir,
    tail_lines,
)
from spotrelay.agent.confined import ConfinedDir, RestoreIncomplete, open_directory
from spotrelay.agent.imds import ImdsError
from spotrelay.agent.logs import JobLogger
from spotrelay.agent.ports import AgentStore, CheckpointIntegrityError, CheckpointStorage, InstanceMetadata, TaskTokens
from spotrelay.agent.runner import (
    JobHandle,
    JobRunner,
    JobUser,
    JobVanished,
    Runner,
    container_name,
    job_command,
    job_environment,
)
from spotrelay.agent.state import DEFAULT_STATE_DIR, AgentState, NoticeRecord, Outcome, OutcomeKind, StateFile
from spotrelay.clock import SYSTEM_CLOCK, ClockThread, WaitingClock
from spotrelay.config import ERROR_CHECKPOINT_CORRUPT, ERROR_JOB_FAILED, ERROR_MIGRATING, ERROR_SPOT_INTERRUPTED
from spotrelay.control.ports import CheckpointPointer, NotFoundError
from spotrelay.models import Attempt, Job, JobSpec, Market

_Read = TypeVar("_Read")
_Result = TypeVar("_Result")
EXIT_POLL_SECONDS = 0.05  # how often the exit of a signalled job is checked
OUTPUT_BYTES_PER_TICK = 4 * 1024 * 1024  # the job's output forwarded per poll, at most
IMDS_ERROR_LOG_SECONDS = 60
# How long a standby attempt's agent waits to be handed the job (its task token); the control plane gives
# up on a standby (terminates it and closes its attempt) 30 minutes after the instance is running.
STANDBY_WAIT_SECONDS = 1800.0


# --- ports ------------------------------------------------------------------------------------------


# The agent's last line about its report: heard, or the control plane had closed the attempt's task first
# (it handled an interruption), which is expected, not an error. A finished job's work is then committed
# as the attempt's final checkpoint, so the next attempt resumes from the end.
REPORTED = "reported on the task token"
CLOSED_FIRST_KEPT = "the control plane closed this attempt first: its finished work is kept as the final checkpoint"
CLOSED_FIRST = "the control plane closed this attempt first: nothing more to report"


# --- settings and results ---------------------------------------------------------------------------


# A job that saves only on its own schedule is handed over after its next save, or after its checkpoint
# interval and this much more at the latest.
HANDOVER_SAVE_SLACK_SECONDS = 300.0


@dataclass
class _DeferredHandover:
    requested_at: datetime
    deadline: float  # the clock's monotonic(): hand over by then, unless the job is in the middle of a save
    signature: tuple[tuple[str, int, int], ...]  # the checkpoint dir as last seen
    last_scan: float
    changed_at: float | None = None  # when the dir was last seen changing since the request


# Heartbeats within one Run task heartbeat timeout: three can fail in a row (a throttled or unreachable
# Step Functions endpoint) before the silence counts as the worker's death
HEARTBEATS_PER_TIMEOUT = 4
HEARTBEAT_SECONDS_UNKNOWN_TIMEOUT = 60.0  # an attempt record from a Launch that did not record the timeout


def heartbeat_interval(configured: float | None, timeout_seconds: int | None) -> float:
    """Seconds between heartbeats: as configured, else a quarter of the Run task's heartbeat timeout."""
    if configured is not None:
        return configured
    if timeout_seconds is None:
        return HEARTBEAT_SECONDS_UNKNOWN_TIMEOUT
    return timeout_seconds / HEARTBEATS_PER_TIMEOUT


class AgentSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    state_dir: Path = DEFAULT_STATE_DIR
    poll_seconds: float = Field(default=5.0, gt=0)
    heartbeat_seconds: float | None = Field(
        default=None,
        gt=0,
        description="how often the task token is heartbeaten; None: paced by the Run task's heartbeat timeout "
        "that Launch records with the attempt (HEARTBEATS_PER_TIMEOUT beats within it)",
    )
    handover_scan_seconds: float = Field(
        default=10.0, gt=0, description="how often the checkpoint dir is scanned for a save (deferred handover)"
    )
    handover_quiet_seconds: float = Field(
        default=15.0, ge=0, description="how long the checkpoint dir must stay unchanged after a save"
    )
    migrate_poll_seconds: float = Field(
        default=60.0, gt=0, description="how often the attempt record is read for a migration request"
    )
    previous_checkpoint_wait_seconds: float = Field(default=150.0, ge=0)
    attempt_record_wait_seconds: float = Field(default=300.0, ge=0)
    standby_wait_seconds: float = Field(
        default=STANDBY_WAIT_SECONDS,
        ge=0,
        description="how long a standby attempt waits for its job to be handed over, from its first read",
    )
    checkpoint_dir: Path | None = Field(default=None, description="instead of the spec's checkpoint.dir")
    refresh_after: timedelta | None = DEFAULT_REFRESH_AFTER
    log_tail_lines: int = Field(default=20, ge=0)
    kill_wait_seconds: float = Field(default=10.0, gt=0)
    job_user: JobUser | None = Field(default=None, description="who the job runs as (None: as the agent)")


class AgentResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    outcome: Outcome | None  # None: the agent was stopped and left the job running (re-attach later)
    already_reported: bool = False
    reattached: bool = False
    restored: tuple[int, int] | None = None  # (attempt, seq) of the checkpoint restored
    checkpoints: tuple[CheckpointResult, ...] = ()


class AgentError(Exception):
    """The agent cannot go on (no attempt record, no task token): exit non-zero, systemd retries."""


class AgentStopped(Exception):
    """`Agent.stop()` was called: leave the job running, keep the state file, return."""


@dataclass(frozen=True)
class _Exited:
    exit_code: int


@dataclass(frozen=True)
class _Vanished:
    reason: str


@dataclass(frozen=True)
class _Interrupted:
    notice: NoticeRecord
    exit_code: int | None
    checkpoint: CheckpointResult | None


class _OutputTail:
    """Forwards the job's new log lines to the agent's log."""

    def __init__(self, path: Path, log: JobLogger, from_end: bool, start: int | None = None) -> None:
        self.path = path
        self.log = log
        self.offset = start if start is not None else path.stat().st_size if from_end and path.exists() else 0
        self.partial = b""

    def forward(self, limit: int = OUTPUT_BYTES_PER_TICK) -> None:
        try:
            with self.path.open("rb") as f:
                if os.fstat(f.fileno()).st_size < self.offset:  # truncated under us: read it from the start
                    self.offset, self.partial = 0, b""
                f.seek(self.offset)
                data = f.read(limit)
        except OSError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            self.log.info("job output", extra={"line": line.decode("utf-8", errors="replace")[:4000]})

    def forward_complete_lines(self) -> int:
        """Forward every complete line written so far; returns the offset of the first byte not forwarded
        (a line the job is still writing is left for whoever reads on)."""
        for _ in range(4):  # bounded: at most 16 MiB
            before = self.offset
            self.forward()
            if self.offset == before:
                break
        return self.offset - len(self.partial)

    def drain(self) -> None:
        """Forward everything, a last line without its newline too (the job has ended)."""
        self.forward_complete_lines()
        if self.partial:
            self.log.info("job output", extra={"line": self.partial.decode("utf-8", errors="replace")[:4000]})
            self.partial = b""


def give_to(directory: Path, user: JobUser, chown: Callable[..., None] = os.chown) -> None:
    """Make the checkpoint dir (and what a restore put there) the job user's. Each entry is changed by
    its name in its directory's fd, a symlink itself and never what it points at, and the walk never
    follows one (`spotrelay.agent.confined`): a directory the job swaps for a symlink meanwhile cannot
    hand it a file of root's."""
    with ConfinedDir.open(directory, job_uid=user.uid) as root:
        chown(root.fd, user.uid, user.gid)
        for entry in root.walk():
            with contextlib.suppress(FileNotFoundError):  # removed since the walk saw it
                chown(entry.name, user.uid, user.gid, dir_fd=entry.dir_fd, follow_symlinks=False)


# --- the agent --------------------------------------------------------------------------------------


class Agent:
    def __init__(
        self,
        *,
        job_id: str,
        attempt: int,
        store: AgentStore,
        storage: CheckpointStorage,
        tokens: TaskTokens,
        metadata: InstanceMetadata,
        settings: AgentSettings | None = None,
        runner: Runner | None = None,
        clock: WaitingClock = SYSTEM_CLOCK,
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.store = store
        self.storage = storage
        self.tokens = tokens
        self.metadata = metadata
        self.settings = settings or AgentSettings()
        self.runner: Runner = runner or JobRunner(user=self.settings.job_user)
        self.clock = clock
        self.log = JobLogger(job_id, attempt)
        self.state_file = StateFile(self.settings.state_dir, job_id, attempt)
        self.state = AgentState(job_id=job_id, attempt=attempt)
        self._state_lock = threading.Lock()  # held for a copy and a file write only, never across a wait
        self._stop = clock.event()
        self._heartbeat_every = HEARTBEAT_SECONDS_UNKNOWN_TIMEOUT
        self._heartbeat_stop = clock.event()
        self._heartbeats: ClockThread | None = None
        self._in_flight: Future[CheckpointResult] | None = None
        self._in_flight_thread: ClockThread | None = None
        self._in_flight_cancel = clock.event()
        self._next_periodic = 0.0
        self._migrate_read: Future[Attempt] | None = None
        self._may_be_asked_to_migrate = True
        self._next_migrate_read = 0.0
        self._handover: _DeferredHandover | None = None  # a migration waiting for the job's next save
        self._request_withdrawn = False  # the latest read of the record found no migration request
        self._results: list[CheckpointResult] = []
        self._imds_errors: dict[str, float] = {}  # error -> when it was last logged
        self._finality: dict[str, bool] = {}  # manifest key -> is it an attempt's final checkpoint
        self.spec: JobSpec | None = None
        self.checkpointer: Checkpointer | None = None
        self._output: _OutputTail | None = None

    # --- control ------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Leave at the next poll with the job still running (SIGTERM to the agent, or a test)."""
        self._stop.set()

    def run(self) -> AgentResult:
        loaded = self.state_file.load()
        if loaded is not None and loaded.outcome is not None:
            self.log.info("outcome already reported: nothing to do", extra={"outcome": loaded.outcome.kind})
            return AgentResult(outcome=loaded.outcome, already_reported=True)
        if loaded is not None:
            self.state = loaded
        try:
            job, _ = self.store.get_job(self.job_id)
        except NotFoundError as e:
            raise AgentError(f"job {self.job_id} is not in the table") from e
        self.spec = job.spec
        checkpoint_dir = self.settings.checkpoint_dir or Path(job.spec.checkpoint.dir)
        self.checkpointer = Checkpointer(
            job_id=self.job_id,
            attempt=self.attempt,
            checkpoint_dir=checkpoint_dir,
            storage=self.storage,
            pointers=self.store,
            state=self.state.checkpoints.model_copy(deep=True),  # the checkpointer's own, saved as snapshots
            persist=self._save_checkpoints,
            refresh_after=self.settings.refresh_after,
            clock=self.clock.now,
            monotonic=self.clock.monotonic,
            job_uid=self.settings.job_user.uid if self.settings.job_user is not None else None,
            log=self.log,
        )
        record = self._wait_for_attempt_record()
        # Only an on-demand attempt is ever asked to migrate (reconcile moves jobs from on-demand back to
        # spot: spotrelay/control/reconcile.py), so only its agent reads its record for a request.
        self._may_be_asked_to_migrate = record.pool.market is Market.ON_DEMAND
        if self.state.process is None or record.task_token is None:
            stale = self._stale(job, record)
            if stale is not None:
                self.log.warning("not starting the job", extra={"reason": stale})
                outcome = Outcome(kind="stale", cause={"reason": stale}, reported_at=self.clock.now())
                self._update(outcome=outcome)
                return AgentResult(outcome=outcome)
        token = record.task_token
        assert token is not None  # a record without one comes back only closed: stale above
        self._heartbeat_every = heartbeat_interval(self.settings.heartbeat_seconds, record.heartbeat_timeout_seconds)
        self._start_heartbeats(token)
        try:
            return self._run(token)
        except AgentStopped:
            if self._output is not None:  # what the job printed so far goes out; the next agent goes on from here
                self._update(output_forwarded=self._output.forward_complete_lines())
            self.log.info("agent stopped; the job keeps running and the next agent re-attaches")
            return AgentResult(outcome=None, checkpoints=tuple(self._results))
        finally:
            self._stop_heartbeats()
            self._in_flight_cancel.set()
            if self._in_flight_thread is not None:
                self._in_flight_thread.join()  # a cancelled upload stops at its next file
            # a record read in flight is left to finish on its own: its answer is not needed any more

    def _run(self, token: str) -> AgentResult:
        assert self.checkpointer is not None
        restored: tuple[int, int] | None = None
        reattached = self.state.process is not None
        if self.state.process is None:
            self._wait_for_previous_attempt()
            pointer = self.store.get_checkpoint(self.job_id)
            try:
                manifest = self.checkpointer.restore(pointer)
            except CheckpointIntegrityError as e:
                self.log.error(
                    "the checkpoint fails verification: not resuming from it", extra={"problems": e.problems}
                )
                cause = {"attempt": self.attempt, "checkpoint": e.where, "problems": e.problems[:20]}
                return self._finish(token, "corrupt", ERROR_CHECKPOINT_CORRUPT, cause)
            except RestoreIncomplete as e:
                # The checkpoint in S3 is intact: a new attempt restores it (JobFailed: a restart, bounded by
                # max_restarts). Starting here from a part of it or from scratch would lose or corrupt work.
                self.log.warning(
                    "the checkpoint could not be restored: not starting the job",
                    extra={"path": e.path, "what": e.why, "partial": e.partial},
                )
                cause = {
                    "attempt": self.attempt,
                    "error": f"the checkpoint could not be restored: {e}"[:1000],
                    "path": e.path,
                    "partial": e.partial,
                }
                return self._finish(token, "failed", ERROR_JOB_FAILED, cause)
            if manifest is not None:
                restored = (manifest.attempt, manifest.seq)
                self.log.info(
                    "checkpoint restored",
                    extra={
                        "checkpoint": f"{manifest.attempt}-{manifest.seq}",
                        "files": len(manifest.files),
                        "bytes": manifest.total_bytes,
                        "work_done_hours": manifest.work_done_hours,
                    },
                )
            self.checkpointer.follow_pointer(pointer)
            # A checkpoint of an empty dir (an attempt interrupted before its job saved anything) leaves the job
            # nothing to resume from: it starts afresh (SPOTRELAY_RESUMED=0), as a job told to resume from an
            # empty dir may rightly refuse to
            resumed = manifest is not None and bool(manifest.files)
            try:
                job = self._start_job(resumed=resumed)
            except (OSError, ValueError) as e:
                # The job cannot start here (its checkpoint dir cannot be made, its command cannot be run):
                # the job's to fix, so JobFailed (a restart, bounded by max_restarts). Crashing instead would
                # have systemd restart the agent into the same failure while the instance runs on.
                self.log.error("the job could not start", extra={"error": f"{type(e).__name__}: {e}"})
                cause = {"attempt": self.attempt, "error": f"the job could not start: {type(e).__name__}: {e}"[:1000]}
                return self._finish(token, "failed", ERROR_JOB_FAILED, cause)
            self._update(process=job.record, resumed=resumed)
            self._output = _OutputTail(job.record.log_file, self.log, from_end=False)
        else:
            assert self.state.process is not None
            job = self.runner.attach(self.state.process)
            forwarded = self.state.output_forwarded
            self._output = _OutputTail(job.record.log_file, self.log, from_end=True, start=forwarded)
            if forwarded is not None:
                # Once the lines printed while no agent ran are forwarded, a crash starts from the end again.
                self._output.forward_complete_lines()
                self._update(output_forwarded=None)
            stopping = self.state.notice.reason if self.state.notice is not None else None
            self.log.info("re-attached to the running job", extra={"pid": job.pid, "stopping_for": stopping})

        ended = self._interrupt(job, self.state.notice) if self.state.notice is not None else self._watch(job)
        self._output.drain()
        result = self._report(token, ended)
        return result.model_copy(update={"restored": restored, "reattached": reattached})

    # --- before the job -----------------------------------------------------------------------------

    def _wait_for_attempt_record(self) -> Attempt:
        """The attempt record with its task token: launch writes it right after RunInstances returns,
        so an agent that boots fast may look before it exists (up to `attempt_record_wait_seconds`).

        A standby attempt (launched ahead of a migration: `handover_from` set, no token yet) gets its
        token only once the attempt it replaces has handed the job back, so it waits longer: up to
        `standby_wait_seconds` from when it first saw its record as a standby, and a checkpoint interval
        more for a job that saves only on its own schedule (the old attempt hands over after its next save).

        A record that is closed (an outcome) before it has a token is returned as it is: it will never
        get one (the control plane gave up on the standby). `run` then takes the stale path: the job is
        not started, the outcome `stale` is kept in the state file and the agent exits 0, so systemd does
        not restart it and a restarted agent does nothing. No record, or no token in time, is an
        AgentError (exit non-zero: systemd restarts the agent)."""
        deadline = self.clock.monotonic() + self.settings.attempt_record_wait_seconds
        standby_since: float | None = None
        assert self.spec is not None
        standby_wait = self.settings.standby_wait_seconds + (
            self.spec.checkpoint.interval_minutes * 60 if self.spec.checkpoint.grace_seconds == 0 else 0.0
        )
        while True:
            try:
                record = self.store.get_attempt(self.job_id, self.attempt)
            except NotFoundError:
                record = None
            if record is not None and (record.task_token or record.outcome is not None):
                return record
            if record is not None and record.handover_from is not None and standby_since is None:
                standby_since = self.clock.monotonic()
                deadline = max(deadline, standby_since + standby_wait)
                self.log.info(
                    "standby: waiting for the previous attempt's job to be handed over",
                    extra={
                        "handover_from": record.handover_from,
                        "wait_seconds": round(deadline - standby_since, 1),
                    },
                )
            if self.clock.monotonic() >= deadline:
                if standby_since is not None:
                    raise AgentError(
                        f"standby attempt {self.attempt} of job {self.job_id} was not handed the job "
                        f"within {standby_wait:g} s"
                    )
                raise AgentError(f"attempt {self.attempt} of job {self.job_id} has no record with a task token")
            if self._stop.wait(self.settings.poll_seconds):
                raise AgentError("stopped while waiting for the attempt record")

    def _stale(self, job: Job, record: Attempt) -> str | None:
        if job.cancel_requested or job.state.is_terminal:
            return f"the job is {job.state}{' (cancel requested)' if job.cancel_requested else ''}"
        if record.outcome is not None:
            return f"attempt {self.attempt} has already ended ({record.outcome})"
        return None

    def _wait_for_previous_attempt(self) -> None:
        """Wait while the previous attempt is interrupted and its final checkpoint is not committed:
        the pointer is older than that attempt, or names one of its checkpoints that is not the
        final one (its manifest says). Bounded by `previous_checkpoint_wait_seconds` after its notice."""
        if self.attempt <= 1:
            return
        try:
            previous = self.store.get_attempt(self.job_id, self.attempt - 1)
        except NotFoundError:
            return
        if previous.interrupted_at is None:
            return
        deadline = previous.interrupted_at + timedelta(seconds=self.settings.previous_checkpoint_wait_seconds)
        announced = False
        while True:
            pointer = self.store.get_checkpoint(self.job_id)
            if pointer is not None and self._after_final_of(previous.attempt, pointer):
                if announced:
                    self.log.info(
                        "the previous attempt's final checkpoint is committed",
                        extra={"checkpoint": f"{pointer.attempt}-{pointer.seq}"},
                    )
                return
            remaining = (deadline - self.clock.now()).total_seconds()
            if remaining <= 0:
                self.log.warning(
                    "the previous attempt committed no final checkpoint in time: restoring the latest there is",
                    extra={"previous_attempt": previous.attempt, "interrupted_at": previous.interrupted_at.isoformat()},
                )
                return
            if not announced:
                self.log.info(
                    "waiting for the interrupted previous attempt's final checkpoint",
                    extra={"previous_attempt": previous.attempt, "wait_seconds": round(remaining, 1)},
                )
                announced = True
            if self._stop.wait(min(self.settings.poll_seconds, remaining)):
                raise AgentStopped

    def _after_final_of(self, attempt: int, pointer: CheckpointPointer) -> bool:
        """Whether the pointer is at or past `attempt`'s final checkpoint."""
        if pointer.attempt != attempt:
            return pointer.attempt > attempt
        if pointer.manifest_key not in self._finality:
            try:
                self._finality[pointer.manifest_key] = self.storage.read_manifest(pointer.manifest_key).final
            except CheckpointIntegrityError:
                return True  # nothing to wait for: the restore reports it
        return self._finality[pointer.manifest_key]

    def _start_job(self, *, resumed: bool) -> JobHandle:
        assert self.spec is not None
        assert self.checkpointer is not None
        run = self.spec.run
        checkpoint_dir = self.checkpointer.dir
        user = self.settings.job_user
        os.close(open_directory(checkpoint_dir, job_uid=self.checkpointer.job_uid, create=True))  # never via a link
        if user is not None:
            give_to(checkpoint_dir, user)
        env = job_environment(
            run,
            job_id=self.job_id,
            attempt=self.attempt,
            checkpoint_dir=checkpoint_dir,
            resumed=resumed,
            progress_file=checkpoint_dir / PROGRESS_FILE_NAME,
            user=user,
        )
        argv = job_command(run, job_id=self.job_id, attempt=self.attempt, checkpoint_dir=checkpoint_dir, user=user)
        exit_file, log_file = self.state_file.job_files()
        job = self.runner.start(
            argv,
            env,
            exit_file=exit_file,
            log_file=log_file,
            started_at=self.clock.now(),
            container=container_name(self.job_id, self.attempt) if run.image is not None else None,
        )
        self.log.info(
            "job started",
            extra={"pid": job.pid, "resumed": resumed, "container": run.image is not None, "log_file": str(log_file)},
        )
        return job

    # --- while the job runs -------------------------------------------------------------------------

    def _watch(self, job: JobHandle) -> _Exited | _Vanished | _Interrupted:
        assert self.spec is not None
        assert self._output is not None
        interval = self.spec.checkpoint.interval_minutes * 60
        self._next_periodic = self.clock.monotonic() + interval
        pending: str | None = None
        while True:
            if self._collect_background():
                self._next_periodic = self.clock.monotonic() + interval  # counted from the end of the last one
            self._output.forward()
            try:
                code = job.exit_code()
            except JobVanished as e:
                self._drop_background()
                return _Vanished(str(e))
            if code is not None:
                self._drop_background()
                return _Exited(code)
            action = self._poll_imds(self.metadata.instance_action)
            if action is not None:
                notice = NoticeRecord(action=action.action, time=action.time, seen_at=self.clock.now())
                self._update(notice=notice)
                return self._interrupt(job, notice)
            requested_at = self._handover_due(self._migration_requested() if self._may_be_asked_to_migrate else None)
            if requested_at is not None:
                notice = NoticeRecord(
                    action="migrate", time=requested_at.isoformat(), seen_at=self.clock.now(), reason="migrate"
                )
                self._update(notice=notice)
                return self._interrupt(job, notice)
            rebalance = self._poll_imds(self.metadata.rebalance_recommendation)
            if rebalance is not None and rebalance.notice_time != self.state.rebalance_handled:
                self.log.info(
                    "rebalance recommendation: checkpointing early", extra={"notice_time": rebalance.notice_time}
                )
                self._update(rebalance_handled=rebalance.notice_time)
                pending = "rebalance"
            if pending is None and self._in_flight is None and self.clock.monotonic() >= self._next_periodic:
                pending = "periodic"
            if pending is not None and self._in_flight is None:
                self._start_background(pending)
                pending = None
            if self._stop.wait(self.settings.poll_seconds):
                raise AgentStopped

    def _poll_imds(self, read: Callable[[], _Read]) -> _Read | None:
        """IMDS's answer; None when IMDS does not answer (logged at most once a minute per error)."""
        try:
            return read()
        except ImdsError as e:
            now = self.clock.monotonic()
            if now - self._imds_errors.get(str(e), -IMDS_ERROR_LOG_SECONDS) >= IMDS_ERROR_LOG_SECONDS:
                self.log.warning("IMDS did not answer", extra={"error": str(e)})
                self._imds_errors[str(e)] = now
            return None

    def _handover_due(self, requested_at: datetime | None) -> datetime | None:
        """When to stop for a migration: at once, or for a job that saves only on its own schedule (no grace
        at a notice) once it has saved (module docstring). A deferred handover whose request is withdrawn
        (its standby went away) is dropped: the job goes on here."""
        assert self.spec is not None
        handover = self._handover
        if handover is None:
            if requested_at is None:
                return None
            if self.spec.checkpoint.grace_seconds > 0:
                return requested_at
            wait = self.spec.checkpoint.interval_minutes * 60 + HANDOVER_SAVE_SLACK_SECONDS
            now = self.clock.monotonic()
            self._handover = _DeferredHandover(
                requested_at=requested_at,
                deadline=now + wait,
                signature=self._checkpoint_dir_signature(),
                last_scan=now,
            )
            self._request_withdrawn = False
            self.log.info(
                "migration back to spot requested: handing over after the job's next save",
                extra={"requested_at": requested_at.isoformat(), "wait_seconds": wait},
            )
            return None
        if self._request_withdrawn:
            self.log.info("the handover request was withdrawn: the job goes on here")
            self._handover = None
            return None
        now = self.clock.monotonic()
        if now - handover.last_scan < self.settings.handover_scan_seconds:
            return None
        handover.last_scan = now
        signature = self._checkpoint_dir_signature()
        if signature != handover.signature:
            handover.signature, handover.changed_at = signature, now  # being written: wait for it to settle
            return None
        settled = handover.changed_at is not None and now - handover.changed_at >= self.settings.handover_quiet_seconds
        if settled:
            return handover.requested_at
        if now >= handover.deadline and (handover.changed_at is None or settled):
            self.log.warning("the job has not saved in time: handing over now")
            return handover.requested_at
        if now >= handover.deadline + HANDOVER_SAVE_SLACK_SECONDS:
            # a dir that never holds still (a job logging into it): hand over within reconcile's limit
            self.log.warning("the checkpoint dir keeps changing: handing over now")
            return handover.requested_at
        return None

    def _checkpoint_dir_signature(self) -> tuple[tuple[str, int, int], ...]:
        """The job's own files in the checkpoint dir (names, sizes, mtimes), without the progress file
        (rewritten at every step, not a save). A scan that fails is no change."""
        assert self.checkpointer is not None
        try:
            files = scan_checkpoint_dir(self.checkpointer.dir, job_uid=self.checkpointer.job_uid)
        except OSError:
            return self._handover.signature if self._handover is not None else ()
        return tuple(sorted((f.path, f.size, f.mtime_ns) for path, f in files.items() if path != PROGRESS_FILE_NAME))

    def _migration_requested(self) -> datetime | None:
        """The attempt record's `migrate_requested_at` once a read finds it set. The record is read on
        its own thread every `migrate_poll_seconds` (the first read at once); a failed read is logged
        and the next one is due `migrate_poll_seconds` later."""
        read = self._migrate_read
        if read is not None:
            if not read.done():
                return None
            self._migrate_read = None
            try:
                record = read.result()
            except Exception as e:
                self.log.warning(
                    "could not read the attempt record for a migration request: trying again later",
                    extra={"error": f"{type(e).__name__}: {e}", "retry_in_seconds": self.settings.migrate_poll_seconds},
                )
                return None
            self._request_withdrawn = record.migrate_requested_at is None
            if record.migrate_requested_at is not None:
                return record.migrate_requested_at
        now = self.clock.monotonic()
        if self._migrate_read is None and now >= self._next_migrate_read:
            self._next_migrate_read = now + self.settings.migrate_poll_seconds
            self._migrate_read, _ = self._on_thread(
                "attempt-record", lambda: self.store.get_attempt(self.job_id, self.attempt)
            )
        return None

    def _on_thread(self, name: str, work: Callable[[], _Result]) -> tuple[Future[_Result], ClockThread]:
        """Run `work` on a thread of the agent's clock; its result (or exception) in the future."""
        future: Future[_Result] = Future()

        def run() -> None:
            try:
                result = work()
            except Exception as e:
                future.set_exception(e)
            else:
                future.set_result(result)

        return future, self.clock.start_thread(f"{name} {self.job_id}/{self.attempt}", run)

    def _start_background(self, reason: str) -> None:
        assert self.checkpointer is not None
        self._in_flight_cancel = self.clock.event()
        cancel = self._in_flight_cancel
        checkpointer = self.checkpointer
        self.log.info("checkpoint started", extra={"reason": reason})
        self._in_flight, self._in_flight_thread = self._on_thread(
            "checkpoint", lambda: checkpointer.take(reason, cancel=cancel)
        )

    def _collect_background(self, wait: bool = False) -> bool:
        """Log the background checkpoint's result once it is done; True if one finished."""
        future = self._in_flight
        if future is None or (not wait and not future.done()):
            return False
        if wait and self._in_flight_thread is not None:
            self._in_flight_thread.join()  # on the clock: the upload's thread needs it to finish
        self._in_flight = None
        try:
            result = future.result()
        except CheckpointTampered as e:
            self.log.warning("checkpoint dropped", extra={"reason": str(e), "path": e.path, "what": e.why})
            return True
        except (CheckpointCancelled, CheckpointUnstable) as e:
            self.log.info("checkpoint dropped", extra={"reason": str(e)})
            return True
        except Exception:
            self.log.exception("checkpoint failed; the next one will try again")
            return True
        self._log_checkpoint(result)
        return True

    def _drop_background(self) -> None:
        """Cancel a periodic checkpoint in flight and wait for it to stop."""
        if self._in_flight is not None:
            self._in_flight_cancel.set()
            self._collect_background(wait=True)

    def _log_checkpoint(self, result: CheckpointResult) -> None:
        self._results.append(result)
        if result.skipped is not None:
            self.log.info("checkpoint skipped", extra={"reason": result.reason, "why": result.skipped})
            return
        self.log.info(
            "checkpoint committed" if result.committed else "checkpoint written but not committed: a newer one exists",
            extra={
                "reason": result.reason,
                "seq": result.seq,
                "files": result.files,
                "uploaded_files": len(result.uploaded),
                "uploaded_bytes": result.uploaded_bytes,
                "copied_files": len(result.copied),
                "reused_files": result.reused,
                "total_bytes": result.total_bytes,
                "work_done_hours": result.work_done_hours,
                "seconds": result.seconds,
            },
        )

    # --- the notice ---------------------------------------------------------------------------------

    def _interrupt(self, job: JobHandle, notice: NoticeRecord) -> _Interrupted:
        assert self.spec is not None
        assert self.checkpointer is not None
        grace = self.spec.checkpoint.grace_seconds
        if notice.reason == "migrate":
            self.log.warning(
                "migration back to spot requested: stopping the job and checkpointing",
                extra={"requested_at": notice.time, "grace_seconds": grace},
            )
        else:
            self.log.warning(
                "spot interruption notice: stopping the job and checkpointing",
                extra={"action": notice.action, "action_time": notice.time, "grace_seconds": grace},
            )
        if notice.reason == "migrate" and grace == 0:
            return self._hand_over_as_saved(job, notice)
        ended, code = self._exit_status(job)
        if not ended:
            job.terminate()
            self.log.info("SIGTERM sent to the job", extra={"pid": job.pid})
            left = grace - (self.clock.now() - notice.seen_at).total_seconds()
            ended, code = self._wait_for_exit(job, left)
            if not ended:
                self.log.warning("the job did not exit within grace_seconds: SIGKILL", extra={"grace_seconds": grace})
                job.kill()
                ended, code = self._wait_for_exit(job, self.settings.kill_wait_seconds)
        self.log.info("the job has stopped", extra={"exit_code": code, "stopped": ended})
        if self._output is not None:
            self._output.drain()  # what it printed while saving goes out now, not after the upload
        self._drop_background()
        result = self._final_checkpoint()
        if result is not None:
            self._log_checkpoint(result)
        return _Interrupted(notice=notice, exit_code=code, checkpoint=result)

    def _checkpoint_the_end(self) -> None:
        """The job finished, but its task was closed first: an interruption warning that reached the control
        plane before this agent's next IMDS poll failed the task, and Recover now waits for this attempt's
        final checkpoint before the job goes on elsewhere (a cancel or a heartbeat timeout closes it too).
        The checkpoint dir as the job left it is that final checkpoint: the next attempt resumes from the
        finished state, not from the last periodic save."""
        if self.checkpointer is None:
            return
        self.log.warning("the job succeeded after its task was closed: checkpointing its final state")
        result = self._final_checkpoint()
        if result is not None:
            self._log_checkpoint(result)

    def _final_checkpoint(self) -> CheckpointResult | None:
        assert self.checkpointer is not None
        try:
            return self.checkpointer.take("final", final=True)
        except CheckpointTampered as e:
            self.log.warning("the final checkpoint failed", extra={"path": e.path, "what": e.why})
            return None
        except Exception:
            self.log.exception("the final checkpoint failed")
            return None

    def _hand_over_as_saved(self, job: JobHandle, notice: NoticeRecord) -> _Interrupted:
        """A job that saves only on its own schedule, handed over right after a save: the final checkpoint
        is taken of the dir as it saved it, and only then is the job killed (a SIGTERM would set it writing,
        and with no grace it would be killed mid-write)."""
        self._drop_background()
        result = self._final_checkpoint()
        ended, code = self._exit_status(job)
        if not ended:
            job.kill()
            ended, code = self._wait_for_exit(job, self.settings.kill_wait_seconds)
        self.log.info("the job has stopped", extra={"exit_code": code, "stopped": ended})
        if result is not None:
            self._log_checkpoint(result)
        return _Interrupted(notice=notice, exit_code=code, checkpoint=result)

    def _exit_status(self, job: JobHandle) -> tuple[bool, int | None]:
        try:
            code = job.exit_code()
        except JobVanished:
            return True, None
        return code is not None, code

    def _wait_for_exit(self, job: JobHandle, seconds: float) -> tuple[bool, int | None]:
        deadline = self.clock.monotonic() + max(0.0, seconds)
        while True:
            ended, code = self._exit_status(job)
            if ended or self.clock.monotonic() >= deadline:
                return ended, code
            if self._output is not None:
                self._output.forward()  # the job saving at a notice says so as it goes
            self.clock.sleep(EXIT_POLL_SECONDS)

    # --- the report ---------------------------------------------------------------------------------

    def _report(self, token: str, ended: _Exited | _Vanished | _Interrupted) -> AgentResult:
        if isinstance(ended, _Interrupted):
            checkpoint = ended.checkpoint
            cause: dict[str, Any] = {
                "attempt": self.attempt,
                "checkpoint_seq": checkpoint.seq if checkpoint is not None and checkpoint.committed else None,
                "committed": checkpoint is not None and checkpoint.committed,
                "exit_code": ended.exit_code,
            }
            if ended.notice.reason == "migrate":
                cause |= {"reason": "migrate", "requested_at": ended.notice.time}
                return self._finish(token, "migrated", ERROR_MIGRATING, cause, exit_code=ended.exit_code)
            cause |= {"instance_action": ended.notice.action, "action_time": ended.notice.time}
            return self._finish(token, "interrupted", ERROR_SPOT_INTERRUPTED, cause, exit_code=ended.exit_code)
        assert self._output is not None
        tail = "\n".join(tail_lines(self._output.path, self.settings.log_tail_lines))
        if isinstance(ended, _Vanished):
            cause = {"exit_code": None, "reason": ended.reason, "log_tail": tail}
            return self._finish(token, "vanished", ERROR_JOB_FAILED, cause)
        if ended.exit_code == 0:
            return self._finish(token, "succeeded", None, {"exit_code": 0}, exit_code=0)
        cause = {"exit_code": ended.exit_code, "log_tail": tail}
        return self._finish(token, "failed", ERROR_JOB_FAILED, cause, exit_code=ended.exit_code)

    def _finish(
        self,
        token: str,
        kind: OutcomeKind,
        error: str | None,
        cause: dict[str, Any],
        exit_code: int | None = None,
    ) -> AgentResult:
        self._stop_heartbeats()
        if error is None:
            accepted = self.tokens.succeed(token, cause)
            if not accepted:
                self._checkpoint_the_end()
        else:
            accepted = self.tokens.fail(token, error, json.dumps(cause, sort_keys=True))
        outcome = Outcome(
            kind=kind,
            exit_code=exit_code,
            error=error,
            cause=cause,
            token_accepted=accepted,
            reported_at=self.clock.now(),
        )
        self._update(outcome=outcome)
        self.log.info(
            REPORTED if accepted else (CLOSED_FIRST_KEPT if error is None else CLOSED_FIRST),
            extra={"outcome": kind, "error": error, "exit_code": exit_code},
        )
        return AgentResult(outcome=outcome, checkpoints=tuple(self._results))

    # --- heartbeats ---------------------------------------------------------------------------------

    def _start_heartbeats(self, token: str) -> None:
        self._heartbeat_stop.clear()
        self._heartbeats = self.clock.start_thread("heartbeat", lambda: self._heartbeat_loop(token))

    def _stop_heartbeats(self) -> None:
        self._heartbeat_stop.set()
        if self._heartbeats is not None:
            self._heartbeats.join(timeout=30)

    def _heartbeat_loop(self, token: str) -> None:
        while not self._heartbeat_stop.is_set():
            try:
                open_token = self.tokens.heartbeat(token)
            except Exception as e:
                self.log.warning("heartbeat failed", extra={"error": str(e)})
                open_token = True
            if not open_token:
                self.log.info("the task token is closed: no more heartbeats")
                return
            if self._heartbeat_stop.wait(self._heartbeat_every):
                return

    # --- state --------------------------------------------------------------------------------------

    def _update(self, **changes: Any) -> None:
        with self._state_lock:
            self.state = self.state.model_copy(update=changes)
            self.state_file.save(self.state)

    def _save_checkpoints(self, checkpoints: CheckpointerState) -> None:
        self._update(checkpoints=checkpoints)
