"""With vpc_id and subnets in the context, the stack uses them and creates no network of its own."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Annotations, Match

from infrastructure.synth import Statement, Synthesized, statements, synthesize

VPC_ID = "vpc-0a1b2c3d4e5f60718"
SUBNETS = [
    {"id": "subnet-0aaaaaaaaaaaaaaa1", "availability_zone": "eu-west-1a"},
    {"id": "subnet-0bbbbbbbbbbbbbbb2", "availability_zone": "eu-west-1b"},
]


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    # Command-line style: the subnets as JSON text
    return synthesize(tmp_path_factory.mktemp("cdk.out"), vpc_id=VPC_ID, subnets=json.dumps(SUBNETS))


def test_no_vpc_is_created_and_workers_use_the_given_vpc(imported: Synthesized) -> None:
    for resource_type in ("AWS::EC2::VPC", "AWS::EC2::Subnet", "AWS::EC2::FlowLog", "AWS::EC2::VPCEndpoint"):
        imported.template.resource_count_is(resource_type, 0)
    assert imported.properties(imported.stack.worker.security_group)["VpcId"] == VPC_ID


def test_functions_get_the_given_subnets_by_zone(imported: Synthesized) -> None:
    for function in ("place", "launch"):
        variables = imported.properties(imported.stack.functions.functions[function])["Environment"]["Variables"]
        assert json.loads(variables["SPOTRELAY_SUBNETS"]) == {s["availability_zone"]: s["id"] for s in SUBNETS}


def test_launch_may_use_exactly_the_given_subnets(imported: Synthesized) -> None:
    launch = f"<{imported.logical_id(imported.stack.functions.roles['launch'])}>"
    launching: list[Statement] = [
        s for s in statements(imported) if launch in s.roles and "ec2:RunInstances" in s.actions
    ]
    subnet_arns = {r for s in launching for r in s.resources if ":subnet/" in r}
    assert subnet_arns == {f"arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:subnet/{s['id']}" for s in SUBNETS}


def test_cdk_reports_no_warnings_for_the_imported_network(imported: Synthesized) -> None:
    annotations = Annotations.from_stack(imported.stack)
    assert annotations.find_warning("*", Match.any_value()) == []
    assert annotations.find_error("*", Match.any_value()) == []
