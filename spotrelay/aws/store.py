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
index. `get_job` of its id still raises the validation error.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_CEILING, Decimal
from typing import TYPE_CHECKING

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from spotrelay.aws.queue import attribute_text
from spotrelay.clock import SYSTEM_CLOCK
from spotrelay.control.ports import CheckpointPointer, Clock, ConflictError, InstanceRef, NotFoundError
from spotrelay.models import Attempt, Job, JobState, Pool
from spotrelay.policy import BlockedPool, PoolObservation

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

    Item = dict[str, AttributeValueTypeDef]

logger = logging.getLogger(__name__)

GSI1 = "gsi1"
QUARANTINED = "QUARANTINED"  # the gsi1 partition of job records that do not read back
MAX_UNREADABLE_REASON_BYTES = 1_024  # why a record was set aside, as stored and logged
MAX_UNREADABLE_REMEMBERED = 100  # by `take_unreadable`, between two calls
INSTANCE_REF_TTL = timedelta(days=30)
EARLY_CANCEL_TTL = timedelta(days=15)  # SQS keeps a message 14 days at most
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CONDITION_FAILED = "ConditionalCheckFailedException"


def job_key(job_id: str) -> str:
    return f"JOB#{job_id}"


def attempt_sort_key(attempt: int) -> str:
    return f"ATTEMPT#{attempt:05d}"


def queued_sort_key(job: Job) -> str:
    """Priority rank, then submission time (fixed-width UTC, so text order is time order), then id."""
    submitted = job.submitted_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{job.spec.priority.rank}#{submitted}#{job.job_id}"


def block_key(pool: Pool) -> str:
    return f"{pool.offering}:{pool.market}"


def epoch_seconds(moment: datetime) -> Decimal:
    """Exact epoch seconds (microsecond resolution) as a DynamoDB number."""
    return Decimal((moment - _EPOCH) // timedelta(microseconds=1)).scaleb(-6)


def _s(value: str) -> AttributeValueTypeDef:
    return {"S": value}


def _n(value: int | Decimal) -> AttributeValueTypeDef:
    return {"N": str(value)}


def _is_condition_failure(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code") == _CONDITION_FAILED


@dataclass(frozen=True)
class UnreadableRecord:
    """A job record a reader skipped because it does not read back."""

    job_id: str
    partition: str  # where it was read: the gsi1 partition (QUEUED, ACTIVE), or "scan"
    error: str  # what is wrong with it, short
    quarantined: bool  # marked and moved to the QUARANTINED partition by this read


def _unreadable_reason(error: Exception) -> str:
    if isinstance(error, ValidationError):
        problems = error.errors()
        shown = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(record)'}: {e['msg']}" for e in problems[:5])
        more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
        text = f"does not read as a Job ({shown}{more})"
    elif isinstance(error, KeyError):
        text = f"has no {error} attribute of the expected type"
    else:
        text = f"{type(error).__name__}: {error}"
    return attribute_text(text, MAX_UNREADABLE_REASON_BYTES)


class DynamoJobStore:
    """The scheduler's records in one DynamoDB table (see the module docstring for the layout)."""

    def __init__(
        self,
        table_name: str,
        client: DynamoDBClient | None = None,
        *,
        clock: Clock | None = None,
        quarantine: bool = False,
    ) -> None:
        self.table_name = table_name
        self._client = client
        self._clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        # Mark unreadable job records and move them out of QUEUED/ACTIVE (see the module docstring). Off for
        # readers that should not write, or may be older than the stack: the CLI, the other functions.
        self.quarantine = quarantine
        self._unreadable: deque[UnreadableRecord] = deque(maxlen=MAX_UNREADABLE_REMEMBERED)

    @property
    def client(self) -> DynamoDBClient:
        if self._client is None:
            self._client = boto3.client("dynamodb")
        return self._client

    # --- jobs ---------------------------------------------------------------------------------------

    def _job_item(self, job: Job, version: int) -> Item:
        item: Item = {
            "pk": _s(job_key(job.job_id)),
            "sk": _s("JOB"),
            "record": _s(job.model_dump_json()),
            "state": _s(job.state),
            "version": _n(version),
        }
        if job.state is JobState.QUEUED:
            item["gsi1pk"] = _s("QUEUED")
            item["gsi1sk"] = _s(queued_sort_key(job))
        elif not job.state.is_terminal:
            item["gsi1pk"] = _s("ACTIVE")
            item["gsi1sk"] = _s(job.job_id)
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
        return Job.model_validate_json(item["record"]["S"]), int(item["version"]["N"])

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

    def queued_jobs(self, limit: int) -> list[Job]:
        jobs: list[Job] = []
        if limit <= 0:
            return jobs
        for job in self._readable(self._query_index("QUEUED", page_size=min(max(limit, 10), 100)), "QUEUED"):
            if job.state is JobState.QUEUED:  # the index lags the table by a moment
                jobs.append(job)
                if len(jobs) >= limit:
                    break
        return jobs

    def active_jobs(self) -> list[Job]:
        jobs = self._readable(self._query_index("ACTIVE"), "ACTIVE")
        return [j for j in jobs if j.state is not JobState.QUEUED and not j.state.is_terminal]

    def all_jobs(self) -> list[Job]:
        """Every job, ended ones included: a scan of the whole table, for `spotrelay ls --all` (the
        functions never call it)."""
        pages = self.client.get_paginator("scan").paginate(
            TableName=self.table_name,
            FilterExpression="sk = :job",
            ExpressionAttributeValues={":job": _s("JOB")},
            ProjectionExpression="#pk, #record",
            ExpressionAttributeNames={"#pk": "pk", "#record": "record"},
        )
        return list(self._readable((item for page in pages for item in page.get("Items", [])), "scan"))

    def take_unreadable(self) -> list[UnreadableRecord]:
        """The job records skipped as unreadable since the last call (the latest 100 at most), oldest first."""
        taken = list(self._unreadable)
        self._unreadable.clear()
        return taken

    def _readable(self, items: Iterable[Item], partition: str) -> Iterator[Job]:
        """The jobs of `items` that read back; each other one is logged, remembered and (with `quarantine`,
        read from an index partition) quarantined, and the rest are read all the same."""
        for item in items:
            try:
                yield Job.model_validate_json(item["record"]["S"])
            except (KeyError, TypeError, ValueError) as e:  # pydantic's ValidationError is a ValueError
                self._set_aside(item, partition, _unreadable_reason(e))

    def _set_aside(self, item: Item, partition: str, reason: str) -> None:
        job_id = item.get("pk", {}).get("S", "").removeprefix("JOB#")
        quarantined = self.quarantine and partition != "scan" and self._quarantine(item, partition, reason)
        self._unreadable.append(
            UnreadableRecord(job_id=job_id, partition=partition, error=reason, quarantined=quarantined)
        )
        logger.error(
            "job record %s does not read back: skipped (%s)",
            job_id,
            reason,
            extra={"job_id": job_id, "partition": partition, "error": reason, "quarantined": quarantined},
        )

    def _quarantine(self, item: Item, partition: str, reason: str) -> bool:
        """Mark the record and move it to the QUARANTINED partition, if it is still as it was read; True if
        it was moved. Best effort: a failure is logged, and the record is skipped (and tried) next time."""
        if "pk" not in item or "sk" not in item:
            return False
        values: dict[str, AttributeValueTypeDef] = {
            ":quarantined": _s(QUARANTINED),
            ":key": item["pk"],
            ":why": _s(reason),
            ":at": _s(self._clock.now().astimezone(UTC).isoformat()),
            ":index": {"M": {name: item[name] for name in ("gsi1pk", "gsi1sk") if name in item}},
            ":from": _s(partition),
        }
        condition = "gsi1pk = :from AND "
        if "version" in item:
            condition += "#version = :version"
            values[":version"] = item["version"]
        else:
            condition += "attribute_not_exists(#version)"
        try:
            self.client.update_item(
                TableName=self.table_name,
                Key={"pk": item["pk"], "sk": item["sk"]},
                UpdateExpression=(
                    "SET gsi1pk = :quarantined, gsi1sk = :key, quarantined = :why, quarantined_at = :at, "
                    "quarantined_index = :index"
                ),
                ConditionExpression=condition,
                ExpressionAttributeNames={"#version": "version"},
                ExpressionAttributeValues=values,
            )
        except (ClientError, BotoCoreError) as e:
            if not (isinstance(e, ClientError) and _is_condition_failure(e)):  # else written again since it was read
                job_id = item["pk"].get("S", "").removeprefix("JOB#")
                logger.warning("could not quarantine a job record", extra={"job_id": job_id}, exc_info=True)
            return False
        return True

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
        version = int(item["version"]["N"]) if "version" in item else 0
        return Attempt.model_validate_json(item["record"]["S"]), version

    def attempts(self, job_id: str) -> list[Attempt]:
        pages = self.client.get_paginator("query").paginate(
            TableName=self.table_name,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
            ExpressionAttributeValues={":pk": _s(job_key(job_id)), ":prefix": _s("ATTEMPT#")},
            ConsistentRead=True,
        )
        found = [Attempt.model_validate_json(item["record"]["S"]) for page in pages for item in page.get("Items", [])]
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

    def get_instance_ref(self, instance_id: str) -> InstanceRef | None:
        item = self._get(f"INSTANCE#{instance_id}", "INSTANCE")
        if item is None:
            return None
        return InstanceRef(instance_id=instance_id, job_id=item["job_id"]["S"], attempt=int(item["attempt"]["N"]))

    # --- pools --------------------------------------------------------------------------------------

    def block_pool(self, block: BlockedPool) -> None:
        until = epoch_seconds(block.until)
        try:
            self.client.put_item(
                TableName=self.table_name,
                Item={
                    "pk": _s(f"BLOCK#{block_key(block.pool)}"),
                    "sk": _s("BLOCK"),
                    "record": _s(block.model_dump_json()),
                    "until_epoch": _n(until),
                    "expires_at": _n(int(until.to_integral_value(rounding=ROUND_CEILING))),
                    "gsi1pk": _s("BLOCKED"),
                    "gsi1sk": _s(block_key(block.pool)),
                },
                # Never shorten a block: only a later `until` replaces the one in force.
                ConditionExpression="attribute_not_exists(pk) OR until_epoch < :until",
                ExpressionAttributeValues={":until": _n(until)},
            )
        except ClientError as e:
            if not _is_condition_failure(e):
                raise

    def blocked_pools(self, now: datetime) -> list[BlockedPool]:
        # TTL deletion lags by up to two days: lapsed blocks are filtered here.
        blocks = (BlockedPool.model_validate_json(item["record"]["S"]) for item in self._query_index("BLOCKED"))
        return [b for b in blocks if b.until > now]

    def record_pool_usage(self, pool: Pool, instance_hours: float, interruptions: int) -> None:
        self.client.update_item(
            TableName=self.table_name,
            Key={"pk": _s(f"POOLSTATS#{pool.offering}"), "sk": _s("STATS")},
            UpdateExpression="ADD interruptions :k, instance_hours :h SET gsi1pk = :g, gsi1sk = :o",
            ExpressionAttributeValues={
                ":k": _n(interruptions),
                ":h": _n(Decimal(repr(float(instance_hours)))),
                ":g": _s("POOLSTATS"),
                ":o": _s(pool.offering),
            },
        )

    def pool_observations(self) -> dict[str, PoolObservation]:
        return {
            item["gsi1sk"]["S"]: PoolObservation(
                interruptions=int(item.get("interruptions", {"N": "0"})["N"]),
                instance_hours=float(Decimal(item.get("instance_hours", {"N": "0"})["N"])),
            )
            for item in self._query_index("POOLSTATS")
        }

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
        return None if item is None else CheckpointPointer.model_validate_json(item["record"]["S"])

    # --- reads --------------------------------------------------------------------------------------

    def _get(self, pk: str, sk: str) -> Item | None:
        response = self.client.get_item(
            TableName=self.table_name, Key={"pk": _s(pk), "sk": _s(sk)}, ConsistentRead=True
        )
        return response.get("Item")

    def _query_index(self, partition: str, page_size: int | None = None) -> Iterator[Item]:
        """Every item of one gsi1 partition, in gsi1sk order, page by page."""
        paginator = self.client.get_paginator("query")
        pages = paginator.paginate(
            TableName=self.table_name,
            IndexName=GSI1,
            KeyConditionExpression="gsi1pk = :p",
            ExpressionAttributeValues={":p": _s(partition)},
            PaginationConfig={"PageSize": page_size} if page_size is not None else {},
        )
        for page in pages:
            yield from page.get("Items", [])
