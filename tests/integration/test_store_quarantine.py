"""A job record that does not read back, on moto: it never stops the readers of the indexes, and the
dispatcher quarantines it (marked, moved out of QUEUED/ACTIVE) so that every job beside it is still
admitted, run after run."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
from fakes import FakeClock
from pydantic import ValidationError

from spotrelay.aws.store import QUARANTINED, DynamoJobStore, queued_sort_key
from spotrelay.control.dispatcher import job_id_for
from spotrelay.models import Job, JobState, parse_job_spec

from .aws_resources import TABLE
from .function_harness import Deployment, recorded_event, resnet50_spec

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)

UNREADABLE = [
    pytest.param(lambda record: "{not json", "does not read as a Job (Invalid JSON: ", id="garbage"),
    pytest.param(
        lambda record: record.replace('"state":"QUEUED"', '"state":"EXPLODED"').replace(
            '"state":"RUNNING"', '"state":"EXPLODED"'
        ),
        "does not read as a Job (state: Input should be",
        id="unknown-state",
    ),
]


def job(job_id: str, state: JobState = JobState.QUEUED, minutes: int = 0) -> Job:
    spec = parse_job_spec({"name": "train", "run": {"command": "python train.py"}, "resources": {"gpus": 1}})
    at = T0 + timedelta(minutes=minutes)
    return Job(job_id=job_id, spec=spec, state=state, submitted_at=at, updated_at=at)


def spoil(dynamodb: DynamoDBClient, job_id: str, change: Callable[[str], str]) -> None:
    """Rewrite the job's stored JSON in place, as a bug or an older version might have written it."""
    key = {"pk": {"S": f"JOB#{job_id}"}, "sk": {"S": "JOB"}}
    record = dynamodb.get_item(TableName=TABLE, Key=key)["Item"]["record"]["S"]
    spoilt = change(record)
    assert spoilt != record
    dynamodb.update_item(
        TableName=TABLE,
        Key=key,
        UpdateExpression="SET #r = :r",
        ExpressionAttributeNames={"#r": "record"},
        ExpressionAttributeValues={":r": {"S": spoilt}},
    )


def raw(dynamodb: DynamoDBClient, job_id: str) -> dict[str, object]:
    key = {"pk": {"S": f"JOB#{job_id}"}, "sk": {"S": "JOB"}}
    return dict(dynamodb.get_item(TableName=TABLE, Key=key, ConsistentRead=True)["Item"])


@pytest.fixture
def quarantining(dynamodb: DynamoDBClient, table: str, clock: FakeClock) -> DynamoJobStore:
    """The store as the dispatcher function builds it."""
    return DynamoJobStore(table, dynamodb, clock=clock, quarantine=True)


@pytest.mark.parametrize(("change", "says"), UNREADABLE)
def test_an_unreadable_queued_job_is_quarantined_and_the_jobs_beside_it_are_read(
    quarantining: DynamoJobStore, dynamodb: DynamoDBClient, change: Callable[[str], str], says: str
) -> None:
    # Given three queued jobs, the middle one's record spoilt
    for n, job_id in enumerate(["first", "spoilt", "last"]):
        assert quarantining.create_job(job(job_id, minutes=n))
    spoil(dynamodb, "spoilt", change)

    # When the queued jobs are read
    queued = quarantining.queued_jobs(10)

    # Then the other two are read, and the spoilt one is reported, saying what is wrong with it
    assert [j.job_id for j in queued] == ["first", "last"]
    [unreadable] = quarantining.take_unreadable()
    assert (unreadable.job_id, unreadable.partition, unreadable.quarantined) == ("spoilt", "QUEUED", True)
    assert unreadable.error.startswith(says)

    # And it is marked in the table, out of the QUEUED partition, with the index keys it had
    item = raw(dynamodb, "spoilt")
    assert item["quarantined"] == {"S": unreadable.error}
    assert item["quarantined_at"] == {"S": "2026-11-30T10:00:00+00:00"}
    assert (item["gsi1pk"], item["gsi1sk"]) == ({"S": QUARANTINED}, {"S": "JOB#spoilt"})
    expected_index = {"gsi1pk": {"S": "QUEUED"}, "gsi1sk": {"S": queued_sort_key(job("spoilt", minutes=1))}}
    assert item["quarantined_index"] == {"M": expected_index}

    # And the next read does not meet it again, while asking for it by id still says what is wrong
    assert [j.job_id for j in quarantining.queued_jobs(10)] == ["first", "last"]
    assert quarantining.take_unreadable() == []
    with pytest.raises(ValidationError):
        quarantining.get_job("spoilt")


@pytest.mark.parametrize(("change", "says"), UNREADABLE)
def test_an_unreadable_active_job_is_quarantined_and_the_jobs_beside_it_are_read(
    quarantining: DynamoJobStore, dynamodb: DynamoDBClient, change: Callable[[str], str], says: str
) -> None:
    # Given two running jobs, one record spoilt
    assert quarantining.create_job(job("running", JobState.RUNNING))
    assert quarantining.create_job(job("spoilt", JobState.RUNNING))
    spoil(dynamodb, "spoilt", change)

    # When the active jobs are read, twice
    first, second = quarantining.active_jobs(), quarantining.active_jobs()

    # Then the other one is read each time, and the spoilt one is quarantined once, out of ACTIVE
    assert [j.job_id for j in first] == [j.job_id for j in second] == ["running"]
    [unreadable] = quarantining.take_unreadable()
    assert (unreadable.job_id, unreadable.partition, unreadable.quarantined) == ("spoilt", "ACTIVE", True)
    assert unreadable.error.startswith(says)
    item = raw(dynamodb, "spoilt")
    assert item["gsi1pk"] == {"S": QUARANTINED}
    assert item["quarantined_index"] == {"M": {"gsi1pk": {"S": "ACTIVE"}, "gsi1sk": {"S": "spoilt"}}}


def test_a_reader_that_does_not_quarantine_skips_the_record_and_leaves_it_as_it_is(
    store: DynamoJobStore, dynamodb: DynamoDBClient
) -> None:
    # Given a store that does not quarantine (the CLI's, the other functions'), and a spoilt queued job
    assert store.create_job(job("fine"))
    assert store.create_job(job("spoilt", minutes=1))
    spoil(dynamodb, "spoilt", lambda record: "{not json")
    before = raw(dynamodb, "spoilt")

    # When the queued jobs and all jobs are read
    queued, every = store.queued_jobs(10), store.all_jobs()

    # Then the others are read, the spoilt one is reported each time, and the table is unchanged
    assert [j.job_id for j in queued] == [j.job_id for j in every] == ["fine"]
    unreadable = store.take_unreadable()
    assert [(u.job_id, u.partition, u.quarantined) for u in unreadable] == [
        ("spoilt", "QUEUED", False),
        ("spoilt", "scan", False),
    ]
    assert raw(dynamodb, "spoilt") == before


def test_a_quarantined_job_written_again_is_back_in_its_index(
    quarantining: DynamoJobStore, dynamodb: DynamoDBClient
) -> None:
    # Given a queued job quarantined for a spoilt record
    assert quarantining.create_job(job("spoilt"))
    spoil(dynamodb, "spoilt", lambda record: "{not json")
    assert quarantining.queued_jobs(10) == []

    # When a writer that can read it (a fixed version) writes it again at its version
    quarantining.put_job(job("spoilt"), expected_version=1)

    # Then it is queued again, and no longer marked
    assert [j.job_id for j in quarantining.queued_jobs(10)] == ["spoilt"]
    assert "quarantined" not in raw(dynamodb, "spoilt")
    assert [u.job_id for u in quarantining.take_unreadable()] == ["spoilt"]  # the first read, only


def test_the_dispatcher_admits_a_new_job_beside_unreadable_records_run_after_run(deployment: Deployment) -> None:
    # Given a queued and a running job whose records do not read back, and a valid job on the queue
    deployment.create_job("spoilt-queued")
    deployment.create_job("spoilt-running", state=JobState.RUNNING)
    spoil(deployment.dynamodb, "spoilt-queued", lambda record: "{not json")
    spoil(deployment.dynamodb, "spoilt-running", lambda record: record.replace('"gpus":1', '"gpus":"many"'))
    message_id = deployment.sqs.send_message(
        QueueUrl=deployment.queues.queue_url, MessageBody=json.dumps(resnet50_spec())
    )["MessageId"]
    valid_id = job_id_for("resnet50", message_id)

    # When the dispatcher runs
    report = deployment.invoke("dispatcher", recorded_event("alarm-state-change"))

    # Then the valid job is admitted, and the unreadable records are reported and quarantined
    assert (report["accepted"], report["admitted"]) == ([valid_id], [valid_id])
    assert deployment.job(valid_id).state is JobState.PLACING
    assert deployment.executions() == [valid_id]
    assert report["unreadable_jobs"] == ["spoilt-queued", "spoilt-running"]
    for job_id in ("spoilt-queued", "spoilt-running"):
        item = deployment.item(f"JOB#{job_id}", "JOB")
        assert item is not None
        assert item["gsi1pk"] == {"S": QUARANTINED}

    # And the next run meets them no more
    again = deployment.invoke("dispatcher", recorded_event("alarm-state-change"))
    assert again["unreadable_jobs"] == []
