"""Acknowledging cdk-nag (AwsSolutions) findings, each on the one resource it concerns, with a reason.

cdk-nag 3 runs as a CDK policy-validation plugin; a finding is acknowledged with
`Validations.of(construct).acknowledge(...)` on the resource or an ancestor. IAM5 (wildcard) findings
are acknowledged per finding, e.g. `AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:...:instance/*]`;
`wildcard_resource_findings` renders a statement's resources the way cdk-nag does, so the
acknowledgment is made from the statement itself and can never drift from it.
"""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import Acknowledgment, Stack, Validations
from aws_cdk import aws_iam as iam
from constructs import IConstruct

PACK = "AwsSolutions"
MIN_REASON_LENGTH = 40


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Acknowledge `AwsSolutions-<rule>` on `scope` (and the resources under it)."""
    if len(reason) < MIN_REASON_LENGTH:
        raise ValueError(f"a suppression of {rule} needs a real reason, got {reason!r}")
    Validations.of(scope).acknowledge(Acknowledgment(id=f"{PACK}-{rule}", reason=reason))


def acknowledge_wildcard_resources(scope: IConstruct, statement: iam.PolicyStatement, reason: str) -> None:
    """Acknowledge the IAM5 finding of every resource of `statement` that contains a `*`."""
    findings = wildcard_resource_findings(Stack.of(scope), statement)
    if not findings:
        raise ValueError(f"statement {statement.actions} has no wildcard resource to acknowledge")
    for finding in findings:
        acknowledge(scope, f"IAM5[{finding}]", reason)


def wildcard_resource_findings(stack: Stack, statement: iam.PolicyStatement) -> list[str]:
    rendered = [flatten_reference(stack.resolve(resource)) for resource in statement.resources]
    return [f"Resource::{resource}" for resource in rendered if "*" in resource]


def resource_finding(stack: Stack, resource: str) -> str:
    """The IAM5 finding id cdk-nag reports for one policy resource (which may hold tokens)."""
    return f"Resource::{flatten_reference(stack.resolve(resource))}"


def flatten_reference(node: Any) -> str:
    """cdk-nag's flattenCfnReference: intrinsics become `<LogicalId.Attr>` / `<Ref>` text."""
    if node is None:
        return ""
    if isinstance(node, str):
        return node.replace("${", "<").replace("}", ">")
    if isinstance(node, dict):
        if "Fn::Join" in node:
            delimiter, items = node["Fn::Join"]
            return str(delimiter).join(flatten_reference(item) for item in items)
        if "Fn::Sub" in node:
            return flatten_reference(node["Fn::Sub"])
        if "Fn::GetAtt" in node:
            resource, attribute = node["Fn::GetAtt"]
            return f"<{flatten_reference(resource)}.{flatten_reference(attribute)}>"
        if "Fn::ImportValue" in node:
            return flatten_reference(node["Fn::ImportValue"])
        if "Ref" in node:
            return f"<{flatten_reference(node['Ref'])}>"
    return json.dumps(node, separators=(",", ":"))
