"""cancel: stop a job wherever it is, terminate its instance, mark it CANCELLED (spotrelay.control.cancel).
Invoked directly: `{"job_id": "..."}` (what `spotrelay cancel JOB` sends)."""

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
from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.wakeup import LambdaWakeup
from spotrelay.aws.workflow import StepFunctionsWorkflow
from spotrelay.config import CancelSettings
from spotrelay.control.cancel import cancel_job

settings = CancelSettings.from_env(os.environ)
logger = Logger()
tracer = Tracer()
metrics = Metrics()
clock = SystemClock()
store = DynamoJobStore(settings.table_name, boto3.client("dynamodb"))
compute = Ec2Compute(boto3.client("ec2"), region=boto3.session.Session().region_name or "")
workflow = StepFunctionsWorkflow(boto3.client("stepfunctions"), settings.state_machine_arn)
wakeup = LambdaWakeup(boto3.client("lambda"), settings.dispatcher_function)


class CancelPayload(BaseModel):
    job_id: str


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    payload = parse(event=event, model=CancelPayload)
    logger.append_keys(job_id=payload.job_id)
    result = cancel_job(payload.job_id, store=store, compute=compute, workflow=workflow, clock=clock, wakeup=wakeup)
    if not result.already_ended and not result.before_admission:  # a note is not a cancelled job (yet)
        metrics.add_metric(name="JobsCancelled", unit=MetricUnit.Count, value=1)
    logger.info("cancelled", extra=result.model_dump(mode="json"))
    return result.model_dump(mode="json")
