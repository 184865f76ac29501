"""dispatcher: on the queue-depth alarm, the schedule or a finished job, turn queue messages into job
records and admit queued jobs within quotas, budget and max concurrency (spotrelay.control.dispatcher)."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from spotrelay.aws.clock import SystemClock
from spotrelay.aws.compute import Ec2Compute
from spotrelay.aws.queue import SqsJobQueue
from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.workflow import StepFunctionsWorkflow
from spotrelay.config import DispatcherSettings
from spotrelay.control.admission import AdmissionLimits
from spotrelay.control.dispatcher import dispatch

settings = DispatcherSettings.from_env(os.environ)
logger = Logger()
tracer = Tracer()
metrics = Metrics()
clock = SystemClock()
# The one reader of both indexes every run: it quarantines a job record that does not read back.
store = DynamoJobStore(settings.table_name, boto3.client("dynamodb"), quarantine=True)
queue = SqsJobQueue(boto3.client("sqs"), settings.queue_url, settings.dlq_url)
workflow = StepFunctionsWorkflow(boto3.client("stepfunctions"), settings.state_machine_arn)
# read for the budget only: the spot price in effect now of each pool a running job is in
compute = Ec2Compute(boto3.client("ec2"), region=boto3.session.Session().region_name or "")


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    trigger = event.get("detail-type") or event.get("source") or "direct"
    report = dispatch(
        store=store,
        queue=queue,
        workflow=workflow,
        clock=clock,
        limits=AdmissionLimits(
            max_concurrent_jobs=settings.max_concurrent_jobs,
            budget_usd_per_hour=settings.budget_usd_per_hour,
            spot_vcpu_quotas=settings.spot_vcpu_quotas,
            allowed_families=settings.allowed_families,
        ),
        heartbeat_seconds=settings.heartbeat_seconds,
        compute=compute,
    )
    metrics.add_metric(name="JobsAccepted", unit=MetricUnit.Count, value=len(report.accepted))
    metrics.add_metric(name="JobsRejected", unit=MetricUnit.Count, value=len(report.rejected) + len(report.conflicts))
    metrics.add_metric(name="JobsAdmitted", unit=MetricUnit.Count, value=len(report.admitted))
    unreadable = [record.job_id for record in store.take_unreadable()]  # each logged by the store
    metrics.add_metric(name="DispatchErrors", unit=MetricUnit.Count, value=len(report.errors) + len(unreadable))
    for job_id in report.rejected:
        logger.warning("invalid job message kept in the DLQ", extra={"job_id": job_id})
    for message_id in report.conflicts:
        logger.warning("message reusing another job's submission id kept in the DLQ", extra={"message_id": message_id})
    for message_id, error in report.errors.items():
        logger.error("message left on the queue after an error", extra={"message_id": message_id, "error": error})
    logger.info("dispatched", extra={"trigger": trigger, **report.model_dump(), "unreadable_jobs": unreadable})
    return {**report.model_dump(), "unreadable_jobs": unreadable}
