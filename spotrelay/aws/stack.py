"""A deployed stack as a user's machine reaches it: the stack's outputs, and the job commands on them
(`spotrelay submit / status / ls / cancel`).

Everything is found from the CloudFormation stack's outputs (one DescribeStacks), so a user needs only the
stack's name (`SpotRelay` unless `cdk deploy` was given another), credentials and the region. Against
`spotrelay local up`, pass its endpoint URL (or set `AWS_ENDPOINT_URL`, which boto3 reads itself).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.wakeup import WAKEUP_SOURCE
from spotrelay.control.dispatcher import job_id_for
from spotrelay.control.ports import NotFoundError
from spotrelay.models import Attempt, Job, JobSpec

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

DEFAULT_STACK = "SpotRelay"

# output key -> DeployedStack field (stacks/scheduler_stack.py declares them)
OUTPUTS = {
    "QueueUrl": "queue_url",
    "TableName": "table_name",
    "DispatcherFunctionName": "dispatcher_function",
    "CancelFunctionName": "cancel_function",
}


class StackError(RuntimeError):
    """The stack or a job cannot be reached or read (the message says which, and why)."""


@dataclass(frozen=True, slots=True)
class DeployedStack:
    name: str
    queue_url: str
    table_name: str
    dispatcher_function: str
    cancel_function: str


def deployed_stack(cloudformation: Any, name: str) -> DeployedStack:
    """The stack's outputs; a StackError names the stack, or the output an older deployment lacks."""
    try:
        stacks = cloudformation.describe_stacks(StackName=name)["Stacks"]
    except (ClientError, BotoCoreError) as e:
        raise StackError(f"cannot read stack {name}: {_why(e)}") from None
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", []) if "OutputKey" in o}
    missing = [key for key in OUTPUTS if not outputs.get(key)]
    if missing:
        raise StackError(
            f"stack {name} has no output {', '.join(missing)}: deploy this version of spotrelay (cdk deploy)"
        )
    return DeployedStack(name=name, **{field: outputs[key] for key, field in OUTPUTS.items()})


@dataclass(frozen=True, slots=True)
class Submitted:
    job_id: str
    message_id: str
    queue_url: str
    dispatcher_woken: bool
    wake_error: str | None = None


@dataclass(frozen=True, slots=True)
class JobStatus:
    job: Job
    attempts: list[Attempt]

    @property
    def live_attempt(self) -> Attempt | None:
        """The attempt that runs the job now (not a standby launched ahead of a move back to spot)."""
        live = [a for a in self.attempts if a.is_live and a.handover_from is None]
        return live[-1] if live else None

    def running_cost(self, now: datetime) -> float:
        """What the live attempts have cost so far (the job's cost_usd counts ended attempts only)."""
        return sum(a.hourly_price * max(0.0, (now - a.started_at).total_seconds()) / 3600 for a in self.live())

    def live(self) -> list[Attempt]:
        return [a for a in self.attempts if a.is_live]


class JobsClient:
    """The job commands on a deployed stack."""

    def __init__(self, stack: DeployedStack, *, sqs: SQSClient, lambda_: Any, store: DynamoJobStore) -> None:
        self.stack = stack
        self.sqs = sqs
        self.lambda_ = lambda_
        self.store = store

    @classmethod
    def connect(cls, stack_name: str, *, region: str | None = None, endpoint_url: str | None = None) -> JobsClient:
        try:
            session = boto3.session.Session(region_name=region)
            kwargs: dict[str, Any] = {"endpoint_url": endpoint_url} if endpoint_url else {}
            stack = deployed_stack(session.client("cloudformation", **kwargs), stack_name)
            return cls(
                stack,
                sqs=session.client("sqs", **kwargs),
                lambda_=session.client("lambda", **kwargs),
                store=DynamoJobStore(stack.table_name, session.client("dynamodb", **kwargs)),
            )
        except BotoCoreError as e:  # no region, no credentials, an endpoint that does not answer
            raise StackError(f"cannot reach stack {stack_name}: {e}") from None

    def submit(self, spec: JobSpec, *, wake: bool = True) -> Submitted:
        """Send the job to the queue, as `aws sqs send-message` would, then wake the dispatcher so it is
        admitted now rather than when the queue-depth alarm or the 5-minute schedule runs it."""
        body = spec.model_dump_json(exclude_unset=True)
        try:
            message_id = self.sqs.send_message(QueueUrl=self.stack.queue_url, MessageBody=body)["MessageId"]
        except (ClientError, BotoCoreError) as e:
            raise StackError(f"cannot send the job to {self.stack.queue_url}: {_why(e)}") from None
        job_id = job_id_for(spec.name, message_id)
        if not wake:
            return Submitted(job_id, message_id, self.stack.queue_url, dispatcher_woken=False)
        payload = json.dumps({"source": WAKEUP_SOURCE, "reason": f"submitted {job_id}"}).encode()
        try:
            self.lambda_.invoke(FunctionName=self.stack.dispatcher_function, InvocationType="Event", Payload=payload)
        except (ClientError, BotoCoreError) as e:
            return Submitted(job_id, message_id, self.stack.queue_url, dispatcher_woken=False, wake_error=_why(e))
        return Submitted(job_id, message_id, self.stack.queue_url, dispatcher_woken=True)

    def status(self, job_id: str) -> JobStatus:
        try:
            job, _ = self.store.get_job(job_id)
            return JobStatus(job=job, attempts=self.store.attempts(job_id))
        except NotFoundError:
            raise StackError(f"no job {job_id} in stack {self.stack.name} (`spotrelay ls --all` lists them)") from None
        except (ClientError, BotoCoreError) as e:
            raise StackError(f"cannot read job {job_id}: {_why(e)}") from None

    def jobs(self, *, ended: bool = False) -> list[Job]:
        """Queued and live jobs, oldest first; with `ended`, every job in the table (a scan)."""
        try:
            jobs = self.store.all_jobs() if ended else [*self.store.queued_jobs(10_000), *self.store.active_jobs()]
        except (ClientError, BotoCoreError) as e:
            raise StackError(f"cannot list the jobs of stack {self.stack.name}: {_why(e)}") from None
        return sorted(jobs, key=lambda job: (job.submitted_at, job.job_id))

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Run the stack's cancel function on the job and return what it answered."""
        self.status(job_id)  # an unknown job is the user's mistake: say so before invoking anything
        try:
            answer = self.lambda_.invoke(
                FunctionName=self.stack.cancel_function, Payload=json.dumps({"job_id": job_id}).encode()
            )
            payload = json.loads(answer["Payload"].read() or b"null")
        except (ClientError, BotoCoreError) as e:
            raise StackError(f"cannot invoke {self.stack.cancel_function}: {_why(e)}") from None
        if answer.get("FunctionError") or not isinstance(payload, dict):
            detail = payload.get("errorMessage", payload) if isinstance(payload, dict) else payload
            raise StackError(f"{self.stack.cancel_function} failed on job {job_id}: {detail}")
        return payload


def _why(error: Exception) -> str:
    if isinstance(error, ClientError):
        info = error.response.get("Error", {})
        return f"{info.get('Code', 'error')}: {info.get('Message', '')}".rstrip(": ")
    return str(error)
