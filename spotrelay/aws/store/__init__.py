"""`JobStore` on one DynamoDB table (single-table design).

Keys (`pk`, `sk`) and the one GSI (`gsi1`: `gsi1pk`, `gsi1sk`, projection ALL):

| item         | pk                           | sk               | gsi1pk        | gsi1sk                           |
| ------------ | ---------------------------- | ---------------- | ------------- | -------------------------------- |
| job          | `JOB#<job_id>`               | `JOB`            | `QUEUED`      | `<rank>#<submitted_at>#<job_id>` |
|              |                              |                  | `ACTIVE`      | `<job_id>` (admitted, live)      |
|              |                              |                  | `QUARANTINED` | `JOB#<job_id>` (unreadable)      |
| attempt      | `JOB#<job_id>`               | `ATTEMPT#00001`  |               |                                  |
| checkpoint   | `JOB#<job_id>`               | `CHECKPOINT`     |               |                                  |
| instance ref | `INSTANCE#<instance_id>`     | `INSTANCE`       |               |                                  |
| early cancel | `CANCEL#<job_id>`            | `CANCEL`         |               |                                  |
| blocked pool | `BLOCK#<type>:<az>:<market>` | `BLOCK`          | `BLOCKED`     | `<type>:<az>:<market>`           |
| pool stats   | `POOLSTATS#<type>:<az>`      | `STATS`          | `POOLSTATS`   | `<type>:<az>`                    |

Models are stored whole as JSON in `record` (floats round-trip exactly); the attributes next to it
exist for keys, indexes, conditions and TTL (`expires_at`, epoch seconds). A terminal job has no
gsi1 attributes, so it drops out of both indexes. The GSI is eventually consistent: readers of
`queued_jobs` / `active_jobs` see a job's index entry a moment after its write.

A job record that does not read back (its JSON fails validation: garbage, a value an older parser let
through) never stops a reader of the indexes (`queued_jobs`, `active_jobs`, `all_jobs`): it is logged,
skipped and counted (`take_unreadable`). With `quarantine=True` (the dispatcher, which reads both
partitions every run) it is also marked: `quarantined` (why), `quarantined_at`, `quarantined_index`
(the gsi1 keys it had), and moved to the `QUARANTINED` partition, so no run reads it again. Only a
record still as it was read is moved; any later `put_job` of the job writes it whole again, back in its
index, and so does `release_quarantined` once the record has been fixed by hand (`spotrelay admin`).

The other readers, each on the side that is safe:
- a blocked pool that does not read back is skipped, logged and counted like a job record (the pool is
  not blocked: see `blocked_pools`), and so are a pool's statistics (the pool has the prior's rate alone);
- the reads of one record (`get_job`, `get_attempt`, `get_checkpoint`, `get_instance_ref`) and of one
  job's attempts (`attempts`) raise `UnreadableRecordError` (a ValidationError) naming the record: their
  caller cannot decide for that job without it, and reports that job (one job's trouble, not the run's).

Modules: `items` (the keys and the encoding of items), `table` (`StoreTable`: the client, one item's and
one partition's reads, the records set aside), `indexes` (the job indexes and the quarantine), `pools`
(blocked pools and pool statistics); `DynamoJobStore`, here, is all of them with the job, attempt,
instance, early-cancel and checkpoint records. Every public name of each is here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError
from pydantic import ValidationError

from spotrelay.aws.store.indexes import JobIndexes, QuarantinedJob, Release
from spotrelay.aws.store.items import (
    EARLY_CANCEL_TTL,
    GSI1,
    INSTANCE_REF_TTL,
    MAX_UNREADABLE_REASON_BYTES,
    MAX_UNREADABLE_REMEMBERED,
    QUARANTINED,
    _attempt_name,
    _index_of,
    _is_condition_failure,
    _n,
    _read,
    _s,
    _version,
    attempt_sort_key,
    block_key,
    epoch_seconds,
    job_key,
    queued_sort_key,
)
from spotrelay.aws.store.pools import PoolRecords
from spotrelay.aws.store.table import StoreTable, UnreadableRecord
from spotrelay.control.ports import (
    CheckpointPointer,
    ConflictError,
    InstanceRef,
    NotFoundError,
    UnreadableRecordError,
)
from spotrelay.models import Attempt, Job

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

    from spotrelay.aws.store.items import Item

__all__ = [
    "EARLY_CANCEL_TTL",
    "GSI1",
    "INSTANCE_REF_TTL",
    "MAX_UNREADABLE_REASON_BYTES",
    "MAX_UNREADABLE_REMEMBERED",
    "QUARANTINED",
    "DynamoJobStore",
    "JobIndexes",
    "PoolRecords",
    "QuarantinedJob",
    "Release",
    "StoreTable",
    "UnreadableRecord",
    "attempt_sort_key",
    "block_key",
    "epoch_seconds",
    "job_key",
    "queued_sort_key",
]


class DynamoJobStore(JobIndexes, PoolRecords):
    """The scheduler's records in one DynamoDB table (see the module docstring for the layout).

    Its job indexes and their quarantine are JobIndexes', its pool records PoolRecords', the table's access
    StoreTable's (spotrelay.aws.store.indexes, .pools, .table)."""

    # --- jobs ---------------------------------------------------------------------------------------

    def _job_item(self, job: Job, version: int) -> Item:
        item: Item = {
            "pk": _s(job_key(job.job_id)),
            "sk": _s("JOB"),
            "record": _s(job.model_dump_json()),
            "state": _s(job.state),
            "version": _n(version),
        }
        index = _index_of(job)
        if index is not None:
            item["gsi1pk"], item["gsi1sk"] = _s(index[0]), _s(index[1])
        return item

    def create_job(self, job: Job) -> bool:
        try:
            self.client.put_item(
                TableName=self.table_name,
                Item=self._job_item(job, 1),
                ConditionExpression="attribute_not_exists(pk)",
            )
        except ClientError as e:
            if _is_condition_failure(e):
                return False
            raise
        return True

    def get_job(self, job_id: str) -> tuple[Job, int]:
        item = self._get(job_key(job_id), "JOB")
        if item is None:
            raise NotFoundError(f"job {job_id}")
        record = f"job {job_id}"
        return _read(Job, item, record), _version(item, record)

    def put_job(self, job: Job, expected_version: int) -> int:
        # PutItem replaces the whole item: a state without an index entry leaves no gsi1 attributes behind.
        new_version = expected_version + 1
        try:
            self.client.put_item(
                TableName=self.table_name,
                Item=self._job_item(job, new_version),
                ConditionExpression="version = :expected",
                ExpressionAttributeValues={":expected": _n(expected_version)},
            )
        except ClientError as e:
            if _is_condition_failure(e):
                raise ConflictError(f"job {job.job_id} is no longer at version {expected_version}") from None
            raise
        return new_version

    # --- attempts -----------------------------------------------------------------------------------

    def put_attempt(self, attempt: Attempt, expected_version: int | None = None) -> int:
        # UpdateItem with ADD bumps the version atomically, so even an unconditional write moves it and a
        # conditional writer that read before it loses and reads again.
        values: dict[str, AttributeValueTypeDef] = {":r": _s(attempt.model_dump_json()), ":one": _n(1)}
        condition: dict[str, str] = {}
        if expected_version is not None:
            if expected_version == 0:
                condition["ConditionExpression"] = "attribute_not_exists(#v)"
            else:
                condition["ConditionExpression"] = "#v = :expected"
                values[":expected"] = _n(expected_version)
        try:
            answer = self.client.update_item(
                TableName=self.table_name,
                Key={"pk": _s(job_key(attempt.job_id)), "sk": _s(attempt_sort_key(attempt.attempt))},
                UpdateExpression="SET #r = :r ADD #v :one",
                ExpressionAttributeNames={"#r": "record", "#v": "version"},
                ExpressionAttributeValues=values,
                ReturnValues="UPDATED_NEW",
                **condition,  # type: ignore[arg-type]
            )
        except ClientError as e:
            if _is_condition_failure(e):
                raise ConflictError(
                    f"attempt {attempt.attempt} of job {attempt.job_id} is no longer at version {expected_version}"
                ) from None
            raise
        return int(answer["Attributes"]["version"]["N"])

    def get_attempt(self, job_id: str, attempt: int) -> Attempt:
        return self.get_attempt_versioned(job_id, attempt)[0]

    def get_attempt_versioned(self, job_id: str, attempt: int) -> tuple[Attempt, int]:
        item = self._get(job_key(job_id), attempt_sort_key(attempt))
        if item is None:
            raise NotFoundError(f"attempt {attempt} of job {job_id}")
        record = f"attempt {attempt} of job {job_id}"
        return _read(Attempt, item, record), _version(item, record, default=0)

    def attempts(self, job_id: str) -> list[Attempt]:
        # All or nothing (UnreadableRecordError), unlike a listing of many jobs: see the JobStore port.
        pages = self.client.get_paginator("query").paginate(
            TableName=self.table_name,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
            ExpressionAttributeValues={":pk": _s(job_key(job_id)), ":prefix": _s("ATTEMPT#")},
            ConsistentRead=True,
        )
        found = [
            _read(Attempt, item, f"{_attempt_name(item)} of job {job_id}")
            for page in pages
            for item in page.get("Items", [])
        ]
        return sorted(found, key=lambda a: a.attempt)

    # --- instances ----------------------------------------------------------------------------------

    def put_instance_ref(self, ref: InstanceRef) -> None:
        expires = self._clock.now() + INSTANCE_REF_TTL
        self.client.put_item(
            TableName=self.table_name,
            Item={
                "pk": _s(f"INSTANCE#{ref.instance_id}"),
                "sk": _s("INSTANCE"),
                "job_id": _s(ref.job_id),
                "attempt": _n(ref.attempt),
                "expires_at": _n(int(expires.timestamp())),
            },
        )

    def request_cancel_before_admission(self, job_id: str) -> None:
        # Kept as long as SQS keeps a message (14 days at most), so its job's intake still finds it
        expires = self._clock.now() + EARLY_CANCEL_TTL
        self.client.put_item(
            TableName=self.table_name,
            Item={"pk": _s(f"CANCEL#{job_id}"), "sk": _s("CANCEL"), "expires_at": _n(int(expires.timestamp()))},
        )

    def cancel_requested_before_admission(self, job_id: str) -> bool:
        return self._get(f"CANCEL#{job_id}", "CANCEL") is not None

    def forget_cancel_before_admission(self, job_id: str) -> None:
        self.client.delete_item(TableName=self.table_name, Key={"pk": _s(f"CANCEL#{job_id}"), "sk": _s("CANCEL")})

    def get_instance_ref(self, instance_id: str) -> InstanceRef | None:
        item = self._get(f"INSTANCE#{instance_id}", "INSTANCE")
        if item is None:
            return None
        fields = {
            "instance_id": instance_id,
            "job_id": item.get("job_id", {}).get("S"),
            "attempt": item.get("attempt", {}).get("N"),
        }
        try:
            return InstanceRef.model_validate(fields)
        except ValidationError as e:
            raise UnreadableRecordError.of(f"the instance ref of {instance_id}", e) from e

    # --- checkpoints --------------------------------------------------------------------------------

    def advance_checkpoint(self, pointer: CheckpointPointer) -> bool:
        try:
            self.client.put_item(
                TableName=self.table_name,
                Item={
                    "pk": _s(job_key(pointer.job_id)),
                    "sk": _s("CHECKPOINT"),
                    "record": _s(pointer.model_dump_json()),
                    "attempt": _n(pointer.attempt),
                    "seq": _n(pointer.seq),
                },
                ConditionExpression="attribute_not_exists(pk) OR attempt < :a OR (attempt = :a AND seq < :s)",
                ExpressionAttributeValues={":a": _n(pointer.attempt), ":s": _n(pointer.seq)},
            )
        except ClientError as e:
            if _is_condition_failure(e):
                return False
            raise
        return True

    def get_checkpoint(self, job_id: str) -> CheckpointPointer | None:
        item = self._get(job_key(job_id), "CHECKPOINT")
        return None if item is None else _read(CheckpointPointer, item, f"the checkpoint pointer of job {job_id}")
