"""ec2_events: spot interruption warnings, rebalance recommendations and instance state changes
(spotrelay.control.ec2_events). A malformed event is logged, counted and acknowledged: never raised
into a retry loop. Only the event itself can be malformed: a record the store cannot read, or a store
or Step Functions error, is raised, so that Lambda retries the event (then its rule's dead-letter
queue keeps it) rather than an interruption warning being acknowledged as if it were garbage."""

from __future__ import annotations

import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel as PowertoolsEventBridgeModel
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import ValidationError

from spotrelay.aws.compute import Ec2Compute
from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.workflow import StepFunctionsWorkflow
from spotrelay.config import Ec2EventsSettings
from spotrelay.control.ec2_events import Ec2Event, MalformedEvent, handle_ec2_event
from spotrelay.field_problems import field_problems

settings = Ec2EventsSettings.from_env(os.environ)
logger = Logger()
tracer = Tracer()
metrics = Metrics()
store = DynamoJobStore(settings.table_name, boto3.client("dynamodb"))
workflow = StepFunctionsWorkflow(boto3.client("stepfunctions"), settings.state_machine_arn)
# for the spot price history an ended instance's bill integrates (spotrelay.models.billing)
compute = Ec2Compute(boto3.client("ec2"), region=boto3.session.Session().region_name or "")


class EventBridgeModel(PowertoolsEventBridgeModel):
    """The EventBridge envelope with `detail` kept as the JSON object it is; the detail models of
    spotrelay.control.ec2_events parse it per kind."""

    detail: dict[str, Any]


MAX_REASON_CHARS = 500  # of a malformed event's error, in the log line and the answer

_METRIC_BY_ACTION = {"interrupt": "Interruptions", "lost": "InstancesLost", "rebalance": "RebalanceRecommendations"}


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        envelope = parse(event=event, model=EventBridgeModel)
        ec2_event = Ec2Event(
            id=envelope.id,
            source=envelope.source,
            detail_type=envelope.detail_type,
            time=envelope.time,
            detail=envelope.detail,
        )
    except ValidationError as e:
        return _malformed(event, e)
    try:
        outcome = handle_ec2_event(
            ec2_event, store=store, workflow=workflow, compute=compute, block_minutes=settings.block_minutes
        )
    except MalformedEvent as e:  # the detail's own parse, raised before anything is read or written
        return _malformed(event, e)
    if outcome.job_id is not None:
        logger.append_keys(job_id=outcome.job_id, attempt=outcome.attempt)
    metric = _METRIC_BY_ACTION.get(outcome.action)
    if metric is not None:
        metrics.add_metric(name=metric, unit=MetricUnit.Count, value=1)
    logger.info("ec2 event handled", extra={"event_id": envelope.id, **outcome.model_dump()})
    return outcome.model_dump()


def _malformed(event: Any, error: Exception) -> dict[str, Any]:
    metrics.add_metric(name="MalformedEvents", unit=MetricUnit.Count, value=1)
    problem = "; ".join(field_problems(error, show_input=True)) if isinstance(error, ValidationError) else str(error)
    reason = problem[:MAX_REASON_CHARS]
    logger.warning(
        "malformed event acknowledged",
        extra={"error": reason, "event_id": event.get("id") if isinstance(event, dict) else None},
    )
    return {"action": "malformed", "reason": reason}
