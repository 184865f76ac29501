"""Records other than a job's index entry that do not read back, on moto, and the way a quarantined job
record comes back once fixed by hand.

A listing of many (blocked pools, pool statistics) skips the unreadable item and says so; a read of one
job's own records (its attempts, its checkpoint pointer, its instance ref, the job itself) raises one named
error, UnreadableRecordError, that says which record and what is wrong with it."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
from fakes import FakeClock
from pydantic import ValidationError

from spotrelay.aws.store import QUARANTINED, DynamoJobStore, QuarantinedJob, queued_sort_key
from spotrelay.control.ports import (
    CheckpointPointer,
    ConflictError,
    InstanceRef,
    NotFoundError,
    UnreadableRecordError,
)
from spotrelay.models import Attempt, Job, JobState, Pool, parse_job_spec
from spotrelay.policy import BlockedPool, PoolObservation

from .aws_resources import TABLE

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)  # FakeClock's start
G6A = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a")
G6B = Pool(instance_type="g6.xlarge", availability_zone="us-east-1b")


def job(job_id: str, state: JobState = JobState.QUEUED, minutes: int = 0) -> Job:
    spec = parse_job_spec({"name": "train", "run": {"command": "python train.py"}, "resources": {"gpus": 1}})
    at = T0 + timedelta(minutes=minutes)
    return Job(job_id=job_id, spec=spec, state=state, submitted_at=at, updated_at=at)


def attempt(number: int) -> Attempt:
    return Attempt(job_id="train-1", attempt=number, pool=G6A, hourly_price=0.35, started_at=T0)


def item(dynamodb: DynamoDBClient, pk: str, sk: str) -> dict[str, object]:
    return dict(dynamodb.get_item(TableName=TABLE, Key={"pk": {"S": pk}, "sk": {"S": sk}}, ConsistentRead=True)["Item"])


def rewrite(dynamodb: DynamoDBClient, pk: str, sk: str, attribute: str, value: dict[str, str]) -> None:
    """Set one attribute of a stored item, as a hand edit (or a bug, or another version) would."""
    dynamodb.update_item(
        TableName=TABLE,
        Key={"pk": {"S": pk}, "sk": {"S": sk}},
        UpdateExpression="SET #a = :v",
        ExpressionAttributeNames={"#a": attribute},
        ExpressionAttributeValues={":v": value},
    )


def spoil(dynamodb: DynamoDBClient, pk: str, sk: str, change: Callable[[str], str]) -> None:
    """Rewrite the item's stored JSON (`record`) with `change`."""
    record = item(dynamodb, pk, sk)["record"]
    assert isinstance(record, dict)
    spoilt = change(record["S"])
    assert spoilt != record["S"]
    rewrite(dynamodb, pk, sk, "record", {"S": spoilt})


# --- listings of many: the unreadable item is skipped ----------------------------------------------------


def test_an_unreadable_blocked_pool_is_skipped_and_the_pool_is_not_blocked(
    store: DynamoJobStore, dynamodb: DynamoDBClient
) -> None:
    # Given two blocked pools, one block's record written with a time that is no time
    for pool in (G6A, G6B):
        store.block_pool(BlockedPool(pool=pool, until=T0 + timedelta(hours=1), reason="interrupted"))
    spoil(dynamodb, "BLOCK#g6.xlarge:us-east-1a:spot", "BLOCK", lambda r: r.replace('"until":"', '"until":"soon'))

    # When placement reads the blocks
    blocked = store.blocked_pools(T0)

    # Then the other pool is blocked, the spoilt one is not, and the skipped item is reported
    assert [b.pool for b in blocked] == [G6B]
    [unreadable] = store.take_unreadable()
    assert (unreadable.job_id, unreadable.partition, unreadable.key, unreadable.quarantined) == (
        "",
        "BLOCKED",
        "BLOCK#g6.xlarge:us-east-1a:spot",
        False,
    )
    assert unreadable.error.startswith("does not read as a BlockedPool (until: Input should be a valid datetime")


def test_unreadable_pool_statistics_are_skipped_and_the_other_pools_keep_theirs(
    store: DynamoJobStore, dynamodb: DynamoDBClient
) -> None:
    # Given the statistics of two pools, one's hours written by hand as text
    store.record_pool_usage(G6A, 10.0, 1)
    store.record_pool_usage(G6B, 4.0, 2)
    rewrite(dynamodb, "POOLSTATS#g6.xlarge:us-east-1a", "STATS", "instance_hours", {"S": "ten"})

    # When placement reads them
    observed = store.pool_observations()

    # Then the other pool's are read, and the spoilt item is reported
    assert observed == {"g6.xlarge:us-east-1b": PoolObservation(interruptions=2, instance_hours=4.0)}
    assert [(u.partition, u.key) for u in store.take_unreadable()] == [("POOLSTATS", "POOLSTATS#g6.xlarge:us-east-1a")]


# --- one job's own records: one named error ---------------------------------------------------------------

SPOILT_ATTEMPTS = [
    pytest.param(
        lambda r: r.replace('"hourly_price":0.35', '"hourly_price":NaN'),
        "hourly_price: Input should be greater than or equal to 0",
        id="nan",
    ),
    pytest.param(lambda r: r[: len(r) // 2], "Invalid JSON: EOF while parsing", id="truncated"),
    pytest.param(lambda r: r.replace('"job_id":"train-1",', ""), "job_id: required", id="missing-field"),
]


@pytest.mark.parametrize(("change", "says"), SPOILT_ATTEMPTS)
def test_an_unreadable_attempt_is_one_named_error_saying_which_attempt_and_why(
    store: DynamoJobStore, dynamodb: DynamoDBClient, change: Callable[[str], str], says: str
) -> None:
    # Given a job's two attempts, the second one's record spoilt
    store.put_attempt(attempt(1))
    store.put_attempt(attempt(2))
    spoil(dynamodb, "JOB#train-1", "ATTEMPT#00002", change)

    # When its attempts are read, or that attempt alone
    with pytest.raises(UnreadableRecordError) as listed:
        store.attempts("train-1")
    with pytest.raises(UnreadableRecordError) as read:
        store.get_attempt_versioned("train-1", 2)

    # Then the error names the attempt and what is wrong, and is still a ValidationError to older handlers
    assert str(listed.value) == str(read.value)
    assert str(read.value).startswith(f"attempt 2 of job train-1 does not read back ({says}")
    assert read.value.record == "attempt 2 of job train-1"
    assert isinstance(read.value, ValidationError)
    # And the readable attempt still reads
    assert store.get_attempt("train-1", 1) == attempt(1)


def test_an_unreadable_checkpoint_pointer_is_a_named_error_until_the_next_checkpoint_moves_it(
    store: DynamoJobStore, dynamodb: DynamoDBClient
) -> None:
    # Given a job's checkpoint pointer, its record truncated
    first = CheckpointPointer(
        job_id="train-1", attempt=1, seq=3, manifest_key="m1", work_done_hours=1.5, committed_at=T0
    )
    assert store.advance_checkpoint(first)
    spoil(dynamodb, "JOB#train-1", "CHECKPOINT", lambda r: r[:20])

    # When it is read, it says so (never "no checkpoint", which would resume the job from nothing)
    with pytest.raises(UnreadableRecordError, match=r"^the checkpoint pointer of job train-1 does not read back \("):
        store.get_checkpoint("train-1")

    # And the job's next checkpoint moves it on, readable again
    second = first.model_copy(update={"attempt": 2, "seq": 0, "manifest_key": "m2"})
    assert store.advance_checkpoint(second)
    assert store.get_checkpoint("train-1") == second


def test_an_unreadable_instance_ref_and_job_are_named_errors(store: DynamoJobStore, dynamodb: DynamoDBClient) -> None:
    # Given an instance ref whose attempt number was written as text, and a job whose state is unknown
    store.put_instance_ref(InstanceRef(instance_id="i-0123", job_id="train-1", attempt=1))
    rewrite(dynamodb, "INSTANCE#i-0123", "INSTANCE", "attempt", {"S": "one"})
    assert store.create_job(job("train-1", JobState.RUNNING))
    spoil(dynamodb, "JOB#train-1", "JOB", lambda r: r.replace('"state":"RUNNING"', '"state":"EXPLODED"'))

    # When each is read, each error names the record and what is wrong
    with pytest.raises(UnreadableRecordError) as ref:
        store.get_instance_ref("i-0123")
    with pytest.raises(UnreadableRecordError) as read_job:
        store.get_job("train-1")
    assert str(ref.value) == "the instance ref of i-0123 does not read back (attempt: Input should be a valid integer)"
    assert str(read_job.value).startswith("job train-1 does not read back (state: Input should be 'QUEUED',")
    # And an id with no record is still NotFoundError (or None), not this
    assert store.get_instance_ref("i-4567") is None
    with pytest.raises(NotFoundError):
        store.get_job("other-1")


# --- a quarantined job record, fixed by hand and released ------------------------------------------------


@pytest.fixture
def quarantining(dynamodb: DynamoDBClient, table: str, clock: FakeClock) -> DynamoJobStore:
    """The store as the dispatcher function builds it."""
    return DynamoJobStore(table, dynamodb, clock=clock, quarantine=True)


def quarantine(store: DynamoJobStore, dynamodb: DynamoDBClient, job_id: str) -> str:
    """Spoil the job's record and let a dispatcher's read quarantine it; returns its good JSON."""
    good = item(dynamodb, f"JOB#{job_id}", "JOB")["record"]
    assert isinstance(good, dict)
    spoil(dynamodb, f"JOB#{job_id}", "JOB", lambda r: "{not json")
    store.queued_jobs(10)
    store.active_jobs()
    assert [u.job_id for u in store.take_unreadable() if u.quarantined] == [job_id]
    return str(good["S"])


def test_a_quarantined_job_is_released_only_once_it_reads_back_and_is_then_queued_again(
    quarantining: DynamoJobStore, dynamodb: DynamoDBClient
) -> None:
    # Given two queued jobs, the second quarantined for a spoilt record
    assert quarantining.create_job(job("first"))
    assert quarantining.create_job(job("spoilt", minutes=1))
    good = quarantine(quarantining, dynamodb, "spoilt")
    assert [j.job_id for j in quarantining.queued_jobs(10)] == ["first"]

    # Then the operator's list shows it, why, since when, where from, and that it does not read yet
    assert quarantining.quarantined_jobs() == [
        QuarantinedJob(
            job_id="spoilt",
            reason="does not read as a Job (Invalid JSON: key must be a string at line 1 column 2)",
            quarantined_at="2026-11-30T10:00:00+00:00",
            index="QUEUED",
            reads_back=False,
        )
    ]

    # When it is released before it is fixed, it stays quarantined, as it was, and the answer says why
    before = item(dynamodb, "JOB#spoilt", "JOB")
    refused = quarantining.release_quarantined("spoilt")
    assert (refused.outcome, refused.index) == ("unreadable", QUARANTINED)
    assert refused.why.startswith("job spoilt is still quarantined: its record does not read as a Job (Invalid JSON: ")
    assert item(dynamodb, "JOB#spoilt", "JOB") == before

    # When the operator fixes it by hand and releases it
    rewrite(dynamodb, "JOB#spoilt", "JOB", "record", {"S": good})
    assert [q.reads_back for q in quarantining.quarantined_jobs()] == [True]
    released = quarantining.release_quarantined("spoilt")

    # Then it is back in the QUEUED index in its place, unmarked, and the next read queues it after the first
    assert (released.outcome, released.index, released.why) == (
        "released",
        "QUEUED",
        "job spoilt released: back in the QUEUED index",
    )
    fixed = item(dynamodb, "JOB#spoilt", "JOB")
    assert (fixed["gsi1pk"], fixed["gsi1sk"]) == ({"S": "QUEUED"}, {"S": queued_sort_key(job("spoilt", minutes=1))})
    assert not {"quarantined", "quarantined_at", "quarantined_index"} & set(fixed)
    assert fixed["version"] == before["version"]  # the record itself is as the operator left it
    assert [j.job_id for j in quarantining.queued_jobs(10)] == ["first", "spoilt"]
    assert quarantining.quarantined_jobs() == []
    assert quarantining.take_unreadable() == []

    # And releasing it again says it is not quarantined, changing nothing
    again = quarantining.release_quarantined("spoilt")
    assert (again.outcome, again.why) == ("not-quarantined", "job spoilt is not quarantined: it is in the QUEUED index")
    with pytest.raises(NotFoundError):
        quarantining.release_quarantined("nobody")


@pytest.mark.parametrize(
    ("fixed_state", "index", "gsi1"),
    [
        pytest.param(JobState.RUNNING, "ACTIVE", {"gsi1pk": {"S": "ACTIVE"}, "gsi1sk": {"S": "spoilt"}}, id="live"),
        pytest.param(JobState.FAILED, None, {}, id="ended"),
    ],
)
def test_a_released_job_goes_where_its_fixed_state_belongs(
    quarantining: DynamoJobStore,
    dynamodb: DynamoDBClient,
    fixed_state: JobState,
    index: str | None,
    gsi1: dict[str, object],
) -> None:
    # Given a running job quarantined, which the operator fixes into `fixed_state`
    assert quarantining.create_job(job("spoilt", JobState.RUNNING))
    good = json.loads(quarantine(quarantining, dynamodb, "spoilt"))
    rewrite(dynamodb, "JOB#spoilt", "JOB", "record", {"S": json.dumps({**good, "state": fixed_state.value})})

    # When it is released
    released = quarantining.release_quarantined("spoilt")

    # Then it is in the index of that state (none for an ended job), and its state attribute agrees
    assert (released.outcome, released.index) == ("released", index)
    fixed = item(dynamodb, "JOB#spoilt", "JOB")
    assert {k: v for k, v in fixed.items() if k.startswith("gsi1")} == gsi1
    assert fixed["state"] == {"S": fixed_state.value}
    assert [j.job_id for j in quarantining.active_jobs()] == (["spoilt"] if index == "ACTIVE" else [])


def test_a_release_loses_to_a_write_made_after_its_read(quarantining: DynamoJobStore, dynamodb: DynamoDBClient) -> None:
    # Given a quarantined job, fixed, and a release whose read is followed by another hand edit
    assert quarantining.create_job(job("spoilt"))
    good = quarantine(quarantining, dynamodb, "spoilt")
    rewrite(dynamodb, "JOB#spoilt", "JOB", "record", {"S": good})
    read = quarantining._get

    def read_then_edited(pk: str, sk: str) -> object:
        found = read(pk, sk)
        rewrite(dynamodb, pk, sk, "record", {"S": "{again not json"})
        return found

    quarantining._get = read_then_edited  # type: ignore[method-assign,assignment]

    # When it is released, it is refused as a conflict, and the newer (unreadable) record stays quarantined
    with pytest.raises(ConflictError):
        quarantining.release_quarantined("spoilt")
    assert item(dynamodb, "JOB#spoilt", "JOB")["gsi1pk"] == {"S": QUARANTINED}
