"""The agent loop end to end, in this process: moto (S3, DynamoDB, Step Functions with a real task
token), an IMDS stub on the loopback, and a real job process steered through its control dir."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, datetime
from pathlib import Path

from spotrelay.agent.checkpoints import PROGRESS_FILE_NAME, sha256_of
from spotrelay.agent.imds import REBALANCE_PATH

from .conftest import JOB_ID, AgentThread, Records, World, job_spec
from .imds_stub import ImdsStub
from .jobs import wait_until, write_job

WAITING = "waiting for the interrupted previous attempt's final checkpoint"


def files_of(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): sha256_of(p) for p in sorted(root.rglob("*")) if p.is_file()}


def seen(control: Path, attempt: int) -> dict[str, object]:
    """What the job saw when attempt `attempt` started (SPOTRELAY_RESUMED, its checkpoint files)."""
    text = wait_until(lambda: _read(control / f"seen-{attempt}.json"), what=f"attempt {attempt} to start")
    seen: dict[str, object] = json.loads(text)
    return seen


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def test_an_interrupted_attempt_commits_within_grace_and_the_next_resumes_from_exactly_that_checkpoint(
    world: World, imds: ImdsStub, tmp_path: Path, agent_logs: Records
) -> None:
    # Given attempt 1 of a job running on its instance, with a step of progress written
    command, control = write_job(tmp_path)
    world.submit(job_spec(command, Path("/ckpt-from-the-spec"), grace_seconds=5))
    first_dir = tmp_path / "instance-1" / "ckpt"
    first = AgentThread(world.agent(1, imds, first_dir))
    token_1 = world.open_task("run-1")
    world.add_attempt(1, token_1)
    wait_until((control / "ready-1").exists, what="attempt 1 ready")
    (control / "step-1-1").write_text("")
    wait_until((control / "stepped-1-1").exists, what="attempt 1 stepped")

    # When the spot interruption notice appears in IMDS
    noticed = time.monotonic()
    imds.arm_interruption()
    pointer = wait_until(lambda: world.store.get_checkpoint(JOB_ID), seconds=10, what="a committed checkpoint")
    committed_after = time.monotonic() - noticed
    result_1 = first.result()

    # Then the job saved its final checkpoint on SIGTERM, and the agent committed it within the grace period
    assert committed_after < 5, committed_after
    assert result_1.outcome is not None
    assert result_1.outcome.kind == "interrupted"
    assert (pointer.attempt, pointer.seq) == (1, 0)
    assert pointer.work_done_hours == 1.5  # from the progress file the job wrote on SIGTERM
    final = result_1.checkpoints[-1]
    assert final.reason == "final"
    assert final.committed
    assert set(files_of(first_dir)) == {"weights.bin", "step.txt", "final.bin", PROGRESS_FILE_NAME}
    # and the task failed with SpotInterrupted, naming the attempt and the checkpoint
    execution_1 = world.execution("run-1")
    assert execution_1["status"] == "FAILED"
    assert execution_1.get("error") == "SpotInterrupted"
    [failure] = world.sent("SendTaskFailure")
    assert failure["error"] == "SpotInterrupted"
    cause = json.loads(failure["cause"])
    assert (cause["attempt"], cause["checkpoint_seq"], cause["committed"]) == (1, 0, True)
    assert world.sent("SendTaskHeartbeat"), "the agent heartbeats its task token"

    # When attempt 2 starts on a fresh instance (an empty checkpoint dir)
    second_dir = tmp_path / "instance-2" / "ckpt"
    token_2 = world.open_task("run-2")
    world.add_attempt(2, token_2)
    world.store.put_attempt(world.store.get_attempt(JOB_ID, 1).model_copy(update={"interrupted_at": datetime.now(UTC)}))
    imds.instance_action = None
    second = AgentThread(world.agent(2, imds, second_dir))

    # Then the job starts resumed, on exactly the files and bytes attempt 1 committed
    started = seen(control, 2)
    assert started["resumed"] == "1"
    assert started["files"] == files_of(first_dir)
    assert (second_dir / "final.bin").read_bytes() == (first_dir / "final.bin").read_bytes()

    # When the job exits 0, Then the task succeeds with its exit code
    (control / "exit-2").write_text("0")
    result_2 = second.result()
    assert result_2.restored == (1, 0)
    assert not agent_logs.logged(WAITING, attempt=2)  # attempt 1's final checkpoint was committed already
    assert result_2.outcome is not None
    assert result_2.outcome.kind == "succeeded"
    execution_2 = world.execution("run-2")
    assert execution_2["status"] == "SUCCEEDED"
    assert json.loads(execution_2["output"]) == {"exit_code": 0}
    assert (control / "runs.log").read_text().splitlines() == ["attempt 1 resumed=0", "attempt 2 resumed=1"]


def test_a_failing_job_reports_job_failed_with_its_exit_code_and_log_tail(
    world: World, imds: ImdsStub, tmp_path: Path
) -> None:
    # Given a running job
    command, control = write_job(tmp_path)
    world.submit(job_spec(command, tmp_path / "ckpt"))
    world.add_attempt(1, world.open_task("run-1"))
    agent = AgentThread(world.agent(1, imds, tmp_path / "ckpt"))
    wait_until((control / "ready-1").exists, what="the job to start")

    # When it exits 3 after printing 30 lines
    (control / "exit-1").write_text("3")
    result = agent.result()

    # Then the task fails with JobFailed, its exit code and the last 20 lines of its output
    assert result.outcome is not None
    assert (result.outcome.kind, result.outcome.exit_code) == ("failed", 3)
    execution = world.execution("run-1")
    assert (execution["status"], execution.get("error")) == ("FAILED", "JobFailed")
    [failure] = world.sent("SendTaskFailure")
    cause = json.loads(failure["cause"])
    assert cause["exit_code"] == 3
    tail = cause["log_tail"].splitlines()
    assert len(tail) == 20
    assert tail[-1] == "line 29 of attempt 1"
    assert "line 9 of attempt 1" not in tail


def test_a_rebalance_recommendation_triggers_one_early_checkpoint(world: World, imds: ImdsStub, tmp_path: Path) -> None:
    # Given a job whose periodic checkpoint is an hour away
    command, control = write_job(tmp_path)
    world.submit(job_spec(command, tmp_path / "ckpt", interval_minutes=60))
    world.add_attempt(1, world.open_task("run-1"))
    agent = AgentThread(world.agent(1, imds, tmp_path / "ckpt"))
    wait_until((control / "ready-1").exists, what="the job to start")

    # When a rebalance recommendation appears (and stays, as it does in IMDS)
    imds.arm_rebalance()
    pointer = wait_until(lambda: world.store.get_checkpoint(JOB_ID), what="an early checkpoint")
    (control / "step-1-1").write_text("")  # the job moves on; the same recommendation must not checkpoint again
    wait_until((control / "stepped-1-1").exists, what="the job to step")
    polls = imds.get_count(REBALANCE_PATH)
    wait_until(lambda: imds.get_count(REBALANCE_PATH) >= polls + 5, what="five more polls of the recommendation")
    (control / "exit-1").write_text("0")
    result = agent.result()

    # Then exactly one checkpoint was taken, for the rebalance, and it holds the job's files
    assert (pointer.attempt, pointer.seq) == (1, 0)
    assert [(c.reason, c.committed) for c in result.checkpoints] == [("rebalance", True)]
    assert world.object_keys(f"jobs/{JOB_ID}/checkpoints/1-0/") == [
        f"jobs/{JOB_ID}/checkpoints/1-0/data/weights.bin",
        f"jobs/{JOB_ID}/checkpoints/1-0/manifest.json",
    ]


def test_periodic_checkpoints_upload_only_what_changed(world: World, imds: ImdsStub, tmp_path: Path) -> None:
    # Given a job checkpointed every 0.6 s
    command, control = write_job(tmp_path)
    world.submit(job_spec(command, tmp_path / "ckpt", interval_minutes=0.01))
    world.add_attempt(1, world.open_task("run-1"))
    agent = AgentThread(world.agent(1, imds, tmp_path / "ckpt"))
    first = wait_until(lambda: world.store.get_checkpoint(JOB_ID), what="the first periodic checkpoint")

    # When only step.txt changes
    (control / "step-1-1").write_text("")
    second = wait_until(
        lambda: (p := world.store.get_checkpoint(JOB_ID)) is not None and p.seq > first.seq and p,
        what="a second periodic checkpoint",
    )
    (control / "exit-1").write_text("0")
    result = agent.result()

    # Then the second checkpoint uploaded step.txt (and the progress file) but not weights.bin,
    # which its manifest references where the first checkpoint put it
    prefix = f"jobs/{JOB_ID}/checkpoints/1-{second.seq}/"
    assert world.object_keys(prefix) == [
        prefix + f"data/{PROGRESS_FILE_NAME}",
        prefix + "data/step.txt",
        prefix + "manifest.json",
    ]
    manifest = world.storage.read_manifest(second.manifest_key)
    weights = next(f for f in manifest.files if f.path == "weights.bin")
    assert weights.key == f"jobs/{JOB_ID}/checkpoints/1-{first.seq}/data/weights.bin"
    uploads = [set(c.uploaded) for c in result.checkpoints if c.committed]
    assert uploads[0] == {"weights.bin"}
    assert uploads[1] == {"step.txt", PROGRESS_FILE_NAME}
    # and a checkpoint with nothing new was skipped rather than written again
    assert all(c.skipped == "nothing changed" for c in result.checkpoints if not c.committed)
    assert manifest.work_done_hours == 0.1
    assert hashlib.sha256((tmp_path / "ckpt" / "weights.bin").read_bytes()).hexdigest() == weights.sha256


def test_a_new_attempt_waits_for_the_interrupted_previous_attempts_final_checkpoint(
    world: World, imds: ImdsStub, tmp_path: Path, agent_logs: Records
) -> None:
    # Given attempt 1 was interrupted a moment ago and committed only an early checkpoint so far
    command, control = write_job(tmp_path)
    world.submit(job_spec(command, tmp_path / "unused"))
    old_dir = tmp_path / "instance-1" / "ckpt"
    old_dir.mkdir(parents=True)
    (old_dir / "weights.bin").write_bytes(b"early weights")
    old = world.checkpointer(1, old_dir)
    assert old.take("periodic").committed
    world.add_attempt(1, "token-of-attempt-1", interrupted_at=datetime.now(UTC))

    # When attempt 2's agent starts while attempt 1 is still uploading its final checkpoint
    world.add_attempt(2, world.open_task("run-2"))
    new_dir = tmp_path / "instance-2" / "ckpt"
    agent = AgentThread(world.agent(2, imds, new_dir, previous_checkpoint_wait_seconds=20))
    wait_until(lambda: agent_logs.logged(WAITING, attempt=2), what="attempt 2 to wait")
    assert not (control / "seen-2.json").exists()
    (old_dir / "weights.bin").write_bytes(b"final weights")
    final = old.take("final", final=True)
    assert final.committed

    # Then attempt 2 resumes from the final checkpoint, not the early one
    started = seen(control, 2)
    assert started["resumed"] == "1"
    assert (new_dir / "weights.bin").read_bytes() == b"final weights"
    (control / "exit-2").write_text("0")
    assert agent.result().restored == (1, final.seq)


def test_a_checkpoint_that_fails_verification_fails_the_task_and_the_job_never_starts(
    world: World, imds: ImdsStub, tmp_path: Path
) -> None:
    # Given a committed checkpoint one of whose objects was changed afterwards (same size)
    command, control = write_job(tmp_path)
    world.submit(job_spec(command, tmp_path / "unused"))
    old_dir = tmp_path / "instance-1" / "ckpt"
    old_dir.mkdir(parents=True)
    (old_dir / "weights.bin").write_bytes(b"A" * 1000)
    committed = world.checkpointer(1, old_dir).take("periodic")
    world.s3.put_object(
        Bucket=world.storage.bucket,
        Key=f"jobs/{JOB_ID}/checkpoints/1-{committed.seq}/data/weights.bin",
        Body=b"B" * 1000,
    )

    # When attempt 2 starts
    world.add_attempt(2, world.open_task("run-2"))
    result = AgentThread(world.agent(2, imds, tmp_path / "instance-2" / "ckpt")).result()

    # Then it fails the task with CheckpointCorrupt, naming the file, and never starts the job
    assert result.outcome is not None
    assert result.outcome.kind == "corrupt"
    [failure] = world.sent("SendTaskFailure")
    assert failure["error"] == "CheckpointCorrupt"
    assert "weights.bin: sha256" in json.loads(failure["cause"])["problems"][0]
    assert world.execution("run-2")["status"] == "FAILED"
    assert not (control / "runs.log").exists()
    assert not (tmp_path / "instance-2" / "ckpt" / "weights.bin").exists()
