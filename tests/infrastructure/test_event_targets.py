"""Every EventBridge rule target: a retry policy, and a dead-letter queue for the events EventBridge cannot
deliver (the Invoke call throttled or failing, a permission or the function missing), encrypted with a
rotated customer-managed key that EventBridge may use, and named by a stack output for the runbook."""

from __future__ import annotations

from typing import Any

from aws_cdk import Validations

from infrastructure.synth import Synthesized, as_list, render
from spotrelay.config import EVENT_TARGET_DLQ_OUTPUT, SCHEDULE_MINUTES
from stacks.events_construct import EC2_DETAIL_TYPES


def _targets(synthesized: Synthesized) -> list[tuple[str, dict[str, Any]]]:
    """(rule logical id, target) for every target of every rule."""
    return [
        (rule_id, target)
        for rule_id, rule in synthesized.of_type("AWS::Events::Rule").items()
        for target in rule["Properties"]["Targets"]
    ]


def _queue_id(target: dict[str, Any]) -> str:
    arn = render(target["DeadLetterConfig"]["Arn"])
    assert arn.startswith("<"), arn
    assert arn.endswith(".Arn>"), arn
    return str(arn[1 : -len(".Arn>")])


def test_every_rule_target_dead_letters_to_an_encrypted_queue_with_a_rotated_key(synthesized: Synthesized) -> None:
    # Given every target of every rule (the three EC2 rules, the alarm's, the schedule's two)
    targets = _targets(synthesized)
    assert len(targets) == 6
    for rule_id, target in targets:
        # Then it names a dead-letter queue of this stack
        assert "DeadLetterConfig" in target, f"{rule_id}: an event EventBridge cannot deliver would be dropped"
        queue = synthesized.resources[_queue_id(target)]
        assert queue["Type"] == "AWS::SQS::Queue"
        # encrypted with a customer-managed key that rotates, and kept two weeks
        key_ref = render(queue["Properties"]["KmsMasterKeyId"])
        key = synthesized.resources[key_ref.strip("<>").removesuffix(".Arn")]
        assert key["Type"] == "AWS::KMS::Key"
        assert key["Properties"]["EnableKeyRotation"] is True
        assert queue["Properties"]["MessageRetentionPeriod"] == 14 * 24 * 3600
    # And it is one queue for them all (each message's TARGET_ARN attribute says whose it is): the stack's
    assert {_queue_id(t) for _, t in targets} == {
        synthesized.logical_id(synthesized.stack.event_rules.dead_letter_queue)
    }


def test_each_target_retries_within_the_age_its_event_is_worth(synthesized: Synthesized) -> None:
    rules = synthesized.stack.event_rules
    expected = {rules.alarm_rule: (2, 600), rules.schedule_rule: (2, SCHEDULE_MINUTES * 60)}
    expected |= dict.fromkeys(rules.rules_by_detail_type.values(), (8, 3600))
    assert set(rules.rules_by_detail_type) == set(EC2_DETAIL_TYPES)
    for rule, (retries, max_age) in expected.items():
        for target in synthesized.properties(rule)["Targets"]:
            assert target["RetryPolicy"] == {"MaximumRetryAttempts": retries, "MaximumEventAgeInSeconds": max_age}


def test_eventbridge_may_send_to_the_queue_from_each_rule_only_and_over_tls_only(synthesized: Synthesized) -> None:
    queue_id = synthesized.logical_id(synthesized.stack.event_rules.dead_letter_queue)
    [policy] = [
        p
        for p in synthesized.of_type("AWS::SQS::QueuePolicy").values()
        if [render(q) for q in p["Properties"]["Queues"]] == [f"<{queue_id}>"]
    ]
    statements = render(policy["Properties"]["PolicyDocument"])["Statement"]
    sends = [s for s in statements if s["Effect"] == "Allow"]
    assert {s["Principal"]["Service"] for s in sends} == {"events.amazonaws.com"}
    assert {a for s in sends for a in as_list(s["Action"])} == {"sqs:SendMessage"}
    # each statement for one rule, by its ARN (no other rule, of this account or another, may send)
    rule_ids = set(synthesized.of_type("AWS::Events::Rule"))
    assert {s["Condition"]["ArnEquals"]["aws:SourceArn"] for s in sends} == {f"<{r}.Arn>" for r in rule_ids}
    assert any(s["Effect"] == "Deny" and s["Condition"]["Bool"]["aws:SecureTransport"] == "false" for s in statements)


def test_the_queues_key_lets_eventbridge_encrypt_for_this_accounts_rules(synthesized: Synthesized) -> None:
    # Given the dead-letter queue's key: SQS asks KMS for a data key as the sender, EventBridge
    queue = synthesized.properties(synthesized.stack.event_rules.dead_letter_queue)
    key = synthesized.resources[render(queue["KmsMasterKeyId"]).strip("<>").removesuffix(".Arn")]
    statements = render(key["Properties"]["KeyPolicy"])["Statement"]
    [events] = [s for s in statements if s.get("Principal", {}).get("Service") == "events.amazonaws.com"]
    assert sorted(as_list(events["Action"])) == ["kms:Decrypt", "kms:GenerateDataKey"]
    assert events["Condition"] == {
        "StringEquals": {"aws:SourceAccount": "<AWS::AccountId>"},
        "ArnLike": {"aws:SourceArn": "arn:<AWS::Partition>:events:<AWS::Region>:<AWS::AccountId>:rule/*"},
    }


def test_the_runbook_finds_the_queue_from_the_stacks_outputs(synthesized: Synthesized) -> None:
    outputs = synthesized.template.to_json()["Outputs"]
    queue_id = synthesized.logical_id(synthesized.stack.event_rules.dead_letter_queue)
    assert render(outputs[EVENT_TARGET_DLQ_OUTPUT]["Value"]) == f"<{queue_id}>"


def test_only_the_dead_letter_queue_is_excused_from_having_a_dlq_of_its_own(synthesized: Synthesized) -> None:
    excused = {
        construct.node.path
        for construct in synthesized.stack.node.find_all()
        for entry in construct.node.metadata
        if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY
        and any("AwsSolutions-SQS3" in k for k in entry.data)
    }
    assert excused == {synthesized.stack.event_rules.dead_letter_queue.node.path}
