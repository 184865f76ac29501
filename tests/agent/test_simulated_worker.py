"""The local runtime's simulated worker plays the agent on a virtual clock: here its answer to a
migration request, and the standby that takes the job over (make-before-break), against the same moto
world as the agent (real checkpointer, real task token)."""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spotrelay.agent.task_tokens import StepFunctionsTaskTokens
from spotrelay.aws.checkpoints import S3CheckpointStorage
from spotrelay.aws.store import DynamoJobStore
from spotrelay.config import ERROR_MIGRATING
from spotrelay.local.ec2_market import Launch
from spotrelay.local.workers import (
    BOOT,
    HEARTBEAT,
    JOB_STOP_SECONDS,
    STANDBY_POLL,
    STANDBY_WAIT,
    STATE_FILE,
    TERMINATED_AFTER_EXIT,
    SimulatedWorker,
)
from spotrelay.models import Attempt, AttemptOutcome, Market, Pool

from .conftest import JOB_ID, World, job_spec

START = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
ON_DEMAND = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a", market=Market.ON_DEMAND)
SPOT = Pool(instance_type="g6.xlarge", availability_zone="us-east-1b", market=Market.SPOT)
INSTANCE = "i-0ondemand"
STANDBY_INSTANCE = "i-0standby"


@dataclass
class VirtualHost:
    """The replay's side of a worker: an agenda on a virtual clock, and what the worker did to it."""

    store: DynamoJobStore
    storage: S3CheckpointStorage
    tokens: StepFunctionsTaskTokens
    checkpoint_root: Path
    clock: datetime = START
    agenda: list[tuple[datetime, int, Callable[[], None]]] = field(default_factory=list)
    emitted: list[tuple[datetime, str, str]] = field(default_factory=list)  # (when, kind, instance id)
    terminated: list[str] = field(default_factory=list)
    notes: list[tuple[datetime, str]] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    def now(self) -> datetime:
        return self.clock

    def schedule(self, when: datetime, label: str, action: Callable[[], None]) -> None:
        heapq.heappush(self.agenda, (max(when, self.clock), next(self._seq), action))

    def emit(self, kind: str, instance_id: str, **detail: str) -> None:
        self.emitted.append((self.clock, kind, instance_id))

    def terminate(self, instance_id: str) -> None:
        self.terminated.append(instance_id)

    def note(self, job: str, text: str, when: datetime | None = None) -> None:
        self.notes.append((when or self.clock, text))

    def run_until(self, until: datetime) -> None:
        while self.agenda and self.agenda[0][0] <= until:
            when, _, action = heapq.heappop(self.agenda)
            self.clock = when
            action()
        self.clock = until


class CountedAttemptReads(DynamoJobStore):
    """The job table, counting the reads of each attempt record (what a worker polls)."""

    def __init__(self, world: World) -> None:
        super().__init__(world.store.table_name, world.dynamodb)
        self.reads: dict[int, int] = {}

    def get_attempt(self, job_id: str, attempt: int) -> Attempt:
        self.reads[attempt] = self.reads.get(attempt, 0) + 1
        return super().get_attempt(job_id, attempt)


def worker_for(host: VirtualHost, attempt: int, launch: Launch) -> SimulatedWorker:
    """A simulated worker of a 10-hour job with a checkpoint every 30 minutes."""
    return SimulatedWorker(
        host=host,
        launch=launch,
        job_id=JOB_ID,
        job_name="train",
        attempt=attempt,
        work_hours=10.0,
        interval=timedelta(minutes=30),
        grace_seconds=60,
        interruption_at=None,
    )


def on_demand_worker(world: World, tmp_path: Path, *, grace_seconds: int) -> tuple[VirtualHost, SimulatedWorker]:
    """Attempt 1 of a 10-hour job (a checkpoint every 30 min) on an on-demand instance, its Run task open,
    its worker started at START."""
    world.submit(job_spec("train", tmp_path / "unused", grace_seconds=grace_seconds, interval_minutes=30))
    world.add_attempt(1, world.open_task("run-1"))
    host = VirtualHost(world.store, world.storage, StepFunctionsTaskTokens(world.sfn), tmp_path / "checkpoints")
    launch = Launch(INSTANCE, ON_DEMAND, START, spot_price=None, max_price=None, client_token=None)
    worker = replace(worker_for(host, 1, launch), grace_seconds=grace_seconds)
    worker.start()
    return host, worker


def add_standby(world: World, number: int, handover_from: int, at: datetime) -> None:
    """What reconcile does ahead of a handover: attempt `number` on a spot instance, no task token."""
    world.store.put_attempt(
        Attempt(
            job_id=JOB_ID,
            attempt=number,
            pool=SPOT,
            hourly_price=0.21,
            instance_id=STANDBY_INSTANCE,
            started_at=at,
            handover_from=handover_from,
        )
    )


def test_a_simulated_worker_asked_to_migrate_checkpoints_fails_with_migrating_and_leaves_termination_to_recover(
    world: World, tmp_path: Path
) -> None:
    # Given a simulated worker on an on-demand instance, its job two hours in (periodic checkpoints every 30 min)
    host, worker = on_demand_worker(world, tmp_path, grace_seconds=60)
    host.run_until(START + timedelta(hours=2))
    assert worker.state == "running"
    periodic = len(worker.checkpoints)
    assert periodic >= 3
    assert not world.sent("SendTaskFailure")

    # When the control plane asks for the job to go back to spot
    requested_at = host.now()
    record = world.store.get_attempt(JOB_ID, 1)
    world.store.put_attempt(record.model_copy(update={"migrate_requested_at": requested_at}))
    host.run_until(requested_at + HEARTBEAT + timedelta(seconds=JOB_STOP_SECONDS + 1))

    # Then at its next heartbeat the worker stops the job and commits a final checkpoint of its work
    assert (worker.state, worker.outcome) == ("gone", "migrated")
    final = worker.checkpoints[-1]
    assert (final.reason, final.committed) == ("final", True)
    assert len(worker.checkpoints) == periodic + 1
    pointer = world.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    assert (pointer.attempt, pointer.seq, pointer.final) == (1, final.seq, True)
    assert world.storage.read_manifest(pointer.manifest_key).final
    assert pointer.work_done_hours > (
        worker.checkpoints[-2].work_done_hours or 0
    )  # the work since the last periodic one
    # and fails the task with Migrating
    [failure] = world.sent("SendTaskFailure")
    assert failure["error"] == ERROR_MIGRATING
    assert json.loads(failure["cause"]) == {
        "attempt": 1,
        "checkpoint_seq": final.seq,
        "committed": True,
        "reason": "migrate",
        "requested_at": requested_at.isoformat(),
    }
    assert world.execution("run-1").get("error") == ERROR_MIGRATING
    assert any(text.startswith("migrating back to spot: checkpointed") for _, text in host.notes)

    # Then the instance is left to Recover's TerminateInstances: no warning, no market termination of its own
    stopped = host.now()
    host.run_until(stopped + timedelta(hours=3))
    assert host.terminated == []
    assert [kind for _, kind, _ in host.emitted] == ["running", "terminated"]
    assert host.emitted[-1][0] <= stopped + TERMINATED_AFTER_EXIT
    # and the worker does nothing more (no heartbeats, no checkpoints)
    assert len(worker.checkpoints) == periodic + 1
    assert len(world.sent("SendTaskFailure")) == 1


def test_a_simulated_worker_of_a_job_that_saves_only_on_its_own_hands_over_right_after_its_next_save(
    world: World, tmp_path: Path
) -> None:
    # Given a simulated worker of a job given no grace at a notice (it saves every 30 min on its own),
    # 2 h 5 min in (its last save at 2 h)
    host, worker = on_demand_worker(world, tmp_path, grace_seconds=0)
    host.run_until(START + timedelta(hours=2, minutes=5))

    # When the control plane asks for the move, and the next heartbeat (2 h 10 min) reads the request
    record = world.store.get_attempt(JOB_ID, 1)
    world.store.put_attempt(record.model_copy(update={"migrate_requested_at": host.now()}))
    host.run_until(START + timedelta(hours=2, minutes=20))

    # Then the job keeps working: stopping it now would lose the work since its last save
    assert worker.state == "running"
    assert not world.sent("SendTaskFailure")
    # And right after its next save (2 h 30 min) it is handed over, the final checkpoint losing nothing
    host.run_until(START + timedelta(hours=2, minutes=31))
    assert (worker.state, worker.outcome) == ("gone", "migrated")
    pointer = world.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    assert pointer.final
    assert pointer.work_done_hours == pytest.approx(2.5 * worker.speed, abs=1e-3)
    [failure] = world.sent("SendTaskFailure")
    assert failure["error"] == ERROR_MIGRATING


def test_a_standby_worker_runs_while_the_old_one_works_then_resumes_from_its_final_checkpoint_once_handed_the_job(
    world: World, tmp_path: Path
) -> None:
    # Given attempt 1 of a 10-hour job on an on-demand instance, two hours in
    world.submit(job_spec("train", tmp_path / "unused", grace_seconds=60, interval_minutes=30))
    world.add_attempt(1, world.open_task("run-1"))
    host = VirtualHost(world.store, world.storage, StepFunctionsTaskTokens(world.sfn), tmp_path / "checkpoints")
    old = worker_for(host, 1, Launch(INSTANCE, ON_DEMAND, START, spot_price=None, max_price=None, client_token=None))
    old.start()
    host.run_until(START + timedelta(hours=2))

    # When reconcile launches a standby attempt 2 on a spot instance
    launched = host.now()
    add_standby(world, 2, handover_from=1, at=launched)
    launch = Launch(STANDBY_INSTANCE, SPOT, launched, spot_price=0.21, max_price=None, client_token=None)
    standby = worker_for(host, 2, launch)
    standby.start()
    host.run_until(launched + BOOT + timedelta(minutes=5))

    # Then it says `running` while the old instance keeps working, and it has not started the job
    assert (launched + BOOT, "running", STANDBY_INSTANCE) in host.emitted
    assert (old.state, standby.state) == ("running", "standby")
    assert standby.checkpointer is None
    assert not (tmp_path / "checkpoints" / JOB_ID / "2").exists()

    # When the control plane, seeing the standby running, asks attempt 1 to hand the job back
    requested_at = launched + BOOT
    record = world.store.get_attempt(JOB_ID, 1)
    world.store.put_attempt(record.model_copy(update={"migrate_requested_at": requested_at}))
    host.run_until(requested_at + HEARTBEAT + timedelta(seconds=JOB_STOP_SECONDS + 1))

    # Then attempt 1 commits its final checkpoint and fails with Migrating, and the standby still waits
    assert (old.state, old.outcome) == ("gone", "migrated")
    final = world.store.get_checkpoint(JOB_ID)
    assert final is not None
    assert (final.attempt, final.final) == (1, True)
    assert world.sent("SendTaskFailure")[0]["error"] == ERROR_MIGRATING
    assert standby.state == "standby"

    # When Launch adopts the standby: the next Run task's token in its record
    adopted_at = host.now()
    record = world.store.get_attempt(JOB_ID, 2)
    token = world.open_task("run-2")
    world.store.put_attempt(
        record.model_copy(update={"task_token": token, "work_done_hours_at_start": final.work_done_hours})
    )
    host.run_until(adopted_at + STANDBY_POLL)

    # Then at its next read it restores attempt 1's final checkpoint and runs the job from there
    assert standby.state == "running"
    assert standby.job_started_at is not None
    assert adopted_at < standby.job_started_at <= adopted_at + STANDBY_POLL
    assert standby.work_at_start == final.work_done_hours
    restored = json.loads((tmp_path / "checkpoints" / JOB_ID / "2" / STATE_FILE).read_text())
    assert restored["work_done_hours"] == round(final.work_done_hours, 6)
    resumed = f"attempt 2 resumed from checkpoint 1-{final.seq} "
    assert any(when == standby.job_started_at and text.startswith(resumed) for when, text in host.notes)

    # When the job runs to its end
    host.run_until(standby.job_started_at + timedelta(hours=10))

    # Then the standby finished the remaining work (counted from the handover, not from its boot) on its token
    assert (standby.state, standby.outcome) == ("gone", "succeeded")
    [success] = world.sent("SendTaskSuccess")
    assert success["taskToken"] == token
    assert world.execution("run-2")["status"] == "SUCCEEDED"
    finish = standby.job_started_at + timedelta(hours=(10.0 - final.work_done_hours) / standby.speed)
    assert host.emitted[-1] == (finish + TERMINATED_AFTER_EXIT, "terminated", STANDBY_INSTANCE)
    periodic = [c for c in standby.checkpoints if c.reason == "periodic"]
    assert periodic
    assert periodic[0].work_done_hours == pytest.approx(final.work_done_hours + 0.5 * standby.speed, abs=1e-5)


@pytest.mark.parametrize("ending", ["closed", "no token"])
def test_a_standby_worker_never_handed_the_job_stops_reading_and_does_nothing_more(
    world: World, tmp_path: Path, ending: str
) -> None:
    # Given a standby attempt 2 of a job, booted and waiting for attempt 1's job
    world.submit(job_spec("train", tmp_path / "unused", grace_seconds=60, interval_minutes=30))
    world.add_attempt(1, world.open_task("run-1"))
    store = CountedAttemptReads(world)
    host = VirtualHost(store, world.storage, StepFunctionsTaskTokens(world.sfn), tmp_path / "checkpoints")
    add_standby(world, 2, handover_from=1, at=START)
    standby = worker_for(
        host, 2, Launch(STANDBY_INSTANCE, SPOT, START, spot_price=0.21, max_price=None, client_token=None)
    )
    standby.start()
    running = START + BOOT
    host.run_until(running + timedelta(minutes=10))
    assert standby.state == "standby"
    assert store.reads[2] == 11  # at boot, then once a minute

    # When the control plane closes the standby (or just never hands it the job)
    if ending == "closed":
        record = world.store.get_attempt(JOB_ID, 2)
        closed = {"outcome": AttemptOutcome.LAUNCH_FAILED, "ended_at": host.now()}
        world.store.put_attempt(record.model_copy(update=closed))
        gives_up = running + timedelta(minutes=10) + STANDBY_POLL
    else:
        gives_up = running + STANDBY_WAIT
    host.run_until(gives_up - timedelta(seconds=1))
    assert standby.state == "standby"
    host.run_until(gives_up)

    # Then at its next read it stops waiting, and does nothing more: no reads, no job, no checkpoint, no call
    assert (standby.state, standby.outcome) == ("gone", "abandoned")
    reads = store.reads[2]
    host.run_until(gives_up + timedelta(hours=12))
    assert store.reads[2] == reads
    assert standby.checkpointer is None
    assert standby.checkpoints == []
    assert world.task_calls == []
    assert [kind for _, kind, _ in host.emitted] == ["running"]  # the control plane terminates the instance
    assert host.terminated == []


def test_a_standby_worker_interrupted_before_the_handover_has_no_job_to_stop_and_its_instance_ends(
    world: World, tmp_path: Path
) -> None:
    # Given a standby attempt 2 on a spot instance that the market takes back 20 minutes after launch
    world.submit(job_spec("train", tmp_path / "unused", grace_seconds=60, interval_minutes=30))
    world.add_attempt(1, world.open_task("run-1"))
    host = VirtualHost(world.store, world.storage, StepFunctionsTaskTokens(world.sfn), tmp_path / "checkpoints")
    add_standby(world, 2, handover_from=1, at=START)
    launch = Launch(STANDBY_INSTANCE, SPOT, START, spot_price=0.21, max_price=None, client_token=None)
    standby = worker_for(host, 2, launch)
    standby.interruption_at = START + timedelta(minutes=20)
    standby.start()

    host.run_until(START + timedelta(minutes=17))
    assert standby.state == "standby"

    # When the warning comes (two minutes ahead) while it waits for the job, and Launch writes a token after it
    host.run_until(START + timedelta(minutes=18, seconds=30))
    assert standby.state == "stopping"
    record = world.store.get_attempt(JOB_ID, 2)
    world.store.put_attempt(record.model_copy(update={"task_token": world.open_task("run-2")}))
    host.run_until(START + timedelta(hours=2))

    # Then it has no job to stop: no checkpoint, no report; its instance ends two minutes after the warning
    assert (standby.state, standby.outcome) == ("gone", "terminated")
    assert standby.checkpointer is None
    assert standby.checkpoints == []
    assert world.task_calls == []
    warning = START + timedelta(minutes=18)
    assert host.emitted == [
        (START + BOOT, "running", STANDBY_INSTANCE),
        (warning, "warning", STANDBY_INSTANCE),
        (warning + timedelta(minutes=2), "terminated", STANDBY_INSTANCE),
    ]
    assert host.terminated == [STANDBY_INSTANCE]
