"""What comes before the job runs: the attempt record with its task token (a standby's wait to be handed
the job included), the previous attempt's final checkpoint, and the start of the job itself.

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

One concern of the worker agent (`spotrelay.agent.agent`: `Agent.run` and `Agent._run` call these before
the loop); its siblings are `heartbeat`, `handover` (the old attempt's side of a migration), `background`,
`output` and `settings`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from spotrelay.agent.checkpoint_contents import PROGRESS_FILE_NAME
from spotrelay.agent.checkpointer import Checkpointer
from spotrelay.agent.confined import ConfinedDir, open_directory
from spotrelay.agent.logs import JobLogger
from spotrelay.agent.ports import AgentStore, CheckpointIntegrityError, CheckpointStorage
from spotrelay.agent.runner import JobHandle, JobUser, Runner, container_name, job_command, job_environment
from spotrelay.agent.settings import AgentError, AgentSettings, AgentStopped
from spotrelay.agent.state import StateFile
from spotrelay.clock import ClockEvent, WaitingClock
from spotrelay.control.ports import CheckpointPointer, NotFoundError
from spotrelay.models import Attempt, Job, JobSpec


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


class BeforeTheJob:
    """The waits and the job's start of `spotrelay.agent.agent.Agent` (a mixin: `Agent.__init__` sets the
    attributes)."""

    job_id: str
    attempt: int
    store: AgentStore
    storage: CheckpointStorage
    settings: AgentSettings
    runner: Runner
    clock: WaitingClock
    log: JobLogger
    state_file: StateFile
    spec: JobSpec | None
    checkpointer: Checkpointer | None
    _stop: ClockEvent
    _finality: dict[str, bool]

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
