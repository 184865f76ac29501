"""finalize (JobLifecycle Finalize step): terminate, total the cost across all attempts, record the
final state, emit the job's metrics and wake the dispatcher (spotrelay.control.lifecycle)."""

from __future__ import annotations

import os
from typing import Any, Literal

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
from spotrelay.aws.wakeup import LambdaWakeup
from spotrelay.config import FinalizeSettings
from spotrelay.control.lifecycle import finalize_step

settings = FinalizeSettings.from_env(os.environ)
logger = Logger()
tracer = Tracer()
metrics = Metrics()
clock = SystemClock()
store = DynamoJobStore(settings.table_name, boto3.client("dynamodb"))
compute = Ec2Compute(boto3.client("ec2"), region=boto3.session.Session().region_name or "")
wakeup = LambdaWakeup(boto3.client("lambda"), settings.dispatcher_function)


class Final(BaseModel):
    outcome: Literal["SUCCEEDED", "FAILED", "CANCELLED"]
    error: dict[str, Any] | None = None


class FinalizePayload(BaseModel):
    job_id: str
    final: Final


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
@named_throttling
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    payload = parse(event=event, model=FinalizePayload)
    logger.append_keys(job_id=payload.job_id)
    summary = finalize_step(
        payload.job_id, payload.final.model_dump(), store=store, compute=compute, clock=clock, wakeup=wakeup
    )
    metrics.add_metric(name=f"Jobs{summary.state.value.title()}", unit=MetricUnit.Count, value=1)
    metrics.add_metric(name="JobCostUsd", unit=MetricUnit.NoUnit, value=summary.cost_usd)
    logger.info("finalized", extra=summary.model_dump(mode="json"))
    return summary.model_dump(mode="json")
