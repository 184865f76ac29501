"""CloudFormation: what moto needs to deploy the synthesized template, and to update it as `cdk deploy` does
(state machines on the executing backend, KMS keys' tags, flow logs to an S3 prefix, archives' names and
patterns, change sets, SSM-typed parameters, a stack's outputs; see the package's docstring). Siblings:
`speed` reads a JSON template as JSON; `installation` runs the patches.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from moto.cloudformation.exceptions import CloudFormationError
from moto.cloudformation.exceptions import ValidationError as CfnValidationError
from moto.cloudformation.models import ChangeSet, CloudFormationBackend
from moto.cloudformation.models import Stack as CfnStack
from moto.ec2.models.flow_logs import FlowLogs, FlowLogsBackend
from moto.events.models import Archive
from moto.kms.models import Key
from moto.stepfunctions import responses as sfn_responses
from moto.stepfunctions.models import StateMachine

from spotrelay.local import cfn_models
from spotrelay.local.patches.canaries import Expected
from spotrelay.local.patches.installation import _Patcher

ARCHIVE_NAME_MAX = 48  # EventBridge's limit on archive names


# (EXPECTED, which the package assembles, lists the canaries of every module in the order they were written:
# this module's are in two groups only to keep that order)

EXPECTED_RESOURCES: tuple[Expected, ...] = (
    Expected(
        StateMachine,
        "create_from_cloudformation_json",
        "(cls, resource_name: 'str', cloudformation_json: 'Any', account_id: 'str', region_name: 'str', "
        "**kwargs: 'Any') -> 'StateMachine'",
        ("sf_backend = stepfunctions_backends[account_id][region_name]",),
    ),
    Expected(
        StateMachine,
        "update_from_cloudformation_json",
        "(cls, original_resource: 'Any', new_resource_name: 'str', cloudformation_json: 'Any', account_id: 'str', "
        "region_name: 'str') -> 'StateMachine'",
    ),
    Expected(
        StateMachine,
        "delete_from_cloudformation_json",
        "(cls, resource_name: 'str', cloudformation_json: 'Any', account_id: 'str', region_name: 'str') -> 'None'",
    ),
    Expected(
        sfn_responses,
        "get_backend",
        "(account: str, region: str) -> moto.stepfunctions.models.StepFunctionBackend",
        ('if sfn_config.get("execute_state_machine", False):',),
    ),
    Expected(
        Key,
        "create_from_cloudformation_json",
        "(cls, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str, **kwargs: Any) "
        "-> 'Key'",
        ('tags=properties.get("Tags", []),',),
    ),
    Expected(
        FlowLogs,
        "create_from_cloudformation_json",
        "(cls, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str, **kwargs: Any) "
        "-> 'FlowLogs'",
        ("flow_log[0].add_tag(tag_key, tag_value)",),
    ),
    Expected(
        FlowLogsBackend,
        "create_flow_logs",
        "(self, resource_type: str, resource_ids: list[str], traffic_type: str, deliver_logs_permission_arn: str, "
        "log_destination_type: str, log_destination: str, log_group_name: str, log_format: str, "
        "max_aggregation_interval: int) -> tuple[list[moto.ec2.models.flow_logs.FlowLogs], list[typing.Any]]",
        ('arn = log_destination.split(":", 5)[5]',),
    ),
    Expected(
        Archive,
        "create_from_cloudformation_json",
        "(cls, resource_name: 'str', cloudformation_json: 'Any', account_id: 'str', region_name: 'str', "
        "**kwargs: 'Any') -> 'Archive'",
        ('event_pattern = properties.get("EventPattern")',),
    ),
)

EXPECTED_CHANGE_SETS: tuple[Expected, ...] = (
    Expected(  # a change set's execution updates the stack's resources only (not its outputs)
        ChangeSet,
        "apply",
        "(self) -> 'None'",
        ("self.stack.resource_map.update(self.template_dict, self.parameters)",),
    ),
    Expected(CfnStack, "_create_output_map", "(self) -> 'OutputMap'"),
    Expected(  # the resolved parameters: an SSM-typed one's value, not its name
        CfnStack, "stack_parameters", None, ("return self.resource_map.resolved_parameters",)
    ),
    Expected(  # a name not found leaves `to_delete` unbound
        CloudFormationBackend,
        "delete_change_set",
        "(self, change_set_name: 'str') -> 'None'",
        ("if self.change_sets[cs].change_set_name == change_set_name:", "del self.change_sets[to_delete]"),
    ),
    Expected(  # a name not found raises the stack's ValidationError
        CloudFormationBackend,
        "describe_change_set",
        "(self, change_set_name: 'str') -> 'ChangeSet | None'",
        ("raise ValidationError(change_set_name)",),
    ),
)


# --- CloudFormation ----------------------------------------------------------------------------------


class _ChangeSetNotFound(CloudFormationError):
    code = "ChangeSetNotFoundException"  # the model's shape: serialized as ChangeSetNotFound, HTTP 404


def _patch_cloudformation(patcher: _Patcher) -> None:
    cfn_models.register()

    def create_state_machine(
        cls: type[StateMachine],
        /,
        resource_name: str,
        cloudformation_json: Any,
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> Any:
        from moto.stepfunctions.utils import cfn_to_api_tags

        properties = cloudformation_json["Properties"]
        definition = properties.get("DefinitionString")
        if definition is None and "Definition" in properties:
            definition = json.dumps(properties["Definition"])
        return sfn_responses.get_backend(account_id, region_name).create_state_machine(
            name=properties.get("StateMachineName", resource_name),
            definition=definition or "",
            roleArn=properties.get("RoleArn", ""),
            tags=cfn_to_api_tags(properties.get("Tags", [])),
            loggingConfiguration=_lower_keys(properties.get("LoggingConfiguration")),
            tracingConfiguration=_lower_keys(properties.get("TracingConfiguration")),
            sm_type=properties.get("StateMachineType"),
        )

    def delete_state_machine(
        cls: type[StateMachine], /, resource_name: str, cloudformation_json: Any, account_id: str, region_name: str
    ) -> None:
        sfn_responses.get_backend(account_id, region_name).delete_state_machine(resource_name)

    def update_state_machine(
        cls: type[StateMachine],
        /,
        original_resource: Any,
        new_resource_name: str,
        cloudformation_json: Any,
        account_id: str,
        region_name: str,
    ) -> Any:
        properties = cloudformation_json.get("Properties", {})
        backend = sfn_responses.get_backend(account_id, region_name)
        name = properties.get("StateMachineName", original_resource.name)
        if name != original_resource.name:
            created = create_state_machine(cls, name, cloudformation_json, account_id, region_name)
            backend.delete_state_machine(original_resource.arn)
            return created
        return backend.update_state_machine(
            original_resource.arn, definition=properties.get("DefinitionString"), role_arn=properties.get("RoleArn")
        )

    patcher.replace(StateMachine, "create_from_cloudformation_json", classmethod(create_state_machine))
    patcher.replace(StateMachine, "delete_from_cloudformation_json", classmethod(delete_state_machine))
    patcher.replace(StateMachine, "update_from_cloudformation_json", classmethod(update_state_machine))

    # A stack made by executing a change set (`cdk deploy`) kept the outputs of the template it was created
    # with, an empty one: describe-stacks listed none, and every command said the stack was not spotrelay's.
    # As CloudFormation does, a change set's execution gives the stack its template's outputs
    original_apply: Callable[[ChangeSet], None] = patcher.original(ChangeSet, "apply")

    def apply(self: ChangeSet) -> None:
        original_apply(self)
        self.stack.template_dict = self.template_dict
        self.stack.output_map = self.stack._create_output_map()

    patcher.replace(ChangeSet, "apply", apply)

    # The CDK CLI deletes its previous change set by name before it makes one; moto raises UnboundLocalError
    # (an HTTP 500 the CLI cannot parse, and `cdk deploy` of an existing stack fails) when there is none.
    # No change set of that name: nothing to delete
    original_delete: Callable[[Any, str], None] = patcher.original(CloudFormationBackend, "delete_change_set")

    def delete_change_set(self: Any, change_set_name: str) -> None:
        known = change_set_name in self.change_sets or any(
            c.change_set_name == change_set_name for c in self.change_sets.values()
        )
        if known:
            original_delete(self, change_set_name)

    patcher.replace(CloudFormationBackend, "delete_change_set", delete_change_set)

    # ... and asks for it first: AWS answers ChangeSetNotFound (404), which the CLI takes for "none";
    # stock moto answers "Stack with id <change set name> does not exist", which stops the deploy
    original_describe: Callable[[Any, str], Any] = patcher.original(CloudFormationBackend, "describe_change_set")

    def describe_change_set(self: Any, change_set_name: str) -> Any:
        try:
            return original_describe(self, change_set_name)
        except CfnValidationError:
            raise _ChangeSetNotFound(f"ChangeSet [{change_set_name}] does not exist") from None

    patcher.replace(CloudFormationBackend, "describe_change_set", describe_change_set)

    # A parameter of type AWS::SSM::Parameter::Value<...> holds the parameter's name, which CloudFormation
    # resolves at each deployment. moto kept only the resolved value (an AMI id), so an update that keeps the
    # previous value (`cdk deploy` of an existing stack: UsePreviousValue) looked that id up as a name, and
    # failed. The previous value of such a parameter is its name, as given or the template's default
    def stack_parameters(self: CfnStack) -> dict[str, Any]:
        parameters = dict(self.resource_map.resolved_parameters)
        for key, slot in (self.template_dict.get("Parameters") or {}).items():
            if key in parameters and str(slot.get("Type", "")).startswith("AWS::SSM::Parameter::"):
                parameters[key] = (self.parameters or {}).get(key, slot.get("Default"))
        return parameters

    patcher.replace(CfnStack, "stack_parameters", property(stack_parameters))

    def key_properties(properties: dict[str, Any], resource_name: str) -> str:
        properties["Tags"] = [
            {"TagKey": t.get("Key", t.get("TagKey")), "TagValue": t.get("Value", t.get("TagValue"))}
            for t in properties.get("Tags", [])
        ]
        if isinstance(properties.get("KeyPolicy"), dict):
            properties["KeyPolicy"] = json.dumps(properties["KeyPolicy"])
        return resource_name

    def flow_log_properties(properties: dict[str, Any], resource_name: str) -> str:
        destination = properties.get("LogDestination")
        if properties.get("LogDestinationType") == "s3" and isinstance(destination, str):
            # moto looks the whole `bucket/prefix/` up as a bucket name: keep the bucket only.
            head, _, rest = destination.partition(":::")
            properties["LogDestination"] = f"{head}:::{rest.split('/', 1)[0]}" if rest else destination
        return resource_name

    def archive_properties(properties: dict[str, Any], resource_name: str) -> str:
        if isinstance(properties.get("EventPattern"), dict):
            properties["EventPattern"] = json.dumps(properties["EventPattern"])
        name = str(properties.get("ArchiveName") or resource_name)
        if len(name) > ARCHIVE_NAME_MAX:
            prefix, _, suffix = name.rpartition("-")
            name = f"{prefix[: ARCHIVE_NAME_MAX - len(suffix) - 1]}-{suffix}" if prefix else name[:ARCHIVE_NAME_MAX]
        return name

    _fix_cfn_properties(patcher, Key, key_properties)
    _fix_cfn_properties(patcher, FlowLogs, flow_log_properties)
    _fix_cfn_properties(patcher, Archive, archive_properties)


def _fix_cfn_properties(patcher: _Patcher, model: type[Any], fix: Callable[[dict[str, Any], str], str]) -> None:
    """Wrap `model.create_from_cloudformation_json` so that `fix` corrects a copy of the resource's
    Properties (and may rename the resource) before moto's own code sees them."""
    original: Callable[..., Any] = patcher.original(model, "create_from_cloudformation_json")

    def create(
        cls: type[Any],
        /,
        resource_name: str,
        cloudformation_json: Any,
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> Any:
        fixed = copy.deepcopy(cloudformation_json)
        name = fix(fixed.setdefault("Properties", {}), resource_name)
        return original(cls, name, fixed, account_id, region_name, **kwargs)

    patcher.replace(model, "create_from_cloudformation_json", classmethod(create))


def _lower_keys(value: Any) -> Any:
    """CloudFormation's PascalCase configuration -> the API's camelCase (LoggingConfiguration, ...)."""
    if isinstance(value, dict):
        return {key[:1].lower() + key[1:]: _lower_keys(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_lower_keys(item) for item in value]
    return value
