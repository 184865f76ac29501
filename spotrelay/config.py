"""Names shared by the infrastructure and the code, and one settings model per Lambda function.

`stacks/` imports this module (pure names and pydantic models, no behaviour) to set each function's
environment, so the two cannot drift apart; an infrastructure test checks every function's
environment keys against its settings model. Functions validate their settings at cold start:
`DispatcherSettings.from_env(os.environ)` in `functions/dispatcher.py`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Tags on every instance spotrelay launches. RunInstances is only allowed with them.
TAG_MANAGED = "spotrelay:managed"  # value "true"
TAG_JOB_ID = "spotrelay:job-id"
TAG_ATTEMPT = "spotrelay:attempt"
TAG_JOB_NAME = "spotrelay:job-name"

METRICS_NAMESPACE = "spotrelay"

# The schedule that runs the dispatcher and reconcile (the safety net for missed events, and the moves of
# on-demand jobs back to spot): how soon a job on on-demand notices that spot is worth going back to.
SCHEDULE_MINUTES = 5
# EC2 reclaims a spot instance two minutes after its interruption warning: it runs no longer than that.
# Source: "Spot Instance interruption notices", Amazon EC2 User Guide.
SPOT_NOTICE_SECONDS = 120
# An interruption warning keeps its pool out for every job this long (the stack's `block_minutes`, by
# default): Karpenter marks an interrupted offering unavailable for its ICE-cache TTL, 3 min
# (aws/karpenter-provider-aws pkg/cache).
INTERRUPTION_BLOCK_MINUTES = 3
# The stack output naming the queue where EventBridge puts an event it could not deliver to any rule's target
# (stacks/events_construct.py); each message's TARGET_ARN attribute names the function it was for
EVENT_TARGET_DLQ_OUTPUT = "EventTargetDeadLetterQueueUrl"

# Error names the JobLifecycle state machine catches (Lambda errors and task-token failures).
ERROR_SPOT_INTERRUPTED = "SpotInterrupted"
ERROR_MIGRATING = "Migrating"  # the agent checkpointed and handed the job back at the control plane's request
ERROR_INSTANCE_LOST = "InstanceLost"
ERROR_JOB_FAILED = "JobFailed"
ERROR_NO_CAPACITY = "InsufficientInstanceCapacity"  # every ranked pool refused us: back to Place
ERROR_LAUNCH_THROTTLED = "LaunchThrottled"  # EC2 throttled RunInstances: retried with backoff, then back to Place
ERROR_AWS_THROTTLED = "AwsThrottled"  # an AWS call of a task function throttled past the SDK's retries
ERROR_CANCELLED = "JobCancelled"
ERROR_BUDGET_EXHAUSTED = "BudgetExhausted"
ERROR_CHECKPOINT_CORRUPT = "CheckpointCorrupt"  # the agent: the committed checkpoint fails verification
# The Run task's retries of ERROR_LAUNCH_THROTTLED (stacks/lifecycle_construct.py): 2 s doubling, at most 30 s,
# 6 retries (2, 4, 8, 16, 30, 30: 90 s), after which Place backs off (spotrelay.control.decisions.THROTTLED_WAIT_*)
LAUNCH_THROTTLED_RETRY_FIRST_SECONDS = 2
LAUNCH_THROTTLED_RETRY_BACKOFF = 2
LAUNCH_THROTTLED_RETRY_MAX_SECONDS = 30
LAUNCH_THROTTLED_RETRY_ATTEMPTS = 6
# How long after an event is due it may still be on its way: a launch is recorded a moment after RunInstances
# returns (reconcile calls no fresh instance an orphan), and EC2's report that an instance is gone comes within
# it (reconcile settles a bill still unsettled after it; resume waits that long for a budgeted job's bills)
ORPHAN_GRACE_SECONDS = 300

# Environment variable names (the settings models' aliases).
ENV_TABLE = "SPOTRELAY_TABLE"
ENV_BUCKET = "SPOTRELAY_BUCKET"
ENV_AGENT_LOG_GROUP = "SPOTRELAY_AGENT_LOG_GROUP"  # where the worker agent ships its log lines
ENV_QUEUE_URL = "SPOTRELAY_QUEUE_URL"
ENV_DLQ_URL = "SPOTRELAY_DLQ_URL"
ENV_STATE_MACHINE_ARN = "SPOTRELAY_STATE_MACHINE_ARN"
ENV_LAUNCH_TEMPLATE_ID = "SPOTRELAY_LAUNCH_TEMPLATE_ID"
ENV_SUBNETS = "SPOTRELAY_SUBNETS"  # JSON {"us-east-1a": "subnet-...", ...}
ENV_ALLOWED_FAMILIES = "SPOTRELAY_ALLOWED_FAMILIES"  # comma-separated, e.g. "g5,g6,p4d"
ENV_MAX_CONCURRENT_JOBS = "SPOTRELAY_MAX_CONCURRENT_JOBS"
ENV_BUDGET_USD_PER_HOUR = "SPOTRELAY_BUDGET_USD_PER_HOUR"
ENV_SPOT_VCPU_QUOTAS = "SPOTRELAY_SPOT_VCPU_QUOTAS"  # JSON {"g": 64, "p": 96}: spot vCPU quota per quota group
ENV_DISPATCHER_FUNCTION = "SPOTRELAY_DISPATCHER_FUNCTION"
ENV_BLOCK_MINUTES = "SPOTRELAY_BLOCK_MINUTES"
ENV_HEARTBEAT_SECONDS = "SPOTRELAY_HEARTBEAT_SECONDS"
# vend (spotrelay.control.vend): whose sessions it serves, what it assumes, what it scopes the credentials to
ENV_WORKER_ROLE_ARN = "SPOTRELAY_WORKER_ROLE_ARN"
ENV_JOB_ROLE_ARN = "SPOTRELAY_JOB_ROLE_ARN"
ENV_TABLE_ARN = "SPOTRELAY_TABLE_ARN"
ENV_BUCKET_ARN = "SPOTRELAY_BUCKET_ARN"
ENV_BUCKET_KEY_ARN = "SPOTRELAY_BUCKET_KEY_ARN"
ENV_AGENT_LOG_GROUP_ARN = "SPOTRELAY_AGENT_LOG_GROUP_ARN"  # vend scopes a job's log streams within it
ENV_VEND_FUNCTION = "SPOTRELAY_VEND_FUNCTION"  # the agent's: where it gets its job's credentials


class FunctionSettings(BaseModel):
    """Settings read from the environment by alias (the env var name); unknown variables are ignored."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        return cls.model_validate(dict(environ))

    @classmethod
    def env_keys(cls) -> set[str]:
        return {field.alias or name for name, field in cls.model_fields.items()}


def _json_if_text(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _split_commas(value: Any) -> Any:
    return tuple(f.strip() for f in value.split(",") if f.strip()) if isinstance(value, str) else value


class TableSettings(FunctionSettings):
    table_name: str = Field(alias=ENV_TABLE, min_length=1)


class DispatcherSettings(TableSettings):
    queue_url: str = Field(alias=ENV_QUEUE_URL, min_length=1)
    dlq_url: str = Field(alias=ENV_DLQ_URL, min_length=1)
    state_machine_arn: str = Field(alias=ENV_STATE_MACHINE_ARN, min_length=1)
    max_concurrent_jobs: int = Field(alias=ENV_MAX_CONCURRENT_JOBS, ge=1)
    budget_usd_per_hour: float = Field(alias=ENV_BUDGET_USD_PER_HOUR, gt=0)
    spot_vcpu_quotas: dict[str, int] = Field(alias=ENV_SPOT_VCPU_QUOTAS)
    heartbeat_seconds: int = Field(alias=ENV_HEARTBEAT_SECONDS, ge=60)
    allowed_families: tuple[str, ...] = Field(alias=ENV_ALLOWED_FAMILIES, min_length=1)

    _parse_quotas = field_validator("spot_vcpu_quotas", mode="before")(_json_if_text)
    _parse_families = field_validator("allowed_families", mode="before")(_split_commas)


class PlaceSettings(TableSettings):
    subnets: dict[str, str] = Field(alias=ENV_SUBNETS, min_length=1, description="AZ -> subnet id")
    allowed_families: tuple[str, ...] = Field(alias=ENV_ALLOWED_FAMILIES, min_length=1)

    _parse_subnets = field_validator("subnets", mode="before")(_json_if_text)
    _parse_families = field_validator("allowed_families", mode="before")(_split_commas)


class LaunchSettings(PlaceSettings):
    launch_template_id: str = Field(alias=ENV_LAUNCH_TEMPLATE_ID, min_length=1)


class Ec2EventsSettings(TableSettings):
    state_machine_arn: str = Field(alias=ENV_STATE_MACHINE_ARN, min_length=1)
    block_minutes: float = Field(alias=ENV_BLOCK_MINUTES, gt=0)


class RecoverSettings(TableSettings):
    pass


class FinalizeSettings(TableSettings):
    dispatcher_function: str = Field(alias=ENV_DISPATCHER_FUNCTION, min_length=1)


class ReconcileSettings(LaunchSettings):
    """Reconcile also moves jobs running on on-demand back to spot, launching their spot standby first:
    Launch's settings, and its own."""

    state_machine_arn: str = Field(alias=ENV_STATE_MACHINE_ARN, min_length=1)
    heartbeat_seconds: int = Field(alias=ENV_HEARTBEAT_SECONDS, ge=60)


class CancelSettings(TableSettings):
    state_machine_arn: str = Field(alias=ENV_STATE_MACHINE_ARN, min_length=1)
    dispatcher_function: str = Field(alias=ENV_DISPATCHER_FUNCTION, min_length=1)


class ResumeSettings(CancelSettings):
    """Cancel's: the table, the state machine whose executions it reads, the dispatcher it wakes."""


class VendSettings(TableSettings):
    worker_role_arn: str = Field(alias=ENV_WORKER_ROLE_ARN, min_length=1)
    job_role_arn: str = Field(alias=ENV_JOB_ROLE_ARN, min_length=1)
    table_arn: str = Field(alias=ENV_TABLE_ARN, min_length=1)
    bucket_arn: str = Field(alias=ENV_BUCKET_ARN, min_length=1)
    bucket_key_arn: str = Field(alias=ENV_BUCKET_KEY_ARN, min_length=1)
    agent_log_group_arn: str = Field(alias=ENV_AGENT_LOG_GROUP_ARN, min_length=1)


SETTINGS_BY_FUNCTION: dict[str, type[FunctionSettings]] = {
    "dispatcher": DispatcherSettings,
    "place": PlaceSettings,
    "launch": LaunchSettings,
    "ec2_events": Ec2EventsSettings,
    "recover": RecoverSettings,
    "finalize": FinalizeSettings,
    "reconcile": ReconcileSettings,
    "cancel": CancelSettings,
    "resume": ResumeSettings,
    "vend": VendSettings,
}
