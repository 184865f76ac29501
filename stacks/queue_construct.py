"""The job queue: where `spotrelay submit` (or `aws sqs send-message`) puts a job, and its DLQ.

Both queues are encrypted with one customer-managed KMS key (rotated yearly) and refuse non-TLS
requests. A message received three times without being deleted moves to the DLQ; the dispatcher
also moves messages that are not valid jobs there itself, after recording them as FAILED jobs.
The depth alarm (>= 1 visible message) wakes the dispatcher through EventBridge; its name carries
the stack name, so the rule can match this alarm and no other.
"""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from stacks.keys import stack_key

MAX_RECEIVE_COUNT = 3


class JobQueue(Construct):
    """`queue`, `dead_letter_queue`, `key` (their CMK) and `depth_alarm`."""

    def __init__(self, scope: Construct, id: str, *, dispatcher_timeout: Duration) -> None:
        super().__init__(scope, id)
        stack_name = Stack.of(self).stack_name
        self.key = stack_key(self, "Key", description=f"{stack_name}: encrypts the job queue and its dead-letter queue")
        self.dead_letter_queue = sqs.Queue(
            self,
            "DeadLetterQueue",
            encryption=sqs.QueueEncryption.KMS,
            encryption_master_key=self.key,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        self.queue = sqs.Queue(
            self,
            "Queue",
            encryption=sqs.QueueEncryption.KMS,
            encryption_master_key=self.key,
            data_key_reuse=Duration.hours(1),
            enforce_ssl=True,
            retention_period=Duration.days(14),
            # A received message stays invisible for longer than one dispatcher run can take.
            visibility_timeout=dispatcher_timeout.plus(Duration.minutes(1)),
            dead_letter_queue=sqs.DeadLetterQueue(max_receive_count=MAX_RECEIVE_COUNT, queue=self.dead_letter_queue),
        )
        self.depth_alarm = cloudwatch.Alarm(
            self,
            "DepthAlarm",
            alarm_name=f"{stack_name}-job-queue-depth",
            alarm_description="Jobs are waiting in the spotrelay job queue: wakes the dispatcher (EventBridge rule).",
            metric=self.queue.metric_approximate_number_of_messages_visible(
                period=Duration.minutes(1), statistic=cloudwatch.Stats.MAXIMUM
            ),
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
