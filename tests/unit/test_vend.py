"""The vend decision (spotrelay.control.vend): whose session, which attempt, what its credentials reach."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from spotrelay.control.ports import InstanceRef
from spotrelay.control.vend import (
    LOG_FLUSH_GRACE_SECONDS,
    LOG_FLUSH_SESSION_SECONDS,
    SESSION_SECONDS,
    SESSION_TAG_JOB_ID,
    JobResources,
    VendNotYet,
    VendRefused,
    grant_for,
    instance_of_caller,
    session_name,
)
from spotrelay.models import Attempt, AttemptOutcome, Pool

WORKER_ROLE = "arn:aws:iam::123456789012:role/SpotRelay-WorkerInstanceRole03ED0B27-AbC"
INSTANCE = "i-0123456789abcdef0"
JOB = "llama-lora-0123456789ab"
RESOURCES = JobResources(
    bucket_arn="arn:aws:s3:::bucket",
    table_arn="arn:aws:dynamodb:r:1:table/t",
    bucket_key_arn="arn:k",
    region="r",
    agent_log_group_arn="arn:aws:logs:r:1:log-group:agents",
)


def _caller(role: str = "SpotRelay-WorkerInstanceRole03ED0B27-AbC", session: str = INSTANCE) -> str:
    return f"arn:aws:sts::123456789012:assumed-role/{role}/{session}"


def _attempt(**fields: object) -> Attempt:
    values: dict[str, object] = {
        "job_id": JOB,
        "attempt": 2,
        "pool": Pool(instance_type="g6.xlarge", availability_zone="us-east-1a"),
        "hourly_price": 0.3,
        "instance_id": INSTANCE,
        "started_at": datetime(2025, 1, 1, tzinfo=UTC),
    }
    return Attempt.model_validate(values | fields)


REF = InstanceRef(instance_id=INSTANCE, job_id=JOB, attempt=2)
NOW = datetime(2025, 1, 1, 3, tzinfo=UTC)


def test_the_instance_is_the_session_name_of_the_worker_role() -> None:
    assert instance_of_caller(_caller(), WORKER_ROLE) == INSTANCE
    # a role with a path: the assumed-role ARN has no path
    assert instance_of_caller(_caller(), WORKER_ROLE.replace("role/", "role/spotrelay/")) == INSTANCE


@pytest.mark.parametrize(
    "caller",
    [
        _caller(role="SomeOtherRole"),
        _caller(session="my-laptop"),
        _caller().replace("123456789012", "210987654321"),
        _caller().replace("arn:aws:", "arn:aws-cn:"),
        "arn:aws:iam::123456789012:user/i-0123456789abcdef0",
        f"{_caller()}/extra",
        "",
    ],
)
def test_any_other_caller_is_refused(caller: str) -> None:
    with pytest.raises(VendRefused):
        instance_of_caller(caller, WORKER_ROLE)


def test_a_live_attempt_on_that_instance_gets_credentials_for_its_job_only() -> None:
    grant = grant_for(INSTANCE, REF, _attempt(), RESOURCES, NOW)
    assert (grant.job_id, grant.attempt, grant.instance_id) == (JOB, 2, INSTANCE)
    assert grant.session_name == f"{JOB}-2"
    assert grant.session_tags == {SESSION_TAG_JOB_ID: JOB}
    assert grant.duration_seconds == SESSION_SECONDS == 3600
    text = json.dumps(grant.session_policy)
    assert f"jobs/{JOB}/" in text
    assert f"JOB#{JOB}" in text
    assert "jobs/*" not in text
    assert "${" not in text


def test_a_standby_attempt_is_live_too() -> None:
    grant_for(INSTANCE, REF, _attempt(handover_from=1), RESOURCES, NOW)


def test_unrecorded_instances_and_attempts_are_not_yet() -> None:
    with pytest.raises(VendNotYet):
        grant_for(INSTANCE, None, None, RESOURCES, NOW)
    with pytest.raises(VendNotYet):
        grant_for(INSTANCE, REF, None, RESOURCES, NOW)


@pytest.mark.parametrize(
    ("ref", "attempt"),
    [
        (REF, _attempt(outcome=AttemptOutcome.INTERRUPTED)),  # ended, and when is not recorded
        # ended longer ago than the last flush may take
        (
            REF,
            _attempt(outcome=AttemptOutcome.SUCCEEDED, ended_at=NOW - timedelta(seconds=LOG_FLUSH_GRACE_SECONDS + 1)),
        ),
        # an end recorded far ahead of vend's clock (a writer with a wrong clock): not "just now"
        (REF, _attempt(outcome=AttemptOutcome.SUCCEEDED, ended_at=NOW + timedelta(days=365))),
        (REF, _attempt(outcome=AttemptOutcome.SUCCEEDED, ended_at=NOW + timedelta(seconds=61))),
        # a foreign instance's attempt that ended just now: not even its log stream
        (REF, _attempt(outcome=AttemptOutcome.SUCCEEDED, ended_at=NOW, instance_id="i-0fedcba9876543210")),
        (REF, _attempt(instance_id="i-0fedcba9876543210")),  # another instance's attempt
        (REF, _attempt(attempt=3)),  # not the recorded attempt
        (InstanceRef(instance_id=INSTANCE, job_id="jobs*", attempt=2), _attempt(job_id="jobs*")),  # a glob
        (InstanceRef(instance_id=INSTANCE, job_id="${aws:userid}", attempt=2), _attempt(job_id="${aws:userid}")),
    ],
)
def test_ended_foreign_or_unsafe_attempts_are_refused(ref: InstanceRef, attempt: Attempt) -> None:
    with pytest.raises(VendRefused) as refused:
        grant_for(INSTANCE, ref, attempt, RESOURCES, NOW)
    assert not isinstance(refused.value, VendNotYet)


def test_session_names_fit_sts_and_keep_the_unique_tail() -> None:
    long_job = f"{'n' * 60}-0123456789ab"
    name = session_name(long_job, 12)
    assert len(name) == 64
    assert name.endswith("-0123456789ab-12")


@pytest.mark.parametrize("ended_seconds_ago", [0, 60, LOG_FLUSH_GRACE_SECONDS, -5, -60])
def test_an_attempt_that_just_ended_on_that_instance_may_still_ship_its_log_stream_only(
    ended_seconds_ago: int,
) -> None:
    # Given attempt 2, ended on this instance within the grace (its agent's last lines go out after its
    # report, and the refresh of credentials in their last 10 minutes used to be refused); -5: a skewed clock
    ended = _attempt(outcome=AttemptOutcome.SUCCEEDED, ended_at=NOW - timedelta(seconds=ended_seconds_ago))
    grant = grant_for(INSTANCE, REF, ended, RESOURCES, NOW)
    # Then a short session that writes attempt 2's log stream and nothing else
    assert grant.logs_only
    assert grant.duration_seconds == LOG_FLUSH_SESSION_SECONDS == 1800  # clear of botocore's 15-minute refresh
    assert grant.session_tags == {SESSION_TAG_JOB_ID: JOB}
    (statement,) = grant.session_policy["Statement"]
    assert statement == {
        "Effect": "Allow",
        "Action": "logs:PutLogEvents",
        "Resource": f"{RESOURCES.agent_log_group_arn}:log-stream:{JOB}/00002",
    }
    # While a live attempt's grant is the whole job's
    assert not grant_for(INSTANCE, REF, _attempt(), RESOURCES, NOW).logs_only
