"""The instances of a replay: each runs the real worker agent (`Agent.run`) on the virtual clock.

For every instance the market lets Launch start, an `InstanceWorker` plays the machine:

    launch  --BOOT-->  `running` state change (EventBridge); its IMDS answers (spotrelay.local.imds);
                       the agent starts, as systemd starts `spotrelay agent` on EC2
    the agent          the real `spotrelay.agent.Agent`, with the replay's DynamoDB, S3 and Step
                       Functions clients (moto), the instance's IMDS through the real `ImdsClient`, and
                       the simulated job (spotrelay.local.sim_job) behind its runner port; its loop, its
                       heartbeat and checkpoint threads are processes of the virtual clock
    a notice           the market (its pool's capacity goes, or the price rises above the launch's
                       MaxPrice) or an injected warning: `spot/instance-action` in IMDS (and the
                       warning on EventBridge when the market sends it); the instance is terminated
                       two minutes later (its `terminated` state change), whatever the agent did
    a rebalance        `events/recommendations/rebalance` in IMDS
    TerminateInstances by the control plane (Finalize, Recover, cancel, reconcile): the instance is
                       gone at once, its `terminated` state change 30 s later
    an injected `terminated`/`stopping`: the instance is gone, with no notice

A gone instance's agent and job stop where they are: their next wait on the clock ends their threads.
What the agent does is read from its own log lines (`AgentLogbook`) and its task-token calls, and
reported per attempt (`InstanceWorker.events`). Faults (spotrelay.local.faults) act on the agent, the
IMDS, the S3 client and the job of one attempt.

What is simulated: the machine (boot time, termination), IMDS, the user's job (a clock process that
writes real files in the checkpoint dir), and time. What is real: the agent, its checkpoint code and
every AWS call it makes (to moto).

The code, one concern a module: spotrelay.local.workers_clock (the instance's clock: `MortalClock`,
`Life`, `Gone`), spotrelay.local.workers_logbook (what the agent did: `AgentEvent`, `AgentLogbook`,
`CountingTokens`), and this module: the instance worker itself, with the agent's clients on its job's
credentials. Every name is importable from here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from spotrelay.agent.agent import CLOSED_FIRST, CLOSED_FIRST_KEPT, REPORTED, Agent, AgentError, AgentSettings
from spotrelay.agent.imds import ImdsClient
from spotrelay.agent.main import wait_for_credentials
from spotrelay.aws.checkpoint_storage import S3CheckpointStorage
from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.task_tokens import StepFunctionsTaskTokens
from spotrelay.catalog import INSTANCE_TYPES, relative_speed
from spotrelay.config import TAG_ATTEMPT, TAG_JOB_ID
from spotrelay.control.vend import VendRefused
from spotrelay.local.clock import VirtualClock
from spotrelay.local.deploy import LocalStack
from spotrelay.local.ec2_market import Launch
from spotrelay.local.faults import Fault, FaultKind, FaultyStorage
from spotrelay.local.imds import ENDPOINT, ImdsFault, InstanceMetadataService
from spotrelay.local.job_credentials import instance_credentials
from spotrelay.local.runtime import DRIVER_CONFIG, LocalRuntime
from spotrelay.local.sim_job import STEP_SAVE_SECONDS, STOP_SECONDS, JobBehaviour, SimulatedJobRunner
from spotrelay.local.workers_clock import Gone, Life, MortalClock
from spotrelay.local.workers_logbook import (
    _AGENT_LINES,
    AgentEvent,
    AgentLogbook,
    CountingTokens,
    _error_of,
    _iso,
    _pick,
)
from spotrelay.models import JobSpec, Market

BOOT = timedelta(seconds=60)  # launch -> `running`
NOTICE = timedelta(minutes=2)  # interruption warning -> termination
# An instance that EC2 ends sends `shutting-down` at once (billing stops there) and `terminated` later
TERMINATED_AFTER = timedelta(seconds=30)  # `shutting-down` -> `terminated`
IMDS_SPELL_GAP = timedelta(minutes=2)  # IMDS errors this close together are one spell (the agent logs once a minute)


class WorkerHost(Protocol):
    """What a worker needs of the replay."""

    store: DynamoJobStore
    storage: S3CheckpointStorage
    tokens: StepFunctionsTaskTokens
    checkpoint_root: Path
    clock: VirtualClock
    imds: InstanceMetadataService
    region: str

    def now(self) -> datetime: ...

    def schedule(self, when: datetime, label: str, action: Callable[[], None]) -> None: ...

    def emit(self, kind: str, instance_id: str, **detail: str) -> None: ...

    def terminate(self, instance_id: str) -> None: ...

    def note(self, job: str, text: str, when: datetime | None = None) -> None: ...

    @property
    def runtime(self) -> LocalRuntime: ...

    @property
    def stack(self) -> LocalStack: ...


# --- the instance ------------------------------------------------------------------------------------


@dataclass
class InstanceWorker:
    host: WorkerHost
    launch: Launch
    job_id: str
    job_name: str
    attempt: int
    spec: JobSpec
    work_hours: float
    interruption_at: datetime | None  # when the market takes the instance back (None: never)
    scenario_start: datetime
    faults: list[Fault] = field(default_factory=list)
    state: str = "booting"  # booting | running | gone
    events: list[AgentEvent] = field(default_factory=list)
    heartbeats: int = 0
    first_heartbeat: datetime | None = None
    last_heartbeat: datetime | None = None
    outcome: str | None = None  # the agent's outcome kind, or what ended the instance
    notice_at: datetime | None = None
    notice_seen_at: datetime | None = None
    final_checkpoint_seconds: float | None = None  # from the notice (as IMDS gave it) to the final commit
    checkpoints: int = 0
    _instance: Life = field(default_factory=Life)
    _agent_life: Life | None = None
    _runner: SimulatedJobRunner | None = None
    _clients: tuple[DynamoJobStore, S3CheckpointStorage, StepFunctionsTaskTokens] | None = None

    @property
    def instance_id(self) -> str:
        return self.launch.instance_id

    @property
    def speed(self) -> float:
        return relative_speed(INSTANCE_TYPES[self.launch.pool.instance_type])

    @property
    def directory(self) -> Path:
        return self.host.checkpoint_root / self.instance_id

    def record(self, event: str, **details: Any) -> None:
        self.events.append(AgentEvent(self.host.now(), event, details))

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        # IMDS holds the instance from its launch: a notice or a rebalance recommendation during the boot
        # is there when the agent first looks
        pool = self.launch.pool
        self.host.imds.register(
            self.instance_id,
            instance_type=pool.instance_type,
            availability_zone=pool.availability_zone,
            region=self.host.region,
            tags={TAG_JOB_ID: self.job_id, TAG_ATTEMPT: str(self.attempt)},
        )
        self.host.schedule(self.launch.at + BOOT, f"{self.instance_id} running", self._running)
        if self.interruption_at is not None and self.launch.pool.market is Market.SPOT:
            warning = max(self.launch.at, self.interruption_at - NOTICE)
            self.host.schedule(warning, f"{self.instance_id} notice", lambda: self.notice("market"))
        booted = self.launch.at + BOOT
        for fault in self.faults:
            # an agent fault due before the agent starts happens as it starts (scheduled after `running`)
            at = max(self._when(fault.at), booted)
            if fault.kind is FaultKind.AGENT_DIES:
                self.host.schedule(at, f"{self.instance_id} agent dies", self._agent_dies)
            elif fault.kind is FaultKind.AGENT_RESTARTS:
                assert fault.after is not None
                back = at + timedelta(hours=fault.after)
                self.host.schedule(at, f"{self.instance_id} agent dies", self._agent_dies)
                self.host.schedule(back, f"{self.instance_id} agent restarts", self._agent_restarts)

    @property
    def start_monotonic(self) -> float:
        """The scenario's start on the clock's monotonic() seconds (fault times count from it)."""
        return self.scenario_start.timestamp()

    def _when(self, hours: float) -> datetime:
        return self.scenario_start + timedelta(hours=hours)

    def _running(self) -> None:
        if self.state != "booting":
            return
        self.state = "running"
        self.host.emit("running", self.instance_id)
        for fault in self.faults:
            begin, end = fault.window(self.start_monotonic)
            if fault.kind is FaultKind.IMDS_SLOW:
                self.host.imds.add_fault(self.instance_id, ImdsFault(begin, end, delay_seconds=fault.seconds or 0.0))
            elif fault.kind is FaultKind.IMDS_ERROR:
                self.host.imds.add_fault(self.instance_id, ImdsFault(begin, end, status=fault.status))
        self._runner = SimulatedJobRunner(MortalClock(self.host.clock, self._instance), self._behaviour())
        self._start_agent()

    def _behaviour(self) -> JobBehaviour:
        grace = self.spec.checkpoint.grace_seconds
        crash = next((f for f in self.faults if f.kind is FaultKind.JOB_CRASH), None)
        hang = next((f for f in self.faults if f.kind is FaultKind.JOB_HANG), None)
        return JobBehaviour(
            work_hours=self.work_hours,
            speed=self.speed,
            # a job given no grace at a notice saves only on its own schedule: its checkpoint interval
            save_seconds=STEP_SAVE_SECONDS if grace > 0 else self.spec.checkpoint.interval_minutes * 60,
            stop_seconds=min(STOP_SECONDS, float(grace)),
            crash_at=crash.window(self.start_monotonic)[0] if crash is not None else None,
            crash_exit_code=crash.exit_code if crash is not None else 1,
            hang_at=hang.window(self.start_monotonic)[0] if hang is not None else None,
            ignore_sigterm=any(f.kind is FaultKind.IGNORE_SIGTERM for f in self.faults),
        )

    def _start_agent(self) -> None:
        """`spotrelay agent` starts (systemd): a new agent process, on a new life of its own."""
        assert self._runner is not None
        life = Life()
        self._agent_life = life
        clock = MortalClock(self.host.clock, self._instance, life)
        windows = [
            (f.kind, *f.window(self.start_monotonic), f.seconds or 0.0)
            for f in self.faults
            if f.kind in {FaultKind.S3_FAIL, FaultKind.S3_STALL}
        ]

        def run() -> None:
            try:
                store, job_storage, tokens = self._job_clients(clock)
                agent = Agent(
                    job_id=self.job_id,
                    attempt=self.attempt,
                    store=store,
                    storage=FaultyStorage(job_storage, clock, windows) if windows else job_storage,
                    tokens=CountingTokens(tokens, self),
                    metadata=ImdsClient(
                        ENDPOINT, monotonic=clock.monotonic, transport=self.host.imds.transport(self.instance_id)
                    ),
                    settings=AgentSettings(
                        state_dir=self.directory / "state",
                        checkpoint_dir=self.directory / "checkpoint",
                        refresh_after=None,
                    ),
                    runner=self._runner,
                    clock=clock,
                )
                result = agent.run()
            except (AgentError, VendRefused, BotoCoreError, ClientError) as e:
                self.record("agent-error", error=str(e))
                self.host.note(self.job_name, f"attempt {self.attempt}: the agent cannot go on ({e})")
                return
            except Exception as e:  # the agent crashed: on EC2 systemd would restart it
                self.record("agent-crashed", error=f"{type(e).__name__}: {e}")
                self.host.note(self.job_name, f"attempt {self.attempt}: the agent crashed ({type(e).__name__}: {e})")
                return
            if result.outcome is not None:
                self.outcome = result.outcome.kind

        clock.start_thread(f"agent {self.instance_id}", run)

    def _job_clients(self, clock: MortalClock) -> tuple[DynamoJobStore, S3CheckpointStorage, StepFunctionsTaskTokens]:
        """The agent's clients on its job's own credentials, from vend (spotrelay.local.job_credentials):
        asked for once per attempt, and kept across agent restarts (they last an hour)."""
        if self._clients is None:
            credentials = instance_credentials(self.host.runtime, self.host.stack)
            vend = credentials.vend_client(self.instance_id)
            first = wait_for_credentials(vend.fetch, clock=clock)
            session = credentials.job_session(first, vend)
            self._clients = (
                DynamoJobStore(self.host.store.table_name, session.client("dynamodb", config=DRIVER_CONFIG)),
                S3CheckpointStorage(session.client("s3", config=DRIVER_CONFIG), self.host.storage.bucket),
                StepFunctionsTaskTokens(session.client("stepfunctions", config=DRIVER_CONFIG)),
            )
        return self._clients

    def _agent_dies(self) -> None:
        if self._agent_life is not None and self._agent_life.alive and self.state == "running":
            self._agent_life.alive = False
            self.record("agent-killed")
            self.host.note(self.job_name, f"attempt {self.attempt}: the agent on {self.instance_id} died (fault)")

    def _agent_restarts(self) -> None:
        if self.state == "running" and self._agent_life is not None and not self._agent_life.alive:
            self.record("agent-restarted")
            self.host.note(self.job_name, f"attempt {self.attempt}: the agent on {self.instance_id} restarts")
            self._start_agent()

    # --- what the agent says -----------------------------------------------------------------------

    def on_log(self, record: logging.LogRecord, now: datetime) -> None:
        message = record.getMessage()
        if message in {"checkpoint committed", "checkpoint written but not committed: a newer one exists"}:
            self._on_checkpoint(record, now, committed=message == "checkpoint committed")
            return
        if message in {REPORTED, CLOSED_FIRST_KEPT, CLOSED_FIRST}:
            reported: dict[str, Any] = {
                "outcome": getattr(record, "outcome", None),
                "error": getattr(record, "error", None),
                "exit_code": getattr(record, "exit_code", None),
                "accepted": message == REPORTED,  # False: the control plane had closed the task first
            }
            self.events.append(AgentEvent(now, "reported", reported))
            return
        known = _AGENT_LINES.get(message)
        if known is None:
            if record.levelno >= logging.WARNING:  # whatever else went wrong, in the agent's own words
                self.events.append(AgentEvent(now, "warning", {"message": message, **_error_of(record)}))
            return
        event, names = known
        details = _pick(record, *names)
        if message == "the final checkpoint failed":
            details["reason"] = "final"
        details |= _error_of(record)
        if event == "imds-unanswered":
            details = {"errors": [details.pop("error", None)], "count": 1, "until": _iso(now)}
        previous = next((e for e in reversed(self.events) if e.event == event), None)
        if (
            event == "imds-unanswered"
            and previous is not None
            and now - datetime.fromisoformat(str(previous.details["until"]).replace("Z", "+00:00")) <= IMDS_SPELL_GAP
        ):
            # IMDS down for a while: one entry that says how often, with which errors, until when
            errors = list(previous.details["errors"])
            errors += [e for e in details["errors"] if e not in errors]
            count = int(previous.details.get("count", 1)) + 1
            self.events[self.events.index(previous)] = AgentEvent(
                previous.at, event, {"errors": errors, "count": count, "until": _iso(now)}
            )
            return
        self.events.append(AgentEvent(now, event, details))
        if event == "restored":
            work = getattr(record, "work_done_hours", None)
            held = f" ({work:.2f} h of work)" if isinstance(work, int | float) else ""
            self.host.note(
                self.job_name,
                f"attempt {self.attempt} resumed from checkpoint {getattr(record, 'checkpoint', '?')}{held}",
            )
        elif event in {"notice-seen", "migrate-seen"}:
            self.notice_seen_at = now
        elif event == "not-started":
            self.host.note(self.job_name, f"attempt {self.attempt}: the agent does not start the job ({record.reason})")  # type: ignore[attr-defined]

    def _on_checkpoint(self, record: logging.LogRecord, now: datetime, *, committed: bool) -> None:
        reason = str(getattr(record, "reason", ""))
        details = _pick(record, "reason", "seq", "uploaded_bytes", "total_bytes", "work_done_hours")
        self.events.append(AgentEvent(now, "checkpoint", {**details, "committed": committed}))
        self.checkpoints += 1
        if reason == "periodic":
            return
        work = getattr(record, "work_done_hours", None)
        saved = f"{work:.2f} h of work saved" if isinstance(work, int | float) else "saved"
        state = "committed" if committed else "not committed"
        after = ""
        if reason == "final" and committed and self.notice_at is not None:
            self.final_checkpoint_seconds = (now - self.notice_at).total_seconds()
            after = f" {self.final_checkpoint_seconds:.0f} s after the notice"
        self.host.note(self.job_name, f"{reason} checkpoint {self.attempt}-{record.seq} {state}{after} ({saved})")  # type: ignore[attr-defined]

    # --- from outside --------------------------------------------------------------------------------

    def notice(self, source: str) -> None:
        """The spot interruption warning (`source`: market = the replay emits the event; injected = a
        recorded event already went to EventBridge): IMDS shows it; the instance ends two minutes later."""
        if self.state == "gone" or self.notice_at is not None:
            return
        now = self.host.now()
        self.notice_at = now
        if source == "market":
            self.host.emit("warning", self.instance_id)
        self.host.imds.notice(self.instance_id, now + NOTICE)
        self.record("notice", source=source)
        self.host.note(self.job_name, f"interrupted: spot interruption warning for {self.instance_id} ({source})")
        self.host.schedule(now + NOTICE, f"{self.instance_id} terminated", self._notice_ran_out)

    def rebalance(self) -> None:
        if self.state != "gone":
            self.host.imds.recommend_rebalance(self.instance_id, self.host.now())
            self.record("rebalance", source="injected")

    def _notice_ran_out(self) -> None:
        if self.state == "gone":
            return
        self._gone("terminated")
        self.host.terminate(self.instance_id)
        self._shutting_down()
        self.host.note(self.job_name, f"instance {self.instance_id} terminated (the notice ran out)")

    def terminated_by_control_plane(self) -> None:
        """TerminateInstances for this instance (Finalize, Recover, cancel, reconcile): gone now."""
        if self.state == "gone":
            return
        self._gone(self.outcome or "terminated")
        self._shutting_down()

    def _shutting_down(self) -> None:
        """The state changes EC2 sends for an instance it ends: `shutting-down` now, `terminated` a little later."""
        self.host.emit("shutting-down", self.instance_id)
        self.host.schedule(
            self.host.now() + TERMINATED_AFTER,
            f"{self.instance_id} terminated",
            lambda: self.host.emit("terminated", self.instance_id),
        )

    def lost(self) -> None:
        """The instance went away without a notice (an injected `terminated`/`stopping`)."""
        if self.state == "gone":
            return
        self._gone("lost")
        self.host.terminate(self.instance_id)

    def _gone(self, outcome: str) -> None:
        self.state = "gone"
        self._instance.alive = False
        self.outcome = self.outcome or outcome
        if self._runner is not None:
            for job in self._runner.jobs.values():
                job.kill()  # its thread wakes and ends (a hung job waits for nothing else)

    def summary(self) -> list[dict[str, Any]]:
        """What the agent did, in order, then one line of its heartbeats: how many, first and last."""
        lines = [e.to_json() for e in sorted(self.events, key=lambda e: e.at)]
        if self.heartbeats and self.first_heartbeat is not None and self.last_heartbeat is not None:
            lines.append(
                {
                    "at": _iso(self.last_heartbeat),
                    "event": "heartbeats",
                    "count": self.heartbeats,
                    "first": _iso(self.first_heartbeat),
                }
            )
        return lines


__all__ = [
    "BOOT",
    "IMDS_SPELL_GAP",
    "NOTICE",
    "TERMINATED_AFTER",
    "AgentEvent",
    "AgentLogbook",
    "CountingTokens",
    "Gone",
    "InstanceWorker",
    "Life",
    "MortalClock",
    "WorkerHost",
]
