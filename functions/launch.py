"""launch (JobLifecycle Run task, .waitForTaskToken): start an instance in the first ranked pool with
capacity and record the attempt with the task token the agent will complete (spotrelay.control.lifecycle).

Raising InsufficientInstanceCapacity (every pool refused), LaunchThrottled (EC2 throttled RunInstances:
the Run task retries it with backoff) or JobCancelled fails the Run task with that error name, which the
state machine catches. A job cancelled while its instance was launching has had that instance terminated
by the time JobCancelled is raised."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, Field

from spotrelay.aws.clock import SystemClock
from spotrelay.aws.compute import Ec2Compute
from spotrelay.aws.errors import named_throttling
from spotrelay.aws.store import DynamoJobStore
from spotrelay.config import LaunchSettings
from spotrelay.control.lifecycle import (
    InsufficientInstanceCapacity,
    JobCancelled,
    LaunchThrottled,
    PlacementContext,
    launch_step,
)

settings = LaunchSettings.from_env(os.environ)
logger = Logger()
tracer = Tracer()
metrics = Metrics()
clock = SystemClock()
store = DynamoJobStore(settings.table_name, boto3.client("dynamodb"))
compute = Ec2Compute(
    boto3.client("ec2"),
    launch_template_id=settings.launch_template_id,
    region=boto3.session.Session().region_name or "",
)
context_ = PlacementContext(subnets=settings.subnets, allowed_families=settings.allowed_families)


class LaunchPayload(BaseModel):
    job_id: str
    task_token: str
    heartbeat_seconds: int | None = Field(default=None, ge=1)  # the Run task's heartbeat timeout


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
@named_throttling
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    payload = parse(event=event, model=LaunchPayload)
    logger.append_keys(job_id=payload.job_id)
    try:
        launched = launch_step(
            payload.job_id,
            payload.task_token,
            store=store,
            compute=compute,
            clock=clock,
            context=context_,
            heartbeat_timeout_seconds=payload.heartbeat_seconds,
        )
    except InsufficientInstanceCapacity as e:
        metrics.add_metric(name="LaunchRefusals", unit=MetricUnit.Count, value=1)
        logger.warning("no capacity in any ranked pool", extra={"reason": str(e)})
        raise
    except LaunchThrottled as e:
        metrics.add_metric(name="LaunchesThrottled", unit=MetricUnit.Count, value=1)
        logger.warning("EC2 throttled the launch: the Run task retries it", extra={"reason": str(e)})
        raise
    except JobCancelled as e:
        logger.info("job cancelled: nothing launched is left running", extra={"reason": str(e)})
        raise
    logger.append_keys(attempt=launched["attempt"])
    metrics.add_metric(name="InstancesLaunched", unit=MetricUnit.Count, value=1)
    logger.info("launched", extra=launched)
    return launched
