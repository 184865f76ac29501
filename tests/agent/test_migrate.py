"""Migration back to spot, in this process: the control plane sets `migrate_requested_at` on the
attempt record, and the agent stops the job as at a spot notice but fails the task with Migrating.
Make-before-break: the spot instance's agent (a standby attempt, no task token yet) waits to be handed
the job, then resumes from the final checkpoint the old attempt committed."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from spotrelay.agent.agent import AgentError
from spotrelay.agent.checkpoints import PROGRESS_FILE_NAME
from spotrelay.aws.store import DynamoJobStore
from spotrelay.config import ERROR_MIGRATING, ERROR_SPOT_INTERRUPTED
from spotrelay.models import Attempt, AttemptOutcome, Market, Pool

from .conftest import JOB_ID, TABLE, AgentThread, Records, World, job_spec
from .imds_stub import ImdsStub
from .jobs import wait_until, write_job

READ_FAILED = "could not read the attempt record for a migration request: trying again later"
STANDBY_WAITING = "standby: waiting for the previous attempt's job to be handed over"
REQUESTED_AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def request_migration(world: World, attempt: int = 1) -> None:
    """What reconcile does: `migrate_requested_at` on the attempt record."""
    record = world.store.get_attempt(JOB_ID, attempt)
    world.store.put_attempt(record.model_copy(update={"migrate_requested_at": REQUESTED_AT}))


def add_standby(world: World, number: int, handover_from: int) -> Attempt:
    """What reconcile does ahead of a handover: attempt `number` on a spot instance, naming the attempt
    it replaces, with no task token."""
    standby = Attempt(
        job_id=JOB_ID,
        attempt=number,
        pool=Pool(instance_type="g6.xlarge", availability_zone="us-east-1b", market=Market.SPOT),
        hourly_price=0.21,
        instance_id=f"i-{number:017d}",
        started_at=datetime.now(UTC),
        handover_from=handover_from,
    )
    world.store.put_attempt(standby)
    return standby


def hand_over(world: World, number: int, token: str) -> None:
    """What Launch does when it adopts the standby: the next Run task's token in its record."""
    record = world.store.get_attempt(JOB_ID, number)
    world.store.put_attempt(record.model_copy(update={"task_token": token}))


def standby_agent(world: World, imds: ImdsStub, tmp_path: Path, **settings: Any) -> AgentThread:
    """Attempt 2's agent on its own instance. It would give up at once on a record without a token
    (attempt_record_wait_seconds=0) were it not a standby."""
    values: dict[str, Any] = {"poll_seconds": 0.01, "attempt_record_wait_seconds": 0, "standby_wait_seconds": 30}
    return AgentThread(world.agent(2, imds, tmp_path / "instance-2" / "ckpt", **(values | settings)))


def running_attempt_1(
    world: World, imds: ImdsStub, tmp_path: Path, *, grace_seconds: int, **settings: Any
) -> tuple[AgentThread, Path, Path]:
    """Attempt 1 of the test job on its (on-demand) instance, its Run task open, the job started: (its
    agent, the job's control dir, the instance's checkpoint dir)."""
    command, control = write_job(tmp_path)
    world.submit(job_spec(command, tmp_path / "ckpt", grace_seconds=grace_seconds))
    checkpoint_dir = tmp_path / "instance-1" / "ckpt"
    agent = AgentThread(world.agent(1, imds, checkpoint_dir, **settings))
    world.add_attempt(1, world.open_task("run-1"))
    wait_until((control / "ready-1").exists, what="attempt 1 ready")
    return agent, control, checkpoint_dir


HANDING_OVER_AFTER_SAVE = "migration back to spot requested: handing over after the job's next save"
WITHDRAWN = "the handover request was withdrawn: the job goes on here"
# Fast scans; the dir must stay still for 0.3 s after a save
DEFERRED: dict[str, Any] = {"migrate_poll_seconds": 0.05, "handover_scan_seconds": 0.02, "handover_quiet_seconds": 0.3}


def test_a_job_that_saves_only_on_its_own_is_handed_over_after_its_next_save(
    world: World, imds: ImdsStub, tmp_path: Path, agent_logs: Records
) -> None:
    # Given a job given no grace at a notice (it saves only on its own schedule), at step 1 of its work
    agent, control, checkpoint_dir = running_attempt_1(world, imds, tmp_path, grace_seconds=0, **DEFERRED)
    (control / "step-1-1").write_text("")
    wait_until((control / "stepped-1-1").exists, what="attempt 1 stepped")

    # When the control plane asks for the move, and the agent has seen the request
    request_migration(world)
    wait_until(lambda: agent_logs.logged(HANDING_OVER_AFTER_SAVE, attempt=1), what="the request seen")

    # Then the job keeps running (stopping it now would lose the work since its last save) ...
    assert world.sent("SendTaskFailure") == []
    # ... until it saves again: then it is stopped, and the final checkpoint has that save (step 2, 0.2 h)
    (control / "step-1-2").write_text("")
    result = agent.result()
    assert result.outcome is not None
    assert result.outcome.kind == "migrated"
    pointer = world.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    assert (pointer.attempt, pointer.final, pointer.work_done_hours) == (1, True, 0.2)
    assert (checkpoint_dir / "step.txt").read_text() == "step 2 of attempt 1\n"
    [failure] = world.sent("SendTaskFailure")
    assert failure["error"] == ERROR_MIGRATING


def test_a_deferred_handover_whose_request_is_withdrawn_leaves_the_job_running_here(
    world: World, imds: ImdsStub, tmp_path: Path, agent_logs: Records
) -> None:
    # Given a job that saves only on its own schedule, whose agent is waiting for its next save to hand over
    agent, control, _ = running_attempt_1(world, imds, tmp_path, grace_seconds=0, **DEFERRED)
    request_migration(world)
    wait_until(lambda: agent_logs.logged(HANDING_OVER_AFTER_SAVE, attempt=1), what="the request seen")

    # When the control plane withdraws the request (the standby went away) before the job saves
    record = world.store.get_attempt(JOB_ID, 1)
    world.store.put_attempt(record.model_copy(update={"migrate_requested_at": None}))
    wait_until(lambda: agent_logs.logged(WITHDRAWN, attempt=1), what="the withdrawal seen")
    (control / "step-1-1").write_text("")
    wait_until((control / "stepped-1-1").exists, what="attempt 1 stepped")
    (control / "exit-1").write_text("0")
    result = agent.result()

    # Then the job was not stopped for the move: it ran to its end here, and the task succeeded
    assert result.outcome is not None
    assert result.outcome.kind == "succeeded"
    assert world.sent("SendTaskFailure") == []


class FlakyAttemptReads(DynamoJobStore):
    """The job table, where the attempt reads after the first fail `failures` times (throttled)."""

    def __init__(self, world: World, failures: int) -> None:
        super().__init__(TABLE, world.dynamodb)
        self.failures = failures
        self.reads = 0

    def get_attempt(self, job_id: str, attempt: int) -> Attempt:
        self.reads += 1
        if self.reads > 1 and self.failures > 0:
            self.failures -= 1
            error: Any = {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"}}
            raise ClientError(error, "GetItem")
        return super().get_attempt(job_id, attempt)


def test_a_migration_request_stops_the_job_commits_a_final_checkpoint_and_fails_the_task_with_migrating(
    world: World, imds: ImdsStub, tmp_path: Path, agent_logs: Records
) -> None:
    # Given attempt 1 of a job running on an on-demand instance, with a step of progress written
    agent, control, checkpoint_dir = running_attempt_1(world, imds, tmp_path, grace_seconds=5, migrate_poll_seconds=0.1)
    (control / "step-1-1").write_text("")
    wait_until((control / "stepped-1-1").exists, what="attempt 1 stepped")
    assert world.store.get_checkpoint(JOB_ID) is None

    # When the control plane asks for the job to move back to spot
    request_migration(world)
    result = agent.result()

    # Then the job got SIGTERM and saved, and the agent committed that as the attempt's final checkpoint
    assert result.outcome is not None
    assert result.outcome.kind == "migrated"
    pointer = world.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    assert (pointer.attempt, pointer.final) == (1, True)
    assert pointer.work_done_hours == 1.5  # the progress file the job wrote on SIGTERM
    assert (checkpoint_dir / "final.bin").exists()
    assert world.storage.read_manifest(pointer.manifest_key).final
    final = result.checkpoints[-1]
    assert (final.reason, final.committed, final.seq) == ("final", True, pointer.seq)
    assert {"final.bin", "step.txt", "weights.bin", PROGRESS_FILE_NAME} <= {p.name for p in checkpoint_dir.iterdir()}
    # and the task failed with Migrating, the cause naming the checkpoint and the request
    execution = world.execution("run-1")
    assert (execution["status"], execution.get("error")) == ("FAILED", ERROR_MIGRATING)
    [failure] = world.sent("SendTaskFailure")
    assert failure["error"] == ERROR_MIGRATING
    cause = json.loads(failure["cause"])
    assert cause.pop("exit_code") == result.outcome.exit_code  # the shell's, under SIGTERM: not asserted here
    assert cause == {
        "attempt": 1,
        "checkpoint_seq": pointer.seq,
        "committed": True,
        "reason": "migrate",
        "requested_at": REQUESTED_AT.isoformat(),
    }
    # and the request is in the state file, as a notice is (a restarted agent goes on with it)
    assert agent.agent.state.notice is not None
    assert agent.agent.state.notice.reason == "migrate"
    assert agent.agent.state_file.load() == agent.agent.state
    assert agent_logs.logged("migration back to spot requested: stopping the job and checkpointing", attempt=1)
    assert (control / "runs.log").read_text().splitlines() == ["attempt 1 resumed=0"]


def test_a_spot_notice_seen_with_a_migration_request_wins(world: World, imds: ImdsStub, tmp_path: Path) -> None:
    # Given an attempt whose record asks for a migration and whose instance has a spot notice
    command, _ = write_job(tmp_path)
    world.submit(job_spec(command, tmp_path / "ckpt"))
    world.add_attempt(1, world.open_task("run-1"), migrate_requested_at=REQUESTED_AT)
    imds.arm_interruption()

    # When the agent runs the job
    result = AgentThread(world.agent(1, imds, tmp_path / "ckpt", migrate_poll_seconds=0.05)).result()

    # Then it reports the interruption, not the migration
    assert result.outcome is not None
    assert (result.outcome.kind, result.outcome.error) == ("interrupted", ERROR_SPOT_INTERRUPTED)
    [failure] = world.sent("SendTaskFailure")
    assert failure["error"] == ERROR_SPOT_INTERRUPTED
    assert "reason" not in json.loads(failure["cause"])


def test_a_failed_read_of_the_attempt_record_is_logged_and_the_next_poll_reads_again(
    world: World, imds: ImdsStub, tmp_path: Path, agent_logs: Records
) -> None:
    # Given a running job whose agent's reads of the attempt record are throttled three times
    command, control = write_job(tmp_path)
    world.submit(job_spec(command, tmp_path / "ckpt"))
    world.add_attempt(1, world.open_task("run-1"))
    flaky = FlakyAttemptReads(world, failures=3)
    agent = world.agent(1, imds, tmp_path / "ckpt", migrate_poll_seconds=0.1)
    agent.store = flaky
    running = AgentThread(agent)
    wait_until((control / "ready-1").exists, what="the job to start")

    # When the reads fail
    wait_until(lambda: flaky.failures == 0 and flaky.reads >= 5, what="the throttled reads and one more")

    # Then each failure is logged and the agent keeps watching the job
    failures = [r for r in agent_logs.records if r.getMessage() == READ_FAILED]
    assert len(failures) == 3
    assert "ProvisionedThroughputExceededException" in failures[0].__dict__["error"]
    assert running.thread.is_alive()
    assert not world.sent("SendTaskFailure")

    # When the control plane then asks for a migration, Then the next read finds it
    request_migration(world)
    result = running.result()
    assert result.outcome is not None
    assert (result.outcome.kind, result.outcome.error) == ("migrated", ERROR_MIGRATING)
    assert world.execution("run-1").get("error") == ERROR_MIGRATING


def test_a_standby_waits_for_the_handover_and_resumes_from_the_final_checkpoint_the_old_attempt_committed(
    world: World, imds: ImdsStub, tmp_path: Path, agent_logs: Records
) -> None:
    # Given attempt 1 running on an on-demand instance, with a step of progress written
    command, control = write_job(tmp_path)
    world.submit(job_spec(command, tmp_path / "ckpt", grace_seconds=5))
    old_dir = tmp_path / "instance-1" / "ckpt"
    world.add_attempt(1, world.open_task("run-1"))
    old = AgentThread(world.agent(1, imds, old_dir, migrate_poll_seconds=0.05))
    wait_until((control / "ready-1").exists, what="attempt 1 ready")
    (control / "step-1-1").write_text("")
    wait_until((control / "stepped-1-1").exists, what="attempt 1 stepped")
    # and a standby attempt 2 booted on a spot instance, its record without a task token
    add_standby(world, 2, handover_from=1)
    standby = standby_agent(world, imds, tmp_path)
    wait_until(lambda: agent_logs.logged(STANDBY_WAITING, attempt=2), what="the standby to wait")

    # When the old attempt is asked to migrate and hands the job back
    request_migration(world)
    old_result = old.result()
    assert old_result.outcome is not None
    assert old_result.outcome.kind == "migrated"

    # Then the standby is still waiting, past attempt_record_wait_seconds, and has not started the job
    assert standby.thread.is_alive()
    assert (control / "runs.log").read_text().splitlines() == ["attempt 1 resumed=0"]
    assert not (control / "ready-2").exists()

    # When Launch adopts the standby: the next Run task's token in its record
    final = world.store.get_checkpoint(JOB_ID)
    assert final is not None
    assert (final.attempt, final.final) == (1, True)
    hand_over(world, 2, world.open_task("run-2"))
    wait_until((control / "ready-2").exists, what="attempt 2 ready")
    (control / "exit-2").write_text("0")
    result = standby.result()

    # Then the standby restored attempt 1's final checkpoint and ran the job from it
    assert result.restored == (1, final.seq)
    seen = json.loads((control / "seen-2.json").read_text())
    assert seen["resumed"] == "1"
    assert seen["files"]["final.bin"] == hashlib.sha256((old_dir / "final.bin").read_bytes()).hexdigest()
    assert seen["files"][PROGRESS_FILE_NAME] == hashlib.sha256(b"1.5").hexdigest()
    assert (control / "runs.log").read_text().splitlines() == ["attempt 1 resumed=0", "attempt 2 resumed=1"]
    # and reported on the token it was handed
    assert result.outcome is not None
    assert result.outcome.kind == "succeeded"
    assert world.execution("run-2")["status"] == "SUCCEEDED"
    [waiting] = [r for r in agent_logs.records if r.getMessage() == STANDBY_WAITING]  # logged once
    assert (waiting.__dict__["handover_from"], waiting.__dict__["attempt"]) == (1, 2)


def test_a_standby_whose_attempt_is_closed_while_it_waits_never_starts_the_job(
    world: World, imds: ImdsStub, tmp_path: Path, agent_logs: Records
) -> None:
    # Given a standby attempt 2 waiting to be handed attempt 1's job
    command, control = write_job(tmp_path)
    world.submit(job_spec(command, tmp_path / "ckpt"))
    world.add_attempt(1, world.open_task("run-1"))
    add_standby(world, 2, handover_from=1)
    standby = standby_agent(world, imds, tmp_path)
    wait_until(lambda: agent_logs.logged(STANDBY_WAITING, attempt=2), what="the standby to wait")

    # When the control plane gives up on the standby and closes its attempt
    record = world.store.get_attempt(JOB_ID, 2)
    closed = {"outcome": AttemptOutcome.LAUNCH_FAILED, "ended_at": datetime.now(UTC)}
    world.store.put_attempt(record.model_copy(update=closed))
    result = standby.result()

    # Then the agent stops waiting and exits without starting the job, nor touching any task
    assert result.outcome is not None
    assert result.outcome.kind == "stale"
    assert "attempt 2 has already ended" in str(result.outcome.cause["reason"])
    assert not (control / "runs.log").exists()
    assert world.task_calls == []
    assert agent_logs.logged("not starting the job", attempt=2)
    # and the outcome is kept, so a restarted agent does nothing (no restart loop)
    again = world.agent(2, imds, tmp_path / "instance-2" / "ckpt").run()
    assert again.already_reported
    assert again.outcome == result.outcome
    assert not (control / "runs.log").exists()


def test_a_standby_never_handed_the_job_gives_up_after_standby_wait_seconds(
    world: World, imds: ImdsStub, tmp_path: Path, agent_logs: Records
) -> None:
    # Given a standby attempt 2 whose agent waits at most 0.3 s to be handed the job
    command, control = write_job(tmp_path)
    world.submit(job_spec(command, tmp_path / "ckpt"))
    add_standby(world, 2, handover_from=1)
    began = time.monotonic()

    # When no token comes
    standby = standby_agent(world, imds, tmp_path, standby_wait_seconds=0.3)

    # Then the agent gives up after standby_wait_seconds, without starting the job
    with pytest.raises(AgentError, match=r"standby attempt 2 of job job-1 was not handed the job within 0\.3 s"):
        standby.result()
    assert time.monotonic() - began >= 0.3
    assert not (control / "runs.log").exists()
    assert world.task_calls == []
