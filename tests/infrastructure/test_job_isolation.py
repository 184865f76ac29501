"""A worker reaches only its own job's checkpoints, records and task token: the synthesized policies
and the session policy vend writes, evaluated (tests/infrastructure/policy_eval.py) for job A's
credentials against job B's resources, and for the instance role on its own."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from infrastructure.policy_eval import Request, allowed, decision, statement_applies
from infrastructure.synth import Synthesized, render, statements
from spotrelay.agent import IMDS_ADDRESS, JOB_USER
from spotrelay.control.vend import SESSION_TAG_JOB_ID, JobResources, log_flush_policy, session_policy
from stacks.config import SpotRelayConfig
from stacks.worker_construct import agent_log_group_name

JOB_A = "train-a-0123456789ab"
JOB_B = "train-b-ba9876543210"
POINTER = ["pk", "sk", "record", "attempt", "seq"]


# --- the evaluator on known cases ----------------------------------------------------------------------


def test_the_evaluator_on_known_cases() -> None:
    allow = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:b/jobs/${aws:PrincipalTag/j}/*"}
    tagged = {"aws:PrincipalTag/j": "A"}
    # Given a policy variable: it resolves from the request, and an unresolved one never matches
    assert statement_applies(allow, Request("s3:GetObject", "arn:b/jobs/A/x", tagged))
    assert not statement_applies(allow, Request("s3:GetObject", "arn:b/jobs/B/x", tagged))
    assert not statement_applies(allow, Request("s3:GetObject", "arn:b/jobs/AB/x", tagged))
    assert not statement_applies(allow, Request("s3:GetObject", "arn:b/jobs/A/x"))
    # Actions are case-insensitive globs; resources are case-sensitive
    assert statement_applies(allow, Request("S3:getobject", "arn:b/jobs/A/x", tagged))
    assert not statement_applies(allow, Request("s3:GetObject", "arn:b/JOBS/A/x", tagged))
    # ForAllValues: every value listed (and true with no value: IAM's pitfall, reproduced)
    keys: dict[str, Any] = {"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": "t"}
    keys["Condition"] = {"ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["JOB#A"]}}
    assert statement_applies(keys, Request("dynamodb:GetItem", "t", {"dynamodb:LeadingKeys": ["JOB#A"]}))
    assert not statement_applies(keys, Request("dynamodb:GetItem", "t", {"dynamodb:LeadingKeys": ["JOB#A", "JOB#B"]}))
    assert statement_applies(keys, Request("dynamodb:GetItem", "t"))
    # StringLike on a prefix; a missing key fails it
    listing: dict[str, Any] = {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "b"}
    listing["Condition"] = {"StringLike": {"s3:prefix": ["jobs/A/*"]}}
    assert statement_applies(listing, Request("s3:ListBucket", "b", {"s3:prefix": "jobs/A/"}))
    assert not statement_applies(listing, Request("s3:ListBucket", "b", {"s3:prefix": "jobs/"}))
    assert not statement_applies(listing, Request("s3:ListBucket", "b"))
    # Explicit deny wins; a session is the intersection of its policy sets
    deny = {"Effect": "Deny", "Action": "s3:*", "Resource": "*"}
    assert decision([allow, deny], Request("s3:GetObject", "arn:b/jobs/A/x", tagged)) == "Deny"
    assert decision([], Request("s3:GetObject", "x")) == "ImplicitDeny"
    everything = {"Effect": "Allow", "Action": "*", "Resource": "*"}
    assert allowed(Request("s3:GetObject", "arn:b/jobs/A/x", tagged), [everything], [allow])
    assert not allowed(Request("s3:GetObject", "arn:b/jobs/B/x", tagged), [everything], [allow])
    # What it does not know, it refuses to guess
    with pytest.raises(NotImplementedError):
        statement_applies({**keys, "Condition": {"DateGreaterThan": {"aws:CurrentTime": "x"}}}, Request("a", "t"))
    with pytest.raises(NotImplementedError):
        statement_applies({"Effect": "Allow", "NotAction": "s3:*", "Resource": "*"}, Request("a", "t"))


# --- the synthesized roles -----------------------------------------------------------------------------


def _role_statements(synthesized: Synthesized, role: Any) -> list[dict[str, Any]]:
    ref = f"<{synthesized.logical_id(role)}>"
    found = [
        {"Effect": s.effect, "Action": list(s.actions), "Resource": list(s.resources), "Condition": s.condition}
        for s in statements(synthesized)
        if ref in s.roles
    ]
    assert found, ref
    return found


@pytest.fixture(scope="module")
def arns(synthesized: Synthesized) -> dict[str, str]:
    storage = synthesized.stack.storage
    return {
        "bucket": f"<{synthesized.logical_id(storage.bucket)}.Arn>",
        "table": f"<{synthesized.logical_id(storage.table)}.Arn>",
        "key": f"<{synthesized.logical_id(storage.bucket_key)}.Arn>",
        "vend": f"<{synthesized.function_ids()['vend']}.Arn>",
        "job_role": f"<{synthesized.logical_id(synthesized.stack.job_credentials.job_role)}.Arn>",
        # the agents' log group: as the job role names it (no `:*`), and as CloudFormation's Arn has it
        "logs": render(synthesized.stack.resolve(synthesized.stack.worker.log_group_arn)),
        "logs_arn": f"<{synthesized.logical_id(synthesized.stack.worker.log_group)}.Arn>",
    }


@pytest.fixture(scope="module")
def job_role(synthesized: Synthesized) -> list[dict[str, Any]]:
    return _role_statements(synthesized, synthesized.stack.job_credentials.job_role)


@pytest.fixture(scope="module")
def instance_role(synthesized: Synthesized) -> list[dict[str, Any]]:
    return _role_statements(synthesized, synthesized.stack.worker.role)


def _session(job_id: str, arns: dict[str, str], attempt: int | None = None) -> list[dict[str, Any]]:
    """The session policy vend writes for `job_id` (`attempt`), with the template's (rendered) ARNs."""
    resources = JobResources(
        bucket_arn=arns["bucket"],
        table_arn=arns["table"],
        bucket_key_arn=arns["key"],
        region="<AWS::Region>",
        agent_log_group_arn=arns["logs"],
    )
    statements: list[dict[str, Any]] = session_policy(job_id, resources, attempt)["Statement"]
    return statements


def _requests(job_id: str, arns: dict[str, str]) -> dict[str, Request]:
    """What an agent of `job_id` does (every call its code makes), as IAM sees each one."""
    bucket, table = arns["bucket"], arns["table"]
    key = f"{bucket}/jobs/{job_id}/checkpoints/2-3/model.pt"
    return {
        "get checkpoint": Request("s3:GetObject", key),
        "put checkpoint": Request("s3:PutObject", key),
        "abort upload": Request("s3:AbortMultipartUpload", key),
        "list prefix": Request("s3:ListBucket", bucket, {"s3:prefix": f"jobs/{job_id}/checkpoints/"}),
        "get job": Request("dynamodb:GetItem", table, {"dynamodb:LeadingKeys": [f"JOB#{job_id}"]}),
        "put pointer": Request(
            "dynamodb:PutItem", table, {"dynamodb:LeadingKeys": [f"JOB#{job_id}"], "dynamodb:Attributes": POINTER}
        ),
        "decrypt": Request("kms:Decrypt", arns["key"], {"kms:ViaService": "s3.<AWS::Region>.amazonaws.com"}),
        "ship log lines": Request("logs:PutLogEvents", f"{arns['logs']}:log-stream:{job_id}/00002"),
    }


def _as_job(job_id: str) -> dict[str, str]:
    return {f"aws:PrincipalTag/{SESSION_TAG_JOB_ID}": job_id}


def _with(request: Request, context: dict[str, str]) -> Request:
    return Request(request.action, request.resource, {**request.context, **context})


def test_job_credentials_reach_everything_their_agent_does(
    job_role: list[dict[str, Any]], arns: dict[str, str]
) -> None:
    session = _session(JOB_A, arns)
    for what, request in _requests(JOB_A, arns).items():
        assert allowed(_with(request, _as_job(JOB_A)), job_role, session), what
    token = Request("states:SendTaskSuccess", "*", _as_job(JOB_A))
    assert allowed(token, job_role, session)


def test_job_a_credentials_reach_nothing_of_job_b(job_role: list[dict[str, Any]], arns: dict[str, str]) -> None:
    # Given job A's session (its role's policy with A's tag, and vend's session policy for A)
    session = _session(JOB_A, arns)
    for what, request in _requests(JOB_B, arns).items():
        if what == "decrypt":
            continue  # the bucket key is one for all jobs: S3 decides which objects, above
        as_a = _with(request, _as_job(JOB_A))
        # Then every one of B's requests is refused by each policy on its own, and so by the session
        assert decision(job_role, as_a) != "Allow", f"role policy: {what}"
        assert decision(session, as_a) != "Allow", f"session policy: {what}"
        assert not allowed(as_a, job_role, session), what


def test_job_credentials_reach_neither_other_items_nor_the_indexes(
    job_role: list[dict[str, Any]], arns: dict[str, str]
) -> None:
    session = _session(JOB_A, arns)
    table, bucket = arns["table"], arns["bucket"]
    a = _as_job(JOB_A)
    refused = {
        # the INSTANCE#, CANCEL#, BLOCK# and POOLSTATS# items, and two partitions at once
        "instance ref": Request("dynamodb:GetItem", table, {**a, "dynamodb:LeadingKeys": ["INSTANCE#i-0abc12345678"]}),
        "a block": Request(
            "dynamodb:PutItem", table, {**a, "dynamodb:LeadingKeys": ["BLOCK#g5.xlarge:us-east-1a:spot"]}
        ),
        "A and B": Request("dynamodb:GetItem", table, {**a, "dynamodb:LeadingKeys": [f"JOB#{JOB_A}", f"JOB#{JOB_B}"]}),
        # an item in its own partition that would show in the QUEUED/ACTIVE/BLOCKED index partitions
        "index entry": Request(
            "dynamodb:PutItem",
            table,
            {**a, "dynamodb:LeadingKeys": [f"JOB#{JOB_A}"], "dynamodb:Attributes": [*POINTER, "gsi1pk", "gsi1sk"]},
        ),
        "query": Request("dynamodb:Query", table, {**a, "dynamodb:LeadingKeys": [f"JOB#{JOB_A}"]}),
        "scan": Request("dynamodb:Scan", table, a),
        "the index": Request("dynamodb:Query", f"{table}/index/gsi1", a),
        "delete": Request("dynamodb:DeleteItem", table, {**a, "dynamodb:LeadingKeys": [f"JOB#{JOB_A}"]}),
        # S3: listing every job, a job whose id starts with A's, the agent wheel, deleting
        "list jobs/": Request("s3:ListBucket", bucket, {**a, "s3:prefix": "jobs/"}),
        "list all": Request("s3:ListBucket", bucket, a),
        "longer id": Request("s3:GetObject", f"{bucket}/jobs/{JOB_A}x/checkpoints/1-1/m", a),
        "delete object": Request("s3:DeleteObject", f"{bucket}/jobs/{JOB_A}/checkpoints/1-1/m", a),
        "agent wheel": Request("s3:PutObject", f"{bucket}/agent/spotrelay-9.whl", a),
        # KMS directly (not through S3)
        "kms directly": Request("kms:Decrypt", arns["key"], a),
        # Logs: a stream of a job whose id starts with A's, a stream outside the job's names, creating
        # streams (vend makes them), reading them
        "longer id stream": Request("logs:PutLogEvents", f"{arns['logs']}:log-stream:{JOB_A}x/00001", a),
        "another stream": Request("logs:PutLogEvents", f"{arns['logs']}:log-stream:anything", a),
        "create stream": Request("logs:CreateLogStream", f"{arns['logs']}:log-stream:{JOB_A}/00009", a),
        "create in the group": Request("logs:CreateLogStream", arns["logs_arn"], a),
        "read its stream": Request("logs:GetLogEvents", f"{arns['logs']}:log-stream:{JOB_A}/00001", a),
    }
    for what, request in refused.items():
        assert not allowed(request, job_role, session), what


def test_the_job_role_without_a_job_tag_reaches_no_job(job_role: list[dict[str, Any]], arns: dict[str, str]) -> None:
    for what, request in _requests(JOB_A, arns).items():
        if what != "decrypt":  # the one bucket key of all jobs, through S3 only
            assert decision(job_role, request) != "Allow", what


def test_the_instance_role_alone_reaches_no_job_no_item_no_token(
    instance_role: list[dict[str, Any]], arns: dict[str, str]
) -> None:
    # Given the instance role's own statements (its managed policy, AmazonSSMManagedInstanceCore, holds
    # only ssm/ssmmessages/ec2messages actions)
    bucket, table = arns["bucket"], arns["table"]
    for job in (JOB_A, JOB_B):
        for what, request in _requests(job, arns).items():
            assert decision(instance_role, request) != "Allow", f"{job}: {what}"
    for action in ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query", "dynamodb:Scan"):
        assert decision(instance_role, Request(action, table)) != "Allow", action
    for action in ("states:SendTaskSuccess", "states:SendTaskFailure", "states:SendTaskHeartbeat"):
        assert decision(instance_role, Request(action, "*")) != "Allow", action
    assert decision(instance_role, Request("s3:GetObject", f"{bucket}/jobs/{JOB_A}/x")) != "Allow"
    assert decision(instance_role, Request("s3:ListBucket", bucket, {"s3:prefix": "jobs/"})) != "Allow"
    assert decision(instance_role, Request("sts:AssumeRole", arns["job_role"])) != "Allow"
    # It writes no log stream, its own job's included: the agent ships its lines with the job's credentials
    for action in ("logs:PutLogEvents", "logs:CreateLogStream"):
        for resource in (arns["logs_arn"], f"{arns['logs']}:log-stream:{JOB_A}/00001"):
            assert decision(instance_role, Request(action, resource)) != "Allow", (action, resource)
    # What it may do: read the agent wheel, and invoke vend (the unqualified function only)
    assert decision(instance_role, Request("s3:GetObject", f"{bucket}/agent/spotrelay-1.0-py3-none-any.whl")) == "Allow"
    assert decision(instance_role, Request("lambda:InvokeFunction", arns["vend"])) == "Allow"
    other = f"<{'X' * 8}.Arn>"
    assert decision(instance_role, Request("lambda:InvokeFunction", other)) != "Allow"
    assert decision(instance_role, Request("lambda:InvokeFunction", f"{arns['vend']}:1")) != "Allow"


def test_only_vend_may_start_job_sessions_and_only_with_a_job_tag(
    synthesized: Synthesized, arns: dict[str, str]
) -> None:
    job_role = synthesized.stack.job_credentials.job_role
    trust = render(synthesized.properties(job_role)["AssumeRolePolicyDocument"])
    vend_role = f"<{synthesized.logical_id(synthesized.stack.functions.roles['vend'])}.Arn>"
    assert trust["Statement"] == [
        {
            "Action": ["sts:AssumeRole", "sts:TagSession"],
            "Condition": {"Null": {f"aws:RequestTag/{SESSION_TAG_JOB_ID}": "false"}},
            "Effect": "Allow",
            "Principal": {"AWS": vend_role},
        }
    ]
    # And vend may assume that role only, read items only, and reach no job data itself
    vend = _role_statements(synthesized, synthesized.stack.functions.roles["vend"])
    assert decision(vend, Request("sts:AssumeRole", arns["job_role"])) == "Allow"
    assert decision(vend, Request("sts:AssumeRole", "<OtherRole.Arn>")) != "Allow"
    assert decision(vend, Request("dynamodb:GetItem", arns["table"])) == "Allow"
    # It makes the attempts' log streams in the agents' group (and writes to none)
    assert decision(vend, Request("logs:CreateLogStream", arns["logs_arn"])) == "Allow"
    assert decision(vend, Request("logs:PutLogEvents", f"{arns['logs']}:log-stream:{JOB_A}/00001")) != "Allow"
    for action in ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query"):
        assert decision(vend, Request(action, arns["table"])) != "Allow", action
    assert decision(vend, Request("s3:GetObject", f"{arns['bucket']}/jobs/{JOB_A}/x")) != "Allow"


def test_the_session_policy_fits_sts_limits_for_the_longest_job_id_and_stack_name() -> None:
    longest = f"{'n' * 60}-0123456789ab"
    # The longest stack name the config takes (stacks.config: 64 characters), in every name CloudFormation
    # derives from it: the table's, the bucket's (at most 63 characters), the agents' log group's
    stack = "S" + "s" * 63
    assert SpotRelayConfig(stack_name=stack).stack_name == stack
    with pytest.raises(ValidationError, match="stack_name"):
        SpotRelayConfig(stack_name=stack + "s")
    resources = JobResources(
        bucket_arn=f"arn:aws-us-gov:s3:::{(stack.lower() + '-storagecheckpointbucket217d3ce2-abcdefghijkl')[:63]}",
        table_arn=f"arn:aws-us-gov:dynamodb:us-gov-west-1:123456789012:table/{stack}-StorageTableB43FDCE7-ABCDEFGHIJKLM",
        bucket_key_arn="arn:aws-us-gov:kms:us-gov-west-1:123456789012:key/0e7d3a4c-1b2f-4c5d-8e9f-0a1b2c3d4e5f",
        region="us-gov-west-1",
        agent_log_group_arn=f"arn:aws-us-gov:logs:us-gov-west-1:123456789012:log-group:{agent_log_group_name(stack)}",
    )
    # STS: a session policy's plaintext is at most 2,048 characters
    assert len(json.dumps(session_policy(longest, resources, 99999), separators=(",", ":"))) <= 2048


def test_the_session_policy_writes_only_the_attempts_own_log_stream(arns: dict[str, str]) -> None:
    # Given job A's attempt 2 session (its role's policy with A's tag, and vend's session policy for attempt 2)
    session = _session(JOB_A, arns, 2)
    stream = f"{arns['logs']}:log-stream:{JOB_A}"
    # Then it writes attempt 2's stream, and not attempt 1's (no forged lines in an earlier attempt's log)
    assert decision(session, _with(Request("logs:PutLogEvents", f"{stream}/00002"), _as_job(JOB_A))) == "Allow"
    assert decision(session, _with(Request("logs:PutLogEvents", f"{stream}/00001"), _as_job(JOB_A))) != "Allow"


def test_an_ended_attempts_session_ships_its_own_lines_and_reaches_nothing_else(
    job_role: list[dict[str, Any]], arns: dict[str, str]
) -> None:
    # Given the session vend grants an instance whose attempt 2 of job A has just ended
    resources = JobResources(
        bucket_arn=arns["bucket"],
        table_arn=arns["table"],
        bucket_key_arn=arns["key"],
        region="<AWS::Region>",
        agent_log_group_arn=arns["logs"],
    )
    session = log_flush_policy(JOB_A, 2, resources)["Statement"]
    as_a = _as_job(JOB_A)
    # Then it ships attempt 2's last lines, with the role's policy and the session's both allowing it
    own_lines = _requests(JOB_A, arns).pop("ship log lines")
    assert allowed(_with(own_lines, as_a), job_role, session)
    # And nothing else of the job: no checkpoint, record, pointer, key or task token, nor an earlier stream
    for what, request in _requests(JOB_A, arns).items():
        if what != "ship log lines":
            assert not allowed(_with(request, as_a), job_role, session), what
    assert not allowed(Request("states:SendTaskSuccess", "*", as_a), job_role, session)
    earlier = Request("logs:PutLogEvents", f"{arns['logs']}:log-stream:{JOB_A}/00001", as_a)
    assert not allowed(earlier, job_role, session)


def test_launch_template_requires_imdsv2_with_hop_limit_one(synthesized: Synthesized) -> None:
    options = synthesized.properties(synthesized.stack.worker.launch_template)["LaunchTemplateData"]["MetadataOptions"]
    assert options["HttpTokens"] == "required"
    assert options["HttpPutResponseHopLimit"] == 1


def test_user_data_creates_the_job_user_and_keeps_it_from_imds(synthesized: Synthesized) -> None:
    data = synthesized.properties(synthesized.stack.worker.launch_template)["LaunchTemplateData"]
    script = render(data["UserData"]["Fn::Base64"])
    assert f"useradd --system --create-home --shell /sbin/nologin {JOB_USER}" in script
    rule = f"OUTPUT -d {IMDS_ADDRESS}/32 -m owner --uid-owner {JOB_USER} -j REJECT"
    # put back every time the agent starts (a reboot runs no user data), before the agent runs
    assert f"ExecStartPre=/bin/sh -c 'iptables -C {rule} 2>/dev/null || iptables -I {rule}'" in script
    assert "StateDirectoryMode=0700" in script
    assert f"spotrelay agent --job-user {JOB_USER}" in script
    assert script.index("useradd") < script.index("systemctl enable --now")
