"""The synthesized template deployed into moto: every resource the local runtime relies on is there,
and wired the way the template says (not a hand-written copy)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotrelay.config import (
    ENV_LAUNCH_TEMPLATE_ID,
    ENV_QUEUE_URL,
    ENV_STATE_MACHINE_ARN,
    ENV_SUBNETS,
    ENV_TABLE,
    SETTINGS_BY_FUNCTION,
)
from spotrelay.local import LocalRuntime, LocalStack, VirtualClock

from .conftest import START, example_market


@pytest.fixture(scope="module")
def deployed(synthesized_template: Path) -> Iterator[tuple[LocalRuntime, LocalStack]]:
    with LocalRuntime(clock=VirtualClock(START), market=example_market()) as runtime:
        yield runtime, runtime.deploy(synthesized_template)


@pytest.fixture(scope="module")
def template(synthesized_template: Path) -> dict[str, Any]:
    loaded = json.loads(synthesized_template.read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_the_template_deploys_and_says_how_long_it_took(deployed: tuple[LocalRuntime, LocalStack]) -> None:
    # (how long is a figure for `make bench-replay`, which reports deploy and loop apart, not a test's bound)
    _, stack = deployed
    assert stack.stack_name
    assert stack.deploy_seconds > 0


def test_every_resource_of_the_template_was_created(
    deployed: tuple[LocalRuntime, LocalStack], template: dict[str, Any]
) -> None:
    runtime, stack = deployed
    resources = runtime.client("cloudformation").list_stack_resources(StackName=stack.stack_name)
    statuses = {r["LogicalResourceId"]: r["ResourceStatus"] for r in resources["StackResourceSummaries"]}
    assert set(statuses) == set(template["Resources"])
    assert set(statuses.values()) == {"CREATE_COMPLETE"}


def test_the_table_queues_bucket_and_alarm_exist(deployed: tuple[LocalRuntime, LocalStack]) -> None:
    runtime, stack = deployed
    assert runtime.dynamodb.describe_table(TableName=stack.table_name)["Table"]["TableStatus"] == "ACTIVE"
    attributes = runtime.sqs.get_queue_attributes(QueueUrl=stack.queue_url, AttributeNames=["All"])["Attributes"]
    dlq_arn = runtime.sqs.get_queue_attributes(QueueUrl=stack.dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    assert json.loads(attributes["RedrivePolicy"])["deadLetterTargetArn"] == dlq_arn
    assert json.loads(attributes["Policy"])["Statement"][0]["Effect"] == "Deny"  # AWS::SQS::QueuePolicy
    assert json.loads(runtime.s3.get_bucket_policy(Bucket=stack.bucket_name)["Policy"])["Statement"]
    alarms = runtime.client("cloudwatch").describe_alarms(AlarmNames=list(stack.alarm_names))["MetricAlarms"]
    # The queue-depth alarm (the one that wakes the dispatcher), on the job queue
    [depth] = [a for a in alarms if a["AlarmName"] == stack.depth_alarm_name]
    queue_name = stack.queue_url.rsplit("/", 1)[-1]
    assert (depth["MetricName"], depth["Threshold"]) == ("ApproximateNumberOfMessagesVisible", 1.0)
    assert depth["Dimensions"] == [{"Name": "QueueName", "Value": queue_name}]
    # And two alarms per dead-letter queue (a message waits; a new one came), each notifying the operators'
    # topic, whose policy is set (AWS::SNS::TopicPolicy). (The job queue's second one is metric math, which the
    # local runtime's alarm model leaves out, spotrelay.local.cfn_models.LocalAlarm: tests/infrastructure checks it.)
    others = [a for a in alarms if a["AlarmName"] != stack.depth_alarm_name]
    assert len(others) == 6
    assert sorted(a["AlarmName"] for a in others if a["AlarmName"].endswith("-new")) == sorted(
        a["AlarmName"] + "-new" for a in others if not a["AlarmName"].endswith("-new")
    )
    [topic] = {action for a in others for action in a["AlarmActions"]}
    policy = runtime.client("sns").get_topic_attributes(TopicArn=topic)["Attributes"]["Policy"]
    assert any(s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"} for s in json.loads(policy)["Statement"])


def test_the_state_machine_runs_on_the_executing_backend(deployed: tuple[LocalRuntime, LocalStack]) -> None:
    runtime, stack = deployed
    described = runtime.sfn.describe_state_machine(stateMachineArn=stack.state_machine_arn)
    definition = json.loads(described["definition"])
    assert {"Place", "Run", "Recover", "WaitForCheckpoint", "Finalize"} <= set(definition["States"])
    run = definition["States"]["Run"]
    assert run["Resource"].endswith(":lambda:invoke.waitForTaskToken")
    assert run["Parameters"]["FunctionName"] == stack.function_arns["launch"]
    assert run["HeartbeatSecondsPath"] == "$.heartbeat_seconds"


def test_eight_functions_with_their_settings(deployed: tuple[LocalRuntime, LocalStack]) -> None:
    runtime, stack = deployed
    assert set(stack.functions) == set(SETTINGS_BY_FUNCTION)
    wired = {
        ENV_TABLE: stack.table_name,
        ENV_QUEUE_URL: stack.queue_url,
        ENV_STATE_MACHINE_ARN: stack.state_machine_arn,
        ENV_LAUNCH_TEMPLATE_ID: stack.launch_template_id,
        ENV_SUBNETS: json.dumps(dict(stack.subnets)),
    }
    lambda_client = runtime.client("lambda")
    for name, settings in SETTINGS_BY_FUNCTION.items():
        configuration = lambda_client.get_function_configuration(FunctionName=stack.functions[name])
        assert configuration["Handler"] == f"functions/{name}.handler"
        variables = configuration["Environment"]["Variables"]
        assert settings.env_keys() <= set(variables), name
        settings.from_env(variables)  # validates, as at the function's cold start
        for key in settings.env_keys() & set(wired):
            expected = wired[key]
            actual = json.dumps(json.loads(variables[key])) if key == ENV_SUBNETS else variables[key]
            assert actual == expected, (name, key)


def test_the_network_and_worker_ami_exist(deployed: tuple[LocalRuntime, LocalStack]) -> None:
    runtime, stack = deployed
    subnets = runtime.ec2.describe_subnets(SubnetIds=list(stack.subnets.values()))["Subnets"]
    assert {s["AvailabilityZone"]: s["SubnetId"] for s in subnets} == dict(stack.subnets)
    versions = runtime.ec2.describe_launch_template_versions(LaunchTemplateId=stack.launch_template_id)
    image_id = versions["LaunchTemplateVersions"][0]["LaunchTemplateData"]["ImageId"]
    assert runtime.ec2.describe_images(ImageIds=[image_id])["Images"]


def test_rules_deliver_to_the_functions(deployed: tuple[LocalRuntime, LocalStack]) -> None:
    runtime, stack = deployed
    events = runtime.events
    targets = {
        rule: [t["Arn"] for t in events.list_targets_by_rule(Rule=rule)["Targets"]] for rule in stack.rules.values()
    }
    interruption = next(rule for logical, rule in stack.rules.items() if "SpotInterruption" in logical)
    assert targets[interruption] == [stack.function_arns["ec2_events"]]
    (schedule,) = stack.schedule_rules
    assert set(targets[schedule]) == {stack.function_arns["dispatcher"], stack.function_arns["reconcile"]}
    assert events.list_archives()["Archives"]
