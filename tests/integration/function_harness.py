"""Drive the Lambda entry points in `functions/` on moto, as Lambda would: each module is imported
fresh (a cold start) with exactly its settings model's environment, so that its settings validate and
its boto3 clients bind to moto; then its `handler` is called with an event and a context.

`Deployment` names the moto resources the fixtures in `conftest.py` create, and offers what the
tests share: loading a function, a real JobLifecycle execution waiting in Run with its task token,
reading back the records, the instances and the executions' outcomes.
"""

from __future__ import annotations

import copy
import importlib
import json
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import boto3
import pytest
import yaml
from fakes import FakeClock
from waiting import eventually

from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.workflow import execution_arn
from spotrelay.config import (
    ENV_AGENT_LOG_GROUP_ARN,
    ENV_ALLOWED_FAMILIES,
    ENV_BLOCK_MINUTES,
    ENV_BUCKET_ARN,
    ENV_BUCKET_KEY_ARN,
    ENV_BUDGET_USD_PER_HOUR,
    ENV_DISPATCHER_FUNCTION,
    ENV_DLQ_URL,
    ENV_HEARTBEAT_SECONDS,
    ENV_JOB_ROLE_ARN,
    ENV_LAUNCH_TEMPLATE_ID,
    ENV_MAX_CONCURRENT_JOBS,
    ENV_QUEUE_URL,
    ENV_SPOT_VCPU_QUOTAS,
    ENV_STATE_MACHINE_ARN,
    ENV_SUBNETS,
    ENV_TABLE,
    ENV_TABLE_ARN,
    ENV_WORKER_ROLE_ARN,
    SETTINGS_BY_FUNCTION,
)
from spotrelay.models import Job, JobState, parse_job_spec

from .aws_resources import REGION, TABLE, Lifecycle, Network, Queues
from .moto_progress import MOTO_PROGRESS

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ec2.type_defs import InstanceTypeDef
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_stepfunctions import SFNClient
    from mypy_boto3_stepfunctions.type_defs import DescribeExecutionOutputTypeDef

# `functions/` is not an installed package (only `spotrelay` is): the repository root goes on the path.
REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

EVENTS_DIR = REPO_ROOT / "events"
RECORDED = EVENTS_DIR / "recorded"
FUNCTIONS = tuple(SETTINGS_BY_FUNCTION)

# The deployment's settings (what the stack would put in each function's environment).
ALLOWED_FAMILIES = ("g5", "g6")  # resnet50 also fits g4dn, gr6, p3 and p4d: those must never be planned
BLOCK_MINUTES = 30
HEARTBEAT_SECONDS = 300
DISPATCHER_FUNCTION = "spotrelay-dispatcher"  # no such function in moto: the wake-up fails, quietly
POWERTOOLS_ENV = {
    "POWERTOOLS_SERVICE_NAME": "spotrelay",
    "POWERTOOLS_METRICS_NAMESPACE": "spotrelay",
    "POWERTOOLS_TRACE_DISABLED": "true",
}


@dataclass(frozen=True)
class LambdaContextStub:
    """The part of the Lambda context Powertools reads."""

    function_name: str
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = ""
    aws_request_id: str = "00000000-0000-0000-0000-000000000000"

    @classmethod
    def of(cls, name: str) -> LambdaContextStub:
        return cls(
            function_name=f"spotrelay-{name}",
            invoked_function_arn=f"arn:aws:lambda:us-east-1:123456789012:function:spotrelay-{name}",
        )


def resnet50_spec() -> dict[str, Any]:
    """events/jobs/resnet50.yaml, as the JSON body a user sends to the job queue."""
    data = yaml.safe_load((EVENTS_DIR / "jobs" / "resnet50.yaml").read_text())
    assert isinstance(data, dict)
    return data


def recorded_event(name: str, instance_id: str | None = None) -> dict[str, Any]:
    """A recorded EventBridge event; with `instance_id`, `detail.instance-id` (and only it) names that instance."""
    event = json.loads((RECORDED / f"{name}.json").read_text())
    assert isinstance(event, dict)
    if instance_id is not None:
        event = copy.deepcopy(event)
        event["detail"]["instance-id"] = instance_id
    return event


def event_time(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(str(event["time"]).replace("Z", "+00:00"))


@dataclass(frozen=True)
class Launched:
    job_id: str
    task_token: str
    instance_id: str
    result: dict[str, Any]  # what the launch function returned


class TaskFailures:
    """The SendTaskFailure requests a function's Step Functions client makes (error, cause), seen on
    the client because moto drops the cause."""

    def __init__(self, client: Any) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        client.meta.events.register("provide-client-params.sfn.SendTaskFailure", self._record)

    def _record(self, params: dict[str, Any], **_: Any) -> None:
        cause = params.get("cause", "")
        try:
            parsed = json.loads(cause)
        except json.JSONDecodeError:
            parsed = {"message": cause}
        self.sent.append((str(params.get("error")), parsed if isinstance(parsed, dict) else {"message": cause}))


@dataclass
class Deployment:
    """The moto resources, named the way the stack passes them to the functions."""

    monkeypatch: pytest.MonkeyPatch
    clock: FakeClock
    store: DynamoJobStore
    dynamodb: DynamoDBClient
    sqs: SQSClient
    sfn: SFNClient
    ec2: EC2Client
    queues: Queues
    lifecycle: Lifecycle
    network: Network
    loaded: dict[str, ModuleType] = field(default_factory=dict)

    @classmethod
    def on(
        cls,
        monkeypatch: pytest.MonkeyPatch,
        clock: FakeClock,
        store: DynamoJobStore,
        queues: Queues,
        lifecycle: Lifecycle,
        network: Network,
    ) -> Deployment:
        """The deployment on the moto fixtures' resources (call it inside the `aws` fixture)."""
        return cls(
            monkeypatch=monkeypatch,
            clock=clock,
            store=store,
            dynamodb=store.client,
            sqs=boto3.client("sqs", region_name=REGION),
            sfn=boto3.client("stepfunctions", region_name=REGION),
            ec2=boto3.client("ec2", region_name=REGION),
            queues=queues,
            lifecycle=lifecycle,
            network=network,
        )

    # --- functions ----------------------------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        return function_environment(self.queues, self.lifecycle, self.network)

    def set_environment(self, name: str, *, without: str | None = None) -> None:
        """Exactly the environment the stack gives function `name` (less `without`), plus Powertools'."""
        set_function_environment(self.monkeypatch, name, self.environment(), without=without)

    def load(self, name: str) -> ModuleType:
        """Cold-start function `name`: import its module fresh with its environment; its clock is ours."""
        if name in self.loaded:
            return self.loaded[name]
        self.set_environment(name)
        module = import_fresh(name, self.monkeypatch)
        if hasattr(module, "clock"):
            self.monkeypatch.setattr(module, "clock", self.clock)
        self.loaded[name] = module
        return module

    def invoke(self, name: str, event: dict[str, Any]) -> dict[str, Any]:
        module = self.load(name)
        result = module.handler(event, LambdaContextStub.of(name))
        assert isinstance(result, dict)
        return result

    # --- jobs ---------------------------------------------------------------------------------------

    def create_job(self, job_id: str, *, state: JobState = JobState.QUEUED, **spec_fields: Any) -> Job:
        spec = parse_job_spec({**resnet50_spec(), **spec_fields})
        now = self.clock.now()
        job = Job(job_id=job_id, spec=spec, state=state, submitted_at=now, updated_at=now)
        assert self.store.create_job(job)
        return job

    def job(self, job_id: str) -> Job:
        return self.store.get_job(job_id)[0]

    def launch_job(self, job_id: str, **spec_fields: Any) -> Launched:
        """A job admitted, placed and launched the way JobLifecycle does it: a real execution waits in
        Run with its task token, Place ranks the pools, Launch starts the instance with that token."""
        self.create_job(job_id, state=JobState.PLACING, **spec_fields)
        token = self.start_waiting_execution(job_id)
        assert self.invoke("place", {"job_id": job_id})["action"] == "launch"
        launched = self.invoke("launch", {"job_id": job_id, "task_token": token})
        return Launched(job_id=job_id, task_token=token, instance_id=str(launched["instance_id"]), result=launched)

    def let_task_failures_land(self, module: ModuleType, job_id: str) -> None:
        """Make `module`'s SendTaskFailure return only once moto's execution thread has applied it.

        moto applies a task failure on the execution's thread, after answering; a StopExecution sent
        right after it (cancel does that while the execution still reads RUNNING) then races with it,
        and the execution ends FAILED or ABORTED by chance. Waiting here keeps the outcome deterministic."""
        workflow = module.workflow
        send = workflow.fail_task

        def fail_task_and_wait(task_token: str, error: str, cause: str) -> bool:
            sent = bool(send(task_token, error, cause))
            if sent:
                self.ended_execution(job_id)
            return sent

        self.monkeypatch.setattr(workflow, "fail_task", fail_task_and_wait)

    # --- Step Functions -----------------------------------------------------------------------------

    def execution_arn(self, job_id: str) -> str:
        return execution_arn(self.lifecycle.state_machine_arn, job_id)

    def start_waiting_execution(self, job_id: str) -> str:
        """A real JobLifecycle execution named `job_id`, waiting in its Run task; returns the task token."""
        self.sfn.start_execution(
            stateMachineArn=self.lifecycle.state_machine_arn,
            name=job_id,
            input=json.dumps({"job_id": job_id, "token_queue_url": self.lifecycle.token_queue_url}),
        )

        def receive() -> str | None:
            messages = self.sqs.receive_message(
                QueueUrl=self.lifecycle.token_queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
            ).get("Messages", [])
            for message in messages:
                body = json.loads(message.get("Body", "{}"))
                if body.get("job_id") == job_id:
                    return str(body["task_token"])
            return None

        return eventually(receive, f"the Run task token of {job_id}", on=MOTO_PROGRESS)

    def execution(self, job_id: str) -> DescribeExecutionOutputTypeDef:
        return self.sfn.describe_execution(executionArn=self.execution_arn(job_id))

    def ended_execution(self, job_id: str) -> DescribeExecutionOutputTypeDef:
        """The execution once it has left RUNNING."""

        def ended() -> DescribeExecutionOutputTypeDef | None:
            described = self.execution(job_id)
            return None if described["status"] == "RUNNING" else described

        return eventually(ended, f"the execution of {job_id} leaving RUNNING", on=MOTO_PROGRESS)

    def outcome(self, job_id: str) -> tuple[str, str | None]:
        """(status, error) of the execution once it has ended. moto 5.2.5 drops SendTaskFailure's
        `cause` (its response handler passes on the error only): see `TaskFailures` for the cause sent."""
        described = self.ended_execution(job_id)
        return described["status"], described.get("error")

    def executions(self) -> list[str]:
        listed = self.sfn.list_executions(stateMachineArn=self.lifecycle.state_machine_arn)["executions"]
        return sorted(e["name"] for e in listed)

    # --- EC2 ----------------------------------------------------------------------------------------

    def instance(self, instance_id: str) -> InstanceTypeDef:
        return self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]

    def instance_state(self, instance_id: str) -> str:
        return self.instance(instance_id).get("State", {}).get("Name", "unknown")

    def all_instances(self) -> list[InstanceTypeDef]:
        reservations = self.ec2.describe_instances()["Reservations"]
        return [i for r in reservations for i in r.get("Instances", [])]

    def launched_at(self, instance_id: str) -> datetime:
        return self.instance(instance_id)["LaunchTime"]

    # --- DynamoDB (raw items, as an operator would read them) ---------------------------------------

    def table_items(self) -> list[dict[str, Any]]:
        """The whole table, in key order (to show that a handler changed nothing)."""
        pages = self.dynamodb.get_paginator("scan").paginate(TableName=TABLE)
        found = [item for page in pages for item in page.get("Items", [])]
        return sorted(found, key=lambda item: (item["pk"]["S"], item["sk"]["S"]))

    def item(self, pk: str, sk: str) -> dict[str, Any] | None:
        found = self.dynamodb.get_item(TableName=TABLE, Key={"pk": {"S": pk}, "sk": {"S": sk}}, ConsistentRead=True)
        return found.get("Item")


def function_environment(queues: Queues, lifecycle: Lifecycle, network: Network) -> dict[str, str]:
    """Every setting of every function, as the stack sets them (each function gets only its own)."""
    return {
        ENV_TABLE: TABLE,
        ENV_QUEUE_URL: queues.queue_url,
        ENV_DLQ_URL: queues.dlq_url,
        ENV_STATE_MACHINE_ARN: lifecycle.state_machine_arn,
        ENV_LAUNCH_TEMPLATE_ID: network.launch_template_id,
        ENV_SUBNETS: json.dumps(network.subnets),
        ENV_ALLOWED_FAMILIES: ",".join(ALLOWED_FAMILIES),
        ENV_MAX_CONCURRENT_JOBS: "4",
        ENV_BUDGET_USD_PER_HOUR: "40",
        ENV_SPOT_VCPU_QUOTAS: json.dumps({"g": 64, "p": 96}),
        ENV_DISPATCHER_FUNCTION: DISPATCHER_FUNCTION,
        ENV_BLOCK_MINUTES: str(BLOCK_MINUTES),
        ENV_HEARTBEAT_SECONDS: str(HEARTBEAT_SECONDS),
        # vend's: names only (tests/integration/test_vend.py runs its step on moto)
        ENV_WORKER_ROLE_ARN: "arn:aws:iam::123456789012:role/spotrelay-worker",
        ENV_JOB_ROLE_ARN: "arn:aws:iam::123456789012:role/spotrelay-job",
        ENV_TABLE_ARN: f"arn:aws:dynamodb:us-east-1:123456789012:table/{TABLE}",
        ENV_BUCKET_ARN: "arn:aws:s3:::spotrelay-checkpoints",
        ENV_BUCKET_KEY_ARN: "arn:aws:kms:us-east-1:123456789012:key/0e7d3a4c-1b2f-4c5d-8e9f-0a1b2c3d4e5f",
        ENV_AGENT_LOG_GROUP_ARN: "arn:aws:logs:us-east-1:123456789012:log-group:/spotrelay/SpotRelay/agents",
    }


def set_function_environment(
    monkeypatch: pytest.MonkeyPatch, name: str, everything: dict[str, str], *, without: str | None = None
) -> None:
    """Exactly function `name`'s settings (less `without`), plus Powertools' variables; no other function's."""
    wanted = SETTINGS_BY_FUNCTION[name].env_keys()
    missing = wanted - everything.keys()
    assert not missing, f"the harness has no value for {name}'s settings {sorted(missing)}"
    for key in everything.keys() - wanted:
        monkeypatch.delenv(key, raising=False)
    for key in sorted(wanted):
        if key == without:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, everything[key])
    for key, value in POWERTOOLS_ENV.items():
        monkeypatch.setenv(key, value)


def import_fresh(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Import `functions.<name>` as a cold start does: whatever was imported before is dropped now,
    and put back (or dropped) when the test ends, so that no test sees another's module."""
    key = f"functions.{name}"
    monkeypatch.setitem(sys.modules, key, sys.modules.get(key))  # remembers what to restore
    del sys.modules[key]
    return importlib.import_module(key)
