"""Security posture over every resource of the template, not one construct at a time: whatever a later
change adds (a queue, a bucket, a table) is encrypted at rest, and no log the stack configures records
the Run task's token."""

from __future__ import annotations

from typing import Any

from infrastructure.synth import Synthesized, render


def _kms_key(synthesized: Synthesized, reference: Any) -> dict[str, Any]:
    logical_id = render(reference).strip("<>").removesuffix(".Arn")
    key = synthesized.resources[logical_id]
    assert key["Type"] == "AWS::KMS::Key"
    return key


def test_every_queue_is_encrypted_with_a_customer_managed_rotating_key(synthesized: Synthesized) -> None:
    queues = synthesized.of_type("AWS::SQS::Queue")
    assert queues
    for logical_id, queue in queues.items():
        key_id = queue["Properties"].get("KmsMasterKeyId")
        assert key_id is not None, f"{logical_id}: messages (job specs, events) rest unencrypted by our key"
        assert _kms_key(synthesized, key_id)["Properties"]["EnableKeyRotation"] is True


def test_every_bucket_is_encrypted_and_the_checkpoints_with_a_customer_managed_key(synthesized: Synthesized) -> None:
    buckets = synthesized.of_type("AWS::S3::Bucket")
    assert buckets
    kms = 0
    for logical_id, bucket in buckets.items():
        rules = bucket["Properties"]["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        algorithms = {rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] for rule in rules}
        # The access-log bucket is SSE-S3: S3 server access logging cannot deliver to an SSE-KMS bucket
        assert algorithms in ({"aws:kms"}, {"AES256"}), logical_id
        if algorithms == {"aws:kms"}:
            kms += 1
            (rule,) = rules
            key = _kms_key(synthesized, rule["ServerSideEncryptionByDefault"]["KMSMasterKeyID"])
            assert key["Properties"]["EnableKeyRotation"] is True
    assert kms >= 1  # the checkpoints (the users' model weights and data)


def test_every_table_is_encrypted_at_rest(synthesized: Synthesized) -> None:
    tables = synthesized.of_type("AWS::DynamoDB::Table")
    assert tables
    for logical_id, table in tables.items():
        assert table["Properties"].get("SSESpecification", {}).get("SSEEnabled") is True, logical_id


def test_the_state_machine_logs_every_event_but_never_its_data_the_task_tokens(synthesized: Synthesized) -> None:
    (machine,) = synthesized.of_type("AWS::StepFunctions::StateMachine").values()
    logging = machine["Properties"]["LoggingConfiguration"]
    assert logging["Level"] == "ALL"  # cdk-nag AwsSolutions-SF1
    # A task's logged input and parameters would carry the Run task's token ($$.Task.Token): anyone who
    # reads the log group could then complete or fail that job's run
    assert logging["IncludeExecutionData"] is False
