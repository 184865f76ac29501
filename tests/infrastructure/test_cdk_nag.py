"""cdk-nag (AwsSolutions) finds nothing unacknowledged, and every acknowledgment is specific and explained.

cdk-nag 3 reports through CDK's policy-validation plugins, not annotations: `Annotations` never shows
its findings. So the pack is run directly (`validate_scope`), and a deliberately bad stack proves the
check can fail. The synthesis behind the `synthesized` fixture also ran the registered plugin, which
raises on any finding.
"""

from __future__ import annotations

from collections.abc import Iterator

from aws_cdk import App, Stack, Validations
from aws_cdk import aws_sqs as sqs
from aws_cdk.assertions import Annotations, Match
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

from infrastructure.synth import Synthesized
from stacks.suppressions import MIN_REASON_LENGTH


def _acknowledgments(root: IConstruct) -> Iterator[tuple[IConstruct, str, str]]:
    for construct in root.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
                for rule, reason in entry.data.items():
                    rule_id = rule.split("::", 1)[-1] if rule.lower().startswith("annotation::") else rule
                    if rule_id.startswith("AwsSolutions-"):
                        yield construct, rule_id, reason


def test_aws_solutions_checks_find_nothing_unacknowledged(synthesized: Synthesized) -> None:
    report = AwsSolutionsChecks().validate_scope(synthesized.stack)
    findings = [
        (violation.rule_name, violation.severity, [r.construct_path for r in violation.violating_resources])
        for violation in report.violations
    ]
    assert findings == []
    assert report.success


def test_the_check_fails_on_a_non_compliant_stack() -> None:
    # Given a queue with no DLQ and no TLS enforcement
    stack = Stack(App(), "NotCompliant")
    sqs.Queue(stack, "Queue")
    # When AwsSolutions checks it, Then it reports both problems as errors
    report = AwsSolutionsChecks().validate_scope(stack)
    rules = {violation.rule_name: violation.severity for violation in report.violations}
    assert rules["AwsSolutions-SQS3"] == "error"
    assert rules["AwsSolutions-SQS4"] == "error"
    assert not report.success


def test_cdk_reports_no_errors_or_warnings(synthesized: Synthesized) -> None:
    annotations = Annotations.from_stack(synthesized.stack)
    assert annotations.find_error("*", Match.any_value()) == []
    assert annotations.find_warning("*", Match.any_value()) == []
    assert annotations.find_error("*", Match.string_like_regexp("AwsSolutions-.*")) == []
    assert annotations.find_warning("*", Match.string_like_regexp("AwsSolutions-.*")) == []


def test_every_acknowledgment_is_on_a_resource_and_explained(synthesized: Synthesized) -> None:
    acknowledgments = list(_acknowledgments(synthesized.stack))
    assert acknowledgments
    for construct, rule, reason in acknowledgments:
        # Never the whole stack (or app): each suppression names the construct it concerns
        assert not isinstance(construct, Stack), rule
        assert len(reason) >= MIN_REASON_LENGTH, (construct.node.path, rule)
    # A reason is written for its finding, not pasted everywhere: one text per kind of finding
    reasons_by_rule: dict[str, set[str]] = {}
    for _, rule, reason in acknowledgments:
        reasons_by_rule.setdefault(rule.split("[")[0], set()).add(reason)
    assert len(reasons_by_rule["AwsSolutions-IAM5"]) >= 5


def test_the_only_acknowledged_rules_are_the_expected_kinds(synthesized: Synthesized) -> None:
    kinds = {rule.split("[")[0] for _, rule, _ in _acknowledgments(synthesized.stack)}
    assert kinds == {
        "AwsSolutions-IAM4",
        "AwsSolutions-IAM5",
        "AwsSolutions-L1",
        "AwsSolutions-S1",
        "AwsSolutions-SQS3",
    }
