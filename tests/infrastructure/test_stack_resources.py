"""The stateful resources, the worker launch template and the event wiring, as synthesized."""

from __future__ import annotations

from aws_cdk.assertions import Match

from infrastructure.synth import Synthesized, render
from stacks.config import DEFAULT_WORKER_AMI_SSM_PARAMETER
from stacks.events_construct import EC2_DETAIL_TYPES, REBALANCE_RECOMMENDATION, SPOT_INTERRUPTION, STATE_CHANGE


def _key_with_rotation(synthesized: Synthesized, key_ref: str) -> None:
    logical_id = key_ref.strip("<>").removesuffix(".Arn")
    key = synthesized.resources[logical_id]
    assert key["Type"] == "AWS::KMS::Key"
    assert key["Properties"]["EnableKeyRotation"] is True


def _denies_insecure_transport(policy_document: dict[str, object]) -> bool:
    statements = render(policy_document)["Statement"]
    return any(
        s["Effect"] == "Deny" and s.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"
        for s in statements
    )


def test_job_queue_and_dlq_are_kms_encrypted_with_a_rotated_key_and_redrive_after_three_receives(
    synthesized: Synthesized,
) -> None:
    # Given the synthesized stack
    queue = synthesized.properties(synthesized.stack.job_queue.queue)
    dlq = synthesized.properties(synthesized.stack.job_queue.dead_letter_queue)
    # Then both queues use the customer-managed key, which rotates
    assert render(queue["KmsMasterKeyId"]) == render(dlq["KmsMasterKeyId"])
    _key_with_rotation(synthesized, render(queue["KmsMasterKeyId"]))
    # And a message received three times moves to the DLQ
    redrive = render(queue["RedrivePolicy"])
    assert redrive["maxReceiveCount"] == 3
    assert (
        redrive["deadLetterTargetArn"]
        == f"<{synthesized.logical_id(synthesized.stack.job_queue.dead_letter_queue)}.Arn>"
    )
    # And both refuse requests without TLS
    queue_policies = synthesized.of_type("AWS::SQS::QueuePolicy").values()
    assert len(queue_policies) == 4  # the job queue, its DLQ, ec2_events' DLQ, the rule targets' DLQ
    assert all(_denies_insecure_transport(p["Properties"]["PolicyDocument"]) for p in queue_policies)


def test_depth_alarm_fires_on_one_visible_message_and_carries_the_stack_name(synthesized: Synthesized) -> None:
    alarm = synthesized.properties(synthesized.stack.job_queue.depth_alarm)
    assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible"
    assert alarm["Namespace"] == "AWS/SQS"
    assert alarm["Threshold"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert alarm["AlarmName"].startswith(synthesized.stack.stack_name)
    assert render(alarm["Dimensions"]) == [
        {"Name": "QueueName", "Value": f"<{synthesized.logical_id(synthesized.stack.job_queue.queue)}.QueueName>"}
    ]


def test_table_has_keys_gsi_ttl_pitr_on_demand_billing_and_encryption(synthesized: Synthesized) -> None:
    table = synthesized.properties(synthesized.stack.storage.table)
    assert table["KeySchema"] == [
        {"AttributeName": "pk", "KeyType": "HASH"},
        {"AttributeName": "sk", "KeyType": "RANGE"},
    ]
    assert {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]} == {
        "pk": "S",
        "sk": "S",
        "gsi1pk": "S",
        "gsi1sk": "S",
    }
    assert table["GlobalSecondaryIndexes"] == [
        {
            "IndexName": "gsi1",
            "KeySchema": [
                {"AttributeName": "gsi1pk", "KeyType": "HASH"},
                {"AttributeName": "gsi1sk", "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "ALL"},
        }
    ]
    assert table["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert table["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert table["BillingMode"] == "PAY_PER_REQUEST"
    assert table["SSESpecification"]["SSEEnabled"] is True


def test_checkpoint_bucket_is_kms_encrypted_private_versioned_tls_only_and_expires_job_checkpoints(
    synthesized: Synthesized,
) -> None:
    storage = synthesized.stack.storage
    bucket = synthesized.properties(storage.bucket)
    # KMS with the stack's rotated key
    encryption = bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
    assert encryption["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    _key_with_rotation(synthesized, render(encryption["ServerSideEncryptionByDefault"]["KMSMasterKeyID"]))
    # No public access, versioned, access logs to the log bucket
    assert bucket["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert bucket["VersioningConfiguration"] == {"Status": "Enabled"}
    assert render(bucket["LoggingConfiguration"]["DestinationBucketName"]) == (
        f"<{synthesized.logical_id(storage.access_logs_bucket)}>"
    )
    # jobs/ expires after the retention; incomplete uploads are aborted after a day
    rules = bucket["LifecycleConfiguration"]["Rules"]
    expiring = [r for r in rules if r.get("Prefix") == "jobs/"]
    assert [r["ExpirationInDays"] for r in expiring] == [30]
    assert any(
        r.get("AbortIncompleteMultipartUpload") == {"DaysAfterInitiation": 1} and "Prefix" not in r for r in rules
    )
    # And its policy refuses non-TLS requests
    bucket_policies = [
        p["Properties"]
        for p in synthesized.of_type("AWS::S3::BucketPolicy").values()
        if render(p["Properties"]["Bucket"]) == f"<{synthesized.logical_id(storage.bucket)}>"
    ]
    assert len(bucket_policies) == 1
    assert _denies_insecure_transport(bucket_policies[0]["PolicyDocument"])


def test_launch_template_requires_imdsv2_exposes_tags_and_encrypts_the_root_volume(synthesized: Synthesized) -> None:
    data = synthesized.properties(synthesized.stack.worker.launch_template)["LaunchTemplateData"]
    assert data["MetadataOptions"] == {
        "HttpEndpoint": "enabled",
        "HttpTokens": "required",
        "HttpPutResponseHopLimit": 1,
        "InstanceMetadataTags": "enabled",
    }
    [root] = data["BlockDeviceMappings"]
    assert root["Ebs"]["Encrypted"] is True
    assert root["Ebs"]["VolumeType"] == "gp3"
    assert data["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert render(data["IamInstanceProfile"]["Arn"]) == (
        f"<{synthesized.logical_id(synthesized.stack.worker.instance_profile)}.Arn>"
    )


def test_worker_ami_is_the_public_ssm_parameter_resolved_at_deploy_time(synthesized: Synthesized) -> None:
    # The AMI is a CloudFormation parameter of SSM type: resolved by CloudFormation, not at synth.
    data = synthesized.properties(synthesized.stack.worker.launch_template)["LaunchTemplateData"]
    parameter = synthesized.json["Parameters"][data["ImageId"]["Ref"]]
    assert parameter == {
        "Type": "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>",
        "Default": DEFAULT_WORKER_AMI_SSM_PARAMETER,
    }


def test_user_data_installs_the_agent_wheel_and_starts_the_unit_without_job_data(synthesized: Synthesized) -> None:
    data = synthesized.properties(synthesized.stack.worker.launch_template)["LaunchTemplateData"]
    script = render(data["UserData"]["Fn::Base64"])
    bucket = f"<{synthesized.logical_id(synthesized.stack.storage.bucket)}>"
    assert script.startswith("#!/bin/bash")
    assert f"s3://{bucket}/agent/" in script
    assert "ExecStart=/opt/spotrelay/venv/bin/spotrelay agent" in script
    assert "systemctl enable --now spotrelay-agent.service" in script
    # The job id and attempt come from instance tags through IMDS, never from user data
    assert "job-id" not in script
    assert "attempt=" not in script
    # The agent needs boto3 (the [aws] extra) and watchtower to ship its logs ([agent]), and an agent crash
    # must not kill the job it re-attaches to
    assert '"${wheel}[aws,agent]"' in script
    assert "KillMode=process" in script
    assert "KillMode=mixed" not in script
    # The agent ships its lines to this stack's log group, whatever the stack is called
    log_group = synthesized.stack.worker.log_group
    assert f"Environment=SPOTRELAY_AGENT_LOG_GROUP=<{synthesized.logical_id(log_group)}>" in script


def test_the_agent_log_group_is_named_after_the_stack(synthesized: Synthesized) -> None:
    # Two stacks in one account and region must not share (or fail to create) one log group
    properties = synthesized.properties(synthesized.stack.worker.log_group)
    assert properties["LogGroupName"] == f"/spotrelay/{synthesized.stack.stack_name}/agent"
    assert properties["RetentionInDays"] == 30


def test_instance_profile_carries_the_worker_role(synthesized: Synthesized) -> None:
    worker = synthesized.stack.worker
    profile = synthesized.properties(worker.instance_profile)
    assert render(profile["Roles"]) == [f"<{synthesized.logical_id(worker.role)}>"]


def test_ec2_rules_send_each_event_kind_to_ec2_events(synthesized: Synthesized) -> None:
    ec2_events = synthesized.function_ids()["ec2_events"]
    rules = synthesized.stack.event_rules.rules_by_detail_type
    assert set(rules) == {SPOT_INTERRUPTION, REBALANCE_RECOMMENDATION, STATE_CHANGE}
    for detail_type, rule in rules.items():
        properties = synthesized.properties(rule)
        assert properties["EventPattern"] == {"source": ["aws.ec2"], "detail-type": [detail_type]}
        assert [render(t["Arn"]) for t in properties["Targets"]] == [f"<{ec2_events}.Arn>"]


def test_alarm_rule_matches_only_the_depth_alarm_entering_alarm_and_wakes_the_dispatcher(
    synthesized: Synthesized,
) -> None:
    properties = synthesized.properties(synthesized.stack.event_rules.alarm_rule)
    alarm = synthesized.logical_id(synthesized.stack.job_queue.depth_alarm)
    assert render(properties["EventPattern"]) == {
        "source": ["aws.cloudwatch"],
        "detail-type": ["CloudWatch Alarm State Change"],
        "detail": {"alarmName": [f"<{alarm}>"], "state": {"value": ["ALARM"]}},
    }
    dispatcher = synthesized.function_ids()["dispatcher"]
    assert [render(t["Arn"]) for t in properties["Targets"]] == [f"<{dispatcher}.Arn>"]


def test_every_five_minutes_the_dispatcher_and_reconcile_run(synthesized: Synthesized) -> None:
    properties = synthesized.properties(synthesized.stack.event_rules.schedule_rule)
    ids = synthesized.function_ids()
    assert properties["ScheduleExpression"] == "rate(5 minutes)"
    assert sorted(render(t["Arn"]) for t in properties["Targets"]) == sorted(
        [f"<{ids['dispatcher']}.Arn>", f"<{ids['reconcile']}.Arn>"]
    )


def test_exactly_five_rules_and_each_target_may_invoke_its_function(synthesized: Synthesized) -> None:
    rules = synthesized.of_type("AWS::Events::Rule")
    assert len(rules) == 5
    targets = {
        (render(t["Arn"]), f"<{rule_id}.Arn>") for rule_id, r in rules.items() for t in r["Properties"]["Targets"]
    }
    permissions = {
        (render(p["Properties"]["FunctionName"]), render(p["Properties"]["SourceArn"]))
        for p in synthesized.of_type("AWS::Lambda::Permission").values()
        if p["Properties"]["Principal"] == "events.amazonaws.com"
    }
    assert targets == permissions


def test_archive_keeps_the_three_ec2_event_kinds_of_the_default_bus_for_30_days(synthesized: Synthesized) -> None:
    [archive] = synthesized.of_type("AWS::Events::Archive").values()
    properties = render(archive["Properties"])
    assert properties["EventPattern"] == {"source": ["aws.ec2"], "detail-type": list(EC2_DETAIL_TYPES)}
    assert properties["RetentionDays"] == 30
    assert properties["SourceArn"] == "arn:<AWS::Partition>:events:<AWS::Region>:<AWS::AccountId>:event-bus/default"


def test_state_machine_is_standard_logs_everything_and_is_traced(synthesized: Synthesized) -> None:
    properties = synthesized.properties(synthesized.stack.lifecycle.state_machine)
    assert properties["StateMachineType"] == "STANDARD"
    assert properties["LoggingConfiguration"]["Level"] == "ALL"
    assert render(properties["LoggingConfiguration"]["Destinations"]) == [
        {
            "CloudWatchLogsLogGroup": {
                "LogGroupArn": f"<{synthesized.logical_id(synthesized.stack.lifecycle.log_group)}.Arn>"
            }
        }
    ]
    assert properties["TracingConfiguration"] == {"Enabled": True}


def test_dashboard_and_outputs_exist(synthesized: Synthesized) -> None:
    synthesized.template.resource_count_is("AWS::CloudWatch::Dashboard", 1)
    outputs = synthesized.json["Outputs"]
    for name in ("QueueUrl", "TableName", "BucketName", "StateMachineArn"):
        assert name in outputs
    assert render(outputs["StateMachineArn"]["Value"]) == (
        f"<{synthesized.logical_id(synthesized.stack.lifecycle.state_machine)}>"
    )
    # what `spotrelay submit`, `spotrelay cancel` and `spotrelay resume` invoke (spotrelay/aws/deployed_stack.py reads
    # these keys)
    functions = synthesized.stack.functions.functions
    invoked = (
        ("DispatcherFunctionName", "dispatcher"),
        ("CancelFunctionName", "cancel"),
        ("ResumeFunctionName", "resume"),
    )
    for output, function in invoked:
        assert render(outputs[output]["Value"]) == f"<{synthesized.logical_id(functions[function])}>"
    assert (
        render(outputs["AgentLogGroupName"]["Value"])
        == f"<{synthesized.logical_id(synthesized.stack.worker.log_group)}>"
    )


def test_every_taggable_resource_is_tagged_project_spotrelay(synthesized: Synthesized) -> None:
    taggable = [r for r in synthesized.resources.values() if "Tags" in r.get("Properties", {})]
    assert len(taggable) > 20
    for resource in taggable:
        tags = resource["Properties"]["Tags"]
        pairs = tags.items() if isinstance(tags, dict) else ((t["Key"], t["Value"]) for t in tags)
        assert ("project", "spotrelay") in set(pairs), resource["Type"]
    synthesized.template.has_resource_properties(
        "AWS::Lambda::Function", {"Tags": Match.array_with([{"Key": "project", "Value": "spotrelay"}])}
    )


def test_created_vpc_has_two_public_subnets_no_nat_and_gateway_endpoints(synthesized: Synthesized) -> None:
    synthesized.template.resource_count_is("AWS::EC2::VPC", 1)
    synthesized.template.resource_count_is("AWS::EC2::NatGateway", 0)
    subnets = synthesized.of_type("AWS::EC2::Subnet").values()
    assert [s["Properties"]["MapPublicIpOnLaunch"] for s in subnets] == [True, True]
    endpoints = [render(e["Properties"]) for e in synthesized.of_type("AWS::EC2::VPCEndpoint").values()]
    assert sorted(e["ServiceName"].rsplit(".", 1)[-1] for e in endpoints) == ["dynamodb", "s3"]
    assert {e.get("VpcEndpointType", "Gateway") for e in endpoints} == {"Gateway"}
    synthesized.template.resource_count_is("AWS::EC2::FlowLog", 1)


def test_ec2_events_dead_letters_what_lambda_gives_up_on_and_the_stack_names_it(synthesized: Synthesized) -> None:
    # Given ec2_events, invoked asynchronously by the EC2 rules
    functions = synthesized.stack.functions
    function = synthesized.properties(functions.functions["ec2_events"])
    dlq = functions.dead_letter_queues["ec2_events"]
    # Then an event Lambda gave up on goes to its DLQ, kept 14 days and encrypted with a rotated key
    assert render(function["DeadLetterConfig"]["TargetArn"]) == f"<{synthesized.logical_id(dlq)}.Arn>"
    queue = synthesized.properties(dlq)
    assert queue["MessageRetentionPeriod"] == 14 * 24 * 3600
    _key_with_rotation(synthesized, render(queue["KmsMasterKeyId"]))
    # And the runbook's commands find the DLQ, the function and the archive from the stack's outputs
    outputs = synthesized.template.to_json()["Outputs"]
    assert render(outputs["Ec2EventsDeadLetterQueueUrl"]["Value"]) == f"<{synthesized.logical_id(dlq)}>"
    assert render(outputs["Ec2EventsFunctionName"]["Value"]) == f"<{synthesized.function_ids()['ec2_events']}>"
    archive = synthesized.logical_id(synthesized.stack.event_rules.archive)
    assert render(outputs["EventArchiveName"]["Value"]) == f"<{archive}>"
    assert render(outputs["EventArchiveArn"]["Value"]) == f"<{archive}.Arn>"
