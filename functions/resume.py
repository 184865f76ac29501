"""resume: queue a FAILED or CANCELLED job again, as a new run from its newest committed checkpoint
(spotrelay.control.resume). Invoked directly: `{"job_id": "..."}` (what `spotrelay resume JOB` sends)."""

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
from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.wakeup import LambdaWakeup
from spotrelay.aws.workflow import StepFunctionsWorkflow
from spotrelay.config import ResumeSettings
from spotrelay.control.resume import resume_job

settings = ResumeSettings.from_env(os.environ)
logger = Logger()
tracer = Tracer()
metrics = Metrics()
clock = SystemClock()
store = DynamoJobStore(settings.table_name, boto3.client("dynamodb"))
workflow = StepFunctionsWorkflow(boto3.client("stepfunctions"), settings.state_machine_arn)
wakeup = LambdaWakeup(boto3.client("lambda"), settings.dispatcher_function)


class ResumePayload(BaseModel):
    job_id: str


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    payload = parse(event=event, model=ResumePayload)
    logger.append_keys(job_id=payload.job_id)
    result = resume_job(payload.job_id, store=store, workflow=workflow, clock=clock, wakeup=wakeup)
    if result.resumed:
        metrics.add_metric(name="JobsResumed", unit=MetricUnit.Count, value=1)
    logger.info("resumed" if result.resumed else "not resumed", extra=result.model_dump(mode="json"))
    return result.model_dump(mode="json")
