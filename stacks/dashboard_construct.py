"""One CloudWatch dashboard: is work waiting, are jobs finishing, are we being interrupted, is
any function failing.

Job counts come from the JobLifecycle executions (one per job) and interruptions from the matched
events of the interruption rule: AWS's own metrics, so the dashboard needs no agreement on custom
metric names with the functions (which publish theirs under the `spotrelay` namespace).
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_events as events
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

PERIOD = Duration.minutes(5)


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
