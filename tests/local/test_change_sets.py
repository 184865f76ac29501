"""A stack deployed the way `cdk deploy` deploys it (a change set, created then executed) has its outputs,
which every `spotrelay` command reads to find the queue, the table and the functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spotrelay.local import LocalRuntime, VirtualClock, deploy

from .conftest import START

QUEUE_ONLY = {
    "Resources": {"Queue": {"Type": "AWS::SQS::Queue"}},
    "Outputs": {"QueueUrl": {"Value": {"Ref": "Queue"}}},
}


def test_a_stack_created_and_updated_by_change_sets_has_its_templates_outputs(synthesized_template: Path) -> None:
    template = json.loads(synthesized_template.read_text())
    with LocalRuntime(clock=VirtualClock(START)) as runtime:
        cloudformation = runtime.client("cloudformation")
        # (what `cdk bootstrap` and the CLI's asset publishing leave in an account: the template's SSM
        # parameters and its assets)
        clients = deploy._Clients(runtime.region, None)
        account = clients.sts.get_caller_identity()["Account"]
        deploy.seed_parameters(clients, template, account, runtime.region)
        deploy.upload_assets(clients, synthesized_template.with_name("SpotRelay.assets.json"), account, runtime.region)

        def execute(body: str, kind: str, name: str, parameters: list[Any] | None = None) -> dict[str, str]:
            if kind == "UPDATE":  # the CDK CLI first looks for a change set of that name, and clears it
                with pytest.raises(cloudformation.exceptions.ChangeSetNotFoundException):
                    cloudformation.describe_change_set(ChangeSetName=name, StackName="SpotRelay")
                cloudformation.delete_change_set(ChangeSetName=name, StackName="SpotRelay")
            cloudformation.create_change_set(
                StackName="SpotRelay",
                ChangeSetName=name,
                ChangeSetType=kind,
                TemplateBody=body,
                Parameters=parameters or [],
                Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM"],
            )
            cloudformation.execute_change_set(ChangeSetName=name, StackName="SpotRelay")
            (stack,) = cloudformation.describe_stacks(StackName="SpotRelay")["Stacks"]
            return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}

        # When a small stack is created by a change set
        created = execute(json.dumps(QUEUE_ONLY), "CREATE", "create")
        # Then it has its output, the queue's URL
        assert list(created) == ["QueueUrl"]
        assert created["QueueUrl"].endswith("SpotRelay-Queue-" + created["QueueUrl"].rsplit("-", 1)[-1])
        # And when a change set updates it to spotrelay's template, it has every output the template names
        updated = execute(synthesized_template.read_text(), "UPDATE", "update")
        assert set(updated) == set(template["Outputs"])
        # And when a later one keeps its parameters (`cdk deploy` again: UsePreviousValue), the SSM-typed ones
        # (the worker AMI, the bootstrap version) are looked up by their names again, and the stack is updated
        kept = [{"ParameterKey": key, "UsePreviousValue": True} for key in template.get("Parameters", {})]
        assert any("SSM::Parameter" in p["Type"] for p in template["Parameters"].values())
        changed = json.dumps({**template, "Description": "spotrelay, deployed again"})  # (an update changes something)
        again = execute(changed, "UPDATE", "again", parameters=kept)
        assert again == updated
        tables = runtime.client("dynamodb").list_tables()["TableNames"]
        assert updated["TableName"] in tables
