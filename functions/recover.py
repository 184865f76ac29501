"""recover (JobLifecycle Recover step): close the lost attempt, account cost and lost work, and let
the job's recovery strategy choose: relaunch, wait for the final checkpoint, or fail."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, Field

from spotrelay.aws.clock import SystemClock
from spotrelay.aws.compute import Ec2Compute
from spotrelay.aws.errors import named_throttling
from spotrelay.aws.store import DynamoJobStore
from spotrelay.config import RecoverSettings
from spotrelay.control.lifecycle import recover_step

settings = RecoverSettings.from_env(os.environ)
logger = Logger()
tracer = Tracer()
metrics = Metrics()
clock = SystemClock()
store = DynamoJobStore(settings.table_name, boto3.client("dynamodb"))
compute = Ec2Compute(boto3.client("ec2"), region=boto3.session.Session().region_name or "")


class StateError(BaseModel):
    error: str = Field(alias="Error")
    cause: str | None = Field(default=None, alias="Cause")


class RecoverPayload(BaseModel):
    job_id: str
    error: StateError


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
@named_throttling
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    payload = parse(event=event, model=RecoverPayload)
    logger.append_keys(job_id=payload.job_id)
    result = recover_step(
        payload.job_id, payload.error.model_dump(by_alias=True), store=store, compute=compute, clock=clock
    )
    logger.info("recovered", extra={"error": payload.error.error, **result.payload()})
    return result.payload()
