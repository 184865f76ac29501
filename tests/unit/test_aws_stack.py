"""spotrelay.aws.deployed_stack without AWS: an older deployment, a refused wake-up, a record of another version."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from spotrelay.aws.deployed_stack import USAGE, DeployedStack, JobsClient, JobStatus, StackError, deployed_stack
from spotrelay.aws.queue import SUBMISSION_ATTRIBUTE
from spotrelay.cli import app
from spotrelay.control.dispatcher import job_id_for
from spotrelay.models import Attempt, AttemptOutcome, Job, JobState, Market, Pool, parse_job_spec

if TYPE_CHECKING:
    from mypy_boto3_logs.type_defs import InputLogEventTypeDef

OUTPUTS = {
    "QueueUrl": "https://queue",
    "TableName": "t",
    "DispatcherFunctionName": "d",
    "CancelFunctionName": "c",
    "AgentLogGroupName": "/spotrelay/agent",
}
SPEC = parse_job_spec(
    {"name": "train", "run": {"command": "python train.py"}, "resources": {"gpus": 1}, "recovery": "same-pool-first"}
)


class CloudFormation:
    def __init__(self, outputs: dict[str, str], status: str = "CREATE_COMPLETE") -> None:
        self.outputs = outputs
        self.status = status

    def describe_stacks(self, StackName: str) -> dict[str, Any]:
        outputs = [{"OutputKey": k, "OutputValue": v} for k, v in self.outputs.items()]
        return {"Stacks": [{"StackStatus": self.status, "Outputs": outputs}]}


class Queue:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send_message(self, **request: Any) -> dict[str, str]:
        self.sent.append(request)
        return {"MessageId": "9e8d7c6b-5a49-3827-1605-f4e3d2c1b0a9"}


class RefusingLambda:
    def invoke(self, **kwargs: Any) -> dict[str, Any]:
        raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "not allowed"}}, "Invoke")


class Table:
    """DynamoDB answering GetItem with a job record another version of spotrelay wrote: in a state this
    version does not know (a field it does not know would be kept, and read: spotrelay.models.records)."""

    def get_item(self, **kwargs: Any) -> dict[str, Any]:
        record = {"job_id": "train-1", "spec": SPEC.model_dump(mode="json"), "state": "HIBERNATING"}
        record |= {"submitted_at": "2026-11-30T12:00:00Z", "updated_at": "2026-11-30T12:00:00Z"}
        return {"Item": {"record": {"S": json.dumps(record)}, "version": {"N": "1"}}}


def client(stack: DeployedStack, *, sqs: Any = None, lambda_: Any = None, dynamodb: Any = None) -> JobsClient:
    return JobsClient(stack, sqs=sqs, lambda_=lambda_, logs=None, dynamodb=dynamodb)  # type: ignore[arg-type]


def test_a_stack_deployed_before_an_output_existed_serves_the_commands_that_do_not_need_it() -> None:
    older = deployed_stack(CloudFormation({"QueueUrl": "https://queue", "TableName": "t"}), "SpotRelay")
    queue = Queue()
    # submit needs only the queue: it sends, and says why it could not wake the dispatcher
    submitted = client(older, sqs=queue).submit(SPEC)
    assert len(queue.sent) == 1
    assert submitted.wake_error == "stack SpotRelay has no output DispatcherFunctionName"
    # cancel needs its function: the error names the output, and is the user's to fix (exit 2)
    with pytest.raises(StackError) as raised:
        client(older).cancel("train-1")
    assert str(raised.value) == (
        "stack SpotRelay has no output CancelFunctionName: deploy this version of spotrelay (cdk deploy)"
    )
    assert raised.value.code == USAGE
    # and so does resume, on a stack deployed before it existed
    with pytest.raises(StackError, match=r"^stack SpotRelay has no output ResumeFunctionName: deploy this version"):
        client(older).resume("train-0123456789ab")


def test_a_stack_that_rolled_back_says_so() -> None:
    failed = deployed_stack(CloudFormation({}, status="ROLLBACK_COMPLETE"), "SpotRelay")
    with pytest.raises(StackError, match=r"^stack SpotRelay \(ROLLBACK_COMPLETE\) has no output TableName"):
        client(failed).jobs()


def test_submit_sends_the_spec_the_dispatcher_reads_back_under_its_own_submission_id() -> None:
    queue = Queue()
    submitted = client(
        deployed_stack(CloudFormation(OUTPUTS), "SpotRelay"), sqs=queue, lambda_=RefusingLambda()
    ).submit(SPEC)
    (request,) = queue.sent
    # The message is the same spec once the dispatcher parses it
    assert parse_job_spec(json.loads(request["MessageBody"])) == SPEC
    # The job id is the one the dispatcher makes from the submission id (not from the SQS message id)
    submission_id = request["MessageAttributes"][SUBMISSION_ATTRIBUTE]["StringValue"]
    assert submitted.job_id == job_id_for("train", submission_id) != job_id_for("train", submitted.message_id)
    # A refused wake-up is reported, not raised: the alarm or the schedule admits the job anyway
    assert not submitted.dispatcher_woken
    assert submitted.wake_error == "AccessDeniedException: not allowed"


def test_submit_refuses_a_job_the_stack_could_never_run_and_sends_nothing() -> None:
    # Given a stack that may launch only g5 and g6 instances, within $10/h for every job together
    limits = {
        "max_concurrent_jobs": 4,
        "budget_usd_per_hour": 10,
        "spot_vcpu_quotas": {},
        "allowed_families": ["g5", "g6"],
    }
    stack = deployed_stack(CloudFormation(OUTPUTS | {"AdmissionLimits": json.dumps(limits)}), "SpotRelay")
    v100 = SPEC.model_copy(update={"resources": SPEC.resources.model_copy(update={"gpu_models": ("V100",)})})
    eight = SPEC.model_copy(update={"resources": SPEC.resources.model_copy(update={"gpus": 8})})

    for spec, why in (
        (v100, "no instance type of the allowed GPU families (g5, g6) fits resources"),
        (eight, "more than the whole budget of $10/h"),
    ):
        # When a job only a p3 could run, or one whose cheapest instance costs more than the budget, is submitted
        queue = Queue()
        with pytest.raises(StackError) as raised:
            client(stack, sqs=queue).submit(spec)

        # Then it is refused with the dispatcher's own reason (the user's to fix: exit 2), and nothing is sent
        assert str(raised.value).startswith("stack SpotRelay would never run job train (")
        assert why in str(raised.value)
        assert str(raised.value).endswith("; not sent")
        assert raised.value.code == USAGE
        assert queue.sent == []

    # while a job a g5 can run is sent
    queue = Queue()
    client(stack, sqs=queue, lambda_=RefusingLambda()).submit(SPEC)
    assert len(queue.sent) == 1


def test_a_record_written_by_another_version_is_a_one_line_error_naming_the_field() -> None:
    stack = deployed_stack(CloudFormation(OUTPUTS), "SpotRelay")
    with pytest.raises(StackError) as raised:
        client(stack, dynamodb=Table()).status("train-1")
    assert str(raised.value) == (
        "the record of job train-1 does not read as this version of spotrelay's (state: Input should be 'QUEUED', "
        "'PLACING', 'WAITING', 'LAUNCHING', 'RUNNING', 'RECOVERING', 'SUCCEEDED', 'FAILED' or 'CANCELLED'): use "
        "the spotrelay version the stack was deployed with"
    )


class FailingCancel:
    """Lambda answering the cancel invocation with the function's error envelope."""

    def invoke(self, **kwargs: Any) -> dict[str, Any]:
        payload = b'{"errorType": "ConflictError", "errorMessage": "job train-1 is no longer at version 3"}'
        return {"StatusCode": 200, "FunctionError": "Unhandled", "Payload": io.BytesIO(payload)}


class JobTable:
    """DynamoDB holding one job (no attempts)."""

    def get_item(self, **kwargs: Any) -> dict[str, Any]:
        record = {"job_id": "train-1", "spec": SPEC.model_dump(mode="json")}
        record |= {"submitted_at": "2026-11-30T12:00:00Z", "updated_at": "2026-11-30T12:00:00Z"}
        return {"Item": {"record": {"S": json.dumps(record)}, "version": {"N": "1"}}}

    def get_paginator(self, name: str) -> Any:
        class Pages:
            def paginate(self, **kwargs: Any) -> list[dict[str, Any]]:
                return [{"Items": []}]

        return Pages()


def test_a_cancel_the_function_fails_is_an_error_with_its_message_not_a_result() -> None:
    stack = deployed_stack(CloudFormation(OUTPUTS), "SpotRelay")
    with pytest.raises(StackError) as raised:
        client(stack, lambda_=FailingCancel(), dynamodb=JobTable()).cancel("train-0123456789ab")
    assert str(raised.value) == "c failed on job train-0123456789ab: job train-1 is no longer at version 3"
    assert raised.value.code != USAGE  # AWS's side: trying again may work


def test_a_cancel_of_an_id_submit_cannot_have_printed_is_refused_before_anything_is_invoked() -> None:
    stack = deployed_stack(CloudFormation(OUTPUTS), "SpotRelay")
    # a typo (no 12 hex digits at the end) would otherwise leave a cancel note that no message ever reads
    with pytest.raises(StackError) as raised:
        client(stack, lambda_=RefusingLambda()).cancel("train-0123456789")
    assert raised.value.code == USAGE
    assert str(raised.value) == (
        "no job train-0123456789: a job id ends in - and 12 hex digits, as `spotrelay submit` printed it"
    )


def test_the_live_attempt_is_the_standby_once_it_is_handed_the_job() -> None:
    started = datetime(2026, 11, 30, 12, tzinfo=UTC)
    on_demand = Attempt(
        job_id="train-1",
        attempt=1,
        pool=Pool(instance_type="p3.2xlarge", availability_zone="us-east-1a", market=Market.ON_DEMAND),
        hourly_price=3.06,
        started_at=started,
        task_token="token-1",
    )
    standby = Attempt(
        job_id="train-1",
        attempt=2,
        pool=Pool(instance_type="p3.2xlarge", availability_zone="us-east-1b", market=Market.SPOT),
        hourly_price=0.97,
        started_at=started + timedelta(hours=1),
        handover_from=1,
    )
    job = Job(job_id="train-1", spec=SPEC, submitted_at=started, updated_at=started)
    # While the spot standby boots, the on-demand attempt runs the job
    assert JobStatus(job, [on_demand, standby]).live_attempt == on_demand
    # Once it is handed the job (the old attempt migrated, the standby got the Run task's token), it does
    handed_over = [
        on_demand.model_copy(update={"outcome": AttemptOutcome.MIGRATED, "ended_at": started + timedelta(hours=2)}),
        standby.model_copy(update={"task_token": "token-2"}),
    ]
    assert JobStatus(job, handed_over).live_attempt == handed_over[1]
    # And both instances count in the cost: 2 h on-demand, 2 h of the standby by 14:00 (boot included)
    now = started + timedelta(hours=3)
    assert JobStatus(job, handed_over).cost(now) == pytest.approx(2 * 3.06 + 2 * 0.97)


class Logs:
    """CloudWatch Logs with `streams` streams of one job, line i of stream s at time 1000 * i + s; FilterLogEvents
    answers sorted by time (its contract), in pages of 10 lines, and counts the pages it served."""

    def __init__(self, job_id: str, streams: int, lines: int) -> None:
        self.names = [f"{job_id}/{n:05d}" for n in range(1, streams + 1)]
        self.lines = lines
        self.pages_served = 0

    def get_paginator(self, operation: str) -> Any:
        logs = self

        class Paginator:
            def paginate(self, **query: Any) -> Any:
                if operation == "describe_log_streams":
                    yield {"logStreams": [{"logStreamName": n} for n in logs.names]}
                    return
                assert len(query["logStreamNames"]) <= 100  # FilterLogEvents' limit
                events = sorted(
                    (
                        {
                            "eventId": f"{name}-{i}",
                            "timestamp": 1000 * i + logs.names.index(name),
                            "logStreamName": name,
                            "message": json.dumps({"message": f"line {i}"}),
                        }
                        for name in query["logStreamNames"]
                        for i in range(logs.lines)
                    ),
                    key=lambda event: event["timestamp"],
                )
                for at in range(0, len(events), 10):
                    logs.pages_served += 1
                    yield {"events": events[at : at + 10]}

        return Paginator()


def test_log_lines_of_many_attempts_come_in_time_order_as_their_pages_arrive() -> None:
    stack = DeployedStack("SpotRelay", "us-east-1", "CREATE_COMPLETE", OUTPUTS)
    # Given a job with 150 attempts (two FilterLogEvents calls of at most 100 streams), 3 lines each
    logs = Logs("train-1", streams=150, lines=3)
    jobs = JobsClient(stack, sqs=None, lambda_=None, logs=logs, dynamodb=None)  # type: ignore[arg-type]

    # When the lines are read
    lines = jobs.log_lines("train-1")
    first = next(lines)

    # Then the first line is there after one page of each call, not after all 45 pages
    assert logs.pages_served == 2
    # and all of them come, each once, oldest first across the two calls
    rest = [first, *lines]
    assert [line.timestamp_ms for line in rest] == sorted(1000 * i + s for i in range(3) for s in range(150))
    assert len({line.event_id for line in rest}) == 450
    assert logs.pages_served == 45


def test_no_region_or_no_credentials_is_the_users_to_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    # Given a machine with no AWS configuration at all
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # When a command connects with no region: exit 2, saying how to give one
    with pytest.raises(StackError) as raised:
        JobsClient.connect("SpotRelay")
    assert raised.value.code == USAGE
    assert str(raised.value).endswith("(give --region, or set AWS_REGION)")
    # and AWS_REGION, as the hint says, gives the commands their region (botocore itself reads only
    # AWS_DEFAULT_REGION): what is missing then is credentials, in that region
    result = CliRunner().invoke(app, ["status", "train-0123456789ab"], env={"AWS_REGION": "eu-west-3"})
    assert result.exit_code == USAGE
    assert "cannot read stack SpotRelay in eu-west-3: Unable to locate credentials" in result.stderr
    # And with a region but no credentials: the same, saying how to give them
    with pytest.raises(StackError) as raised:
        JobsClient.connect("SpotRelay", region="us-east-1")
    assert raised.value.code == USAGE
    assert "Unable to locate credentials" in str(raised.value)
    assert str(raised.value).endswith("(give AWS_PROFILE, or `aws configure`)")


def test_log_lines_of_overlapping_attempts_come_in_time_order_from_cloudwatch() -> None:
    import boto3
    from moto import mock_aws

    with mock_aws():
        logs = boto3.client("logs", region_name="us-east-1")
        logs.create_log_group(logGroupName="/spotrelay/agent")
        # Given two attempts whose lines overlap in time (a standby taking over, say)
        now = int(datetime.now(UTC).timestamp() * 1000)  # CloudWatch refuses events older than 14 days
        for stream, times in (("train-1/00001", (1000, 3000)), ("train-1/00002", (2000, 4000))):
            logs.create_log_stream(logGroupName="/spotrelay/agent", logStreamName=stream)
            events: list[InputLogEventTypeDef] = [
                {"timestamp": now + t, "message": json.dumps({"message": f"at {t}"})} for t in times
            ]
            logs.put_log_events(logGroupName="/spotrelay/agent", logStreamName=stream, logEvents=events)
        stack = DeployedStack("SpotRelay", "us-east-1", "CREATE_COMPLETE", OUTPUTS)
        jobs = JobsClient(stack, sqs=None, lambda_=None, logs=logs, dynamodb=None)  # type: ignore[arg-type]
        # When they are read, Then they come oldest first across both streams
        assert [line.record["message"] for line in jobs.log_lines("train-1")] == [
            "at 1000",
            "at 2000",
            "at 3000",
            "at 4000",
        ]


def test_status_of_a_live_job_says_why_it_left_its_last_attempt() -> None:
    from spotrelay.cli.job_commands import describe_status

    now = datetime(2026, 11, 30, 13, tzinfo=UTC)
    cause = "HeartbeatTimeout in g4dn.xlarge in us-east-1a (spot): block it, take the next best pool"
    job = Job(
        job_id="train-0123456789ab",
        spec=SPEC,
        state=JobState.LAUNCHING,
        submitted_at=now - timedelta(hours=1),
        updated_at=now,
        attempts=2,
        interruptions=1,
        last_recovered_attempt=1,
        last_recovery={"action": "relaunch", "cause": cause},
    )
    lines = describe_status(JobStatus(job=job, attempts=[]), now)
    assert f"  last recovery, after attempt 1: {cause}" in lines
    # an ended job says why it ended instead
    ended = job.model_copy(update={"state": JobState.FAILED, "failure_reason": "TooManyInterruptions: 21"})
    assert not any(line.startswith("  last recovery") for line in describe_status(JobStatus(ended, []), now))


def test_status_of_a_job_waiting_on_ec2_throttling_says_it_fails_with_no_capacity_not_on_demand() -> None:
    from spotrelay.cli.job_commands import describe_status
    from spotrelay.control.decisions import THROTTLED_NOTE

    # Given a job with on-demand fallback (which a capacity wait would take) waiting because EC2 throttles
    # RunInstances (Launch's note)
    now = datetime(2026, 11, 30, 13, tzinfo=UTC)
    limits = SPEC.limits.model_copy(update={"deadline_hours": 30.0, "on_demand_fallback": True})
    job = Job(
        job_id="train-0123456789ab",
        spec=SPEC.model_copy(update={"limits": limits, "work_hours": 10.0}),
        state=JobState.WAITING,
        submitted_at=now - timedelta(hours=1),
        updated_at=now,
        waiting_since=now - timedelta(hours=1),
        waiting_reason=f"{THROTTLED_NOTE} (RequestLimitExceeded): throttling is per account and Region",
    )
    # When its status is described
    [line] = [line for line in describe_status(JobStatus(job, [], ("g6",)), now) if line.startswith("  waiting since")]
    # Then it says the job fails with NoCapacity once its patience is spent, as Place does (not "on-demand")
    assert "at 2026-12-01 12:00 UTC (limits.max_wait_hours 24)" in line
    assert line.endswith(
        "it fails with NoCapacity if EC2 still throttles its launches then (throttling is per "
        "account and Region: on-demand launches are throttled alike)"
    )
    assert "on-demand (" not in line


@pytest.mark.parametrize(
    ("update", "families", "then"),
    [
        ({"on_demand_fallback": False}, None, "it fails with NoCapacity (limits.on_demand_fallback is off)"),
        ({"deadline_hours": None}, None, "it fails with NoCapacity: no deadline (or no work estimate): spot only"),
        (
            {"max_price_per_hour": 0.5},
            None,
            "it fails with NoCapacity: no on-demand type fits within the price cap: spot only",
        ),
        # Place ranks by cost to finish: g6e.xlarge (L40S) finishes 10 h of work for less than g4dn.xlarge
        (
            {},
            None,
            "it goes on-demand (g6e.xlarge at $1.861/h) (if the stack allows its family); NoCapacity as long "
            "again later if on-demand is refused too",
        ),
        (
            {},
            ("g5", "g6"),
            "it goes on-demand (g6.xlarge at $0.805/h); NoCapacity as long again later if on-demand is refused too",
        ),
        # $3 of budget: no on-demand type finishes within it, and by then the slow ones miss the deadline
        (
            {"max_total_cost": 3},
            ("g4dn", "g5", "g6"),
            "it fails with NoCapacity: no pool can take the job then: ",
        ),
    ],
)
def test_status_of_a_waiting_job_says_what_happens_when_its_patience_runs_out(
    update: dict[str, Any], families: tuple[str, ...] | None, then: str
) -> None:
    from spotrelay.cli.job_commands import describe_status

    # Given a waiting job with a deadline (or not), a price cap, and the stack's GPU families (or not known)
    now = datetime(2026, 11, 30, 13, tzinfo=UTC)
    limits = SPEC.limits.model_copy(update={"deadline_hours": 30.0, **update})
    spec = SPEC.model_copy(update={"limits": limits, "work_hours": 10.0})
    job = Job(
        job_id="train-0123456789ab",
        spec=spec,
        state=JobState.WAITING,
        submitted_at=now - timedelta(hours=1),
        updated_at=now,
        waiting_since=now - timedelta(hours=1),
        waiting_reason="no pool can take the job now: 3 price-cap (...)",
    )

    # When its status is described
    [line] = [line for line in describe_status(JobStatus(job, [], families), now) if line.startswith("  waiting since")]

    # Then it says when its patience runs out and what Place will do then
    assert "at 2026-12-01 12:00 UTC (limits.max_wait_hours 24)" in line
    if then.endswith(": "):
        assert then in line
        assert "budget left" in line
    else:
        assert line.endswith(then)
