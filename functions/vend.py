"""vend: a worker instance's agent asks for its job's credentials (spotrelay.control.vend).
Invoked directly by the agent: `{"identity": {<headers of a signed sts:GetCallerIdentity request>}}`;
answers `{"job_id", "attempt", "credentials": {...}}`, or fails with VendNotYet / VendRefused."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel, Field

from spotrelay.aws.clock import SystemClock
from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.vend import AgentLogStreams, StsCallerIdentity, StsJobRole, checked_identity_headers
from spotrelay.config import VendSettings
from spotrelay.control.vend import JobResources, VendRefused, vend_step

settings = VendSettings.from_env(os.environ)
logger = Logger()
tracer = Tracer()
metrics = Metrics()
clock = SystemClock()
region = boto3.session.Session().region_name or ""
store = DynamoJobStore(settings.table_name, boto3.client("dynamodb"))
identity = StsCallerIdentity(region, endpoint_url=os.environ.get("AWS_ENDPOINT_URL"))
sessions = StsJobRole(settings.job_role_arn, boto3.client("sts"))
streams = AgentLogStreams(settings.agent_log_group_arn, boto3.client("logs"))
resources = JobResources(
    bucket_arn=settings.bucket_arn,
    table_arn=settings.table_arn,
    bucket_key_arn=settings.bucket_key_arn,
    region=region,
    agent_log_group_arn=settings.agent_log_group_arn,
)


class VendPayload(BaseModel):
    identity: dict[str, str] = Field(max_length=8)


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    payload = parse(event=event, model=VendPayload)
    try:
        headers = checked_identity_headers(payload.identity, context.function_name)
        vended = vend_step(
            headers,
            identity=identity,
            records=store,
            sessions=sessions,
            worker_role_arn=settings.worker_role_arn,
            resources=resources,
            now=clock.now(),
        )
    except VendRefused as e:
        metrics.add_metric(name="CredentialsRefused", unit=MetricUnit.Count, value=1)
        logger.warning("credentials refused", extra={"refusal": type(e).__name__, "reason": str(e)})
        raise
    grant = vended.grant
    logger.append_keys(job_id=grant.job_id, attempt=grant.attempt)
    logger.info(
        "credentials vended",
        extra={"instance_id": grant.instance_id, "session_name": grant.session_name, "logs_only": grant.logs_only},
    )
    try:
        streams.ensure(grant.job_id, grant.attempt)  # the agent's lines go there, with these credentials
    except (BotoCoreError, ClientError) as e:  # the job runs without its lines shipped: never refuse it for that
        metrics.add_metric(name="LogStreamNotCreated", unit=MetricUnit.Count, value=1)
        logger.warning("could not create the attempt's log stream", extra={"error": str(e)[:500]})
    return {"job_id": grant.job_id, "attempt": grant.attempt, "credentials": vended.credentials}
