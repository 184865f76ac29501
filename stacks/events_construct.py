"""EventBridge: what wakes the functions, and the archive that makes incidents replayable.

- EC2 spot interruption warnings, rebalance recommendations and instance state changes (default bus,
  source aws.ec2) -> ec2_events. They carry no tags, so every instance's events arrive; ec2_events
  acknowledges and ignores instances spotrelay does not manage.
- The job-queue depth alarm entering ALARM -> dispatcher (this alarm only, matched by name).
- Every SCHEDULE_MINUTES (5) minutes -> dispatcher and reconcile (the safety net for lost or missed events).
- An archive of the three EC2 event kinds for 30 days, so a production incident can be replayed
  (`spotrelay replay`) with the events exactly as AWS sent them, and so that the events of a window when
  the functions were down can be delivered again (`spotrelay admin replay-archive`, EventBridge's
  StartReplay: the README's runbook). Its name and ARN are stack outputs (spotrelay.aws.recovery).
"""

from __future__ import annotations

from aws_cdk import CfnOutput, Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from spotrelay.aws.recovery import ARCHIVE_ARN_OUTPUT, ARCHIVE_NAME_OUTPUT
from spotrelay.config import SCHEDULE_MINUTES

EC2_SOURCE = "aws.ec2"
SPOT_INTERRUPTION = "EC2 Spot Instance Interruption Warning"
REBALANCE_RECOMMENDATION = "EC2 Instance Rebalance Recommendation"
STATE_CHANGE = "EC2 Instance State-change Notification"
EC2_DETAIL_TYPES = (SPOT_INTERRUPTION, REBALANCE_RECOMMENDATION, STATE_CHANGE)
ALARM_STATE_CHANGE = "CloudWatch Alarm State Change"
SCHEDULE = f"rate({SCHEDULE_MINUTES} minutes)"
ARCHIVE_RETENTION_DAYS = 30


class EventRules(Construct):
    """`rules_by_detail_type` (the three EC2 rules), `alarm_rule`, `schedule_rule`, `archive`."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        ec2_events: lambda_.IFunction,
        dispatcher: lambda_.IFunction,
        reconcile: lambda_.IFunction,
        depth_alarm: cloudwatch.IAlarm,
    ) -> None:
        super().__init__(scope, id)
        self.rules_by_detail_type: dict[str, events.Rule] = {}
        for rule_id, detail_type in (
            ("SpotInterruptionWarning", SPOT_INTERRUPTION),
            ("RebalanceRecommendation", REBALANCE_RECOMMENDATION),
            ("InstanceStateChange", STATE_CHANGE),
        ):
            self.rules_by_detail_type[detail_type] = events.Rule(
                self,
                rule_id,
                description=f"spotrelay: {detail_type} -> ec2_events",
                event_pattern=events.EventPattern(source=[EC2_SOURCE], detail_type=[detail_type]),
                targets=[targets.LambdaFunction(ec2_events, retry_attempts=8, max_event_age=Duration.hours(1))],
            )

        self.alarm_rule = events.Rule(
            self,
            "QueueDepthAlarm",
            description="spotrelay: jobs are waiting in the queue -> dispatcher",
            event_pattern=events.EventPattern(
                source=["aws.cloudwatch"],
                detail_type=[ALARM_STATE_CHANGE],
                detail={"alarmName": [depth_alarm.alarm_name], "state": {"value": ["ALARM"]}},
            ),
            targets=[targets.LambdaFunction(dispatcher, retry_attempts=2, max_event_age=Duration.minutes(10))],
        )
        self.schedule_rule = events.Rule(
            self,
            "SafetyNet",
            description="spotrelay: periodic dispatch and reconciliation",
            schedule=events.Schedule.expression(SCHEDULE),
            targets=[
                targets.LambdaFunction(dispatcher, retry_attempts=0),
                targets.LambdaFunction(reconcile, retry_attempts=0),
            ],
        )

        default_bus = events.EventBus.from_event_bus_name(self, "DefaultBus", "default")
        self.archive = events.Archive(
            self,
            "Ec2EventArchive",
            source_event_bus=default_bus,
            description=f"{Stack.of(self).stack_name}: EC2 spot and instance events, kept for replay",
            event_pattern=events.EventPattern(source=[EC2_SOURCE], detail_type=list(EC2_DETAIL_TYPES)),
            retention=Duration.days(ARCHIVE_RETENTION_DAYS),
        )
        stack = Stack.of(self)
        CfnOutput(
            stack, ARCHIVE_NAME_OUTPUT, value=self.archive.archive_name, description="spotrelay admin replay-archive"
        )
        CfnOutput(stack, ARCHIVE_ARN_OUTPUT, value=self.archive.archive_arn)
