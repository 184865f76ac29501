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


def _encrypted_with(synthesized: Synthesized) -> dict[str, list[str]]:
    """key logical id -> the resources it encrypts (queues, topics, buckets)."""
    users: dict[str, list[str]] = {key_id: [] for key_id in synthesized.of_type("AWS::KMS::Key")}
    for logical_id, resource in synthesized.resources.items():
        properties = resource.get("Properties", {})
        references = [properties.get("KmsMasterKeyId")]
        for rule in properties.get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration", []):
            references.append(rule["ServerSideEncryptionByDefault"].get("KMSMasterKeyID"))
        for reference in references:
            if reference is not None:
                users[render(reference).strip("<>").removesuffix(".Arn")].append(logical_id)
    return users


def test_a_key_is_deleted_with_what_it_encrypts_and_kept_while_anything_it_encrypts_is_kept(
    synthesized: Synthesized,
) -> None:
    # A stack deletion deletes the queues and the topic: their keys go too (a kept key is billed monthly),
    # after KMS's shortest pending window; one an update replaces stays. The checkpoint bucket is kept: its
    # key must be, or the kept checkpoints can never be read again.
    users = _encrypted_with(synthesized)
    kept = 0
    for key_id, encrypted in users.items():
        assert encrypted, f"{key_id} encrypts nothing"
        key = synthesized.resources[key_id]
        policies = {synthesized.resources[r].get("DeletionPolicy", "Delete") for r in encrypted}
        if "Retain" in policies:
            kept += 1
            assert key.get("DeletionPolicy") == "Retain", f"{key_id} would be deleted under {encrypted}"
            assert key.get("UpdateReplacePolicy") == "Retain", key_id
        else:
            assert key.get("DeletionPolicy") == "Delete", f"{key_id} outlives {encrypted}"
            # A key an update replaces is kept: what it encrypted may wait in a DLQ longer than the window
            assert key.get("UpdateReplacePolicy") == "Retain", key_id
            assert key["Properties"]["PendingWindowInDays"] == 7, key_id
    assert kept == 1  # the checkpoint bucket's
