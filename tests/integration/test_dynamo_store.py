"""DynamoJobStore on moto: conditional writes, the queued/active indexes, blocks, counters and the
checkpoint pointer behave as the JobStore port promises.

The tests that use `job_store` run against the DynamoDB adapter and against `tests/fakes.FakeJobStore`,
so the fake the unit tests rely on cannot drift from the adapter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
from fakes import FakeClock, FakeJobStore

from spotrelay.aws.store import DynamoJobStore
from spotrelay.control.ports import CheckpointPointer, ConflictError, InstanceRef, JobStore, NotFoundError
from spotrelay.models import Attempt, AttemptOutcome, Job, JobState, Market, Pool, parse_job_spec
from spotrelay.policy import BlockedPool

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
G6A = Pool(instance_type="g6.xlarge", availability_zone="us-east-1a")
G6B = Pool(instance_type="g6.xlarge", availability_zone="us-east-1b")


def job(job_id: str, priority: str = "normal", submitted_at: datetime = T0, state: JobState = JobState.QUEUED) -> Job:
    spec = parse_job_spec(
        {"name": "train", "run": {"command": "python train.py"}, "resources": {"gpus": 1}, "priority": priority}
    )
    return Job(job_id=job_id, spec=spec, state=state, submitted_at=submitted_at, updated_at=submitted_at)


def attempt(job_id: str, number: int, **changes: object) -> Attempt:
    base = Attempt(job_id=job_id, attempt=number, pool=G6A, hourly_price=0.3512, started_at=T0)
    return base.model_copy(update=changes)


def pointer(attempt: int, seq: int, job_id: str = "job-1") -> CheckpointPointer:
    return CheckpointPointer(
        job_id=job_id,
        attempt=attempt,
        seq=seq,
        manifest_key=f"jobs/{job_id}/checkpoints/{attempt}-{seq}/manifest.json",
        work_done_hours=attempt + seq / 10,
        committed_at=T0,
    )


def raw_item(dynamodb: DynamoDBClient, table: str, pk: str, sk: str) -> dict[str, object]:
    return dict(dynamodb.get_item(TableName=table, Key={"pk": {"S": pk}, "sk": {"S": sk}})["Item"])


@pytest.fixture(params=["dynamodb", "fake"])
def job_store(request: pytest.FixtureRequest) -> JobStore:
    if request.param == "fake":
        return FakeJobStore()
    store: DynamoJobStore = request.getfixturevalue("store")
    return store


# --- jobs -------------------------------------------------------------------------------------------


def test_creating_a_job_twice_keeps_the_first(job_store: JobStore) -> None:
    # Given a job created once
    assert job_store.create_job(job("job-1", priority="high")) is True

    # When a job with the same id is created again (a redelivered submission)
    again = job_store.create_job(job("job-1", priority="low"))

    # Then the second create is refused and the stored job is the first, at version 1
    stored, version = job_store.get_job("job-1")
    assert again is False
    assert stored.spec.priority == "high"
    assert version == 1


def test_a_write_from_a_stale_read_is_a_conflict(job_store: JobStore) -> None:
    # Given a job read by two handlers, and the first one's write
    job_store.create_job(job("job-1"))
    first, version = job_store.get_job("job-1")
    second = first.model_copy(update={"state": JobState.CANCELLED, "cancel_requested": True})
    new_version = job_store.put_job(first.model_copy(update={"state": JobState.PLACING}), version)

    # When the second writes with the version it read
    with pytest.raises(ConflictError):
        job_store.put_job(second, version)

    # Then the first write stands, one version up
    stored, stored_version = job_store.get_job("job-1")
    assert (stored.state, stored_version, new_version) == (JobState.PLACING, 2, 2)


def test_a_missing_job_is_not_found(job_store: JobStore) -> None:
    # Given an empty table / When a job is read / Then NotFoundError
    with pytest.raises(NotFoundError):
        job_store.get_job("nope")


def test_floats_of_a_job_round_trip_exactly(job_store: JobStore) -> None:
    # Given a job whose numbers are not exact in decimal
    original = job("job-1").model_copy(update={"work_done_hours": 0.1 + 0.2, "cost_usd": 1 / 3})
    job_store.create_job(original)

    # When it is read back
    stored, _ = job_store.get_job("job-1")

    # Then every field is equal, bit for bit
    assert stored == original


def test_queued_jobs_come_by_priority_then_age(job_store: JobStore) -> None:
    # Given queued jobs of every priority, submitted at different times, and one already admitted
    for job_id, priority, minutes in [
        ("low-old", "low", 0),
        ("normal-new", "normal", 30),
        ("high-new", "high", 40),
        ("normal-old", "normal", 10),
        ("high-old", "high", 20),
    ]:
        job_store.create_job(job(job_id, priority, T0 + timedelta(minutes=minutes)))
    job_store.create_job(job("running", "high", T0, state=JobState.RUNNING))

    # When the queue is read, whole and limited
    everything = [j.job_id for j in job_store.queued_jobs(limit=100)]
    first_two = [j.job_id for j in job_store.queued_jobs(limit=2)]

    # Then high comes before normal before low, and older first within a priority
    assert everything == ["high-old", "high-new", "normal-old", "normal-new", "low-old"]
    assert first_two == ["high-old", "high-new"]


def test_a_job_moves_from_the_queued_index_to_the_active_one_and_out(
    store: DynamoJobStore, dynamodb: DynamoDBClient, table: str
) -> None:
    # Given a queued job
    store.create_job(job("job-1"))
    assert [j.job_id for j in store.queued_jobs(10)] == ["job-1"]
    assert store.active_jobs() == []

    # When it is admitted
    admitted, version = store.get_job("job-1")
    version = store.put_job(admitted.model_copy(update={"state": JobState.PLACING}), version)

    # Then it has left the queue and is active
    assert store.queued_jobs(10) == []
    assert [(j.job_id, j.state) for j in store.active_jobs()] == [("job-1", JobState.PLACING)]

    # When it ends
    store.put_job(admitted.model_copy(update={"state": JobState.SUCCEEDED}), version)

    # Then it is in neither index, and its item carries no index attributes
    assert store.queued_jobs(10) == []
    assert store.active_jobs() == []
    item = raw_item(dynamodb, table, "JOB#job-1", "JOB")
    assert "gsi1pk" not in item
    assert "gsi1sk" not in item
    assert item["state"] == {"S": "SUCCEEDED"}


# --- attempts and instances -------------------------------------------------------------------------


def test_attempts_round_trip_in_attempt_order(job_store: JobStore) -> None:
    # Given attempts written out of order, the first one later replaced with its outcome
    job_store.put_attempt(attempt("job-1", 2, instance_id="i-2"))
    job_store.put_attempt(attempt("job-1", 1))
    job_store.put_attempt(attempt("job-1", 11))
    ended = attempt("job-1", 1, outcome=AttemptOutcome.INTERRUPTED, lost_work_hours=0.1 + 0.2)
    job_store.put_attempt(ended)
    job_store.put_attempt(attempt("job-2", 1))

    # When the job's attempts are read
    found = job_store.attempts("job-1")

    # Then they come in attempt order, as written, and the replaced one as replaced
    assert [a.attempt for a in found] == [1, 2, 11]
    assert found[0] == ended
    assert job_store.get_attempt("job-1", 2) == attempt("job-1", 2, instance_id="i-2")
    with pytest.raises(NotFoundError):
        job_store.get_attempt("job-1", 3)


def test_an_attempt_write_from_a_stale_read_is_a_conflict(job_store: JobStore) -> None:
    # Given an attempt, read by two writers
    job_store.put_attempt(attempt("job-1", 1))
    first, version = job_store.get_attempt_versioned("job-1", 1)
    _, same_version = job_store.get_attempt_versioned("job-1", 1)
    assert version == same_version >= 1
    # When the first writes its change conditionally
    new_version = job_store.put_attempt(first.model_copy(update={"rebalance_at": T0}), version)
    # Then the second's write from its stale read is refused, and a fresh read has the first's field
    with pytest.raises(ConflictError):
        job_store.put_attempt(first.model_copy(update={"interrupted_at": T0}), same_version)
    fresh, fresh_version = job_store.get_attempt_versioned("job-1", 1)
    assert (fresh.rebalance_at, fresh.interrupted_at, fresh_version) == (T0, None, new_version)
    # And an unconditional write moves the version too, so a conditional writer that read before it loses
    job_store.put_attempt(fresh.model_copy(update={"running_at": T0}))
    with pytest.raises(ConflictError):
        job_store.put_attempt(fresh.model_copy(update={"interrupted_at": T0}), fresh_version)
    # And "absent" is version 0
    created = job_store.put_attempt(attempt("job-1", 2), 0)
    with pytest.raises(ConflictError):
        job_store.put_attempt(attempt("job-1", 2), 0)
    assert job_store.get_attempt_versioned("job-1", 2)[1] == created


def test_an_attempt_written_before_versions_reads_as_version_zero(
    store: DynamoJobStore, dynamodb: DynamoDBClient, table: str
) -> None:
    # Given an attempt item as the previous release wrote it (PutItem, no version attribute)
    dynamodb.put_item(
        TableName=table,
        Item={
            "pk": {"S": "JOB#job-1"},
            "sk": {"S": "ATTEMPT#00001"},
            "record": {"S": attempt("job-1", 1).model_dump_json()},
        },
    )
    # When it is read and written back conditionally, Then version 0 stands for it
    old, version = store.get_attempt_versioned("job-1", 1)
    assert version == 0
    assert store.put_attempt(old.model_copy(update={"running_at": T0}), 0) == 1


def test_instance_refs_round_trip_and_expire_in_thirty_days(
    store: DynamoJobStore, dynamodb: DynamoDBClient, table: str, clock: FakeClock
) -> None:
    # Given the instance of attempt 2 of a job
    store.put_instance_ref(InstanceRef(instance_id="i-0abc", job_id="job-1", attempt=2))

    # When it is looked up, and an unknown instance too
    # Then the one is found, the other is None, and the item expires 30 days after it was written
    assert store.get_instance_ref("i-0abc") == InstanceRef(instance_id="i-0abc", job_id="job-1", attempt=2)
    assert store.get_instance_ref("i-unknown") is None
    item = raw_item(dynamodb, table, "INSTANCE#i-0abc", "INSTANCE")
    assert item["expires_at"] == {"N": str(int((clock.now() + timedelta(days=30)).timestamp()))}


# --- pools ------------------------------------------------------------------------------------------


def test_a_later_block_replaces_an_earlier_one(job_store: JobStore) -> None:
    # Given a pool blocked for an hour
    job_store.block_pool(BlockedPool(pool=G6A, until=T0 + timedelta(hours=1), reason="first"))

    # When it is blocked again for longer
    job_store.block_pool(BlockedPool(pool=G6A, until=T0 + timedelta(hours=3), reason="second"))

    # Then the longer block is the one in force
    assert job_store.blocked_pools(T0) == [BlockedPool(pool=G6A, until=T0 + timedelta(hours=3), reason="second")]


def test_an_earlier_block_does_not_shorten_one_in_force(job_store: JobStore) -> None:
    # Given a pool blocked for three hours
    job_store.block_pool(BlockedPool(pool=G6A, until=T0 + timedelta(hours=3), reason="long"))

    # When a shorter block of the same pool arrives (an older event, delivered late)
    job_store.block_pool(BlockedPool(pool=G6A, until=T0 + timedelta(hours=1), reason="short"))

    # Then the pool stays blocked for three hours
    assert [b.reason for b in job_store.blocked_pools(T0 + timedelta(hours=2))] == ["long"]


def test_lapsed_blocks_are_not_returned(store: DynamoJobStore, dynamodb: DynamoDBClient, table: str) -> None:
    # Given two pools blocked until different times, and the same offering blocked on-demand
    on_demand = G6A.model_copy(update={"market": Market.ON_DEMAND})
    store.block_pool(BlockedPool(pool=G6A, until=T0 + timedelta(minutes=30), reason="a"))
    store.block_pool(BlockedPool(pool=G6B, until=T0 + timedelta(hours=2), reason="b"))
    store.block_pool(BlockedPool(pool=on_demand, until=T0 + timedelta(hours=2), reason="od"))

    # When the blocks are read after the first one lapsed (TTL has not deleted it yet)
    in_force = store.blocked_pools(T0 + timedelta(hours=1))

    # Then only the ones still in force come back, each market on its own
    assert sorted(b.reason for b in in_force) == ["b", "od"]
    item = raw_item(dynamodb, table, "BLOCK#g6.xlarge:us-east-1a:spot", "BLOCK")
    assert item["expires_at"] == {"N": str(int((T0 + timedelta(minutes=30)).timestamp()))}


def test_pool_usage_adds_up_across_calls(job_store: JobStore) -> None:
    # Given usage recorded in pieces, in two pools
    job_store.record_pool_usage(G6A, instance_hours=0.1, interruptions=0)
    job_store.record_pool_usage(G6A, instance_hours=0.2, interruptions=1)
    job_store.record_pool_usage(G6A, instance_hours=2.5, interruptions=2)
    job_store.record_pool_usage(G6B, instance_hours=4, interruptions=0)

    # When the observations are read
    observed = job_store.pool_observations()

    # Then each pool has the sum of its pieces
    assert {k: o.interruptions for k, o in observed.items()} == {"g6.xlarge:us-east-1a": 3, "g6.xlarge:us-east-1b": 0}
    hours = {k: o.instance_hours for k, o in observed.items()}
    assert hours == pytest.approx({"g6.xlarge:us-east-1a": 2.8, "g6.xlarge:us-east-1b": 4.0})


# --- checkpoints ------------------------------------------------------------------------------------


def test_the_checkpoint_pointer_only_moves_forward(job_store: JobStore) -> None:
    # Given a job with no checkpoint, then checkpoint (2, 0)
    assert job_store.get_checkpoint("job-1") is None
    assert job_store.advance_checkpoint(pointer(2, 0)) is True

    # When an older one (1, 3), a newer one (2, 1), and that one again arrive
    older = job_store.advance_checkpoint(pointer(1, 3))
    newer = job_store.advance_checkpoint(pointer(2, 1))
    duplicate = job_store.advance_checkpoint(pointer(2, 1))

    # Then only the newer one moved the pointer
    assert (older, newer, duplicate) == (False, True, False)
    assert job_store.get_checkpoint("job-1") == pointer(2, 1)


def test_each_job_has_its_own_checkpoint_pointer(job_store: JobStore) -> None:
    # Given job-1 at checkpoint (3, 5)
    job_store.advance_checkpoint(pointer(3, 5))

    # When job-2 commits its first checkpoint
    accepted = job_store.advance_checkpoint(pointer(1, 0, job_id="job-2"))

    # Then it is accepted, and job-1's pointer is untouched
    assert accepted is True
    assert job_store.get_checkpoint("job-1") == pointer(3, 5)
