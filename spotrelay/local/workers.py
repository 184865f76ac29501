"""Simulated workers: what runs on each instance the market starts, on the virtual clock.

A worker plays the instance and its agent for one attempt:

    launch  --boot-->  `running` state change (EventBridge), the agent starts:
                       restore the pointer's checkpoint (the real `Checkpointer.restore`, verified)
    every checkpoint.interval_minutes: the simulated job writes its checkpoint dir (a small state
                       file and the progress file), the agent takes a periodic checkpoint (the real
                       `Checkpointer.take`: data, manifest, then the conditional pointer, into moto)
    every HEARTBEAT:   SendTaskHeartbeat on the attempt's task token (the real `StepFunctionsTaskTokens`)
    work done:         SendTaskSuccess {"exit_code": 0}; the instance is terminated by Finalize
                       (its `terminated` state change follows)
    a notice:          the job stops (SIGTERM) within its grace, the final checkpoint is committed
                       (final=True), SendTaskFailure SpotInterrupted; the instance ends 2 minutes
                       after the notice (`terminated` state change)
    a rebalance:       a checkpoint now
    a migration:       make-before-break. The control plane launches the spot instance first, as a
                       standby attempt (`handover_from` set, no task token); its worker boots, says
                       `running` and reads its attempt record every STANDBY_POLL while the old instance
                       keeps working. Seeing the standby running, the control plane sets
                       `migrate_requested_at` on the old attempt; at its next heartbeat or periodic
                       checkpoint the old worker reads its record (a job given no grace at a notice
                       only right after a periodic save) and stops as at a notice: the final
                       checkpoint (final=True), SendTaskFailure Migrating. Recover terminates the old
                       instance (its `terminated` state change follows; the market's two minutes do not
                       apply) and Launch writes the next Run task's token into the standby's record: at
                       its next read the standby restores the pointer's checkpoint (the old attempt's
                       final one) and runs the job from there. A standby whose record is closed, or that
                       gets no token within STANDBY_WAIT, stops reading and does nothing more (the
                       control plane terminates its instance)

Progress is `relative_speed` of the instance's GPU (spotrelay.catalog) reference-GPU hours per hour
of running. What is real: every AWS call the agent makes and its checkpoint code. What is not: the
agent's own loop (`spotrelay.agent.agent.Agent`) polls IMDS and heartbeats on threads in real time,
which the virtual clock cannot own, so the worker calls the agent's pieces (checkpointer, task
tokens) itself at the times the loop would.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

from spotrelay.agent.agent import STANDBY_WAIT_SECONDS
from spotrelay.agent.checkpointer import Checkpointer, CheckpointResult
from spotrelay.agent.checkpoints import PROGRESS_FILE_NAME
from spotrelay.agent.task_tokens import StepFunctionsTaskTokens
from spotrelay.aws.checkpoints import S3CheckpointStorage
from spotrelay.aws.store import DynamoJobStore
from spotrelay.catalog import INSTANCE_TYPES, relative_speed
from spotrelay.config import ERROR_MIGRATING, ERROR_SPOT_INTERRUPTED
from spotrelay.control.ports import NotFoundError
from spotrelay.local.ec2_market import Launch
from spotrelay.models import Attempt, Market

BOOT = timedelta(seconds=60)  # launch -> `running`
HEARTBEAT = timedelta(minutes=10)  # within the stack's HeartbeatSeconds (900 s)
NOTICE = timedelta(minutes=2)  # interruption warning -> termination
JOB_STOP_SECONDS = 20  # the simulated job stops this long after SIGTERM (at most its grace)
TERMINATED_AFTER_EXIT = timedelta(seconds=30)  # Finalize's (or Recover's) TerminateInstances -> `terminated`
STANDBY_POLL = timedelta(seconds=60)  # a standby's agent reads its attempt record for the task token
STANDBY_WAIT = timedelta(seconds=STANDBY_WAIT_SECONDS)  # then it gives up (the control plane terminates it)
STATE_FILE = "state.json"


class WorkerHost(Protocol):
    """What a worker needs of the replay."""

    store: DynamoJobStore
    storage: S3CheckpointStorage
    tokens: StepFunctionsTaskTokens
    checkpoint_root: Path

    def now(self) -> datetime: ...

    def schedule(self, when: datetime, label: str, action: Callable[[], None]) -> None: ...

    def emit(self, kind: str, instance_id: str, **detail: str) -> None: ...

    def terminate(self, instance_id: str) -> None: ...

    def note(self, job: str, text: str, when: datetime | None = None) -> None: ...


@dataclass
class SimulatedWorker:
    host: WorkerHost
    launch: Launch
    job_id: str
    job_name: str
    attempt: int
    work_hours: float
    interval: timedelta
    grace_seconds: int
    interruption_at: datetime | None  # when the market takes the instance back (None: never)
    state: str = "booting"  # booting | standby (running, no job yet) | running | stopping | gone
    running_at: datetime | None = None  # the instance's `running`
    job_started_at: datetime | None = None  # the job's start: `running`, or a standby's handover
    work_at_start: float = 0.0
    token: str | None = None
    checkpointer: Checkpointer | None = None
    checkpoints: list[CheckpointResult] = field(default_factory=list)
    outcome: str | None = None
    handover_deferred: bool = False  # a migration waits for the job's next save (no grace at a notice)

    @property
    def instance_id(self) -> str:
        return self.launch.instance_id

    @property
    def speed(self) -> float:
        return relative_speed(INSTANCE_TYPES[self.launch.pool.instance_type])

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        self.host.schedule(self.launch.at + BOOT, f"{self.instance_id} running", self._running)
        if self.interruption_at is not None and self.launch.pool.market is Market.SPOT:
            warning = max(self.launch.at, self.interruption_at - NOTICE)
            self.host.schedule(warning, f"{self.instance_id} notice", lambda: self.notice("market"))

    def work_done(self, when: datetime) -> float:
        if self.job_started_at is None or when <= self.job_started_at:
            return self.work_at_start
        hours = (when - self.job_started_at).total_seconds() / 3600
        return min(self.work_hours, self.work_at_start + hours * self.speed)

    def _running(self) -> None:
        if self.state != "booting":
            return
        self.host.emit("running", self.instance_id)
        self.running_at = self.host.now()
        record = self.host.store.get_attempt(self.job_id, self.attempt)
        if record.handover_from is not None and record.task_token is None:
            self.state = "standby"
            waiting = f"waiting for attempt {record.handover_from}'s job to be handed over"
            self.host.note(self.job_name, f"attempt {self.attempt} on standby: {waiting}")
            self._await_handover(record)
            return
        self._start_job(record.task_token)

    def _await_handover(self, record: Attempt | None = None) -> None:
        """A standby's agent: its attempt record (read now, then every STANDBY_POLL) until Launch writes
        the Run task's token into it; closed by the control plane, or no token within STANDBY_WAIT of
        `running`: it stops reading and does nothing more."""
        if self.state != "standby":
            return  # a notice (stopping) or a loss (gone) came first
        now = self.host.now()
        if record is None:
            record = self.host.store.get_attempt(self.job_id, self.attempt)
        if record.task_token is not None:
            self._start_job(record.task_token)
            return
        assert self.running_at is not None
        if record.outcome is not None or now - self.running_at >= STANDBY_WAIT:
            why = f"attempt closed: {record.outcome}" if record.outcome is not None else "no task token in time"
            self.host.note(self.job_name, f"attempt {self.attempt}: standby never handed the job ({why}); agent stops")
            self.state = "gone"
            self.outcome = "abandoned"
            return
        self._next_tick(now + STANDBY_POLL, self._await_handover)

    def _start_job(self, token: str | None) -> None:
        """The agent has its task token: restore the pointer's checkpoint, run the job from there."""
        now = self.host.now()
        self.state = "running"
        self.job_started_at = now
        self.token = token
        self.checkpointer = Checkpointer(
            job_id=self.job_id,
            attempt=self.attempt,
            checkpoint_dir=self.host.checkpoint_root / self.job_id / str(self.attempt),
            storage=self.host.storage,
            pointers=self.host.store,
            refresh_after=None,
            clock=self.host.now,
        )
        pointer = self.host.store.get_checkpoint(self.job_id)
        self.checkpointer.follow_pointer(pointer)
        self.checkpointer.restore(pointer)
        self.work_at_start = pointer.work_done_hours if pointer is not None else 0.0
        if pointer is not None:
            self.host.note(
                self.job_name,
                f"attempt {self.attempt} resumed from checkpoint {pointer.attempt}-{pointer.seq} "
                f"({pointer.work_done_hours:.2f} h of work)",
            )
        remaining = max(0.0, self.work_hours - self.work_at_start)
        finish = now + timedelta(hours=remaining / self.speed)
        self.host.schedule(finish, f"{self.instance_id} exit", self._exit)
        self._next_tick(now + self.interval, self._periodic)
        self._next_tick(now + HEARTBEAT, self._heartbeat)

    def _next_tick(self, when: datetime, action: Callable[[], None]) -> None:
        self.host.schedule(when, f"{self.instance_id} tick", action)

    def _heartbeat(self) -> None:
        if self.state != "running" or self.token is None:
            return
        if self._migration_requested():
            return
        if not self.host.tokens.heartbeat(self.token):
            # The control plane ended the Run task (cancel, reconcile, a notice it saw first).
            self.host.note(self.job_name, f"attempt {self.attempt}: the task token is closed; the agent stops")
            self.state = "gone"
            self.outcome = "abandoned"
            return
        self._next_tick(self.host.now() + HEARTBEAT, self._heartbeat)

    def _periodic(self) -> None:
        if self.state != "running":
            return
        if self._migration_requested():
            return
        self.checkpoint("periodic")
        # a job that saves only on its own schedule is handed over right after a save (as the agent does)
        if self.grace_seconds == 0 and self._migration_requested(just_saved=True):
            return
        self._next_tick(self.host.now() + self.interval, self._periodic)

    def _write_dir(self, work: float) -> None:
        assert self.checkpointer is not None
        directory = self.checkpointer.dir
        directory.mkdir(parents=True, exist_ok=True)
        state = {"job_id": self.job_id, "work_done_hours": round(work, 6)}
        digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()
        for name, text in ((STATE_FILE, json.dumps({**state, "weights": digest})), (PROGRESS_FILE_NAME, f"{work:.6f}")):
            temporary = directory / f".{name}.tmp"
            temporary.write_text(text)
            temporary.replace(directory / name)

    def checkpoint(self, reason: str, *, final: bool = False, work: float | None = None) -> CheckpointResult | None:
        if self.checkpointer is None:
            return None
        done = self.work_done(self.host.now()) if work is None else work
        self._write_dir(done)
        result = self.checkpointer.take(reason, final=final)
        self.checkpoints.append(result)
        if final or reason != "periodic":
            saved = f"{result.work_done_hours:.2f} h of work saved" if result.work_done_hours is not None else "saved"
            state = "committed" if result.committed else "not committed"
            self.host.note(self.job_name, f"{reason} checkpoint {self.attempt}-{result.seq} {state} ({saved})")
        return result

    def _exit(self) -> None:
        if self.state != "running" or self.token is None:
            return
        self._write_dir(self.work_hours)
        self.state = "gone"
        self.outcome = "succeeded"
        self.host.tokens.succeed(self.token, {"exit_code": 0})
        self.host.schedule(
            self.host.now() + TERMINATED_AFTER_EXIT,
            f"{self.instance_id} terminated",
            lambda: self.host.emit("terminated", self.instance_id),
        )

    def _migration_requested(self, *, just_saved: bool = False) -> bool:
        """The agent's read of its attempt record: if the control plane asked for a migration, stop. A job
        given no grace at a notice (it saves only on its own schedule) is stopped only right after a save,
        so that the move loses nothing; until then it keeps working."""
        try:
            record = self.host.store.get_attempt(self.job_id, self.attempt)
        except NotFoundError:
            return False
        if record.migrate_requested_at is None:
            return False
        if self.grace_seconds == 0 and not just_saved:
            if not self.handover_deferred:
                self.handover_deferred = True
                self.host.note(self.job_name, "migration requested: handing over after the job's next save")
            return False
        self.migrate(record.migrate_requested_at)
        return True

    # --- from outside --------------------------------------------------------------------------------

    def notice(self, source: str) -> None:
        """The spot interruption warning (`source`: market = the replay emits the event; injected = a
        recorded event already went to EventBridge): the job stops, the final checkpoint, the token."""
        if self.state in {"stopping", "gone"}:
            return
        now = self.host.now()
        if source == "market":
            self.host.emit("warning", self.instance_id)
        self.host.note(self.job_name, f"interrupted: spot interruption warning for {self.instance_id} ({source})")
        self._stop_job(ERROR_SPOT_INTERRUPTED)
        self.host.schedule(now + NOTICE, f"{self.instance_id} terminated", self._terminated)

    def migrate(self, requested_at: datetime) -> None:
        """The control plane's request to move the job back to spot (the attempt record's
        `migrate_requested_at`): the job stops as at a notice, the task fails with Migrating."""
        if self.state != "running":
            return
        self.host.note(
            self.job_name,
            f"migrating back to spot: {self.instance_id} stops its job (requested at {requested_at:%Y-%m-%d %H:%M:%S})",
        )
        self._stop_job(ERROR_MIGRATING, {"reason": "migrate", "requested_at": requested_at.isoformat()})

    def _stop_job(self, error: str, reported: dict[str, str] | None = None) -> None:
        """SIGTERM: the job saves its state and stops within its grace, then the final checkpoint and
        SendTaskFailure `error` (with `reported` in the cause). A booting instance, or a standby not yet
        handed the job, has no job to stop."""
        now = self.host.now()
        no_job = self.state in {"booting", "standby"}
        self.state = "stopping"
        stopped_at = now + timedelta(seconds=min(JOB_STOP_SECONDS, self.grace_seconds))
        work = self.work_done(now)  # the job saves its state at SIGTERM
        if not no_job:
            self.host.schedule(
                stopped_at, f"{self.instance_id} final checkpoint", lambda: self._final(work, error, reported or {})
            )

    def _final(self, work: float, error: str, reported: dict[str, str]) -> None:
        result = self.checkpoint("final", final=True, work=work)
        if self.token is not None:
            cause: dict[str, object] = {
                "attempt": self.attempt,
                "checkpoint_seq": result.seq if result else None,
                "committed": bool(result and result.committed),
                **reported,
            }
            self.host.tokens.fail(self.token, error, json.dumps(cause, sort_keys=True))
        if error == ERROR_MIGRATING:
            self.state = "gone"
            self.outcome = "migrated"
            saved = "checkpointed" if result is not None and result.committed else "no checkpoint committed"
            self.host.note(self.job_name, f"migrating back to spot: {saved}; the task fails with {ERROR_MIGRATING}")
            self.host.schedule(
                self.host.now() + TERMINATED_AFTER_EXIT,
                f"{self.instance_id} terminated",
                lambda: self.host.emit("terminated", self.instance_id),
            )

    def _terminated(self) -> None:
        if self.state == "gone" and self.outcome == "terminated":
            return
        self.state = "gone"
        self.outcome = "terminated"
        self.host.terminate(self.instance_id)
        self.host.emit("terminated", self.instance_id)
        self.host.note(self.job_name, f"instance {self.instance_id} terminated (the notice ran out)")

    def rebalance(self) -> None:
        if self.state == "running":
            self.checkpoint("rebalance")

    def lost(self) -> None:
        """The instance went away without a notice (an injected `terminated`/`stopping`)."""
        if self.state == "gone":
            return
        self.state = "gone"
        self.outcome = "lost"
        self.host.terminate(self.instance_id)
