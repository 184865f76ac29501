"""The agent's world on moto: the job table, the checkpoint bucket, a state machine whose Run state
hands out a real task token (through SQS, as `.waitForTaskToken` does), and IMDS.

Two worlds share those resources:
- `vworld` (VirtualWorld): the agent on a VirtualClock, as the replay runs it: `Agent.run` a process of
  the clock, the in-process IMDS (spotrelay.local.imds) through the real ImdsClient, and a scripted job
  (tests/agent/jobs.py) behind the runner port. The agent has its production settings (poll 5 s,
  heartbeat 60 s, ...); time passes only when the test advances the clock. For the agent's logic.
- `world`: the resources alone (the checkpointer's tests); test_restart's `server_world` serves them to
  `spotrelay agent` in its own process, with the `imds` stub on the loopback and a real job process.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from moto import mock_aws

from spotrelay.agent.agent import Agent, AgentResult, AgentSettings
from spotrelay.agent.checkpointer import Checkpointer
from spotrelay.agent.imds import ImdsClient
from spotrelay.agent.logs import LOGGER_NAME, configure_json_logging
from spotrelay.agent.ports import AgentStore
from spotrelay.aws.checkpoint_storage import S3CheckpointStorage
from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.task_tokens import StepFunctionsTaskTokens
from spotrelay.clock import SYSTEM_CLOCK
from spotrelay.local.clock import VirtualClock
from spotrelay.local.imds import ENDPOINT, InstanceMetadataService
from spotrelay.local.workers import Gone, Life, MortalClock
from spotrelay.models import Attempt, Job, JobSpec, Market, Pool

from .imds_stub import ImdsStub
from .jobs import ScriptedJob, ScriptedRunner

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
START = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)  # the virtual clock's start
STALL_SECONDS = 60.0  # real seconds a step of the virtual clock may take: a hang guard, never a bound asserted
TOKEN_WAIT_SECONDS = 20  # SQS long poll for a task token (moto's execution thread sends it): a hang guard

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
    task_call_times: list[tuple[str, datetime]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.store = DynamoJobStore(TABLE, self.dynamodb)
        self.storage = S3CheckpointStorage(self.s3, BUCKET)

        def record(params: dict[str, Any], model: Any, **kwargs: Any) -> None:
            if model.name.startswith("SendTask"):
                self.task_calls.append((model.name, dict(params)))
                self.task_call_times.append((model.name, self.now()))

        # moto 5.2.5 drops SendTaskFailure's cause (describe_execution has none): read it from the call.
        self.sfn.meta.events.register("provide-client-params.sfn", record)

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sent(self, api: str) -> list[dict[str, Any]]:
        """The parameters of every `api` call (SendTaskFailure, SendTaskSuccess, SendTaskHeartbeat)."""
        return [params for name, params in self.task_calls if name == api]

    def sent_at(self, api: str) -> list[datetime]:
        """When each `api` call was made (on the world's clock)."""
        return [when for name, when in self.task_call_times if name == api]

    def submit(self, spec: JobSpec, job_id: str = JOB_ID) -> Job:
        now = self.now()
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

        # moto runs the execution on a thread of its own: a long poll (woken by the message) receives it
        for _ in range(3):
            messages = self.sqs.receive_message(
                QueueUrl=self.token_queue_url, MaxNumberOfMessages=1, WaitTimeSeconds=TOKEN_WAIT_SECONDS
            )
            for message in messages.get("Messages", []):
                self.sqs.delete_message(QueueUrl=self.token_queue_url, ReceiptHandle=message["ReceiptHandle"])
                body = json.loads(message.get("Body", "{}"))
                if body.get("execution") == execution:
                    return str(body["task_token"])
        raise AssertionError(f"no task token of {execution} came through SQS")

    def add_attempt(
        self, number: int, token: str, job_id: str = JOB_ID, *, market: Market = Market.SPOT, **changes: Any
    ) -> Attempt:
        attempt = Attempt(
            job_id=job_id,
            attempt=number,
            pool=Pool(instance_type="g6.xlarge", availability_zone="us-east-1a", market=market),
            hourly_price=0.35,
            instance_id=f"i-{number:017d}",
            started_at=self.now(),
            task_token=token,
            **changes,
        )
        self.store.put_attempt(attempt)
        return attempt

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


# --- the virtual-clock world ------------------------------------------------------------------------


class ClockAgent:
    """`agent.run()` as a process of the virtual clock (systemd's `spotrelay agent` on its instance)."""

    def __init__(self, agent: Agent, clock: VirtualClock, life: Life) -> None:
        self.agent = agent
        self.clock = clock
        self.life = life
        self.result: AgentResult | None = None
        self.error: Exception | None = None
        self.killed = False
        self.done = False
        with clock.exclusive():
            self.thread = clock.start_thread(f"agent {agent.job_id}/{agent.attempt}", self._run)

    def _run(self) -> None:
        try:
            self.result = self.agent.run()
        except Gone:
            self.killed = True
        except Exception as e:  # surfaced by the test (VirtualWorld.finish)
            self.error = e
        finally:
            self.done = True

    def kill(self) -> None:
        """SIGKILL: the agent's threads end at their next wait; the job and the state file stay."""
        with self.clock.exclusive():
            self.life.alive = False

    def stop(self) -> None:
        """SIGTERM: the agent leaves at its next poll with the job running."""
        with self.clock.exclusive():
            self.agent.stop()


@dataclass
class VirtualWorld(World):
    """The moto resources, and the agent's instances on a VirtualClock (see the module docstring)."""

    clock: VirtualClock = field(default_factory=lambda: VirtualClock(START, stall_seconds=STALL_SECONDS))
    runs: list[str] = field(default_factory=list)  # one line per start of the job, on any instance
    runners: dict[int, ScriptedRunner] = field(default_factory=dict)  # attempt -> its instance's runner
    metadata: InstanceMetadataService = field(init=False)
    processes: list[ClockAgent] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.metadata = InstanceMetadataService(self.clock)

    def now(self) -> datetime:
        return self.clock.now()

    def seconds(self, when: datetime | None = None) -> float:
        """Virtual seconds since the start (of `when`, else of now)."""
        return ((when or self.clock.now()) - START).total_seconds()

    @staticmethod
    def instance_id(attempt: int) -> str:
        return f"i-{attempt:017d}"

    def checkpoint_dir(self, attempt: int) -> Path:
        return self.tmp_path / f"instance-{attempt}" / "ckpt"

    def runner(self, attempt: int, *, term_seconds: float = 3.0, ignores_sigterm: bool = False) -> ScriptedRunner:
        """Attempt `attempt`'s instance's runner (made on first use, with the job's behaviour at SIGTERM)."""
        if attempt not in self.runners:
            self.runners[attempt] = ScriptedRunner(
                self.clock, self.runs, term_seconds=term_seconds, ignores_sigterm=ignores_sigterm
            )
        return self.runners[attempt]

    def job(self, attempt: int) -> ScriptedJob:
        """The job attempt `attempt` started (the latest, if more than one)."""
        jobs = self.runner(attempt).jobs
        assert jobs, f"attempt {attempt} has started no job"
        return jobs[max(jobs)]

    def relaunch_after_interruption(self, noticed: datetime) -> ClockAgent:
        """What the control plane does after attempt 1's interruption (warned at `noticed`): attempt 2 with its
        own task, attempt 1 marked interrupted; attempt 2's agent started on a fresh instance."""
        self.add_attempt(2, self.open_task("run-2"))
        self.act(
            lambda: self.store.put_attempt(
                self.store.get_attempt(JOB_ID, 1).model_copy(update={"interrupted_at": noticed})
            )
        )
        return self.start_agent(2)

    def start_agent(
        self, attempt: int, job_id: str = JOB_ID, *, store: AgentStore | None = None, **settings: Any
    ) -> ClockAgent:
        """Attempt `attempt`'s agent on its instance (its own IMDS, checkpoint and state dirs), with the
        production settings unless `settings` says otherwise; its loop a process of the clock."""
        instance_id = self.instance_id(attempt)
        if instance_id not in self.metadata.instances:
            self.metadata.register(
                instance_id, instance_type="g6.xlarge", availability_zone="us-east-1a", region=REGION, tags={}
            )
        values: dict[str, Any] = {
            "state_dir": self.tmp_path / f"state-{job_id}-{attempt}",
            "checkpoint_dir": self.checkpoint_dir(attempt),
        }
        life = Life()
        agent_clock = MortalClock(self.clock, life)
        agent = Agent(
            job_id=job_id,
            attempt=attempt,
            store=store or self.store,
            storage=self.storage,
            tokens=StepFunctionsTaskTokens(self.sfn),
            metadata=ImdsClient(
                ENDPOINT, monotonic=self.clock.monotonic, transport=self.metadata.transport(instance_id)
            ),
            settings=AgentSettings(**(values | settings)),
            runner=self.runner(attempt),
            clock=agent_clock,
        )
        process = ClockAgent(agent, self.clock, life)
        self.processes.append(process)
        self.clock.wait_quiescent()
        return process

    # --- the driver: what happens, and time passing ---------------------------------------------------

    def act(self, action: Callable[[], object]) -> None:
        """Inject something while nothing runs (what it wakes runs afterwards, in order)."""
        with self.clock.exclusive():
            action()

    def notice(self, attempt: int, after: float = 120.0) -> datetime:
        """The spot interruption notice in IMDS (the action `after` seconds from now); when it appeared."""
        at = self.clock.now()
        self.act(lambda: self.metadata.notice(self.instance_id(attempt), at + timedelta(seconds=after)))
        return at

    def recommend_rebalance(self, attempt: int) -> datetime:
        at = self.clock.now()
        self.act(lambda: self.metadata.recommend_rebalance(self.instance_id(attempt), at))
        return at

    def advance(self, seconds: float) -> None:
        self.clock.advance_by(seconds)

    def run_until(self, condition: Callable[[], object], *, within: float, what: str) -> float:
        """Let virtual time pass, one wake-up at a time, until `condition` holds; the virtual seconds it
        took. Fails if it does not hold within `within` virtual seconds."""
        began = self.clock.now()
        limit = began + timedelta(seconds=within)
        self.clock.wait_quiescent()
        while not condition():
            if self.clock.advance_to_next_wakeup(limit=limit) is None:
                self.clock.advance_to(limit)
                if not condition():
                    raise AssertionError(f"{what}: not within {within:g} virtual s; blocked: {self.clock.pending()}")
                break
        return (self.clock.now() - began).total_seconds()

    def finish(self, process: ClockAgent, *, within: float = 3600.0) -> AgentResult:
        """Run until the agent returns (within `within` virtual seconds); its result, or its error raised."""
        self.run_until(lambda: process.done, within=within, what=f"the agent of attempt {process.agent.attempt}")
        if process.error is not None:
            raise process.error
        assert process.result is not None, "the agent was killed"
        return process.result


class Records(logging.Handler):
    """Keeps the agent's log records, for tests that wait for one; on the virtual clock, when each came."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.clock: VirtualClock | None = None
        self.times: list[datetime] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.times.append((self.clock or SYSTEM_CLOCK).now())

    def named(self, message: str, attempt: int | None = None) -> list[tuple[datetime, logging.LogRecord]]:
        """(when, record) of every record with `message` (of `attempt`)."""
        return [
            (when, r)
            for when, r in zip(list(self.times), list(self.records), strict=True)
            if r.getMessage() == message and (attempt is None or getattr(r, "attempt", None) == attempt)
        ]

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
def world(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[World]:
    """The moto resources alone (the checkpointer's tests)."""
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
        yield world


@pytest.fixture
def vworld(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, agent_logs: Records) -> Iterator[VirtualWorld]:
    """The agent's world on the virtual clock (the module docstring)."""
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
        world = VirtualWorld(
            dynamodb=dynamodb,
            s3=s3,
            sfn=sfn,
            sqs=sqs,
            state_machine_arn=arn["stateMachineArn"],
            token_queue_url=token_queue_url,
            tmp_path=tmp_path,
        )
        agent_logs.clock = world.clock
        try:
            yield world
        finally:
            agent_logs.clock = None
            world.clock.close()  # whatever still waits on it stays parked (daemon threads)
