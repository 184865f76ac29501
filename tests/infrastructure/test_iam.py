"""Least privilege, checked on every identity-policy statement of the synthesized template."""

from __future__ import annotations

import re

import pytest

from infrastructure.synth import Statement, Synthesized, statements
from spotrelay.config import TAG_MANAGED
from stacks.config import DEFAULT_GPU_FAMILIES

# Actions that support no resource-level permissions: the only ones allowed on Resource "*".
ACTIONS_WITHOUT_RESOURCE_LEVEL_PERMISSIONS = {
    "ec2:DescribeInstances",
    "ec2:DescribeInstanceStatus",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeInstanceTypeOfferings",
    "ec2:DescribeSpotPriceHistory",
    "states:SendTaskSuccess",
    "states:SendTaskFailure",
    "states:SendTaskHeartbeat",
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "xray:GetSamplingRules",
    "xray:GetSamplingTargets",
    # Step Functions' log delivery to CloudWatch Logs (added by CDK for LogLevel.ALL)
    "logs:CreateLogDelivery",
    "logs:DeleteLogDelivery",
    "logs:DescribeLogGroups",
    "logs:DescribeResourcePolicies",
    "logs:GetLogDelivery",
    "logs:ListLogDeliveries",
    "logs:PutResourcePolicy",
    "logs:UpdateLogDelivery",
}
EC2_PREFIX = "arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:"


@pytest.fixture(scope="module")
def allows(synthesized: Synthesized) -> list[Statement]:
    found = [s for s in statements(synthesized) if s.effect == "Allow"]
    assert len(found) > 30
    return found


def _role(synthesized: Synthesized, function: str) -> str:
    return f"<{synthesized.logical_id(synthesized.stack.functions.roles[function])}>"


def _granted(allows: list[Statement], role: str, action: str) -> list[Statement]:
    return [s for s in allows if role in s.roles and action in s.actions]


def test_no_statement_has_a_star_or_service_wide_action(allows: list[Statement]) -> None:
    for statement in allows:
        for action in statement.actions:
            assert action != "*", statement
            assert not re.fullmatch(r"[a-z0-9-]+:\*", action), statement


def test_resource_star_only_for_actions_without_resource_level_permissions(allows: list[Statement]) -> None:
    for statement in allows:
        if "*" in statement.resources:
            assert set(statement.actions) <= ACTIONS_WITHOUT_RESOURCE_LEVEL_PERMISSIONS, statement


@pytest.mark.parametrize("function", ["launch", "reconcile"])
def test_run_instances_only_for_allowed_gpu_families_and_only_tagged(
    synthesized: Synthesized, allows: list[Statement], function: str
) -> None:
    launch = _role(synthesized, function)
    on_instances = [s for s in _granted(allows, launch, "ec2:RunInstances") if f"{EC2_PREFIX}instance/*" in s.resources]
    assert len(on_instances) == 1
    [statement] = on_instances
    assert statement.resources == (f"{EC2_PREFIX}instance/*",)
    assert statement.condition == {
        "StringLike": {"ec2:InstanceType": [f"{family}.*" for family in DEFAULT_GPU_FAMILIES]},
        "StringEquals": {f"aws:RequestTag/{TAG_MANAGED}": "true"},
    }
    # No other statement lets an instance be launched unconditionally
    for other in _granted(allows, launch, "ec2:RunInstances"):
        if other is not statement:
            assert not any(r.endswith(":instance/*") or r == "*" for r in other.resources)


def test_no_role_may_launch_but_through_run_instances(allows: list[Statement]) -> None:
    # spotrelay launches with RunInstances only (spotrelay.aws.compute): no fleet or spot-request API is granted
    granted = {action for s in allows for action in s.actions}
    assert not granted & {"ec2:CreateFleet", "ec2:RequestSpotInstances", "ec2:RequestSpotFleet"}
    assert not any("ec2fleet.amazonaws.com" in str(s.condition) or ":fleet/" in str(s.resources) for s in allows)


def test_no_role_but_launch_and_reconcile_may_launch_or_pass_roles(
    synthesized: Synthesized, allows: list[Statement]
) -> None:
    # reconcile launches the spot standby of a job it moves off on-demand (make-before-break)
    launchers = {_role(synthesized, "launch"), _role(synthesized, "reconcile")}
    for action in ("ec2:RunInstances", "iam:PassRole"):
        assert {role for s in allows if action in s.actions for role in s.roles} == launchers


def test_pass_role_only_for_the_worker_role_and_only_to_ec2(synthesized: Synthesized, allows: list[Statement]) -> None:
    [statement] = [s for s in allows if "iam:PassRole" in s.actions]
    assert statement.actions == ("iam:PassRole",)
    assert statement.resources == (f"<{synthesized.logical_id(synthesized.stack.worker.role)}.Arn>",)
    assert statement.condition == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}


def test_tags_only_while_launching(allows: list[Statement]) -> None:
    tagging = [s for s in allows if "ec2:CreateTags" in s.actions]
    assert tagging
    for statement in tagging:
        assert statement.condition == {"StringEquals": {"ec2:CreateAction": ["RunInstances"]}}


def test_terminate_only_instances_tagged_managed(synthesized: Synthesized, allows: list[Statement]) -> None:
    terminating = [s for s in allows if "ec2:TerminateInstances" in s.actions]
    assert terminating
    for statement in terminating:
        assert statement.resources == (f"{EC2_PREFIX}instance/*",)
        assert statement.condition == {"StringEquals": {f"aws:ResourceTag/{TAG_MANAGED}": "true"}}
    roles = {role for s in terminating for role in s.roles}
    assert roles == {_role(synthesized, name) for name in ("launch", "finalize", "reconcile", "cancel")}


def test_executions_and_task_tokens_go_to_the_functions_that_need_them(
    synthesized: Synthesized, allows: list[Statement]
) -> None:
    def holders(action: str) -> set[str]:
        return {role for s in allows if action in s.actions for role in s.roles}

    def roles(*names: str) -> set[str]:
        return {_role(synthesized, name) for name in names}

    assert holders("states:StartExecution") == roles("dispatcher")
    assert holders("states:StopExecution") == roles("reconcile", "cancel")
    assert holders("states:SendTaskSuccess") == roles("ec2_events", "cancel", "reconcile") | {
        f"<{synthesized.logical_id(synthesized.stack.job_credentials.job_role)}>"
    }
    assert holders("sqs:ReceiveMessage") == holders("sqs:DeleteMessage") == roles("dispatcher")
    assert holders("sqs:SendMessage") == roles("dispatcher", "ec2_events")  # ec2_events: Lambda's DLQ (its role)
    [wake] = [s for s in allows if "lambda:InvokeFunction" in s.actions and _role(synthesized, "finalize") in s.roles]
    assert wake.resources == (f"<{synthesized.function_ids()['dispatcher']}.Arn>",)
    assert set(wake.roles) == roles("finalize", "cancel", "resume")
    # resume reads the previous run's execution, and may neither stop nor start one (the dispatcher starts it)
    assert _role(synthesized, "resume") in holders("states:DescribeExecution")


def test_dispatcher_sends_only_to_the_dlq(synthesized: Synthesized, allows: list[Statement]) -> None:
    dispatcher = _role(synthesized, "dispatcher")
    [send] = [s for s in allows if "sqs:SendMessage" in s.actions and dispatcher in s.roles]
    assert send.resources == (f"<{synthesized.logical_id(synthesized.stack.job_queue.dead_letter_queue)}.Arn>",)


def test_ec2_events_sends_only_to_its_own_dlq_and_uses_only_its_key(
    synthesized: Synthesized, allows: list[Statement]
) -> None:
    # Given ec2_events' role, which Lambda uses to dead-letter an event it gave up on
    role = _role(synthesized, "ec2_events")
    functions = synthesized.stack.functions
    # Then it may send to its DLQ, and to no other queue
    [send] = [s for s in allows if "sqs:SendMessage" in s.actions and role in s.roles]
    assert send.resources == (f"<{synthesized.logical_id(functions.dead_letter_queues['ec2_events'])}.Arn>",)
    assert not [s for s in allows if role in s.roles and {"sqs:ReceiveMessage", "sqs:DeleteMessage"} & set(s.actions)]
    # And encrypt with the DLQ's key only
    key = f"<{synthesized.logical_id(functions.dead_letter_key)}.Arn>"
    kms = [s for s in allows if role in s.roles and any(a.startswith("kms:") for a in s.actions)]
    assert kms
    assert all(s.resources == (key,) for s in kms)


def test_worker_role_reaches_only_the_agent_wheel_and_vend(synthesized: Synthesized, allows: list[Statement]) -> None:
    # Its job's data and log streams are reached with vend's credentials only
    # (tests/infrastructure/test_job_isolation.py)
    worker = f"<{synthesized.logical_id(synthesized.stack.worker.role)}>"
    bucket = f"<{synthesized.logical_id(synthesized.stack.storage.bucket)}.Arn>"
    granted = {(a, r) for s in allows if worker in s.roles for a in s.actions for r in s.resources}
    assert granted == {
        ("s3:GetObject", f"{bucket}/agent/*"),
        ("lambda:InvokeFunction", f"<{synthesized.function_ids()['vend']}.Arn>"),
    }


def test_function_roles_have_no_managed_policies(synthesized: Synthesized) -> None:
    for name, role in synthesized.stack.functions.roles.items():
        assert "ManagedPolicyArns" not in synthesized.properties(role), name


def test_the_dispatcher_reads_spot_prices_and_nothing_else_of_ec2(
    synthesized: Synthesized, allows: list[Statement]
) -> None:
    """Its budget counts a running spot job at its pool's price now (DescribeSpotPriceHistory); it launches,
    terminates and describes nothing."""
    dispatcher = _role(synthesized, "dispatcher")
    granted = {a for s in allows if dispatcher in s.roles for a in s.actions if a.startswith("ec2:")}
    assert granted == {"ec2:DescribeSpotPriceHistory"}
