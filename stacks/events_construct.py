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
- Every target has a retry policy and a dead-letter queue: what EventBridge does when it cannot invoke the
  target at all (the Invoke call throttled or failing, a permission or the function missing), as opposed to
  a function error, which Lambda retries and dead-letters itself (ec2_events' own DLQ, functions_construct).
  EventBridge retries with backoff while the event is younger than the target's `max_event_age` and has
  retries left; a missing permission or function is not retried. Then the event goes to ONE queue for every
  target (KMS with the functions' dead-letter key, TLS only, 14 days; the stack output
  EVENT_TARGET_DLQ_OUTPUT), with the rule's and the target's ARNs and the error in its message attributes
  (RULE_ARN, TARGET_ARN, ERROR_CODE, ERROR_MESSAGE, EXHAUSTED_RETRY_CONDITION, RETRY_ATTEMPTS), so one queue
  tells the targets apart; the README's runbook redrives it. Retries and ages:
  - EC2 events -> ec2_events: 8 retries within an hour. An interruption warning is worth acting on for
    its two minutes, a state change while its attempt is open; past an hour the reconciler (every 5
    minutes) has done what the event would have, and the archive keeps it.
  - The queue-depth alarm -> dispatcher: 2 retries within 10 minutes (the schedule admits the job by then).
  - The schedule -> dispatcher, reconcile: 2 retries within one period (SCHEDULE_MINUTES): a tick older
    than the next one is worth nothing, so nothing is retried past it.
  A message in the DLQ always means an event was not delivered: its depth is on the dashboard.
"""

from __future__ import annotations

from aws_cdk import CfnOutput, Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from spotrelay.aws.recovery import ARCHIVE_ARN_OUTPUT, ARCHIVE_NAME_OUTPUT
from spotrelay.config import EVENT_TARGET_DLQ_OUTPUT, SCHEDULE_MINUTES
from stacks.suppressions import acknowledge

EC2_SOURCE = "aws.ec2"
SPOT_INTERRUPTION = "EC2 Spot Instance Interruption Warning"
REBALANCE_RECOMMENDATION = "EC2 Instance Rebalance Recommendation"
STATE_CHANGE = "EC2 Instance State-change Notification"
EC2_DETAIL_TYPES = (SPOT_INTERRUPTION, REBALANCE_RECOMMENDATION, STATE_CHANGE)
ALARM_STATE_CHANGE = "CloudWatch Alarm State Change"
SCHEDULE = f"rate({SCHEDULE_MINUTES} minutes)"
ARCHIVE_RETENTION_DAYS = 30
DEAD_LETTER_RETENTION = Duration.days(14)  # SQS's longest, as the functions' DLQs
# Each target's retry policy (module docstring)
EC2_EVENT_RETRIES, EC2_EVENT_MAX_AGE = 8, Duration.hours(1)
ALARM_RETRIES, ALARM_MAX_AGE = 2, Duration.minutes(10)
SCHEDULE_RETRIES, SCHEDULE_MAX_AGE = 2, Duration.minutes(SCHEDULE_MINUTES)


class EventRules(Construct):
    """`rules_by_detail_type` (the three EC2 rules), `alarm_rule`, `schedule_rule`, `archive`, and
    `dead_letter_queue` (every target's, encrypted with `dead_letter_key`)."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        ec2_events: lambda_.IFunction,
        dispatcher: lambda_.IFunction,
        reconcile: lambda_.IFunction,
        depth_alarm: cloudwatch.IAlarm,
        dead_letter_key: kms.Key,
    ) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        self.dead_letter_queue = sqs.Queue(
            self,
            "TargetDeadLetterQueue",
            encryption=sqs.QueueEncryption.KMS,
            encryption_master_key=dead_letter_key,
            enforce_ssl=True,
            retention_period=DEAD_LETTER_RETENTION,
        )
        acknowledge(
            self.dead_letter_queue,
            "SQS3",
            "This queue is a dead-letter queue: every EventBridge rule target's DeadLetterConfig names it (cdk-nag "
            "recognizes a DLQ only by an SQS redrive policy or a Lambda DeadLetterConfig).",
        )
        # EventBridge sends to the encrypted queue as events.amazonaws.com: SQS asks KMS for a data key on its
        # behalf, which the key policy must allow (CDK's targets add only the queue policy: sqs:SendMessage
        # from each rule, by its ARN). Only for rules of this account, as SQS's key-management guide advises.
        dead_letter_key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="EventBridgeDeadLetters",
                principals=[iam.ServicePrincipal("events.amazonaws.com")],
                actions=["kms:GenerateDataKey", "kms:Decrypt"],
                resources=["*"],  # in a key policy: this key
                conditions={
                    "StringEquals": {"aws:SourceAccount": stack.account},
                    "ArnLike": {
                        "aws:SourceArn": stack.format_arn(service="events", resource="rule", resource_name="*")
                    },
                },
            )
        )

        def to(function: lambda_.IFunction, retries: int, max_age: Duration) -> targets.LambdaFunction:
            return targets.LambdaFunction(
                function, dead_letter_queue=self.dead_letter_queue, retry_attempts=retries, max_event_age=max_age
            )

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
                targets=[to(ec2_events, EC2_EVENT_RETRIES, EC2_EVENT_MAX_AGE)],
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
            targets=[to(dispatcher, ALARM_RETRIES, ALARM_MAX_AGE)],
        )
        self.schedule_rule = events.Rule(
            self,
            "SafetyNet",
            description="spotrelay: periodic dispatch and reconciliation",
            schedule=events.Schedule.expression(SCHEDULE),
            targets=[
                to(dispatcher, SCHEDULE_RETRIES, SCHEDULE_MAX_AGE),
                to(reconcile, SCHEDULE_RETRIES, SCHEDULE_MAX_AGE),
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
        CfnOutput(
            stack, ARCHIVE_NAME_OUTPUT, value=self.archive.archive_name, description="spotrelay admin replay-archive"
        )
        CfnOutput(stack, ARCHIVE_ARN_OUTPUT, value=self.archive.archive_arn)
        CfnOutput(
            stack,
            EVENT_TARGET_DLQ_OUTPUT,
            value=self.dead_letter_queue.queue_url,
            description="the events EventBridge could not deliver to a target (the README's runbook)",
        )
