"""place (JobLifecycle Place step): rank the pools for a job now and hand the best few to Launch,
or ask the state machine to wait, or give up after the job's patience (spotrelay.control.lifecycle)."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel

from spotrelay.aws.clock import SystemClock
from spotrelay.aws.compute import Ec2Compute
from spotrelay.aws.errors import named_throttling
from spotrelay.aws.store import DynamoJobStore
from spotrelay.config import PlaceSettings
from spotrelay.control.lifecycle import PlacementContext, place_step

settings = PlaceSettings.from_env(os.environ)
logger = Logger()
tracer = Tracer()
metrics = Metrics()
clock = SystemClock()
store = DynamoJobStore(settings.table_name, boto3.client("dynamodb"))
compute = Ec2Compute(boto3.client("ec2"), region=boto3.session.Session().region_name or "")
context_ = PlacementContext(subnets=settings.subnets, allowed_families=settings.allowed_families)


class PlacePayload(BaseModel):
    job_id: str


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
@named_throttling
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    payload = parse(event=event, model=PlacePayload)
    logger.append_keys(job_id=payload.job_id)
    result = place_step(payload.job_id, store=store, compute=compute, clock=clock, context=context_)
    if result.action == "wait":
        metrics.add_metric(name="PlacementWaits", unit=MetricUnit.Count, value=1)
    logger.info("placed", extra=result.payload())
    return result.payload()
