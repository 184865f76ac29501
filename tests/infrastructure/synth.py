"""Synthesizing the stack the way `app.py` does, and reading the template back."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aws_cdk import App, CfnElement
from aws_cdk.assertions import Template
from constructs import IConstruct

from infrastructure import REPO_ROOT
from stacks.config import SpotRelayConfig
from stacks.scheduler_stack import SchedulerStack, build_scheduler
from stacks.suppressions import flatten_reference

CDK_JSON = REPO_ROOT / "cdk.json"


def cdk_json_context() -> dict[str, Any]:
    context: dict[str, Any] = json.loads(CDK_JSON.read_text())["context"]
    return context


@dataclass
class Synthesized:
    stack: SchedulerStack
    template: Template
    outdir: Path
    json: dict[str, Any] = field(repr=False)

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        resources: dict[str, dict[str, Any]] = self.json["Resources"]
        return resources

    def of_type(self, resource_type: str) -> dict[str, dict[str, Any]]:
        return {key: value for key, value in self.resources.items() if value["Type"] == resource_type}

    def logical_id(self, construct: IConstruct) -> str:
        """The logical id of an L2 construct's resource (or of an L1 element)."""
        element = construct if isinstance(construct, CfnElement) else construct.node.default_child
        assert isinstance(element, CfnElement)
        logical_id: str = self.stack.resolve(element.logical_id)
        return logical_id

    def properties(self, construct: IConstruct) -> dict[str, Any]:
        properties: dict[str, Any] = self.resources[self.logical_id(construct)]["Properties"]
        return properties

    def function_ids(self) -> dict[str, str]:
        """function name (dispatcher, place, ...) -> logical id."""
        return {name: self.logical_id(fn) for name, fn in self.stack.functions.functions.items()}


def synthesize(outdir: Path, **context: Any) -> Synthesized:
    """Build the app as app.py does (cdk.json context, overridden by `context`), synthesized into `outdir`.

    CDK's built-in CloudFormation validation is off here: `make synth` runs cfn-lint on the same
    template. The cdk-nag plugin does run: an unacknowledged finding fails the synthesis."""
    app = App(context=cdk_json_context() | context, outdir=str(outdir), builtin_cloud_formation_validation=False)
    stack = build_scheduler(app, SpotRelayConfig.from_context(app.node.try_get_context))
    template = Template.from_stack(stack)
    return Synthesized(stack=stack, template=template, outdir=outdir, json=dict(template.to_json()))


INTRINSICS = ("Ref", "Fn::Join", "Fn::GetAtt", "Fn::Sub", "Fn::Select", "Fn::GetAZs", "Fn::ImportValue", "Fn::Split")


def render(value: Any) -> Any:
    """Template value with every intrinsic rendered as text, the way cdk-nag names findings:
    `{"Ref": "X"}` -> "<X>", GetAtt -> "<X.Arn>", Fn::Join joined, Fn::Sub's `${...}` -> `<...>`;
    other intrinsics (Fn::Select, ...) -> a placeholder unique to the expression."""
    if isinstance(value, dict):
        if len(value) == 1 and next(iter(value)) in INTRINSICS:
            return _text(value)
        return {key: render(item) for key, item in value.items()}
    if isinstance(value, list):
        return [render(item) for item in value]
    return value


def _text(node: Any) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, dict) and len(node) == 1:
        [(key, argument)] = node.items()
        if key == "Fn::Join":
            delimiter, items = argument
            return str(delimiter).join(_text(item) for item in items)
        if key in ("Ref", "Fn::GetAtt", "Fn::Sub"):
            return flatten_reference(node)
        digest = hashlib.sha256(json.dumps(node, sort_keys=True).encode()).hexdigest()[:8]
        return f"<{key}#{digest}>"
    return json.dumps(node)


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@dataclass(frozen=True)
class Statement:
    policy: str  # logical id of the policy (or role, for inline role policies)
    effect: str
    actions: tuple[str, ...]
    resources: tuple[str, ...]
    condition: Mapping[str, Any]
    roles: tuple[str, ...]


def statements(synthesized: Synthesized) -> Iterator[Statement]:
    """Every identity-policy statement in the template, rendered."""
    for logical_id, resource in synthesized.resources.items():
        properties = resource.get("Properties", {})
        documents: list[dict[str, Any]] = []
        roles: list[str] = []
        if resource["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            documents.append(properties["PolicyDocument"])
            roles = [render(role) for role in properties.get("Roles", [])]
        elif resource["Type"] == "AWS::IAM::Role":
            documents.extend(policy["PolicyDocument"] for policy in properties.get("Policies", []))
            roles = [f"<{logical_id}>"]
        for document in documents:
            for raw in document["Statement"]:
                statement = render(raw)
                yield Statement(
                    policy=logical_id,
                    effect=statement["Effect"],
                    actions=tuple(as_list(statement.get("Action", []))),
                    resources=tuple(as_list(statement.get("Resource", []))),
                    condition=statement.get("Condition", {}),
                    roles=tuple(roles),
                )


def state_machine_definition(synthesized: Synthesized) -> dict[str, Any]:
    """The JobLifecycle definition: its Fn::Join rendered with `<...>` placeholders for tokens, parsed."""
    definition = synthesized.properties(synthesized.stack.lifecycle.state_machine)["DefinitionString"]
    parsed: dict[str, Any] = json.loads(render(definition))
    return parsed
