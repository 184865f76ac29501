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

The modules of the agent, one concern each (this one holds `Agent`: its loop, the notice and the report):
- `spotrelay.agent.startup`: before the job runs - the attempt record and its token (a standby's wait,
  make-before-break migration), the wait on an interrupted previous attempt's final checkpoint (racing
  attempts), the job's start (`give_to`);
- `spotrelay.agent.heartbeat`: the heartbeat thread and its pace (`heartbeat_interval`);
- `spotrelay.agent.background`: periodic and rebalance checkpoints on a thread of their own, so the loop
  keeps polling IMDS while a large upload is in flight;
- `spotrelay.agent.handover`: migration back to spot - the attempt record read for a request on a thread of
  its own, and the deferred handover of a job that saves only on its own schedule;
- `spotrelay.agent.output`: the job's log lines forwarded to the agent's log;
- `spotrelay.agent.settings`: `AgentSettings`, `AgentResult`, `AgentError`, `AgentStopped`.
`Agent` takes the parts above as mixins (their methods on `self`, their state set in `Agent.__init__`).

The agent takes its collaborators as arguments (the DynamoDB store, the S3 storage, the task-token
reporter, the instance metadata, the job runner), so tests drive it with moto and an IMDS stub.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from spotrelay.agent.background import BackgroundCheckpoints
from spotrelay.agent.checkpoint_contents import tail_lines
from spotrelay.agent.checkpointer import Checkpointer, CheckpointerState, CheckpointResult, CheckpointTampered
from spotrelay.agent.confined import RestoreIncomplete
from spotrelay.agent.handover import HANDOVER_SAVE_SLACK_SECONDS, DeferredHandover, MigrationHandover
from spotrelay.agent.heartbeat import (
    HEARTBEAT_SECONDS_UNKNOWN_TIMEOUT,
    HEARTBEATS_PER_TIMEOUT,
    Heartbeats,
    heartbeat_interval,
)
from spotrelay.agent.imds import ImdsError
from spotrelay.agent.logs import JobLogger
from spotrelay.agent.output import OUTPUT_BYTES_PER_TICK, OutputTail
from spotrelay.agent.ports import AgentStore, CheckpointIntegrityError, CheckpointStorage, InstanceMetadata, TaskTokens
from spotrelay.agent.runner import JobHandle, JobRunner, JobVanished, Runner
from spotrelay.agent.settings import STANDBY_WAIT_SECONDS, AgentError, AgentResult, AgentSettings, AgentStopped
from spotrelay.agent.startup import BeforeTheJob, give_to
from spotrelay.agent.state import AgentState, NoticeRecord, Outcome, OutcomeKind, StateFile
from spotrelay.clock import SYSTEM_CLOCK, ClockThread, WaitingClock
from spotrelay.config import ERROR_CHECKPOINT_CORRUPT, ERROR_JOB_FAILED, ERROR_MIGRATING, ERROR_SPOT_INTERRUPTED
from spotrelay.control.ports import NotFoundError
from spotrelay.models import Attempt, JobSpec, Market

__all__ = [
    "CLOSED_FIRST",
    "CLOSED_FIRST_KEPT",
    "EXIT_POLL_SECONDS",
    "HANDOVER_SAVE_SLACK_SECONDS",
    "HEARTBEATS_PER_TIMEOUT",
    "HEARTBEAT_SECONDS_UNKNOWN_TIMEOUT",
    "IMDS_ERROR_LOG_SECONDS",
    "OUTPUT_BYTES_PER_TICK",
    "REPORTED",
    "STANDBY_WAIT_SECONDS",
    "Agent",
    "AgentError",
    "AgentResult",
    "AgentSettings",
    "AgentStopped",
    "give_to",
    "heartbeat_interval",
]

_Read = TypeVar("_Read")
EXIT_POLL_SECONDS = 0.05  # how often the exit of a signalled job is checked
IMDS_ERROR_LOG_SECONDS = 60

# --- ports ------------------------------------------------------------------------------------------


# The agent's last line about its report: heard, or the control plane had closed the attempt's task first
# (it handled an interruption), which is expected, not an error. A finished job's work is then committed
# as the attempt's final checkpoint, so the next attempt resumes from the end.
REPORTED = "reported on the task token"
CLOSED_FIRST_KEPT = "the control plane closed this attempt first: its finished work is kept as the final checkpoint"
CLOSED_FIRST = "the control plane closed this attempt first: nothing more to report"


# --- results of the loop ----------------------------------------------------------------------------


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


# --- the agent --------------------------------------------------------------------------------------


class Agent(Heartbeats, BeforeTheJob, MigrationHandover, BackgroundCheckpoints):
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
        self._handover: DeferredHandover | None = None  # a migration waiting for the job's next save
        self._request_withdrawn = False  # the latest read of the record found no migration request
        self._results: list[CheckpointResult] = []
        self._imds_errors: dict[str, float] = {}  # error -> when it was last logged
        self._finality: dict[str, bool] = {}  # manifest key -> is it an attempt's final checkpoint
        self.spec: JobSpec | None = None
        self.checkpointer: Checkpointer | None = None
        self._output: OutputTail | None = None

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
            self._output = OutputTail(job.record.log_file, self.log, from_end=False)
        else:
            assert self.state.process is not None
            job = self.runner.attach(self.state.process)
            forwarded = self.state.output_forwarded
            self._output = OutputTail(job.record.log_file, self.log, from_end=True, start=forwarded)
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

    # --- state --------------------------------------------------------------------------------------

    def _update(self, **changes: Any) -> None:
        with self._state_lock:
            self.state = self.state.model_copy(update=changes)
            self.state_file.save(self.state)

    def _save_checkpoints(self, checkpoints: CheckpointerState) -> None:
        self._update(checkpoints=checkpoints)
