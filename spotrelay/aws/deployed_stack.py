"""A deployed stack as a user's machine reaches it: the stack's outputs, and the job commands on them
(`spotrelay submit / status / ls / logs / cost / wait / cancel`).

Everything is found from the CloudFormation stack's outputs (one DescribeStacks), so a user needs only the
stack's name (`SpotRelay` unless `cdk deploy` was given another), credentials and the region. Against
`spotrelay local up`, pass its endpoint URL (or set `AWS_ENDPOINT_URL`, which boto3 reads itself).
"""

from __future__ import annotations

import heapq
import json
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError, NoRegionError
from pydantic import ValidationError

from spotrelay.aws.queue import SUBMISSION_ATTRIBUTE
from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.wakeup import WAKEUP_SOURCE
from spotrelay.control.accounting import on_demand_cost
from spotrelay.control.admission import AdmissionLimits, never_admitted
from spotrelay.control.dispatcher import job_id_for
from spotrelay.control.ports import NotFoundError
from spotrelay.control.vend import attempt_log_stream
from spotrelay.field_problems import field_problems
from spotrelay.models import Attempt, Job, JobSpec

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_lambda import LambdaClient
    from mypy_boto3_logs import CloudWatchLogsClient
    from mypy_boto3_sqs import SQSClient

DEFAULT_STACK = "SpotRelay"

# What each command needs from the stack's outputs (stacks/scheduler_stack.py declares them): a command
# works on a stack deployed before an output it does not need existed.
QUEUE_URL = "QueueUrl"
TABLE_NAME = "TableName"
DISPATCHER_FUNCTION = "DispatcherFunctionName"
CANCEL_FUNCTION = "CancelFunctionName"
RESUME_FUNCTION = "ResumeFunctionName"
AGENT_LOG_GROUP = "AgentLogGroupName"
ADMISSION_LIMITS = "AdmissionLimits"

# Exit statuses: the user's input is wrong (an unknown stack or job, a bad option; retrying will not
# help), or AWS failed or refused (retrying may).
USAGE = 2
UNAVAILABLE = 1

# The most a queue message may be, body and attributes (SQS counts each attribute's name, type and value).
# A queue made without a MaximumMessageSize (ours: stacks/queue_construct.py) took 256 KiB until SQS's
# limit rose to 1 MiB in 2025: 256 KiB holds for every deployment. A job spec is about 1 KiB.
SQS_MESSAGE_MAX_BYTES = 256 * 1024

# The Lambda invocations wait longer than the cancel function may run (60 s), and are never retried by
# the SDK: a retry after a read timeout would cancel twice and report "had already ended".
LAMBDA_CONFIG = Config(read_timeout=90, retries={"total_max_attempts": 1})


# What `job_id_for` makes: a name, then 12 hex digits of a UUID (the submission id or the SQS message id)
JOB_ID_SHAPE = re.compile(r"[A-Za-z0-9_-]+-[0-9a-f]{12}")


def _check_job_id(job_id: str, hint: str = "") -> None:
    """A StackError (the user's input) unless `job_id` has the shape `job_id_for` gives every job id."""
    if not JOB_ID_SHAPE.fullmatch(job_id):
        raise StackError(
            f"no job {job_id}: a job id ends in - and 12 hex digits, as `spotrelay submit` printed it{hint}", USAGE
        )


class StackError(RuntimeError):
    """The stack or a job cannot be reached or read: the message says which and why, `code` is the exit
    status (USAGE or UNAVAILABLE)."""

    def __init__(self, message: str, code: int = UNAVAILABLE) -> None:
        super().__init__(message)
        self.code = code


class JobNotFound(StackError):
    """The table has no record of the job: a wrong id, or a job whose message the dispatcher has not read
    yet (`spotrelay submit --wait` waits through that)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, USAGE)


@dataclass(frozen=True, slots=True)
class DeployedStack:
    name: str
    region: str
    status: str
    outputs: Mapping[str, str]

    @property
    def admission_limits(self) -> AdmissionLimits | None:
        """What the stack's dispatcher admits; None from a stack deployed before it said (or unreadable)."""
        try:
            return AdmissionLimits.model_validate_json(self.outputs[ADMISSION_LIMITS])
        except (KeyError, ValidationError):
            return None

    def output(self, key: str) -> str:
        value = self.outputs.get(key)
        if not value:
            state = "" if self.status.endswith("_COMPLETE") and "ROLLBACK" not in self.status else f" ({self.status})"
            raise StackError(
                f"stack {self.name}{state} has no output {key}: deploy this version of spotrelay (cdk deploy)", USAGE
            )
        return value


def deployed_stack(cloudformation: Any, name: str) -> DeployedStack:
    """The stack's outputs, as DescribeStacks gives them; a StackError names the stack and the region."""
    region = getattr(getattr(cloudformation, "meta", None), "region_name", None) or "?"
    try:
        stacks = cloudformation.describe_stacks(StackName=name)["Stacks"]
    except NoCredentialsError as e:  # this machine's AWS configuration, not AWS
        raise StackError(
            f"cannot read stack {name} in {region}: {e} (give AWS_PROFILE, or `aws configure`)", USAGE
        ) from None
    except (ClientError, BotoCoreError) as e:
        missing = isinstance(e, ClientError) and "does not exist" in str(e)
        hint = ""
        if missing:
            hint = " (another stack name: --stack NAME or SPOTRELAY_STACK; another region: --region)"
        elif isinstance(e, EndpointConnectionError):
            endpoint = getattr(getattr(cloudformation, "meta", None), "endpoint_url", "")
            if "localhost" in endpoint or "127.0.0.1" in endpoint:
                hint = " (is `spotrelay local up` running there? its port: AWS_ENDPOINT_URL or --endpoint-url)"
        raise StackError(
            f"cannot read stack {name} in {region}: {_why(e)}{hint}", USAGE if missing else UNAVAILABLE
        ) from None
    stack = stacks[0]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", []) if "OutputKey" in o}
    return DeployedStack(name=name, region=region, status=str(stack.get("StackStatus", "")), outputs=outputs)


@dataclass(frozen=True, slots=True)
class Submitted:
    job_id: str
    message_id: str
    queue_url: str
    dispatcher_woken: bool
    wake_error: str | None = None


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line the worker agent shipped (spotrelay.agent.logs): `record` is its JSON object (the job's
    own output has message "job output" and the text in `line`)."""

    event_id: str
    timestamp_ms: int
    stream: str
    record: dict[str, Any]

    @property
    def is_job_output(self) -> bool:
        return self.record.get("message") == "job output"


@dataclass(frozen=True, slots=True)
class JobStatus:
    job: Job
    attempts: list[Attempt]
    allowed_families: tuple[str, ...] | None = None  # the stack's GPU families (None: not known)

    @property
    def live_attempt(self) -> Attempt | None:
        """The attempt that runs the job now: not a standby launched ahead of a move back to spot, until it
        is handed the job (then it has the Run task's token, and it is the one)."""
        live = [a for a in self.attempts if a.is_live and not a.is_standby]
        return live[-1] if live else None

    def running_cost(self, now: datetime) -> float:
        """What the live attempts have cost so far (the job's cost_usd counts ended attempts only)."""
        return sum(a.cost(now) for a in self.live())

    def cost(self, now: datetime) -> float:
        """Every attempt's bill (`Attempt.cost`, the replay's report counts the same): the prices in effect
        until its instance's end once that end is reported and settled, before that its hours so far (the
        live ones up to `now`) at its launch price."""
        return sum(a.cost(now) for a in self.attempts)

    def on_demand_cost(self, now: datetime) -> float:
        """The same instance hours at on-demand prices: what the job's savings are measured against."""
        return on_demand_cost(self.attempts, now)

    def live(self) -> list[Attempt]:
        return [a for a in self.attempts if a.is_live]


class JobsClient:
    """The job commands on a deployed stack."""

    def __init__(
        self,
        stack: DeployedStack,
        *,
        sqs: SQSClient,
        lambda_: LambdaClient,
        logs: CloudWatchLogsClient,
        dynamodb: DynamoDBClient,
    ) -> None:
        self.stack = stack
        self.sqs = sqs
        self.lambda_ = lambda_
        self.logs = logs
        self.dynamodb = dynamodb

    @classmethod
    def connect(cls, stack_name: str, *, region: str | None = None, endpoint_url: str | None = None) -> JobsClient:
        try:
            session = boto3.session.Session(region_name=region)
            kwargs: dict[str, Any] = {"endpoint_url": endpoint_url} if endpoint_url else {}
            stack = deployed_stack(session.client("cloudformation", **kwargs), stack_name)
            return cls(
                stack,
                sqs=session.client("sqs", **kwargs),
                lambda_=session.client("lambda", config=LAMBDA_CONFIG, **kwargs),
                logs=session.client("logs", **kwargs),
                dynamodb=session.client("dynamodb", **kwargs),
            )
        except ValueError as e:  # botocore's answer to an endpoint URL it cannot use
            raise StackError(f"--endpoint-url {endpoint_url}: {e}", USAGE) from None
        except NoRegionError as e:  # this machine's AWS configuration, not AWS
            raise StackError(
                f"cannot reach stack {stack_name}: {e} (give --region, or set AWS_REGION)", USAGE
            ) from None
        except BotoCoreError as e:  # no region, no credentials, an endpoint that does not answer
            raise StackError(f"cannot reach stack {stack_name}: {e}") from None

    @property
    def store(self) -> DynamoJobStore:
        return DynamoJobStore(self.stack.output(TABLE_NAME), self.dynamodb)

    def submit(self, spec: JobSpec, *, wake: bool = True) -> Submitted:
        """Send the job to the queue, as `aws sqs send-message` would, with a submission id the dispatcher
        names the job by (a message the SDK sends twice is one job); then wake the dispatcher so the job
        is admitted now rather than when the queue-depth alarm or the 5-minute schedule runs it."""
        queue_url = self.stack.output(QUEUE_URL)
        limits = self.stack.admission_limits
        never = None if limits is None else never_admitted(spec, limits)
        if never is not None:
            raise StackError(f"stack {self.stack.name} would never run job {spec.name} ({never}); not sent", USAGE)
        submission_id = str(uuid.uuid4())
        # ASCII JSON: SQS takes no U+FFFE, U+FFFF or other character outside its allowed set in a message, and
        # a spec may hold one in its text; as \u escapes it travels, and the dispatcher reads the same text
        body = json.dumps(spec.model_dump(mode="json", exclude_unset=True), ensure_ascii=True, separators=(",", ":"))
        size = len(body.encode()) + len(SUBMISSION_ATTRIBUTE) + len("String") + len(submission_id)
        if size > SQS_MESSAGE_MAX_BYTES:  # SQS would refuse it (the user's to fix: a smaller spec)
            raise StackError(
                f"job {spec.name} is {size:,} bytes as a queue message, more than SQS takes "
                f"({SQS_MESSAGE_MAX_BYTES:,}); make its spec smaller (run.env: put large values in the image "
                "or S3); not sent",
                USAGE,
            )
        try:
            message_id = self.sqs.send_message(
                QueueUrl=queue_url,
                MessageBody=body,
                MessageAttributes={SUBMISSION_ATTRIBUTE: {"DataType": "String", "StringValue": submission_id}},
            )["MessageId"]
        except (ClientError, BotoCoreError) as e:
            raise StackError(f"cannot send the job to {queue_url}: {_why(e)}") from None
        job_id = job_id_for(spec.name, submission_id)
        dispatcher = self.stack.outputs.get(DISPATCHER_FUNCTION)
        if not wake or not dispatcher:
            why = None if not wake else f"stack {self.stack.name} has no output {DISPATCHER_FUNCTION}"
            return Submitted(job_id, message_id, queue_url, dispatcher_woken=False, wake_error=why)
        payload = json.dumps({"source": WAKEUP_SOURCE, "reason": f"submitted {job_id}"}).encode()
        try:
            self.lambda_.invoke(FunctionName=dispatcher, InvocationType="Event", Payload=payload)
        except (ClientError, BotoCoreError) as e:
            return Submitted(job_id, message_id, queue_url, dispatcher_woken=False, wake_error=_why(e))
        return Submitted(job_id, message_id, queue_url, dispatcher_woken=True)

    def status(self, job_id: str) -> JobStatus:
        store = self.store
        job = self.job(job_id)
        limits = self.stack.admission_limits
        families = None if limits is None else limits.allowed_families
        return JobStatus(job=job, attempts=self._attempts(store, job_id), allowed_families=families)

    def job(self, job_id: str) -> Job:
        """The job's record alone, one GetItem: what `spotrelay wait` polls."""
        try:
            job, _ = self.store.get_job(job_id)
        except NotFoundError:
            _check_job_id(job_id, " (`spotrelay ls` lists them)")  # a job's name, say, rather than its id
            raise JobNotFound(
                f"no job {job_id} in stack {self.stack.name}: not submitted there, or its message is still in "
                "the queue (the dispatcher records a job when it next runs, within 5 minutes)"
            ) from None
        except ValidationError as e:
            raise _other_version(f"job {job_id}", e) from None
        except (ClientError, BotoCoreError) as e:
            raise StackError(f"cannot read job {job_id}: {_why(e)}") from None
        return job

    def with_attempts(self, jobs: Sequence[Job]) -> list[JobStatus]:
        """These jobs, as already read, with their attempts (one Query each): what `spotrelay ls` shows each
        job's pool and cost from."""
        store = self.store
        return [JobStatus(job=job, attempts=self._attempts(store, job.job_id)) for job in jobs]

    def _attempts(self, store: DynamoJobStore, job_id: str) -> list[Attempt]:
        try:
            return store.attempts(job_id)
        except ValidationError as e:
            raise _other_version(f"job {job_id}", e) from None
        except (ClientError, BotoCoreError) as e:
            raise StackError(f"cannot read job {job_id}: {_why(e)}") from None

    def jobs(self, *, ended: bool = False) -> list[Job]:
        """Queued and live jobs, oldest first; with `ended`, every job in the table (a scan)."""
        store = self.store
        try:
            found = store.all_jobs() if ended else [*store.queued_jobs(10_000), *store.active_jobs()]
        except ValidationError as e:
            raise _other_version("a job", e) from None
        except (ClientError, BotoCoreError) as e:
            raise StackError(f"cannot list the jobs of stack {self.stack.name}: {_why(e)}") from None
        # The index lags the table: a job moving from QUEUED on may be read under both partitions.
        latest: dict[str, Job] = {}
        for job in found:
            if job.job_id not in latest or job.updated_at > latest[job.job_id].updated_at:
                latest[job.job_id] = job
        return sorted(latest.values(), key=lambda job: (job.submitted_at, job.job_id))

    def statuses(self, job_ids: Sequence[str] = ()) -> list[JobStatus]:
        """These jobs (default: every job in the table) with their attempts, oldest first."""
        if not job_ids:
            job_ids = [job.job_id for job in self.jobs(ended=True)]
        return [self.status(job_id) for job_id in dict.fromkeys(job_ids)]  # each once, in the order given

    def log_lines(self, job_id: str, *, attempt: int | None = None, since_ms: int | None = None) -> Iterator[LogLine]:
        """The job's log lines (one attempt's, with `attempt`) from `since_ms` on, oldest first, as their
        pages arrive: a long job's history prints without waiting for all of it, or holding it.

        The job's streams are listed first (`<job id>/<attempt>`, by prefix), then read by name, at most
        100 a call (FilterLogEvents' limit), rather than filtered by prefix: moto ignores that filter. Each
        call's events come sorted by time (FilterLogEvents' contract), so the calls' pages are merged."""
        group = self.stack.output(AGENT_LOG_GROUP)
        prefix = attempt_log_stream(job_id, attempt) if attempt is not None else f"{job_id}/"
        try:
            streams = [
                stream["logStreamName"]
                for page in self.logs.get_paginator("describe_log_streams").paginate(
                    logGroupName=group, logStreamNamePrefix=prefix
                )
                for stream in page.get("logStreams", [])
                if stream.get("logStreamName", "").startswith(prefix)
            ]
        except (ClientError, BotoCoreError) as e:
            raise StackError(f"cannot read the logs of job {job_id}: {_why(e)}") from None
        chunks = [self._events(job_id, group, streams[at : at + 100], since_ms) for at in range(0, len(streams), 100)]
        # heapq.merge is stable: lines of one millisecond keep the order their call gave them
        yield from heapq.merge(*chunks, key=lambda line: line.timestamp_ms)

    def _events(self, job_id: str, group: str, streams: list[str], since_ms: int | None) -> Iterator[LogLine]:
        # interleaved: AWS always interleaves streams by time (the flag is deprecated there); moto only if asked
        query: dict[str, Any] = {"logGroupName": group, "logStreamNames": streams, "interleaved": True}
        if since_ms is not None:
            query["startTime"] = since_ms
        try:
            for page in self.logs.get_paginator("filter_log_events").paginate(**query):
                for event in page.get("events", []):
                    yield LogLine(
                        event_id=event.get("eventId", ""),
                        timestamp_ms=event.get("timestamp", 0),
                        stream=event.get("logStreamName", ""),
                        record=_record(event.get("message", "")),
                    )
        except (ClientError, BotoCoreError) as e:
            raise StackError(f"cannot read the logs of job {job_id}: {_why(e)}") from None

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Run the stack's cancel function on the job and return what it answered. A job with no record yet
        (its message still in the queue) is cancelled when the dispatcher reads it (`before_admission`)."""
        return self._invoke(CANCEL_FUNCTION, job_id)  # (a typo would leave a note no message ever reads)

    def resume(self, job_id: str) -> dict[str, Any]:
        """Run the stack's resume function on the job (spotrelay.control.resume) and return what it answered:
        `resumed`, `already` (a resumed run is live), or `refused` with the reason."""
        return self._invoke(RESUME_FUNCTION, job_id)

    def _invoke(self, output: str, job_id: str) -> dict[str, Any]:
        function = self.stack.output(output)
        _check_job_id(job_id)
        try:
            answer = self.lambda_.invoke(FunctionName=function, Payload=json.dumps({"job_id": job_id}).encode())
            payload = json.loads(answer["Payload"].read() or b"null")
        except (ClientError, BotoCoreError) as e:
            raise StackError(f"cannot invoke {function}: {_why(e)}") from None
        if answer.get("FunctionError") or not isinstance(payload, dict):
            detail = payload.get("errorMessage", payload) if isinstance(payload, dict) else payload
            raise StackError(f"{function} failed on job {job_id}: {detail}")
        return payload


def _other_version(what: str, error: ValidationError) -> StackError:
    detail = "; ".join(field_problems(error, at_most=1))
    return StackError(
        f"the record of {what} does not read as this version of spotrelay's ({detail}): "
        "use the spotrelay version the stack was deployed with"
    )


def _record(message: str) -> dict[str, Any]:
    try:
        record = json.loads(message)
    except json.JSONDecodeError:
        record = None
    return record if isinstance(record, dict) else {"message": message}


def _why(error: Exception) -> str:
    if isinstance(error, ClientError):
        info = error.response.get("Error", {})
        return f"{info.get('Code', 'error')}: {info.get('Message', '')}".rstrip(": ")
    return str(error)
