"""Every dead-letter queue has an alarm on its first message and one on each new message, and both reach
an operator.

The dead-letter queues are found from the template itself (an SQS redrive policy's target, a function's
DeadLetterConfig, an EventBridge target's DeadLetterConfig), so a DLQ added later without an alarm fails here.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import pytest

from infrastructure.synth import Synthesized, render

# A queue that is some other resource's dead-letter queue, by where its ARN appears (rendered "<Id.Arn>")
TEMPLATE_DEAD_LETTER_QUEUES = 3  # the job queue's, ec2_events', the rule targets'


def _queue_id(arn: Any) -> str:
    rendered = render(arn)
    assert isinstance(rendered, str), rendered
    assert rendered.endswith(".Arn>"), rendered
    return rendered.strip("<>").removesuffix(".Arn")


def dead_letter_queue_ids(synthesized: Synthesized) -> set[str]:
    found: set[str] = set()
    for queue in synthesized.of_type("AWS::SQS::Queue").values():
        redrive = queue["Properties"].get("RedrivePolicy")
        if redrive is not None:
            found.add(_queue_id(redrive["deadLetterTargetArn"]))
    for function in synthesized.of_type("AWS::Lambda::Function").values():
        config = function["Properties"].get("DeadLetterConfig")
        if config is not None:
            found.add(_queue_id(config["TargetArn"]))
    for rule in synthesized.of_type("AWS::Events::Rule").values():
        for target in rule["Properties"].get("Targets", []):
            if "DeadLetterConfig" in target:
                found.add(_queue_id(target["DeadLetterConfig"]["Arn"]))
    for queue_id in found:
        assert synthesized.resources[queue_id]["Type"] == "AWS::SQS::Queue", queue_id
    return found


def _alarms_on(synthesized: Synthesized, queue_id: str) -> list[dict[str, Any]]:
    return [
        alarm["Properties"]
        for alarm in synthesized.of_type("AWS::CloudWatch::Alarm").values()
        if alarm["Properties"].get("Namespace") == "AWS/SQS"
        and render(alarm["Properties"].get("Dimensions")) == [{"Name": "QueueName", "Value": f"<{queue_id}.QueueName>"}]
    ]


@pytest.fixture(scope="module")
def dead_letter_alarms(synthesized: Synthesized) -> dict[str, dict[str, Any]]:
    """queue logical id -> the alarm on its ApproximateNumberOfMessagesVisible."""
    queues = dead_letter_queue_ids(synthesized)
    assert len(queues) == TEMPLATE_DEAD_LETTER_QUEUES, sorted(queues)
    alarms: dict[str, dict[str, Any]] = {}
    for queue_id in sorted(queues):
        [alarm] = [
            a for a in _alarms_on(synthesized, queue_id) if a["MetricName"] == "ApproximateNumberOfMessagesVisible"
        ]
        alarms[queue_id] = alarm
    return alarms


def test_the_stacks_dead_letter_queues_are_the_ones_the_constructs_name(synthesized: Synthesized) -> None:
    stack = synthesized.stack
    assert dead_letter_queue_ids(synthesized) == {
        synthesized.logical_id(stack.job_queue.dead_letter_queue),
        synthesized.logical_id(stack.functions.dead_letter_queues["ec2_events"]),
        synthesized.logical_id(stack.event_rules.dead_letter_queue),
    }


def test_every_dead_letter_queue_alarms_on_its_first_visible_message(
    dead_letter_alarms: dict[str, dict[str, Any]],
) -> None:
    for queue_id, alarm in dead_letter_alarms.items():
        # Then one message, at any moment of 5 minutes, is an alarm; an idle queue (no data) is not
        assert alarm["Threshold"] == 1, queue_id
        assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold", queue_id
        assert alarm["Statistic"] == "Maximum", queue_id
        assert alarm["Period"] == 300, queue_id
        assert alarm["EvaluationPeriods"] == 1, queue_id
        assert alarm["TreatMissingData"] == "notBreaching", queue_id
        assert alarm.get("ActionsEnabled", True) is True, queue_id


def test_every_dead_letter_alarm_notifies_the_operator_topic_which_is_an_output(
    synthesized: Synthesized, dead_letter_alarms: dict[str, dict[str, Any]]
) -> None:
    topic_id = synthesized.logical_id(synthesized.stack.dead_letter_alarms.topic)
    assert synthesized.resources[topic_id]["Type"] == "AWS::SNS::Topic"
    for queue_id, alarm in dead_letter_alarms.items():
        assert render(alarm["AlarmActions"]) == [f"<{topic_id}>"], queue_id
    # And operators find the topic to subscribe to in the stack's outputs
    outputs = synthesized.json["Outputs"]
    assert render(outputs["AlarmTopicArn"]["Value"]) == f"<{topic_id}>"


def test_each_alarm_names_its_queue_and_the_command_that_drains_it(
    synthesized: Synthesized, dead_letter_alarms: dict[str, dict[str, Any]]
) -> None:
    stack = synthesized.stack
    redrive = f"spotrelay admin redrive --stack {stack.stack_name}"
    job_dlq = dead_letter_alarms[synthesized.logical_id(stack.job_queue.dead_letter_queue)]["AlarmDescription"]
    ec2_dlq = dead_letter_alarms[synthesized.logical_id(stack.functions.dead_letter_queues["ec2_events"])][
        "AlarmDescription"
    ]
    target_dlq = dead_letter_alarms[synthesized.logical_id(stack.event_rules.dead_letter_queue)]["AlarmDescription"]
    # The queue by its stack output (the URL the runbook's commands take)
    outputs = synthesized.json["Outputs"]
    for description, output in (
        (job_dlq, "DeadLetterQueueUrl"),
        (ec2_dlq, "Ec2EventsDeadLetterQueueUrl"),
        (target_dlq, "EventTargetDeadLetterQueueUrl"),
    ):
        assert output in outputs
        assert output in description
        assert len(description) <= 1024  # CloudWatch's limit
    # `spotrelay admin redrive` drains ec2_events' DLQ and the rule targets' (spotrelay/cli/admin.py), not the
    # job queue's: its jobs are sent again by hand
    assert redrive in ec2_dlq
    assert redrive in target_dlq
    assert "does not drain this queue" in job_dlq
    assert "spotrelay submit" in job_dlq


def test_the_topic_is_encrypted_tls_only_and_cloudwatch_publishes_for_these_alarms_only(
    synthesized: Synthesized, dead_letter_alarms: dict[str, dict[str, Any]]
) -> None:
    alerts = synthesized.stack.dead_letter_alarms
    topic_id = synthesized.logical_id(alerts.topic)
    topic = synthesized.properties(alerts.topic)
    # Encrypted with a customer-managed key (CloudWatch cannot use SNS's AWS-managed one), rotated
    key_id = synthesized.logical_id(alerts.key)
    assert render(topic["KmsMasterKeyId"]) == f"<{key_id}.Arn>"
    key = synthesized.resources[key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    key_statements = render(key["KeyPolicy"])["Statement"]
    assert any(
        s["Effect"] == "Allow"
        and s["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
        and set(s["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey*"}
        for s in key_statements
    )
    # The topic policy refuses non-TLS publishing and lets CloudWatch publish for this account's alarms
    [policy] = [
        p["Properties"]
        for p in synthesized.of_type("AWS::SNS::TopicPolicy").values()
        if render(p["Properties"]["Topics"]) == [f"<{topic_id}>"]
    ]
    statements = render(policy["PolicyDocument"])["Statement"]
    assert any(
        s["Effect"] == "Deny" and s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"
        for s in statements
    )
    [allow] = [s for s in statements if s["Effect"] == "Allow"]
    assert allow["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert allow["Action"] == "sns:Publish"
    assert allow["Condition"]["StringEquals"] == {"aws:SourceAccount": "<AWS::AccountId>"}
    source_arn = allow["Condition"]["ArnLike"]["aws:SourceArn"]
    # And every dead-letter alarm's ARN matches the condition (else its notifications are silently dropped),
    # while the queue-depth alarm's (which wakes the dispatcher, nobody's pager) does not
    prefix = "arn:<AWS::Partition>:cloudwatch:<AWS::Region>:<AWS::AccountId>:alarm:"
    assert source_arn.startswith(prefix)
    for queue_id, alarm in dead_letter_alarms.items():
        assert fnmatch.fnmatchcase(prefix + alarm["AlarmName"], source_arn), queue_id
    depth = synthesized.properties(synthesized.stack.job_queue.depth_alarm)
    assert not fnmatch.fnmatchcase(prefix + depth["AlarmName"], source_arn)


def test_every_dead_letter_queue_alarms_again_on_each_new_dead_letter(
    synthesized: Synthesized, dead_letter_alarms: dict[str, dict[str, Any]]
) -> None:
    # The first alarm stays in ALARM while any message waits: a second dead letter a day later would say
    # nothing. Each queue has a second alarm on arrivals: the messages Lambda and EventBridge send
    # (NumberOfMessagesSent), and for the job queue's DLQ, which its redrive policy fills without a send, its
    # depth rising, the messages in flight counted (a redrive hides them for a period)
    stack = synthesized.stack
    topic_id = synthesized.logical_id(stack.dead_letter_alarms.topic)
    [policy] = [
        p["Properties"]
        for p in synthesized.of_type("AWS::SNS::TopicPolicy").values()
        if render(p["Properties"]["Topics"]) == [f"<{topic_id}>"]
    ]
    [allow] = [s for s in render(policy["PolicyDocument"])["Statement"] if s["Effect"] == "Allow"]
    source_arn = allow["Condition"]["ArnLike"]["aws:SourceArn"]
    prefix = "arn:<AWS::Partition>:cloudwatch:<AWS::Region>:<AWS::AccountId>:alarm:"
    job_dlq = synthesized.logical_id(stack.job_queue.dead_letter_queue)
    dimensions = {q: [{"Name": "QueueName", "Value": f"<{q}.QueueName>"}] for q in dead_letter_alarms}
    for queue_id, first in dead_letter_alarms.items():
        [alarm] = [
            a["Properties"]
            for a in synthesized.of_type("AWS::CloudWatch::Alarm").values()
            if a["Properties"]["AlarmName"] == first["AlarmName"] + "-new"
        ]
        if queue_id == job_dlq:
            metrics = alarm["Metrics"]
            stats = {m["Id"]: m["MetricStat"] for m in metrics if "MetricStat" in m}
            assert {i: s["Metric"]["MetricName"] for i, s in stats.items()} == {
                "visible": "ApproximateNumberOfMessagesVisible",
                "hidden": "ApproximateNumberOfMessagesNotVisible",
            }
            assert all(render(s["Metric"]["Dimensions"]) == dimensions[queue_id] for s in stats.values())
            assert all((s["Stat"], s["Period"]) == ("Maximum", 300) for s in stats.values())
            [expression] = [m for m in metrics if "Expression" in m]
            assert expression["Expression"] == "DIFF(visible + hidden)"
            assert expression.get("ReturnData", True) is True
        else:
            assert alarm["MetricName"] == "NumberOfMessagesSent", queue_id
            assert render(alarm["Dimensions"]) == dimensions[queue_id]
            assert (alarm["Statistic"], alarm["Period"]) == ("Sum", 300), queue_id
        assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (1, "GreaterThanOrEqualToThreshold"), queue_id
        assert (alarm["EvaluationPeriods"], alarm["TreatMissingData"]) == (1, "notBreaching"), queue_id
        assert render(alarm["AlarmActions"]) == [f"<{topic_id}>"], queue_id
        assert fnmatch.fnmatchcase(prefix + alarm["AlarmName"], source_arn), queue_id  # else SNS drops it
        assert len(alarm["AlarmDescription"]) <= 1024  # CloudWatch's limit (the text is not cut to it)
        assert alarm["AlarmDescription"].endswith(first["AlarmDescription"])  # the same runbook
