"""Who may have which job's credentials: the decision of the Vend function (a token vending machine).

A worker instance's own role reaches no job's data. Its agent asks Vend for its job's credentials,
proving who it is with a signed `sts:GetCallerIdentity` request (HashiCorp Vault's IAM auth): Vend
sends the request to STS, which answers with the signer's ARN. For an instance profile that is
`arn:<partition>:sts::<account>:assumed-role/<worker role>/<instance id>`: EC2 names the role session
after the instance, and only EC2 can start sessions of the worker role (its trust policy), so the ARN
names the calling instance. Then:

    caller ARN -> instance id          (`instance_of_caller`: the worker role's session, else refused)
    instance id -> job and attempt     (the store's INSTANCE#<id> item, written by Launch / reconcile)
    attempt live on that instance?     (`grant_for`: the attempt record names it and has no outcome)
    -> a grant: AssumeRole of JobRole for at most an hour, session name `<job>-<attempt>`, session
       tag `spotrelay-job-id`, and a session policy of `job_statements(job_id)`.
    attempt ended there, just now?     (within LOG_FLUSH_GRACE_SECONDS of its `ended_at`)
    -> a grant of the attempt's log stream alone, for 30 minutes (LOG_FLUSH_SESSION_SECONDS): asked
       for up to 15 minutes after the end, the last one lasts until 45 minutes after it.

The second grant is for the agent's last log lines. They go out after its report, so after the attempt
has ended, with the job's credentials; when those were in their last 10 minutes (botocore's mandatory
refresh), the refresh was refused and the lines were lost. Nothing else is granted once the attempt has
ended: its checkpoints, records and task token are the next attempt's business.

`job_statements` is also JobRole's own policy, written with the session tag's policy variable
(`${aws:PrincipalTag/spotrelay-job-id}`) where the session policy has the literal job id: either
alone confines the credentials to one job; a session's permissions are their intersection.

What a job's credentials reach (everything the agent reads or writes, nothing else):
- S3: Get/Put/AbortMultipartUpload of `jobs/<job_id>/*` (checkpoint data, manifests; CopyObject of
  an unchanged file is a Get of its source and a Put of its copy, both under the prefix); ListBucket
  only with a `jobs/<job_id>/` prefix.
- DynamoDB, items of partition `JOB#<job_id>` only (`dynamodb:LeadingKeys`): GetItem (the job, its
  attempts, the checkpoint pointer) and PutItem (the pointer) of the attributes a pointer has
  (`dynamodb:Attributes`): never `gsi1pk`/`gsi1sk`, so nothing it writes shows up in the QUEUED,
  ACTIVE or BLOCKED index partitions that the control plane reads for every job.
- KMS: the bucket key, only through S3 (`kms:ViaService`).
- Step Functions: SendTaskSuccess/Failure/Heartbeat. These take no resource-level permission: the
  task token is the capability, and the only tokens these credentials can read are their own job's
  (in its attempt records).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from spotrelay.control.ports import InstanceRef, NotFoundError
from spotrelay.models import Attempt

SESSION_TAG_JOB_ID = "spotrelay-job-id"
JOB_ID_VARIABLE = f"${{aws:PrincipalTag/{SESSION_TAG_JOB_ID}}}"
SESSION_SECONDS = 3600  # the most a chained role session may last
# botocore refreshes credentials in their last 15 minutes (RefreshableCredentials' advisory window), so a
# session of 15 (STS's shortest) would ask vend again at every call: 30 minutes leaves 15 before that
LOG_FLUSH_SESSION_SECONDS = 1800
# How long after its attempt ends an instance may still ship that attempt's lines: botocore refreshes
# 15 minutes before expiry (its advisory window), so one refresh at the end carries the final flush
LOG_FLUSH_GRACE_SECONDS = 900
# An end recorded ahead of vend's clock by more than this is not "just now" (a record from a writer whose clock
# is wrong would otherwise renew the grant for as long as it is ahead)
LOG_FLUSH_CLOCK_SKEW_SECONDS = 60
CHECKPOINT_PREFIX = "jobs/"
POINTER_ATTRIBUTES = ("pk", "sk", "record", "attempt", "seq")  # what `advance_checkpoint` writes
TASK_TOKEN_ACTIONS = ("states:SendTaskSuccess", "states:SendTaskFailure", "states:SendTaskHeartbeat")
# Job ids are [A-Za-z0-9_-] (spotrelay.control.dispatcher.job_id_for); anything else (a glob character, a
# policy variable, a slash) would widen the policy it is written into.
JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")
ASSUMED_ROLE = re.compile(
    r"arn:(?P<partition>aws[a-z-]*):sts::(?P<account>\d{12}):assumed-role/"
    r"(?P<role>[\w+=,.@-]{1,64})/(?P<session>[\w+=,.@-]{2,64})"
)
ROLE = re.compile(
    r"arn:(?P<partition>aws[a-z-]*):iam::(?P<account>\d{12}):role/(?:[\w+=,.@/-]*/)?(?P<role>[\w+=,.@-]{1,64})"
)
MAX_SESSION_NAME = 64


class VendRefused(Exception):
    """No credentials for this caller (the Lambda error type the agent sees is the class name)."""


class VendNotYet(VendRefused):
    """No credentials yet: the caller's instance or attempt is not recorded yet (Launch records them just
    after RunInstances returns); the agent asks again a little later."""


class JobResources(BaseModel):
    """The ARNs a job's credentials are scoped within (CDK tokens in the stack, text in the function)."""

    model_config = ConfigDict(frozen=True)

    bucket_arn: str
    table_arn: str
    bucket_key_arn: str
    region: str
    # The worker agents' log group, as `arn:<partition>:logs:<region>:<account>:log-group:<name>` (no `:*`)
    agent_log_group_arn: str


class JobGrant(BaseModel):
    """What Vend asks STS for: AssumeRole of JobRole with these."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    attempt: int
    instance_id: str
    session_name: str
    session_tags: dict[str, str]
    session_policy: dict[str, Any]
    duration_seconds: int = SESSION_SECONDS
    logs_only: bool = False  # the attempt has ended: its log stream only (module docstring)


def job_statements(job: str, resources: JobResources, attempt: int | None = None) -> list[dict[str, Any]]:
    """The IAM statements of one job's credentials; `job` is a job id or `JOB_ID_VARIABLE`. With `attempt`,
    the log lines go to that attempt's stream only (else to any of the job's)."""
    prefix = f"{CHECKPOINT_PREFIX}{job}/"
    streams = f"{job}/*" if attempt is None else attempt_log_stream(job, attempt)
    return [
        {
            "Sid": "ThisJobsCheckpointObjects",
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"],
            "Resource": f"{resources.bucket_arn}/{prefix}*",
        },
        {
            "Sid": "ListOnlyThisJobsPrefix",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": resources.bucket_arn,
            "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}},
        },
        {
            "Sid": "ReadThisJobsItems",
            "Effect": "Allow",
            "Action": "dynamodb:GetItem",
            "Resource": resources.table_arn,
            "Condition": {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [f"JOB#{job}"]}},
        },
        {
            "Sid": "WriteThisJobsCheckpointPointer",
            "Effect": "Allow",
            "Action": "dynamodb:PutItem",
            "Resource": resources.table_arn,
            "Condition": {
                "ForAllValues:StringEquals": {
                    "dynamodb:LeadingKeys": [f"JOB#{job}"],
                    "dynamodb:Attributes": list(POINTER_ATTRIBUTES),
                }
            },
        },
        {
            "Sid": "BucketKeyThroughS3Only",
            "Effect": "Allow",
            "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
            "Resource": resources.bucket_key_arn,
            "Condition": {"StringEquals": {"kms:ViaService": f"s3.{resources.region}.amazonaws.com"}},
        },
        {
            # The agent ships its lines with the job's credentials, not the instance profile's, so an
            # instance writes only its job's streams (`<job id>/<attempt>`, `attempt_log_stream`). Vend
            # creates the stream (CreateLogStream is authorized on the log group, not the stream).
            "Sid": "ThisJobsAgentLogStreams",
            "Effect": "Allow",
            "Action": "logs:PutLogEvents",
            "Resource": f"{resources.agent_log_group_arn}:log-stream:{streams}",
        },
        {
            "Sid": "TaskTokensTheTokenIsTheCapability",
            "Effect": "Allow",
            "Action": list(TASK_TOKEN_ACTIONS),
            "Resource": "*",
        },
    ]


def attempt_log_stream(job_id: str, attempt: int) -> str:
    """The attempt's agent log stream (job ids are [A-Za-z0-9_-], so no ':' or '*' in it)."""
    return f"{job_id}/{attempt:05d}"


def session_policy(job_id: str, resources: JobResources, attempt: int | None = None) -> dict[str, Any]:
    """The job role's statements with the literal job id (and the attempt's own log stream). Without their
    Sids (the role's policy has them): STS takes at most 2,048 characters of session policy, and the longest
    stack name (64 characters, stacks.config) and job id come close."""
    statements = [
        {k: v for k, v in statement.items() if k != "Sid"} for statement in job_statements(job_id, resources, attempt)
    ]
    return {"Version": "2012-10-17", "Statement": statements}


def log_flush_policy(job_id: str, attempt: int, resources: JobResources) -> dict[str, Any]:
    """The session policy of an ended attempt's instance: PutLogEvents to that attempt's stream, nothing else."""
    statements = [
        {k: v for k, v in statement.items() if k != "Sid"}
        for statement in job_statements(job_id, resources, attempt)
        if statement["Sid"] == "ThisJobsAgentLogStreams"
    ]
    return {"Version": "2012-10-17", "Statement": statements}


def instance_of_caller(caller_arn: str, worker_role_arn: str) -> str:
    """The instance id of a caller that is a session of the worker role (its instance profile)."""
    caller = ASSUMED_ROLE.fullmatch(caller_arn)
    role = ROLE.fullmatch(worker_role_arn)
    if role is None:
        raise ValueError(f"not an IAM role ARN: {worker_role_arn!r}")
    if caller is None or any(caller[part] != role[part] for part in ("partition", "account", "role")):
        raise VendRefused(f"the caller {caller_arn[:200]!r} is not a session of the worker role")
    instance_id = caller["session"]
    if not INSTANCE_ID.fullmatch(instance_id):
        raise VendRefused(f"the worker role's session {instance_id!r} is not an instance id")
    return instance_id


def session_name(job_id: str, attempt: int) -> str:
    """`<job>-<attempt>`, cut from the left of the job's name to STS's 64 characters (the job id's
    unique hex tail and the attempt stay; the exact job id is the session tag)."""
    tail = f"-{attempt}"
    return job_id[-(MAX_SESSION_NAME - len(tail)) :] + tail


def grant_for(
    instance_id: str, ref: InstanceRef | None, attempt: Attempt | None, resources: JobResources, now: datetime
) -> JobGrant:
    """Credentials for the job attempt that runs on `instance_id`, if that attempt is live there; its log
    stream alone if it ended there within LOG_FLUSH_GRACE_SECONDS."""
    if ref is None:
        raise VendNotYet(f"no job attempt is recorded for instance {instance_id}")
    if not JOB_ID.fullmatch(ref.job_id):
        raise VendRefused(f"instance {instance_id} is recorded for a job id that is not one: {ref.job_id[:200]!r}")
    if attempt is None:
        raise VendNotYet(f"attempt {ref.attempt} of job {ref.job_id} is not recorded")
    if attempt.job_id != ref.job_id or attempt.attempt != ref.attempt:
        raise VendRefused(f"the record read for attempt {ref.attempt} of job {ref.job_id} is another one's")
    if attempt.instance_id != instance_id:
        raise VendRefused(f"attempt {ref.attempt} of job {ref.job_id} runs on {attempt.instance_id}, not {instance_id}")
    if not attempt.is_live:
        ended = attempt.ended_at
        since = None if ended is None else (now - ended).total_seconds()
        if since is None or not -LOG_FLUSH_CLOCK_SKEW_SECONDS <= since <= LOG_FLUSH_GRACE_SECONDS:
            raise VendRefused(f"attempt {ref.attempt} of job {ref.job_id} has ended ({attempt.outcome})")
        return JobGrant(
            job_id=ref.job_id,
            attempt=ref.attempt,
            instance_id=instance_id,
            session_name=session_name(ref.job_id, ref.attempt),
            session_tags={SESSION_TAG_JOB_ID: ref.job_id},
            session_policy=log_flush_policy(ref.job_id, ref.attempt, resources),
            duration_seconds=LOG_FLUSH_SESSION_SECONDS,
            logs_only=True,
        )
    return JobGrant(
        job_id=ref.job_id,
        attempt=ref.attempt,
        instance_id=instance_id,
        session_name=session_name(ref.job_id, ref.attempt),
        session_tags={SESSION_TAG_JOB_ID: ref.job_id},
        session_policy=session_policy(ref.job_id, resources, ref.attempt),
    )


# --- the step: decide, then do -----------------------------------------------------------------------


class VendRecords(Protocol):
    """What Vend reads of the store (GetItem only)."""

    def get_instance_ref(self, instance_id: str) -> InstanceRef | None: ...

    def get_attempt(self, job_id: str, attempt: int) -> Attempt: ...


class CallerIdentity(Protocol):
    def caller_arn(self, headers: Mapping[str, str]) -> str: ...


class JobRoleSessions(Protocol):
    def assume(self, grant: JobGrant) -> dict[str, str]: ...


class Vended(BaseModel):
    model_config = ConfigDict(frozen=True)

    grant: JobGrant
    credentials: dict[str, str] = Field(repr=False)  # a secret: never logged


def vend_step(
    headers: Mapping[str, str],
    *,
    identity: CallerIdentity,
    records: VendRecords,
    sessions: JobRoleSessions,
    worker_role_arn: str,
    resources: JobResources,
    now: datetime,
) -> Vended:
    """Who calls (STS says), which attempt runs there (the store says), and its credentials."""
    instance_id = instance_of_caller(identity.caller_arn(headers), worker_role_arn)
    ref = records.get_instance_ref(instance_id)
    attempt = None
    if ref is not None:
        try:
            attempt = records.get_attempt(ref.job_id, ref.attempt)
        except NotFoundError:
            attempt = None
    grant = grant_for(instance_id, ref, attempt, resources, now)
    return Vended(grant=grant, credentials=sessions.assume(grant))
