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

from spotrelay.agent.checkpointer import Checkpointer, CheckpointResult
from spotrelay.agent.checkpoints import PROGRESS_FILE_NAME
from spotrelay.agent.task_tokens import StepFunctionsTaskTokens
from spotrelay.aws.checkpoints import S3CheckpointStorage
from spotrelay.aws.store import DynamoJobStore
from spotrelay.catalog import INSTANCE_TYPES, relative_speed
from spotrelay.config import ERROR_SPOT_INTERRUPTED
from spotrelay.local.ec2_market import Launch
from spotrelay.models import Market

BOOT = timedelta(seconds=60)  # launch -> `running`
HEARTBEAT = timedelta(minutes=10)  # within the stack's HeartbeatSeconds (900 s)
NOTICE = timedelta(minutes=2)  # interruption warning -> termination
JOB_STOP_SECONDS = 20  # the simulated job stops this long after SIGTERM (at most its grace)
TERMINATED_AFTER_EXIT = timedelta(seconds=30)  # Finalize's TerminateInstances -> `terminated`
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
    state: str = "booting"  # booting | running | stopping | gone
    running_at: datetime | None = None
    work_at_start: float = 0.0
    token: str | None = None
    checkpointer: Checkpointer | None = None
    checkpoints: list[CheckpointResult] = field(default_factory=list)
    outcome: str | None = None

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
        if self.running_at is None or when <= self.running_at:
            return self.work_at_start
        hours = (when - self.running_at).total_seconds() / 3600
        return min(self.work_hours, self.work_at_start + hours * self.speed)

    def _running(self) -> None:
        if self.state != "booting":
            return
        self.host.emit("running", self.instance_id)
        now = self.host.now()
        self.state = "running"
        self.running_at = now
        attempt = self.host.store.get_attempt(self.job_id, self.attempt)
        self.token = attempt.task_token
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
        self.checkpoint("periodic")
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
        booting = self.state == "booting"
        self.state = "stopping"
        stopped_at = now + timedelta(seconds=min(JOB_STOP_SECONDS, self.grace_seconds))
        work = self.work_done(now)  # the job saves its state at SIGTERM
        if not booting:
            self.host.schedule(stopped_at, f"{self.instance_id} final checkpoint", lambda: self._final(work))
        self.host.schedule(now + NOTICE, f"{self.instance_id} terminated", self._terminated)

    def _final(self, work: float) -> None:
        result = self.checkpoint("final", final=True, work=work)
        if self.token is not None:
            cause = {
                "attempt": self.attempt,
                "checkpoint_seq": result.seq if result else None,
                "committed": bool(result and result.committed),
            }
            self.host.tokens.fail(self.token, ERROR_SPOT_INTERRUPTED, json.dumps(cause, sort_keys=True))

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
