"""Migration back to spot, on the virtual clock: the control plane sets `migrate_requested_at` on the
attempt record, and the agent stops the job as at a spot notice but fails the task with Migrating.
Make-before-break: the spot instance's agent (a standby attempt, no task token yet) waits to be handed
the job, then resumes from the final checkpoint the old attempt committed. The agents have their
production settings: the record is read every 60 s, the dir scanned every 10 s and must stay still 15 s."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from spotrelay.agent.agent import HANDOVER_SAVE_SLACK_SECONDS, AgentError
from spotrelay.agent.checkpoint_contents import PROGRESS_FILE_NAME, sha256_of
from spotrelay.agent.runner import KILLED_EXIT_CODE
from spotrelay.aws.store import DynamoJobStore
from spotrelay.config import ERROR_MIGRATING, ERROR_SPOT_INTERRUPTED
from spotrelay.models import Attempt, AttemptOutcome, Market, Pool

from .conftest import JOB_ID, TABLE, ClockAgent, Records, VirtualWorld, job_spec

READ_FAILED = "could not read the attempt record for a migration request: trying again later"
STANDBY_WAITING = "standby: waiting for the previous attempt's job to be handed over"
HANDING_OVER_AFTER_SAVE = "migration back to spot requested: handing over after the job's next save"
WITHDRAWN = "the handover request was withdrawn: the job goes on here"
STOPPING = "migration back to spot requested: stopping the job and checkpointing"
REQUESTED_AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
POLL, MIGRATE_POLL, SCAN, QUIET = 5.0, 60.0, 10.0, 15.0  # the agent's production settings


def request_migration(vworld: VirtualWorld, attempt: int = 1, requested_at: datetime | None = REQUESTED_AT) -> None:
    """What reconcile does: `migrate_requested_at` on the attempt record (None: it withdraws it)."""
    record = vworld.store.get_attempt(JOB_ID, attempt)
    vworld.act(lambda: vworld.store.put_attempt(record.model_copy(update={"migrate_requested_at": requested_at})))


def add_standby(vworld: VirtualWorld, number: int, handover_from: int) -> Attempt:
    """What reconcile does ahead of a handover: attempt `number` on a spot instance, naming the attempt
    it replaces, with no task token."""
    standby = Attempt(
        job_id=JOB_ID,
        attempt=number,
        pool=Pool(instance_type="g6.xlarge", availability_zone="us-east-1b", market=Market.SPOT),
        hourly_price=0.21,
        instance_id=vworld.instance_id(number),
        started_at=vworld.now(),
        handover_from=handover_from,
    )
    vworld.store.put_attempt(standby)
    return standby


def hand_over(vworld: VirtualWorld, number: int, token: str) -> None:
    """What Launch does when it adopts the standby: the next Run task's token in its record."""
    record = vworld.store.get_attempt(JOB_ID, number)
    vworld.act(lambda: vworld.store.put_attempt(record.model_copy(update={"task_token": token})))


def running_attempt_1(vworld: VirtualWorld, *, grace_seconds: int, interval_minutes: float = 60) -> ClockAgent:
    """Attempt 1 of the test job on its (on-demand) instance, its Run task open, the job started and
    ten minutes in."""
    vworld.submit(
        job_spec("python train.py", Path("/unused"), grace_seconds=grace_seconds, interval_minutes=interval_minutes)
    )
    vworld.add_attempt(1, vworld.open_task("run-1"), market=Market.ON_DEMAND)
    agent = vworld.start_agent(1)
    vworld.advance(600)
    return agent


def seen_at(agent_logs: Records, message: str, attempt: int = 1) -> datetime:
    [(when, _)] = agent_logs.named(message, attempt=attempt)
    return when


def test_a_job_that_saves_only_on_its_own_is_handed_over_after_its_next_save(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given a job given no grace at a notice (it saves only on its own schedule), at step 1 of its work
    agent = running_attempt_1(vworld, grace_seconds=0)
    job = vworld.job(1)
    vworld.act(lambda: job.step(1))

    # When the control plane asks for the move, and the agent has seen the request (at its next read)
    request_migration(vworld)
    vworld.run_until(
        lambda: agent_logs.named(HANDING_OVER_AFTER_SAVE, attempt=1), within=MIGRATE_POLL + POLL, what="the request"
    )
    vworld.advance(120)

    # Then the job keeps running (stopping it now would lose the work since its last save) ...
    assert vworld.sent("SendTaskFailure") == []
    assert job.code is None
    # ... until it saves again and the dir stays still: then the final checkpoint has that save (step 2, 0.2 h)
    vworld.act(lambda: job.step(2))
    saved = vworld.now()
    result = vworld.finish(agent, within=120)
    assert result.outcome is not None
    assert (result.outcome.kind, result.outcome.exit_code) == ("migrated", KILLED_EXIT_CODE)
    pointer = vworld.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    assert (pointer.attempt, pointer.final, pointer.work_done_hours) == (1, True, 0.2)
    handed_over = (pointer.committed_at - saved).total_seconds()
    assert QUIET <= handed_over <= QUIET + 2 * SCAN  # seen at a scan, still at the scans for 15 s after
    # and only then was the job killed: a SIGTERM would have set it writing with no grace to finish
    assert job.sigterm_at is None
    assert job.killed_at == pointer.committed_at
    assert (vworld.checkpoint_dir(1) / "step.txt").read_text() == "step 2 of attempt 1\n"
    [failure] = vworld.sent("SendTaskFailure")
    assert failure["error"] == ERROR_MIGRATING


def test_a_job_that_saves_only_on_its_own_and_does_not_save_is_handed_over_after_its_interval_and_slack(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given a job with no grace that saves every 30 minutes on its own, and a migration request seen
    agent = running_attempt_1(vworld, grace_seconds=0, interval_minutes=30)
    request_migration(vworld)
    vworld.run_until(
        lambda: agent_logs.named(HANDING_OVER_AFTER_SAVE, attempt=1), within=MIGRATE_POLL + POLL, what="the request"
    )
    seen = seen_at(agent_logs, HANDING_OVER_AFTER_SAVE)

    # When the job never saves
    result = vworld.finish(agent, within=3600)

    # Then the agent hands over once its interval and the slack have passed (at the scan due then)
    assert result.outcome is not None
    assert result.outcome.kind == "migrated"
    pointer = vworld.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    waited = (pointer.committed_at - seen).total_seconds()
    assert 30 * 60 + HANDOVER_SAVE_SLACK_SECONDS <= waited <= 30 * 60 + HANDOVER_SAVE_SLACK_SECONDS + SCAN
    assert agent_logs.named("the job has not saved in time: handing over now", attempt=1)


def test_a_deferred_handover_whose_request_is_withdrawn_leaves_the_job_running_here(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given a job that saves only on its own schedule, whose agent is waiting for its next save to hand over
    agent = running_attempt_1(vworld, grace_seconds=0)
    request_migration(vworld)
    vworld.run_until(
        lambda: agent_logs.named(HANDING_OVER_AFTER_SAVE, attempt=1), within=MIGRATE_POLL + POLL, what="the request"
    )

    # When the control plane withdraws the request (the standby went away) before the job saves
    request_migration(vworld, requested_at=None)
    vworld.run_until(lambda: agent_logs.named(WITHDRAWN, attempt=1), within=MIGRATE_POLL + POLL, what="the withdrawal")
    job = vworld.job(1)
    vworld.act(lambda: job.step(1))
    vworld.advance(600)  # saved, and still for longer than the quiet time
    vworld.act(lambda: job.exit(0))
    result = vworld.finish(agent, within=POLL)

    # Then the job was not stopped for the move: it ran to its end here, and the task succeeded
    assert result.outcome is not None
    assert result.outcome.kind == "succeeded"
    assert vworld.sent("SendTaskFailure") == []
    assert (job.sigterm_at, job.killed_at) == (None, None)


class FlakyAttemptReads(DynamoJobStore):
    """The job table, where the attempt reads after the first fail `failures` times (throttled)."""

    def __init__(self, vworld: VirtualWorld, failures: int) -> None:
        super().__init__(TABLE, vworld.dynamodb)
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
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given attempt 1 of a job running on an on-demand instance, with a step of progress written
    agent = running_attempt_1(vworld, grace_seconds=30)
    job = vworld.job(1)
    vworld.act(lambda: job.step(1))
    assert vworld.store.get_checkpoint(JOB_ID) is None

    # When the control plane asks for the job to move back to spot
    request_migration(vworld)
    asked = vworld.now()
    result = vworld.finish(agent, within=MIGRATE_POLL + POLL + 30)

    # Then at its next read of the record the agent sent SIGTERM; the job saved, and the agent committed that
    # as the attempt's final checkpoint
    assert job.sigterm_at is not None
    assert 0 < (job.sigterm_at - asked).total_seconds() <= MIGRATE_POLL + POLL
    assert result.outcome is not None
    assert result.outcome.kind == "migrated"
    pointer = vworld.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    assert (pointer.attempt, pointer.final) == (1, True)
    assert pointer.work_done_hours == 1.5  # the progress file the job wrote on SIGTERM
    assert vworld.storage.read_manifest(pointer.manifest_key).final
    final = result.checkpoints[-1]
    assert (final.reason, final.committed, final.seq) == ("final", True, pointer.seq)
    names = {p.name for p in vworld.checkpoint_dir(1).iterdir()}
    assert {"final.bin", "step.txt", "weights.bin", PROGRESS_FILE_NAME} <= names
    # and the task failed with Migrating, the cause naming the checkpoint and the request
    [failure] = vworld.sent("SendTaskFailure")
    assert failure["error"] == ERROR_MIGRATING
    assert json.loads(failure["cause"]) == {
        "attempt": 1,
        "checkpoint_seq": pointer.seq,
        "committed": True,
        "exit_code": 0,
        "reason": "migrate",
        "requested_at": REQUESTED_AT.isoformat(),
    }
    assert result.outcome.token_accepted
    # and the request is in the state file, as a notice is (a restarted agent goes on with it)
    state = agent.agent.state
    assert state.notice is not None
    assert (state.notice.reason, state.notice.seen_at) == ("migrate", job.sigterm_at)
    assert agent.agent.state_file.load() == state
    assert agent_logs.named(STOPPING, attempt=1)
    assert vworld.runs == ["attempt 1 resumed=0"]


def test_a_spot_notice_seen_with_a_migration_request_wins(vworld: VirtualWorld) -> None:
    # Given an attempt whose record asks for a migration and whose instance has a spot notice
    vworld.submit(job_spec("python train.py", Path("/unused")))
    vworld.add_attempt(1, vworld.open_task("run-1"), market=Market.ON_DEMAND, migrate_requested_at=REQUESTED_AT)
    vworld.metadata.register(
        vworld.instance_id(1), instance_type="g6.xlarge", availability_zone="us-east-1a", region="us-east-1", tags={}
    )
    vworld.notice(1)

    # When the agent runs the job
    result = vworld.finish(vworld.start_agent(1), within=120)

    # Then it reports the interruption, not the migration
    assert result.outcome is not None
    assert (result.outcome.kind, result.outcome.error) == ("interrupted", ERROR_SPOT_INTERRUPTED)
    [failure] = vworld.sent("SendTaskFailure")
    assert failure["error"] == ERROR_SPOT_INTERRUPTED
    assert "reason" not in json.loads(failure["cause"])


def test_a_failed_read_of_the_attempt_record_is_logged_and_read_again_a_migrate_poll_later(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given a running job whose agent's reads of the attempt record are throttled three times
    vworld.submit(job_spec("python train.py", Path("/unused")))
    vworld.add_attempt(1, vworld.open_task("run-1"), market=Market.ON_DEMAND)
    flaky = FlakyAttemptReads(vworld, failures=3)
    agent = vworld.start_agent(1, store=flaky)

    # When the reads fail
    vworld.advance(4 * MIGRATE_POLL)

    # Then each failure is logged, a read every migrate_poll_seconds, and the agent keeps watching the job
    failures = agent_logs.named(READ_FAILED, attempt=1)
    assert len(failures) == 3
    assert "ProvisionedThroughputExceededException" in failures[0][1].__dict__["error"]
    times = [vworld.seconds(when) for when, _ in failures]
    assert [b - a for a, b in itertools.pairwise(times)] == [MIGRATE_POLL, MIGRATE_POLL]
    assert not agent.done
    assert not vworld.sent("SendTaskFailure")

    # When the control plane then asks for a migration, Then the next read finds it
    request_migration(vworld)
    result = vworld.finish(agent, within=MIGRATE_POLL + POLL + 30)
    assert result.outcome is not None
    assert (result.outcome.kind, result.outcome.error) == ("migrated", ERROR_MIGRATING)
    assert [params["error"] for params in vworld.sent("SendTaskFailure")] == [ERROR_MIGRATING]


def test_a_spot_attempts_agent_never_reads_its_record_for_a_migration_request(vworld: VirtualWorld) -> None:
    # Given a job running on spot (reconcile asks only on-demand attempts to move back to spot)
    vworld.submit(job_spec("python train.py", Path("/unused")))
    vworld.add_attempt(1, vworld.open_task("run-1"))
    reads = FlakyAttemptReads(vworld, failures=0)
    agent = vworld.start_agent(1, store=reads)

    # When it runs for ten migrate polls
    vworld.advance(10 * MIGRATE_POLL)

    # Then its agent read the attempt record once, for its task token, and never again
    assert reads.reads == 1
    assert not agent.done


def test_a_standby_waits_for_the_handover_and_resumes_from_the_final_checkpoint_the_old_attempt_committed(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given attempt 1 running on an on-demand instance, with a step of progress written
    old = running_attempt_1(vworld, grace_seconds=30)
    old_job = vworld.job(1)
    vworld.act(lambda: old_job.step(1))
    # and a standby attempt 2 booted on a spot instance, its record without a task token
    add_standby(vworld, 2, handover_from=1)
    standby = vworld.start_agent(2)
    booted = vworld.now()
    assert agent_logs.named(STANDBY_WAITING, attempt=2)

    # When, past attempt_record_wait_seconds (300 s), the old attempt is asked to migrate and hands the job back
    vworld.advance(400)
    request_migration(vworld)
    old_result = vworld.finish(old, within=MIGRATE_POLL + POLL + 30)
    assert old_result.outcome is not None
    assert old_result.outcome.kind == "migrated"

    # Then the standby is still waiting, and has not started the job
    assert not standby.done
    assert vworld.runs == ["attempt 1 resumed=0"]
    assert not vworld.runner(2).jobs

    # When Launch adopts the standby: the next Run task's token in its record
    final = vworld.store.get_checkpoint(JOB_ID)
    assert final is not None
    assert (final.attempt, final.final) == (1, True)
    hand_over(vworld, 2, vworld.open_task("run-2"))
    handed = vworld.now()
    vworld.run_until(lambda: vworld.runner(2).jobs, within=POLL, what="attempt 2 to start the job")
    job = vworld.job(2)
    vworld.act(lambda: job.exit(0))
    result = vworld.finish(standby, within=POLL)

    # Then the standby took the job at its next poll, restored attempt 1's final checkpoint and ran the job from it
    assert 0 < (job.record.started_at - handed).total_seconds() <= POLL
    assert (job.record.started_at - booted).total_seconds() > 300
    assert result.restored == (1, final.seq)
    assert job.resumed == "1"
    assert job.files_at_start["final.bin"] == sha256_of(vworld.checkpoint_dir(1) / "final.bin")
    assert job.files_at_start[PROGRESS_FILE_NAME] == sha256_of(vworld.checkpoint_dir(1) / PROGRESS_FILE_NAME)
    assert (vworld.checkpoint_dir(1) / PROGRESS_FILE_NAME).read_text() == "1.5"
    assert vworld.runs == ["attempt 1 resumed=0", "attempt 2 resumed=1"]
    # and reported on the token it was handed
    assert result.outcome is not None
    assert (result.outcome.kind, result.outcome.token_accepted) == ("succeeded", True)
    [(_, waiting)] = agent_logs.named(STANDBY_WAITING)  # logged once
    assert (waiting.__dict__["handover_from"], waiting.__dict__["attempt"]) == (1, 2)


def test_a_standby_whose_attempt_is_closed_while_it_waits_never_starts_the_job(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given a standby attempt 2 waiting to be handed attempt 1's job
    vworld.submit(job_spec("python train.py", Path("/unused")))
    vworld.add_attempt(1, vworld.open_task("run-1"), market=Market.ON_DEMAND)
    add_standby(vworld, 2, handover_from=1)
    standby = vworld.start_agent(2)
    vworld.advance(600)

    # When the control plane gives up on the standby and closes its attempt
    record = vworld.store.get_attempt(JOB_ID, 2)
    closed = {"outcome": AttemptOutcome.LAUNCH_FAILED, "ended_at": vworld.now()}
    vworld.act(lambda: vworld.store.put_attempt(record.model_copy(update=closed)))
    result = vworld.finish(standby, within=POLL)

    # Then the agent stops waiting at its next poll and exits without starting the job, nor touching any task
    assert result.outcome is not None
    assert result.outcome.kind == "stale"
    assert "attempt 2 has already ended" in str(result.outcome.cause["reason"])
    assert vworld.runs == []
    assert vworld.task_calls == []
    assert agent_logs.named("not starting the job", attempt=2)
    # and the outcome is kept, so a restarted agent does nothing (no restart loop)
    again = vworld.finish(vworld.start_agent(2), within=0)
    assert again.already_reported
    assert again.outcome == result.outcome
    assert vworld.runs == []


@pytest.mark.parametrize(("grace_seconds", "waits"), [(30, 1800.0), (0, 1800.0 + 30 * 60)])
def test_a_standby_never_handed_the_job_gives_up_after_standby_wait_seconds(
    vworld: VirtualWorld, grace_seconds: int, waits: float
) -> None:
    # Given a standby attempt 2 (a job with no grace is handed over after its next save: a checkpoint
    # interval, 30 minutes, longer)
    vworld.submit(job_spec("python train.py", Path("/unused"), grace_seconds=grace_seconds, interval_minutes=30))
    add_standby(vworld, 2, handover_from=1)

    # When no token comes
    standby = vworld.start_agent(2)

    # Then the agent gives up after standby_wait_seconds (1800 s), without starting the job
    with pytest.raises(AgentError, match=rf"standby attempt 2 of job job-1 was not handed the job within {waits:g} s"):
        vworld.finish(standby, within=2 * waits)
    assert vworld.seconds() == waits
    assert vworld.runs == []
    assert vworld.task_calls == []
