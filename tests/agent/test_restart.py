"""A restarted agent: it goes on from its state file (re-attaches to the job, finishes a stop it had
begun, forwards what the job printed meanwhile) and never runs the job twice. On the virtual clock, an
agent killed (SIGKILL) ends at its next wait while its job runs on; a stopped one (SIGTERM) leaves at its
next poll. And once end to end: `spotrelay agent` as systemd runs it, in its own process, against moto in
server mode, learning its job from the instance tags in IMDS, with a real job process."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer
from waiting import POLLING, eventually

from spotrelay.config import ENV_AGENT_LOG_GROUP, ERROR_MIGRATING, TAG_ATTEMPT, TAG_JOB_ID
from spotrelay.models import Market

from .conftest import (
    BUCKET,
    JOB_ID,
    REGION,
    ROLE_ARN,
    RUN_ONLY,
    TABLE,
    Records,
    VirtualWorld,
    World,
    aws_environment,
    create_table,
    job_spec,
)
from .imds_stub import ImdsStub
from .jobs import write_job

AGENT = "from spotrelay.cli import main; main()"
MIGRATING = "migration back to spot requested: stopping the job and checkpointing"
REATTACHED = "re-attached to the running job"
POLL, MIGRATE_POLL = 5.0, 60.0  # the agent's production settings


def test_a_restarted_agent_reattaches_to_the_running_job_instead_of_running_it_again(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given attempt 1's agent running the job for ten minutes
    vworld.submit(job_spec("python train.py", Path("/unused")))
    vworld.add_attempt(1, vworld.open_task("run-1"), market=Market.ON_DEMAND)
    first = vworld.start_agent(1)
    vworld.advance(600)
    job = vworld.job(1)

    # When the agent is killed, and systemd starts it again a little later
    first.kill()
    vworld.advance(30)
    assert first.killed
    second = vworld.start_agent(1)

    # Then it re-attached to the same job at once (from its state file) and watches it to its end
    [(reattached_at, reattached)] = agent_logs.named(REATTACHED, attempt=1)
    assert reattached_at == vworld.now()
    assert reattached.__dict__["pid"] == job.pid
    vworld.act(lambda: job.exit(0))
    result = vworld.finish(second, within=POLL)
    assert result.reattached
    assert result.outcome is not None
    assert (result.outcome.kind, result.outcome.token_accepted) == ("succeeded", True)
    assert len(vworld.sent("SendTaskSuccess")) == 1
    assert vworld.runs == ["attempt 1 resumed=0"]  # the job ran once
    # and the token was heartbeaten through the restart: by the first agent, then at once by the second
    beats = [vworld.seconds(t) for t in vworld.sent_at("SendTaskHeartbeat")]
    assert beats == [60.0 * k for k in range(11)] + [630.0]

    # When the agent starts once more (a reboot of the service), Then it does nothing
    third = vworld.finish(vworld.start_agent(1), within=0)
    assert third.already_reported
    assert agent_logs.named("outcome already reported: nothing to do", attempt=1)
    assert vworld.runs == ["attempt 1 resumed=0"]


def test_a_restarted_agent_finishes_the_migration_it_had_begun_and_does_not_run_the_job_again(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given an agent running attempt 1 on an on-demand instance, whose job takes 40 s to save at SIGTERM
    vworld.submit(job_spec("python train.py", Path("/unused"), grace_seconds=60))
    vworld.runner(1, term_seconds=40)
    vworld.add_attempt(1, vworld.open_task("run-1"), market=Market.ON_DEMAND)
    first = vworld.start_agent(1)
    vworld.advance(600)
    job = vworld.job(1)

    # When the control plane asks for a migration, and the agent dies while the job is saving
    record = vworld.store.get_attempt(JOB_ID, 1)
    vworld.act(lambda: vworld.store.put_attempt(record.model_copy(update={"migrate_requested_at": vworld.now()})))
    vworld.run_until(lambda: agent_logs.named(MIGRATING, attempt=1), within=MIGRATE_POLL + POLL, what="the request")
    first.kill()
    vworld.advance(10)
    second = vworld.start_agent(1)
    result = vworld.finish(second, within=60)

    # Then the restarted agent goes on with the migration: it waits for the job's save, commits the final
    # checkpoint as soon as the job exits, and fails the task with Migrating
    assert job.sigterm_at is not None
    pointer = vworld.store.get_checkpoint(JOB_ID)
    assert pointer is not None
    assert (pointer.attempt, pointer.final, pointer.work_done_hours) == (1, True, 1.5)
    assert (pointer.committed_at - job.sigterm_at).total_seconds() == pytest.approx(40.0, abs=0.06)
    assert job.killed_at is None  # within its grace: no SIGKILL
    [failure] = vworld.sent("SendTaskFailure")
    assert failure["error"] == ERROR_MIGRATING
    state = json.loads((vworld.tmp_path / f"state-{JOB_ID}-1" / f"{JOB_ID}-1.json").read_text())
    assert state["outcome"]["kind"] == "migrated"
    assert state["outcome"]["cause"]["reason"] == "migrate"
    assert state["outcome"]["cause"]["committed"] is True
    assert result.outcome is not None
    assert result.outcome.kind == "migrated"
    # (going on from its state file, not from a new read of the request)
    [(_, reattached)] = agent_logs.named(REATTACHED, attempt=1)
    assert reattached.__dict__["stopping_for"] == "migrate"
    # and the job ran once: it was not started again, nor watched to its end
    assert len(agent_logs.named("job started", attempt=1)) == 1
    assert vworld.runs == ["attempt 1 resumed=0"]


def test_what_the_job_prints_while_its_agent_is_stopped_is_forwarded_by_the_next_agent(
    vworld: VirtualWorld, agent_logs: Records
) -> None:
    # Given an agent running attempt 1, stopped by systemd (SIGTERM: it leaves the job running)
    vworld.submit(job_spec("python train.py", Path("/unused")))
    vworld.add_attempt(1, vworld.open_task("run-1"), market=Market.ON_DEMAND)
    first = vworld.start_agent(1)
    vworld.advance(60)
    first.stop()
    assert vworld.finish(first, within=POLL).outcome is None
    stopped = vworld.now()

    # When the job prints its 30 lines and exits while no agent runs, and the agent starts again
    job = vworld.job(1)
    vworld.act(lambda: job.exit(0))
    vworld.advance(60)
    result = vworld.finish(vworld.start_agent(1), within=0)

    # Then the restarted agent forwards those lines (from where the stopped one left off), each once
    output = [(when, r.__dict__["line"]) for when, r in agent_logs.named("job output", attempt=1)]
    assert [line for when, line in output if when <= stopped] == ["attempt 1 started"]
    assert [line for when, line in output if when > stopped] == [f"line {i} of attempt 1" for i in range(30)]
    assert result.outcome is not None
    assert result.outcome.kind == "succeeded"


def moto_config(endpoint: str, execute: bool) -> None:
    request = urllib.request.Request(
        f"{endpoint}/moto-api/config",
        data=json.dumps({"stepfunctions": {"execute_state_machine": execute}}).encode(),
        method="POST",
    )
    urllib.request.urlopen(request, timeout=5).close()


@pytest.fixture
def server_world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, imds: ImdsStub) -> Iterator[World]:
    """The same resources as `world`, in a moto server that other processes reach over HTTP."""
    aws_environment(monkeypatch)
    werkzeug = logging.getLogger("werkzeug")  # one line per request otherwise
    monkeypatch.setattr(werkzeug, "level", logging.WARNING)
    server = ThreadedMotoServer(ip_address="localhost", port=0, verbose=False)
    server.start()
    port = server.get_host_and_port()[1]
    endpoint = f"http://localhost:{port}"
    monkeypatch.setenv("MOTO_PORT", str(port))  # where moto's own Step Functions -> SQS calls go
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=5).close()
    moto_config(endpoint, execute=True)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    try:
        dynamodb = boto3.client("dynamodb", region_name=REGION)
        create_table(dynamodb)
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        sqs = boto3.client("sqs", region_name=REGION)
        sfn = boto3.client("stepfunctions", region_name=REGION)
        arn = sfn.create_state_machine(name="RunOnly", definition=json.dumps(RUN_ONLY), roleArn=ROLE_ARN)
        yield World(
            dynamodb=dynamodb,
            s3=s3,
            sfn=sfn,
            sqs=sqs,
            state_machine_arn=arn["stateMachineArn"],
            token_queue_url=sqs.create_queue(QueueName="spotrelay-task-tokens")["QueueUrl"],
            tmp_path=tmp_path,
        )
    finally:
        moto_config(endpoint, execute=False)
        server.stop()


class AgentProcess:
    """`spotrelay agent` in a child process, its output in a file."""

    def __init__(
        self, name: str, tmp_path: Path, imds: ImdsStub, *, fast_migrate_poll: bool = False, log_group: str = ""
    ) -> None:
        self.output = tmp_path / f"{name}.out"
        env = {**os.environ, "SPOTRELAY_TABLE": TABLE, "SPOTRELAY_BUCKET": BUCKET}
        if log_group:
            env[ENV_AGENT_LOG_GROUP] = log_group  # as the worker's systemd unit sets it
        with self.output.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    AGENT,
                    "agent",
                    "--imds-endpoint",
                    imds.endpoint,
                    "--state-dir",
                    str(tmp_path / "state"),
                    "--checkpoint-dir",
                    str(tmp_path / "ckpt"),
                    "--poll-seconds",
                    "0.05",
                    "--heartbeat-seconds",
                    "1",
                    "--migrate-poll-seconds",
                    "0.1" if fast_migrate_poll else "60",
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def lines(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.output.read_text().splitlines() if line.startswith("{")]

    def logged(self, message: str) -> bool:
        return any(line.get("message") == message for line in self.lines())

    def wait(self, seconds: float = 30) -> int:
        try:
            return self.process.wait(seconds)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"the agent did not exit; its output:\n{self.output.read_text()}") from None


def start_attempt_1(
    world: World, imds: ImdsStub, tmp_path: Path, *, grace_seconds: int = 5, **agent: Any
) -> tuple[AgentProcess, Path]:
    """Attempt 1 of the test job on an instance tagged with it, its agent running and the job started:
    (the agent, the job's control dir)."""
    command, control = write_job(tmp_path)
    world.submit(job_spec(command, Path("/not-used-the-agent-gets-a-checkpoint-dir"), grace_seconds=grace_seconds))
    world.add_attempt(1, world.open_task("run-1"))
    imds.tags = {TAG_JOB_ID: JOB_ID, TAG_ATTEMPT: "1"}
    first = AgentProcess("agent-1", tmp_path, imds, **agent)
    eventually((control / "ready-1").exists, "the job to start", on=POLLING)
    return first, control


def test_the_agent_ships_its_lines_and_the_jobs_output_to_the_attempts_log_stream(
    server_world: World, imds: ImdsStub, tmp_path: Path
) -> None:
    # Given the stack's log group, and an agent told of it running attempt 1 of a job
    world = server_world
    logs = boto3.client("logs", region_name=REGION)
    logs.create_log_group(logGroupName="/spotrelay/agent")
    agent, control = start_attempt_1(world, imds, tmp_path, log_group="/spotrelay/agent")
    # When the job prints its 30 lines and exits 0, and the agent reports it and exits
    (control / "exit-1").write_text("0")
    assert agent.wait() == 0
    # Then the attempt's stream holds every line the agent wrote, the job's output among them, in order:
    # what was still queued at the exit was sent before it
    events = logs.get_log_events(logGroupName="/spotrelay/agent", logStreamName=f"{JOB_ID}/00001", startFromHead=True)
    shipped = [json.loads(event["message"]) for event in events["events"]]
    assert [line["message"] for line in shipped] == [line["message"] for line in agent.lines()]
    output = [line["line"] for line in shipped if line["message"] == "job output"]
    assert output == ["attempt 1 started", *(f"line {i} of attempt 1" for i in range(30))]
    assert shipped[-1]["message"] == "agent done"
    assert all(line["job_id"] == JOB_ID and line["attempt"] == 1 for line in shipped)
