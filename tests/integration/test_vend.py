"""Both ends of the token vending machine on moto (spotrelay.aws.vend): the agent signs
GetCallerIdentity with its instance's session, vend learns the caller from STS, reads the instance's
attempt and assumes JobRole; the agent's session then works on those credentials."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest

from spotrelay.aws.store import DynamoJobStore
from spotrelay.aws.vend import (
    AUDIENCE_HEADER,
    StsCallerIdentity,
    StsJobRole,
    checked_identity_headers,
    signed_identity,
    vended_session,
)
from spotrelay.control.ports import InstanceRef
from spotrelay.control.vend import SESSION_TAG_JOB_ID, JobResources, VendRefused, vend_step
from spotrelay.models import Attempt, Pool

REGION = "us-east-1"
INSTANCE = "i-0123456789abcdef0"
JOB = "train-0123456789ab"
FUNCTION = "SpotRelay-Vend"


def _role(name: str) -> str:
    arn: str = boto3.client("iam").create_role(RoleName=name, AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    return arn


def _instance_session(worker_role: str) -> boto3.session.Session:
    own = boto3.client("sts").assume_role(RoleArn=worker_role, RoleSessionName=INSTANCE)["Credentials"]
    return boto3.session.Session(
        aws_access_key_id=own["AccessKeyId"],
        aws_secret_access_key=own["SecretAccessKey"],
        aws_session_token=own["SessionToken"],
        region_name=REGION,
    )


def _headers(session: boto3.session.Session, audience: str = FUNCTION) -> dict[str, str]:
    credentials = session.get_credentials()
    assert credentials is not None
    return signed_identity(credentials.get_frozen_credentials(), REGION, audience)


@pytest.fixture
def recorded(store: DynamoJobStore) -> DynamoJobStore:
    store.put_attempt(
        Attempt(
            job_id=JOB,
            attempt=1,
            pool=Pool(instance_type="g6.xlarge", availability_zone="us-east-1a"),
            hourly_price=0.3,
            instance_id=INSTANCE,
            started_at=datetime(2025, 1, 1, tzinfo=UTC),
        )
    )
    store.put_instance_ref(InstanceRef(instance_id=INSTANCE, job_id=JOB, attempt=1))
    return store


def test_the_signed_identity_names_the_instance_and_its_job_gets_credentials(
    recorded: DynamoJobStore, table: str, bucket: str
) -> None:
    # Given the worker role's session named after the instance (what EC2's instance profile gives)
    worker_role, job_role = _role("WorkerRole"), _role("JobRole")
    headers = _headers(_instance_session(worker_role))
    # When vend checks the signed headers and carries out its decision
    checked = checked_identity_headers(headers, FUNCTION)
    vended = vend_step(
        checked,
        identity=StsCallerIdentity(REGION),
        records=recorded,
        sessions=StsJobRole(job_role, boto3.client("sts")),
        worker_role_arn=worker_role,
        resources=JobResources(
            bucket_arn=f"arn:aws:s3:::{bucket}",
            table_arn="t",
            bucket_key_arn="k",
            region=REGION,
            agent_log_group_arn="g",
        ),
        now=datetime(2025, 1, 1, 1, tzinfo=UTC),
    )
    # Then the job's credentials, whose session is the job attempt's
    assert vended.grant.job_id == JOB
    assert vended.grant.session_tags == {SESSION_TAG_JOB_ID: JOB}
    assert "secret_key" not in repr(vended)
    session = vended_session(lambda: vended.credentials, REGION, vended.credentials)
    assert session.client("sts").get_caller_identity()["Arn"].endswith(f"assumed-role/JobRole/{JOB}-1")
    assert DynamoJobStore(table, session.client("dynamodb")).get_attempt(JOB, 1).instance_id == INSTANCE


def test_another_role_or_an_unknown_instance_gets_nothing(recorded: DynamoJobStore) -> None:
    worker_role, other = _role("WorkerRole"), _role("SomethingElse")
    identity = StsCallerIdentity(REGION)
    arguments: dict[str, Any] = {
        "identity": identity,
        "records": recorded,
        "sessions": StsJobRole(_role("JobRole"), boto3.client("sts")),
        "worker_role_arn": worker_role,
        "resources": JobResources(
            bucket_arn="b", table_arn="t", bucket_key_arn="k", region=REGION, agent_log_group_arn="g"
        ),
        "now": datetime(2025, 1, 1, 1, tzinfo=UTC),
    }
    with pytest.raises(VendRefused, match="not a session of the worker role"):
        vend_step(_headers(_instance_session(other)), **arguments)
    recorded.put_instance_ref(InstanceRef(instance_id=INSTANCE, job_id=JOB, attempt=7))
    with pytest.raises(VendRefused, match="not recorded"):
        vend_step(_headers(_instance_session(worker_role)), **arguments)


def test_only_a_request_signed_for_this_vend_function_is_accepted(aws: None) -> None:
    session = _instance_session(_role("WorkerRole"))
    good = _headers(session)
    assert set(checked_identity_headers(good, FUNCTION)) == {
        "authorization",
        "x-amz-date",
        "x-amz-security-token",
        "content-type",
        AUDIENCE_HEADER.lower(),
    }
    with pytest.raises(VendRefused, match="another Vend"):
        checked_identity_headers(_headers(session, audience="OtherStack-Vend"), FUNCTION)
    unsigned = {**good, AUDIENCE_HEADER: FUNCTION}
    unsigned["Authorization"] = good["Authorization"].replace(";x-spotrelay-vend", "")
    with pytest.raises(VendRefused, match="not signed for Vend"):
        checked_identity_headers(unsigned, FUNCTION)
    without_type = {name: value for name, value in good.items() if name != "Content-Type"}
    with pytest.raises(VendRefused, match="unexpected header"):
        checked_identity_headers({**without_type, "Host": "evil.example.com"}, FUNCTION)
    with pytest.raises(VendRefused):
        checked_identity_headers({**good, "X-Amz-Date": "x" * 10_000}, FUNCTION)
    with pytest.raises(VendRefused):
        checked_identity_headers(json.dumps(good), FUNCTION)
