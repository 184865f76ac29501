"""reconcile (schedule): terminate orphan instances, fail attempts whose instance is gone, repair jobs
whose execution ended without them (spotrelay.control.reconcile)."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from spotrelay.aws.clock import SystemClock
from spotrelay.aws.compute import Ec2Compute
from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.workflow import StepFunctionsWorkflow
from spotrelay.config import ReconcileSettings
from spotrelay.control.lifecycle import PlacementContext
from spotrelay.control.reconcile import reconcile

settings = ReconcileSettings.from_env(os.environ)
logger = Logger()
tracer = Tracer()
metrics = Metrics()
clock = SystemClock()
store = DynamoJobStore(settings.table_name, boto3.client("dynamodb"))
compute = Ec2Compute(
    boto3.client("ec2"),
    launch_template_id=settings.launch_template_id,  # the spot standbys of jobs moving back to spot
    region=boto3.session.Session().region_name or "",
)
workflow = StepFunctionsWorkflow(boto3.client("stepfunctions"), settings.state_machine_arn)
placement = PlacementContext(subnets=settings.subnets, allowed_families=settings.allowed_families)


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    report = reconcile(
        store=store,
        compute=compute,
        workflow=workflow,
        clock=clock,
        heartbeat_seconds=settings.heartbeat_seconds,
        placement=placement,
    )
    metrics.add_metric(name="OrphansTerminated", unit=MetricUnit.Count, value=len(report.terminated_orphans))
    metrics.add_metric(name="InstancesLost", unit=MetricUnit.Count, value=len(report.lost_attempts))
    metrics.add_metric(name="JobsRepaired", unit=MetricUnit.Count, value=len(report.repaired_jobs))
    metrics.add_metric(name="StandbysLaunched", unit=MetricUnit.Count, value=len(report.standbys))
    metrics.add_metric(name="MigrationsRequested", unit=MetricUnit.Count, value=len(report.migrating))
    metrics.add_metric(name="StandbysDropped", unit=MetricUnit.Count, value=len(report.dropped_standbys))
    metrics.add_metric(name="MoveErrors", unit=MetricUnit.Count, value=len(report.move_errors))
    if report.move_errors:
        logger.warning("moving jobs back to spot failed for some jobs", extra={"errors": report.move_errors})
    logger.info("reconciled", extra=report.model_dump())
    return report.model_dump()
