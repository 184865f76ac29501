"""The agent loop on the virtual clock: moto (S3, DynamoDB, Step Functions with a real task token), the
in-process IMDS, and the scripted job behind the runner port. The agent has its production settings
(poll 5 s, heartbeat 60 s); times are virtual seconds since the clock's start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from waiting import POLLING, eventually

from spotrelay.agent.checkpoint_contents import PROGRESS_FILE_NAME, sha256_of
from spotrelay.agent.runner import KILLED_EXIT_CODE

from .conftest import JOB_ID, Records, VirtualWorld, job_spec
from .jobs import ScriptedRunner

WAITING = "waiting for the interrupted previous attempt's final checkpoint"
POLL = 5.0  # the agent's production poll_seconds
TICK = 0.06  # the agent checks a signalled job's exit every 0.05 s (EXIT_POLL_SECONDS)


def files_of(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): sha256_of(p) for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_interrupted_attempt_commits_within_grace_and_the_next_resumes_from_exactly_that_checkpoint(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given attempt 1's agent booted before its attempt record was written, then the job running with a
    # step of progress (its save at SIGTERM takes 3 s; its grace is 30 s)
    vworld.submit(job_spec("python train.py", Path("/ckpt-from-the-spec"), grace_seconds=30))
    first = vworld.start_agent(1)
    vworld.advance(12)
    vworld.add_attempt(1, vworld.open_task("run-1"))
    vworld.run_until(lambda: vworld.runner(1).jobs, within=POLL, what="attempt 1 to start the job")
    job_1 = vworld.job(1)
    vworld.act(lambda: job_1.step(1))
    vworld.advance(600)

    # When the spot interruption notice appears in IMDS
    noticed = vworld.notice(1)
    result_1 = vworld.finish(first, within=120)

    # Then the agent saw it at its next poll and sent SIGTERM; the job saved its final checkpoint on SIGTERM,
    # and the agent committed it as soon as the job exited: well within the grace period
    assert job_1.sigterm_at is not None
    seen = (job_1.sigterm_at - noticed).total_seconds()
    assert 0 < seen <= POLL
    pointer = vworld.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    committed = (pointer.committed_at - job_1.sigterm_at).total_seconds()
    assert committed == pytest.approx(3.0, abs=TICK)
    assert result_1.outcome is not None
    assert result_1.outcome.kind == "interrupted"
    assert (pointer.attempt, pointer.seq, pointer.final) == (1, 0, True)
    assert pointer.work_done_hours == 1.5  # from the progress file the job wrote on SIGTERM
    final = result_1.checkpoints[-1]
    assert (final.reason, final.committed) == ("final", True)
    first_dir = vworld.checkpoint_dir(1)
    assert set(files_of(first_dir)) == {"weights.bin", "step.txt", "final.bin", PROGRESS_FILE_NAME}
    assert job_1.killed_at is None
    # and the task failed with SpotInterrupted, naming the attempt and the checkpoint, right after the commit
    [failure] = vworld.sent("SendTaskFailure")
    assert failure["error"] == "SpotInterrupted"
    cause = json.loads(failure["cause"])
    assert (cause["attempt"], cause["checkpoint_seq"], cause["committed"], cause["exit_code"]) == (1, 0, True, 0)
    assert vworld.sent_at("SendTaskFailure") == [pointer.committed_at]
    assert result_1.outcome.token_accepted

    # When attempt 2 starts on a fresh instance (an empty checkpoint dir)
    second = vworld.relaunch_after_interruption(noticed)

    # Then the job starts at once, resumed, on exactly the files and bytes attempt 1 committed
    job_2 = vworld.job(2)
    assert job_2.resumed == "1"
    assert job_2.files_at_start == files_of(first_dir)
    assert (vworld.checkpoint_dir(2) / "final.bin").read_bytes() == (first_dir / "final.bin").read_bytes()

    # When the job exits 0, Then the task succeeds with its exit code
    vworld.act(lambda: job_2.exit(0))
    result_2 = vworld.finish(second, within=POLL)
    assert result_2.restored == (1, 0)
    assert not agent_logs.named(WAITING, attempt=2)  # attempt 1's final checkpoint was committed already
    assert result_2.outcome is not None
    assert (result_2.outcome.kind, result_2.outcome.token_accepted) == ("succeeded", True)
    [success] = vworld.sent("SendTaskSuccess")
    assert json.loads(success["output"]) == {"exit_code": 0}
    assert vworld.runs == ["attempt 1 resumed=0", "attempt 2 resumed=1"]


def test_the_agent_heartbeats_its_task_token_every_heartbeat_seconds_until_it_reports(vworld: VirtualWorld) -> None:
    # Given a job running for ten minutes
    vworld.submit(job_spec("python train.py", Path("/unused")))
    vworld.add_attempt(1, vworld.open_task("run-1"))
    agent = vworld.start_agent(1)
    vworld.advance(600)

    # When it exits, and time goes on
    job = vworld.job(1)
    vworld.act(lambda: job.exit(0))
    vworld.finish(agent, within=POLL)
    vworld.advance(600)

    # Then the token was heartbeaten at start and every 60 s, and not any more once the task succeeded
    beats = [vworld.seconds(t) for t in vworld.sent_at("SendTaskHeartbeat")]
    assert beats == [60.0 * k for k in range(11)]
    [succeeded] = vworld.sent_at("SendTaskSuccess")
    assert vworld.seconds(succeeded) == 600 + POLL  # the exit was seen at the next poll
    [token] = {params["taskToken"] for params in vworld.sent("SendTaskHeartbeat")}
    assert token == vworld.store.get_attempt(JOB_ID, 1).task_token


def test_heartbeats_are_paced_by_the_heartbeat_timeout_launch_recorded_with_the_attempt(vworld: VirtualWorld) -> None:
    # Given an attempt whose Run task times out after 900 s of silence, and an agent with no interval of its own
    vworld.submit(job_spec("python train.py", Path("/unused")))
    vworld.add_attempt(1, vworld.open_task("run-1"), heartbeat_timeout_seconds=900)
    agent = vworld.start_agent(1, heartbeat_seconds=None)

    # When its job runs for an hour
    vworld.advance(3600)
    job = vworld.job(1)
    vworld.act(lambda: job.exit(0))
    vworld.finish(agent, within=POLL)

    # Then it beat four times per timeout: three beats can fail in a row before Step Functions gives up
    beats = [vworld.seconds(t) for t in vworld.sent_at("SendTaskHeartbeat")]
    assert beats == [225.0 * k for k in range(17)]


def test_a_job_that_ignores_sigterm_is_killed_at_its_grace_and_the_final_checkpoint_is_still_taken(
    vworld: VirtualWorld,
) -> None:
    # Given a job with a grace of 30 s that does not stop at SIGTERM, with a step of progress
    vworld.submit(job_spec("python train.py", Path("/unused"), grace_seconds=30))
    vworld.runner(1, ignores_sigterm=True)
    vworld.add_attempt(1, vworld.open_task("run-1"))
    agent = vworld.start_agent(1)
    job = vworld.job(1)
    vworld.act(lambda: job.step(1))
    vworld.advance(300)

    # When the notice comes
    vworld.notice(1)
    result = vworld.finish(agent, within=120)

    # Then the agent sent SIGTERM, SIGKILL when the grace ran out, and committed what the dir holds then
    assert job.sigterm_at is not None
    assert job.killed_at is not None
    assert (job.killed_at - job.sigterm_at).total_seconds() == pytest.approx(30.0, abs=TICK)
    pointer = vworld.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    assert (pointer.attempt, pointer.final, pointer.work_done_hours) == (1, True, 0.1)
    assert pointer.committed_at >= job.killed_at
    assert result.outcome is not None
    assert (result.outcome.kind, result.outcome.exit_code) == ("interrupted", KILLED_EXIT_CODE)
    [failure] = vworld.sent("SendTaskFailure")
    cause = json.loads(failure["cause"])
    assert (cause["exit_code"], cause["committed"]) == (KILLED_EXIT_CODE, True)
    assert "final.bin" not in files_of(vworld.checkpoint_dir(1))


def test_a_job_that_finishes_after_its_task_was_closed_leaves_its_final_state_as_the_final_checkpoint(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given a running job with a step of progress, whose task the control plane fails with SpotInterrupted (an
    # interruption warning handled by ec2_events before the agent's next IMDS poll saw the notice)
    vworld.submit(job_spec("python train.py", Path("/unused")))
    token = vworld.open_task("run-1")
    vworld.add_attempt(1, token)
    agent = vworld.start_agent(1)
    vworld.run_until(lambda: vworld.runner(1).jobs, within=POLL, what="the job to start")
    job = vworld.job(1)
    vworld.act(lambda: job.step(1))
    vworld.advance(60)
    vworld.act(lambda: vworld.sfn.send_task_failure(taskToken=token, error="SpotInterrupted"))
    # (moto's execution takes the failure on a thread of its own, on real time: wait until it has)
    arn = vworld.state_machine_arn.replace(":stateMachine:", ":execution:") + ":run-1"
    eventually(
        lambda: vworld.sfn.describe_execution(executionArn=arn)["status"] != "RUNNING" or None,
        "the execution to take the task's failure",
        on=POLLING,
    )

    # When the job finishes (exit 0) before the agent sees any notice
    vworld.act(lambda: job.exit(0))
    result = vworld.finish(agent, within=POLL)

    # Then its success is refused (the task is closed), and the checkpoint dir as the job left it is committed
    # as this attempt's final checkpoint: Recover stops waiting, and the next attempt resumes from the end
    assert result.outcome is not None
    assert (result.outcome.kind, result.outcome.token_accepted) == ("succeeded", False)
    pointer = vworld.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    assert (pointer.attempt, pointer.final) == (1, True)
    assert (result.checkpoints[-1].reason, result.checkpoints[-1].committed) == ("final", True)
    assert agent_logs.named("the job succeeded after its task was closed: checkpointing its final state", attempt=1)


def test_a_final_checkpoint_of_an_empty_dir_gives_the_next_attempt_nothing_to_resume_from(vworld: VirtualWorld) -> None:
    # Given an attempt interrupted before its job saved anything (it ignores SIGTERM and is killed at its grace)
    vworld.submit(job_spec("python train.py", Path("/unused"), grace_seconds=10))
    vworld.runner(1, ignores_sigterm=True)
    vworld.add_attempt(1, vworld.open_task("run-1"))
    first = vworld.start_agent(1)
    vworld.run_until(lambda: vworld.runner(1).jobs, within=POLL, what="the job to start")
    vworld.act(lambda: (vworld.checkpoint_dir(1) / "weights.bin").unlink())  # (the test job writes it at start)
    noticed = vworld.notice(1)
    vworld.finish(first, within=120)
    pointer = vworld.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    assert (pointer.attempt, pointer.final) == (1, True)  # committed, of an empty dir

    # When attempt 2 restores it
    second = vworld.relaunch_after_interruption(noticed)

    # Then its job starts afresh: SPOTRELAY_RESUMED=0 and no files, not "resume" from nothing
    job_2 = vworld.job(2)
    assert (job_2.resumed, job_2.files_at_start) == ("0", {})
    vworld.act(lambda: job_2.exit(0))
    assert vworld.finish(second, within=POLL).restored == (1, 0)


def test_a_failing_job_reports_job_failed_with_its_exit_code_and_log_tail(vworld: VirtualWorld) -> None:
    # Given a running job
    vworld.submit(job_spec("python train.py", Path("/unused")))
    vworld.add_attempt(1, vworld.open_task("run-1"))
    agent = vworld.start_agent(1)
    vworld.advance(60)

    # When it exits 3 after printing 30 lines
    job = vworld.job(1)
    vworld.act(lambda: job.exit(3))
    result = vworld.finish(agent, within=POLL)

    # Then the task fails with JobFailed, its exit code and the last 20 lines of its output
    assert result.outcome is not None
    assert (result.outcome.kind, result.outcome.exit_code, result.outcome.token_accepted) == ("failed", 3, True)
    [failure] = vworld.sent("SendTaskFailure")
    assert failure["error"] == "JobFailed"
    cause = json.loads(failure["cause"])
    assert cause["exit_code"] == 3
    tail = cause["log_tail"].splitlines()
    assert len(tail) == 20
    assert tail[-1] == "line 29 of attempt 1"
    assert "line 9 of attempt 1" not in tail


def test_a_job_that_cannot_start_fails_its_task_with_job_failed_instead_of_crashing_the_agent(
    vworld: VirtualWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a job its instance cannot start (its command holds a NUL: execve refuses it, on every attempt)
    def refuse(*args: object, **kwargs: object) -> None:
        raise ValueError("embedded null byte")

    monkeypatch.setattr(ScriptedRunner, "start", refuse)
    vworld.submit(job_spec("python train.py", Path("/unused")))
    vworld.add_attempt(1, vworld.open_task("run-1"))

    # When its agent runs
    result = vworld.finish(vworld.start_agent(1), within=POLL)

    # Then it reports JobFailed on the task token (a restart, bounded by max_restarts), saying why, and ends:
    # it does not crash for systemd to restart it into the same failure while the instance runs on
    assert result.outcome is not None
    assert (result.outcome.kind, result.outcome.token_accepted) == ("failed", True)
    [failure] = vworld.sent("SendTaskFailure")
    assert failure["error"] == "JobFailed"
    assert json.loads(failure["cause"])["error"] == "the job could not start: ValueError: embedded null byte"


def test_a_rebalance_recommendation_triggers_one_early_checkpoint(vworld: VirtualWorld, agent_logs: Records) -> None:
    # Given a job whose periodic checkpoint is an hour away
    vworld.submit(job_spec("python train.py", Path("/unused"), interval_minutes=60))
    vworld.add_attempt(1, vworld.open_task("run-1"))
    agent = vworld.start_agent(1)
    vworld.advance(600)

    # When a rebalance recommendation appears (and stays, as it does in IMDS), and the job goes on stepping
    recommended = vworld.recommend_rebalance(1)
    vworld.advance(POLL)
    pointer = vworld.store.get_checkpoint(JOB_ID)
    job = vworld.job(1)
    vworld.act(lambda: job.step(1))
    vworld.advance(1200)  # 240 more polls that see the same recommendation
    vworld.act(lambda: job.exit(0))
    result = vworld.finish(agent, within=POLL)

    # Then exactly one checkpoint was taken, for the rebalance, at the poll after it appeared
    assert pointer is not None
    assert (pointer.attempt, pointer.seq) == (1, 0)
    assert 0 < (pointer.committed_at - recommended).total_seconds() <= POLL
    assert [(c.reason, c.committed) for c in result.checkpoints] == [("rebalance", True)]
    assert len(agent_logs.named("rebalance recommendation: checkpointing early")) == 1
    assert vworld.object_keys(f"jobs/{JOB_ID}/checkpoints/1-0/") == [
        f"jobs/{JOB_ID}/checkpoints/1-0/data/weights.bin",
        f"jobs/{JOB_ID}/checkpoints/1-0/manifest.json",
    ]


def test_periodic_checkpoints_run_every_interval_and_upload_only_what_changed(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given a job checkpointed every 30 minutes
    vworld.submit(job_spec("python train.py", Path("/unused"), interval_minutes=30))
    vworld.add_attempt(1, vworld.open_task("run-1"))
    agent = vworld.start_agent(1)
    vworld.advance(1900)
    first = vworld.store.get_checkpoint(JOB_ID)

    # When only step.txt (and the progress file) change, and the job runs on to 1.5 h
    job = vworld.job(1)
    vworld.act(lambda: job.step(1))
    vworld.advance(5400 - 1900)
    vworld.act(lambda: job.exit(0))
    result = vworld.finish(agent, within=POLL)

    # Then a checkpoint started every 30 minutes, counted from the poll that saw the previous one finish
    started = [vworld.seconds(when) for when, _ in agent_logs.named("checkpoint started")]
    assert started == [1800.0, 3605.0]  # (the next, at 5410, would have been after the exit)
    assert first is not None
    assert vworld.seconds(first.committed_at) == 1800.0
    # and the second uploaded step.txt and the progress file but not weights.bin, which its manifest
    # references where the first checkpoint put it
    second = vworld.store.get_checkpoint(JOB_ID)
    assert second is not None
    assert (first.seq, second.seq) == (0, 1)
    prefix = f"jobs/{JOB_ID}/checkpoints/1-1/"
    assert vworld.object_keys(prefix) == [
        prefix + f"data/{PROGRESS_FILE_NAME}",
        prefix + "data/step.txt",
        prefix + "manifest.json",
    ]
    manifest = vworld.storage.read_manifest(second.manifest_key)
    weights = next(f for f in manifest.files if f.path == "weights.bin")
    assert weights.key == f"jobs/{JOB_ID}/checkpoints/1-0/data/weights.bin"
    assert [set(c.uploaded) for c in result.checkpoints] == [{"weights.bin"}, {"step.txt", PROGRESS_FILE_NAME}]
    assert manifest.work_done_hours == 0.1
    assert sha256_of(vworld.checkpoint_dir(1) / "weights.bin") == weights.sha256


def test_a_checkpoint_with_nothing_new_is_skipped_rather_than_written_again(vworld: VirtualWorld) -> None:
    # Given a job checkpointed every 30 minutes that writes nothing after its first checkpoint
    vworld.submit(job_spec("python train.py", Path("/unused"), interval_minutes=30))
    vworld.add_attempt(1, vworld.open_task("run-1"))
    agent = vworld.start_agent(1)

    # When another interval passes
    vworld.advance(3700)
    job = vworld.job(1)
    vworld.act(lambda: job.exit(0))
    result = vworld.finish(agent, within=POLL)

    # Then only the first checkpoint was written; the next one found nothing changed
    assert [(c.reason, c.committed, c.skipped) for c in result.checkpoints] == [
        ("periodic", True, None),
        ("periodic", False, "nothing changed"),
    ]
    assert vworld.object_keys(f"jobs/{JOB_ID}/checkpoints/") == [
        f"jobs/{JOB_ID}/checkpoints/1-0/data/weights.bin",
        f"jobs/{JOB_ID}/checkpoints/1-0/manifest.json",
    ]


def test_a_new_attempt_waits_for_the_interrupted_previous_attempts_final_checkpoint(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given attempt 1 was interrupted a moment ago and committed only an early checkpoint so far
    vworld.submit(job_spec("python train.py", Path("/unused")))
    old_dir = vworld.checkpoint_dir(1)
    old_dir.mkdir(parents=True)
    (old_dir / "weights.bin").write_bytes(b"early weights")
    old = vworld.checkpointer(1, old_dir, clock=vworld.clock.now)
    assert old.take("periodic").committed
    vworld.add_attempt(1, "token-of-attempt-1", interrupted_at=vworld.clock.now())

    # When attempt 2's agent starts while attempt 1 is still uploading its final checkpoint
    vworld.add_attempt(2, vworld.open_task("run-2"))
    agent = vworld.start_agent(2)
    vworld.advance(40)
    assert agent_logs.named(WAITING, attempt=2)
    assert not vworld.runner(2).jobs
    (old_dir / "weights.bin").write_bytes(b"final weights")
    final = old.take("final", final=True)
    assert final.committed

    # Then attempt 2 resumes from the final checkpoint at its next poll, not the early one
    vworld.advance(POLL)
    job = vworld.job(2)
    assert job.resumed == "1"
    assert (vworld.checkpoint_dir(2) / "weights.bin").read_bytes() == b"final weights"
    assert vworld.seconds(job.record.started_at) == 45.0
    vworld.act(lambda: job.exit(0))
    assert vworld.finish(agent, within=POLL).restored == (1, final.seq)


def test_a_new_attempt_waits_for_the_previous_final_checkpoint_only_until_its_bound(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given attempt 1 was interrupted and has committed only an early checkpoint
    vworld.submit(job_spec("python train.py", Path("/unused")))
    old_dir = vworld.checkpoint_dir(1)
    old_dir.mkdir(parents=True)
    (old_dir / "weights.bin").write_bytes(b"early weights")
    early = vworld.checkpointer(1, old_dir, clock=vworld.clock.now).take("periodic")
    vworld.add_attempt(1, "token-of-attempt-1", interrupted_at=vworld.clock.now())

    # When attempt 2's agent starts and attempt 1 never commits its final checkpoint
    vworld.add_attempt(2, vworld.open_task("run-2"))
    agent = vworld.start_agent(2)
    vworld.run_until(lambda: vworld.runner(2).jobs, within=300, what="attempt 2 to start the job")

    # Then it waits previous_checkpoint_wait_seconds (150 s) after the notice, then resumes from the latest
    assert vworld.seconds(vworld.job(2).record.started_at) == 150.0
    assert agent_logs.named("the previous attempt committed no final checkpoint in time: restoring the latest there is")
    job = vworld.job(2)
    vworld.act(lambda: job.exit(0))
    assert vworld.finish(agent, within=POLL).restored == (1, early.seq)


def test_a_checkpoint_that_fails_verification_fails_the_task_and_the_job_never_starts(vworld: VirtualWorld) -> None:
    # Given a committed checkpoint one of whose objects was changed afterwards (same size)
    vworld.submit(job_spec("python train.py", Path("/unused")))
    old_dir = vworld.checkpoint_dir(1)
    old_dir.mkdir(parents=True)
    (old_dir / "weights.bin").write_bytes(b"A" * 1000)
    committed = vworld.checkpointer(1, old_dir, clock=vworld.clock.now).take("periodic")
    vworld.s3.put_object(
        Bucket=vworld.storage.bucket,
        Key=f"jobs/{JOB_ID}/checkpoints/1-{committed.seq}/data/weights.bin",
        Body=b"B" * 1000,
    )

    # When attempt 2 starts
    vworld.add_attempt(2, vworld.open_task("run-2"))
    result = vworld.finish(vworld.start_agent(2), within=0)

    # Then it fails the task with CheckpointCorrupt, naming the file, and never starts the job
    assert result.outcome is not None
    assert (result.outcome.kind, result.outcome.token_accepted) == ("corrupt", True)
    [failure] = vworld.sent("SendTaskFailure")
    assert failure["error"] == "CheckpointCorrupt"
    assert "weights.bin: sha256" in json.loads(failure["cause"])["problems"][0]
    assert vworld.runs == []
    assert not (vworld.checkpoint_dir(2) / "weights.bin").exists()
