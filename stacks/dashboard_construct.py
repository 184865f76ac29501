"""What an operator watches: one CloudWatch dashboard (is work waiting, are jobs finishing, are we
being interrupted, is any function failing) and the alarms that tell them (`DeadLetterAlarms`).

Job counts come from the JobLifecycle executions (one per job) and interruptions from the matched
events of the interruption rule: AWS's own metrics, so the dashboard needs no agreement on custom
metric names with the functions (which publish theirs under the `spotrelay` namespace).

Dead letters: every message in a dead-letter queue is something the stack gave up on (a job it could not
read or handle, an EC2 event a function failed on, an event EventBridge could not deliver), so each DLQ has
an alarm on one visible message (the maximum over 5 minutes; no data, an idle queue, is not breaching)
whose description names the queue's stack output and the command that drains it (the README's runbook).
They notify one SNS topic (stack output ALARM_TOPIC_OUTPUT, for operators to subscribe to), encrypted with
a rotated key of its own, TLS only, which CloudWatch may publish to for these alarms only.
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import ArnFormat, CfnOutput, Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from spotrelay.aws.recovery import dead_letter_queue_output
from stacks.keys import stack_key

PERIOD = Duration.minutes(5)
ALARM_TOPIC_OUTPUT = "AlarmTopicArn"
DEAD_LETTER_PERIOD = Duration.minutes(5)
# Every dead-letter alarm's name is `<stack>-<DEAD_LETTER_ALARM_INFIX><queue>`: the topic's policy lets
# CloudWatch publish for the alarms named so, and no other.
DEAD_LETTER_ALARM_INFIX = "dead-letters-"
# Each queue's second alarm, `<stack>-<DEAD_LETTER_ALARM_INFIX><queue><NEW_DEAD_LETTERS_SUFFIX>`: the first stays
# in ALARM while any message waits, and so says nothing of the dead letters that arrive after it fired
NEW_DEAD_LETTERS_SUFFIX = "-new"


class Dashboard(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        queue: sqs.IQueue,
        dead_letter_queue: sqs.IQueue,
        event_dead_letter_queue: sqs.IQueue,
        state_machine: sfn.IStateMachine,
        interruption_rule: events.IRule,
        rebalance_rule: events.IRule,
        functions: Mapping[str, lambda_.IFunction],
    ) -> None:
        super().__init__(scope, id)
        stack_name = Stack.of(self).stack_name
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"{stack_name}-spotrelay")
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Queue depth (jobs waiting / dead-lettered)",
                left=[
                    queue.metric_approximate_number_of_messages_visible(period=PERIOD, label="waiting"),
                    dead_letter_queue.metric_approximate_number_of_messages_visible(period=PERIOD, label="DLQ"),
                    # not a job: an event EventBridge could not deliver to a function (the README's runbook)
                    event_dead_letter_queue.metric_approximate_number_of_messages_visible(
                        period=PERIOD, label="undelivered events"
                    ),
                ],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Jobs started / succeeded / failed",
                left=[
                    state_machine.metric_started(period=PERIOD, label="started"),
                    state_machine.metric_succeeded(period=PERIOD, label="succeeded"),
                    state_machine.metric_failed(period=PERIOD, label="failed or cancelled"),
                ],
                width=12,
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Spot interruption warnings / rebalance recommendations (all instances)",
                left=[
                    _matched_events(interruption_rule, "interruption warnings"),
                    _matched_events(rebalance_rule, "rebalance recommendations"),
                ],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Lambda errors",
                left=[fn.metric_errors(period=PERIOD, label=name) for name, fn in functions.items()],
                width=12,
            ),
        )


def _matched_events(rule: events.IRule, label: str) -> cloudwatch.Metric:
    return cloudwatch.Metric(
        namespace="AWS/Events",
        metric_name="MatchedEvents",
        dimensions_map={"RuleName": rule.rule_name},
        statistic=cloudwatch.Stats.SUM,
        period=PERIOD,
        label=label,
    )


class DeadLetterAlarms(Construct):
    """`topic` (and its `key`), and `alarms[queue]` for the job queue's DLQ ("job-queue"), ec2_events' DLQ
    ("ec2-events") and the rule targets' DLQ ("event-targets"), each notifying the topic."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        job_dead_letter_queue: sqs.IQueue,
        ec2_events_dead_letter_queue: sqs.IQueue,
        event_target_dead_letter_queue: sqs.IQueue,
    ) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        stack_name = stack.stack_name
        redrive = f"spotrelay admin redrive --stack {stack_name}"
        descriptions = {
            "job-queue": (
                job_dead_letter_queue,
                "A message is in the spotrelay job queue's DLQ (stack output DeadLetterQueueUrl): a job the "
                "dispatcher recorded FAILED as invalid (spotrelay status JOB_ID says why), or a message it failed "
                "to handle 3 times. spotrelay admin redrive does not drain this queue: read the messages (aws sqs "
                "receive-message --queue-url <DeadLetterQueueUrl>), fix and send each job again (spotrelay "
                "submit), then delete the message (aws sqs delete-message).",
            ),
            "ec2-events": (
                ec2_events_dead_letter_queue,
                "A message is in ec2_events' DLQ (stack output "
                f"{dead_letter_queue_output('ec2_events')}): an EC2 spot or instance event Lambda gave up on after "
                f"its retries. Once the functions answer again, drain it with `{redrive}` (the README's runbook: "
                "the control plane was down).",
            ),
            "event-targets": (
                event_target_dead_letter_queue,
                "A message is in the EventBridge rule targets' DLQ (stack output EventTargetDeadLetterQueueUrl): "
                "an event EventBridge could not deliver to a function (its ERROR_CODE and ERROR_MESSAGE attributes "
                f"say why; a missing function or permission: redeploy first). Drain it with `{redrive}` (the "
                "README's runbook: the control plane was down).",
            ),
        }
        alarm_prefix = f"{stack_name}-{DEAD_LETTER_ALARM_INFIX}"
        self.key = stack_key(
            self, "TopicKey", description=f"{stack_name}: encrypts the operator alarm topic (dead-letter alarms)"
        )
        # CloudWatch publishes to an encrypted topic only with the key's data keys (SNS's key-management guide:
        # compatibility with AWS services). This key encrypts this topic and nothing else; which alarms may
        # publish is the topic policy's condition below.
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarms",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],  # in a key policy: this key
            )
        )
        self.topic = sns.Topic(
            self,
            "Topic",
            display_name=f"{stack_name}: spotrelay dead letters",
            master_key=self.key,
            enforce_ssl=True,
        )
        # The topic policy CDK writes (enforce_ssl) replaces SNS's default one: CloudWatch is allowed to
        # publish explicitly, for this account's dead-letter alarms only (confused-deputy conditions).
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchDeadLetterAlarms",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions={
                    "StringEquals": {"aws:SourceAccount": stack.account},
                    "ArnLike": {
                        "aws:SourceArn": stack.format_arn(
                            service="cloudwatch",
                            resource="alarm",
                            resource_name=f"{alarm_prefix}*",
                            arn_format=ArnFormat.COLON_RESOURCE_NAME,
                        )
                    },
                },
            )
        )
        action = cloudwatch_actions.SnsAction(self.topic)
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        self.arrival_alarms: dict[str, cloudwatch.Alarm] = {}
        for name, (queue, description) in descriptions.items():
            construct_id = "".join(part.capitalize() for part in name.split("-"))
            visible = queue.metric_approximate_number_of_messages_visible(
                period=DEAD_LETTER_PERIOD, statistic=cloudwatch.Stats.MAXIMUM
            )
            self.alarms[name] = self._alarm(
                f"{construct_id}Alarm", f"{alarm_prefix}{name}", description, visible, action
            )
            # A second alarm, on each new arrival: it fires again however many wait already, and is OK once
            # none arrive. Lambda and EventBridge put their dead letters with SendMessage, which
            # NumberOfMessagesSent counts; a message the job queue's redrive policy moves is not counted there
            # ("Available CloudWatch metrics for Amazon SQS", Amazon SQS Developer Guide), so for that DLQ it is
            # its depth rising from one period to the next, the messages in flight included (a redrive that
            # hides them for a period is no arrival). (A message deleted in the period one arrives hides it.)
            arrivals: cloudwatch.IMetric
            if name == "job-queue":
                arrivals = cloudwatch.MathExpression(
                    expression="DIFF(visible + hidden)",
                    using_metrics={
                        "visible": visible,
                        "hidden": queue.metric_approximate_number_of_messages_not_visible(
                            period=DEAD_LETTER_PERIOD, statistic=cloudwatch.Stats.MAXIMUM
                        ),
                    },
                    period=DEAD_LETTER_PERIOD,
                    label=f"{name}: new dead letters",
                )
            else:
                arrivals = queue.metric_number_of_messages_sent(
                    period=DEAD_LETTER_PERIOD, statistic=cloudwatch.Stats.SUM
                )
            self.arrival_alarms[name] = self._alarm(
                f"{construct_id}NewAlarm",
                f"{alarm_prefix}{name}{NEW_DEAD_LETTERS_SUFFIX}",
                f"New dead letters in the last 5 minutes. {description}",
                arrivals,
                action,
            )
        CfnOutput(
            stack,
            ALARM_TOPIC_OUTPUT,
            value=self.topic.topic_arn,
            description="Subscribe here: an alarm for every message in a dead-letter queue (the README's runbook)",
        )

    def _alarm(
        self,
        construct_id: str,
        name: str,
        description: str,
        metric: cloudwatch.IMetric,
        action: cloudwatch.IAlarmAction,
    ) -> cloudwatch.Alarm:
        """A dead-letter alarm: at 1 or more, over one period; no data is no alarm; it notifies `action`."""
        alarm = cloudwatch.Alarm(
            self,
            construct_id,
            alarm_name=name,
            alarm_description=description,
            metric=metric,
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        alarm.add_alarm_action(action)
        return alarm
