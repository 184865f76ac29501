"""The agent's world on moto: the job table, the checkpoint bucket, a state machine whose Run state
hands out a real task token (through SQS, as `.waitForTaskToken` does), and an IMDS stub."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from moto import mock_aws

from spotrelay.agent.agent import Agent, AgentResult, AgentSettings
from spotrelay.agent.checkpointer import Checkpointer
from spotrelay.agent.imds import ImdsClient
from spotrelay.agent.logs import LOGGER_NAME, configure_json_logging
from spotrelay.agent.task_tokens import StepFunctionsTaskTokens
from spotrelay.aws.checkpoints import S3CheckpointStorage
from spotrelay.aws.store import DynamoJobStore
from spotrelay.models import Attempt, Job, JobSpec, Pool

from .imds_stub import ImdsStub
from .jobs import wait_until

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_stepfunctions import SFNClient

REGION = "us-east-1"
TABLE = "spotrelay-agent-test"
BUCKET = "spotrelay-checkpoints-agent-test"
ROLE_ARN = "arn:aws:iam::123456789012:role/spotrelay-sfn"
JOB_ID = "job-1"

# Run hands its task token out through SQS and waits for it, like JobLifecycle's Run state.
RUN_ONLY = {
    "StartAt": "Run",
    "States": {
        "Run": {
            "Type": "Task",
            "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
            "HeartbeatSeconds": 3600,
            "Parameters": {
                "QueueUrl.$": "$.token_queue_url",
                "MessageBody": {"execution.$": "$$.Execution.Name", "task_token.$": "$$.Task.Token"},
            },
            "End": True,
        }
    },
}


def aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def create_table(dynamodb: DynamoDBClient) -> None:
    dynamodb.create_table(
        TableName=TABLE,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": n, "AttributeType": "S"} for n in ("pk", "sk", "gsi1pk", "gsi1sk")],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "gsi1",
                "KeySchema": [
                    {"AttributeName": "gsi1pk", "KeyType": "HASH"},
                    {"AttributeName": "gsi1sk", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
    )


def job_spec(command: str, checkpoint_dir: Path, *, grace_seconds: int = 5, interval_minutes: float = 60) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "agent-test",
            "run": {"command": command, "env": {"JOB_FLAVOUR": "test"}},
            "resources": {"gpus": 1},
            "checkpoint": {
                "dir": str(checkpoint_dir),
                "grace_seconds": grace_seconds,
                "interval_minutes": interval_minutes,
            },
            "work_hours": 2.0,
        }
    )


@dataclass
class World:
    """Clients and names of the moto resources, and helpers to set the scene."""

    dynamodb: DynamoDBClient
    s3: S3Client
    sfn: SFNClient
    sqs: SQSClient
    state_machine_arn: str
    token_queue_url: str
    tmp_path: Path
    store: DynamoJobStore = field(init=False)
    storage: S3CheckpointStorage = field(init=False)
    task_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    agents: list[Agent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.store = DynamoJobStore(TABLE, self.dynamodb)
        self.storage = S3CheckpointStorage(self.s3, BUCKET)

        def record(params: dict[str, Any], model: Any, **kwargs: Any) -> None:
            if model.name.startswith("SendTask"):
                self.task_calls.append((model.name, dict(params)))

        # moto 5.2.5 drops SendTaskFailure's cause (describe_execution has none): read it from the call.
        self.sfn.meta.events.register("provide-client-params.sfn", record)

    def sent(self, api: str) -> list[dict[str, Any]]:
        """The parameters of every `api` call (SendTaskFailure, SendTaskSuccess, SendTaskHeartbeat)."""
        return [params for name, params in self.task_calls if name == api]

    def submit(self, spec: JobSpec, job_id: str = JOB_ID) -> Job:
        now = datetime.now(UTC)
        job = Job(job_id=job_id, spec=spec, submitted_at=now, updated_at=now)
        assert self.store.create_job(job)
        return job

    def open_task(self, execution: str) -> str:
        """Start an execution waiting in Run; its task token."""
        self.sfn.start_execution(
            stateMachineArn=self.state_machine_arn,
            name=execution,
            input=json.dumps({"token_queue_url": self.token_queue_url}),
        )

        def receive() -> str | None:
            messages = self.sqs.receive_message(QueueUrl=self.token_queue_url, MaxNumberOfMessages=10)
            for message in messages.get("Messages", []):
                body = json.loads(message.get("Body", "{}"))
                if body.get("execution") == execution:
                    return str(body["task_token"])
            return None

        return wait_until(receive, what=f"the task token of {execution}")

    def add_attempt(self, number: int, token: str, job_id: str = JOB_ID, **changes: Any) -> Attempt:
        attempt = Attempt(
            job_id=job_id,
            attempt=number,
            pool=Pool(instance_type="g6.xlarge", availability_zone="us-east-1a"),
            hourly_price=0.35,
            instance_id=f"i-{number:017d}",
            started_at=datetime.now(UTC),
            task_token=token,
            **changes,
        )
        self.store.put_attempt(attempt)
        return attempt

    def execution(self, name: str) -> dict[str, Any]:
        """The execution once it has left RUNNING."""
        arn = self.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{name}"

        def ended() -> dict[str, Any] | None:
            described = self.sfn.describe_execution(executionArn=arn)
            return dict(described) if described["status"] != "RUNNING" else None

        return wait_until(ended, what=f"execution {name} to end")

    def agent(self, number: int, imds: ImdsStub, checkpoint_dir: Path, job_id: str = JOB_ID, **settings: Any) -> Agent:
        """An agent for attempt `number`, as on its own instance (its own checkpoint and state dirs)."""
        values: dict[str, Any] = {
            "state_dir": self.tmp_path / f"state-{job_id}-{number}",
            "poll_seconds": 0.05,
            "heartbeat_seconds": 0.5,
            "previous_checkpoint_wait_seconds": 20,
            "attempt_record_wait_seconds": 5,
            "checkpoint_dir": checkpoint_dir,
            "kill_wait_seconds": 5,
        }
        values.update(settings)
        agent = Agent(
            job_id=job_id,
            attempt=number,
            store=self.store,
            storage=self.storage,
            tokens=StepFunctionsTaskTokens(self.sfn),
            metadata=ImdsClient(imds.endpoint, timeout_seconds=1.0),
            settings=AgentSettings(**values),
        )
        self.agents.append(agent)
        return agent

    def stop_agents(self) -> None:
        """Teardown: stop every agent and kill the jobs they started (a failed test leaves them)."""
        for agent in self.agents:
            agent.stop()
            process = agent.state.process
            if process is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)

    def checkpointer(self, number: int, checkpoint_dir: Path, job_id: str = JOB_ID, **kwargs: Any) -> Checkpointer:
        return Checkpointer(
            job_id=job_id,
            attempt=number,
            checkpoint_dir=checkpoint_dir,
            storage=self.storage,
            pointers=self.store,
            **kwargs,
        )

    def object_keys(self, prefix: str = "jobs/") -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


class AgentThread:
    """`agent.run()` on a thread, as on its instance; `result()` waits (bounded) for the outcome."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._result: AgentResult | None = None
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"agent-{agent.attempt}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._result = self.agent.run()
        except BaseException as e:  # surfaced by result()
            self._error = e

    def result(self, seconds: float = 20.0) -> AgentResult:
        self.thread.join(seconds)
        if self.thread.is_alive():
            self.agent.stop()
            self.thread.join(10)
            raise AssertionError(f"the agent of attempt {self.agent.attempt} did not finish in {seconds} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


class Records(logging.Handler):
    """Keeps the agent's log records, for tests that wait for one."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def logged(self, message: str, attempt: int | None = None) -> bool:
        return any(
            r.getMessage() == message and (attempt is None or getattr(r, "attempt", None) == attempt)
            for r in list(self.records)
        )


@pytest.fixture(autouse=True)
def agent_logs() -> Iterator[Records]:
    """JSON lines on stdout, as on an instance, and the records for the test."""
    configure_json_logging()
    records = Records()
    logger = logging.getLogger(LOGGER_NAME)
    logger.addHandler(records)
    try:
        yield records
    finally:
        logger.removeHandler(records)


@pytest.fixture
def imds() -> Iterator[ImdsStub]:
    with ImdsStub().running() as stub:
        yield stub


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, imds: ImdsStub) -> Iterator[World]:
    """(The IMDS stub is set up first so that it is torn down after the agents are stopped.)"""
    aws_environment(monkeypatch)
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        dynamodb = boto3.client("dynamodb", region_name=REGION)
        create_table(dynamodb)
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        sqs = boto3.client("sqs", region_name=REGION)
        token_queue_url = sqs.create_queue(QueueName="spotrelay-task-tokens")["QueueUrl"]
        sfn = boto3.client("stepfunctions", region_name=REGION)
        arn = sfn.create_state_machine(name="RunOnly", definition=json.dumps(RUN_ONLY), roleArn=ROLE_ARN)
        world = World(
            dynamodb=dynamodb,
            s3=s3,
            sfn=sfn,
            sqs=sqs,
            state_machine_arn=arn["stateMachineArn"],
            token_queue_url=token_queue_url,
            tmp_path=tmp_path,
        )
        try:
            yield world
        finally:
            world.stop_agents()
