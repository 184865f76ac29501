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
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_CEILING, Decimal
from typing import TYPE_CHECKING, Literal, TypeVar

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel, ValidationError

from spotrelay.aws.queue import attribute_text
from spotrelay.clock import SYSTEM_CLOCK
from spotrelay.control.ports import (
    CheckpointPointer,
    Clock,
    ConflictError,
    InstanceRef,
    NotFoundError,
    UnreadableRecordError,
)
from spotrelay.field_problems import field_problems
from spotrelay.models import Attempt, Job, JobState, Pool
from spotrelay.policy import BlockedPool, PoolObservation

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

    Item = dict[str, AttributeValueTypeDef]

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

GSI1 = "gsi1"
QUARANTINED = "QUARANTINED"  # the gsi1 partition of job records that do not read back
MAX_UNREADABLE_REASON_BYTES = 1_024  # why a record was set aside, as stored and logged
MAX_UNREADABLE_REMEMBERED = 100  # by `take_unreadable`, between two calls
INSTANCE_REF_TTL = timedelta(days=30)
EARLY_CANCEL_TTL = timedelta(days=15)  # SQS keeps a message 14 days at most
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CONDITION_FAILED = "ConditionalCheckFailedException"
_QUARANTINE_MARKS = ("quarantined", "quarantined_at", "quarantined_index")


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
    """A record a reader skipped because it does not read back."""

    job_id: str  # "" for a record of no job (a blocked pool, a pool's statistics)
    partition: str  # where it was read: the gsi1 partition (QUEUED, ACTIVE, BLOCKED, POOLSTATS), or "scan"
    error: str  # what is wrong with it, short
    quarantined: bool  # marked and moved to the QUARANTINED partition by this read
    key: str = ""  # its pk: `JOB#<job_id>`, `BLOCK#<type>:<az>:<market>`, ...


@dataclass(frozen=True)
class QuarantinedJob:
    """A job record in the QUARANTINED partition, as `spotrelay admin quarantined` lists it."""

    job_id: str
    reason: str  # why it was set aside, when it was
    quarantined_at: str  # ISO 8601, UTC, as stored
    index: str  # the gsi1 partition it was read from (QUEUED, ACTIVE), "" if not recorded
    reads_back: bool  # it reads back now (fixed by hand since): `release_quarantined` puts it back


@dataclass(frozen=True)
class Release:
    """What `release_quarantined` did."""

    job_id: str
    outcome: Literal["released", "unreadable", "not-quarantined"]
    index: str | None  # the gsi1 partition the record is in now (QUEUED, ACTIVE, QUARANTINED); None: none
    why: str  # one line, for the operator


def _unreadable_reason(error: Exception, model: str = "Job") -> str:
    if isinstance(error, ValidationError):
        text = f"does not read as a {model} ({'; '.join(field_problems(error, at_most=5))})"
    elif isinstance(error, KeyError):
        text = f"has no {error} attribute of the expected type"
    else:
        text = f"{type(error).__name__}: {error}"
    return attribute_text(text, MAX_UNREADABLE_REASON_BYTES)


def _read(model: type[M], item: Item, record: str) -> M:
    """The item's `record` as `model`; UnreadableRecordError naming `record` ("attempt 2 of job x") if it
    does not read back."""
    text = item.get("record", {}).get("S")
    if text is None:
        raise UnreadableRecordError.problem(record, "record", "no `record` attribute of type S")
    try:
        return model.model_validate_json(text)
    except ValidationError as e:
        raise UnreadableRecordError.of(record, e) from e


def _version(item: Item, record: str, default: int | None = None) -> int:
    """The item's `version` (`default` if it has none and one is given)."""
    if "version" not in item and default is not None:
        return default
    try:
        return int(item["version"]["N"])
    except (KeyError, ValueError):
        raise UnreadableRecordError.problem(record, "version", "not a whole number (N)") from None


def _whole_job(item: Item) -> Job:
    """The job a job item holds, if `get_job` and `put_job` can use it (its record and its version read);
    else UnreadableRecordError."""
    record = f"job {item.get('pk', {}).get('S', '').removeprefix('JOB#')}"
    _version(item, record)
    return _read(Job, item, record)


def _attempt_name(item: Item) -> str:
    """`attempt 2`, from the item's sort key `ATTEMPT#00002`."""
    number = item.get("sk", {}).get("S", "").removeprefix("ATTEMPT#").lstrip("0")
    return f"attempt {number or '?'}"


def _index_of(job: Job) -> tuple[str, str] | None:
    """The gsi1 keys of the job's index entry; None for a terminal job, which is in no index."""
    if job.state is JobState.QUEUED:
        return "QUEUED", queued_sort_key(job)
    if not job.state.is_terminal:
        return "ACTIVE", job.job_id
    return None


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
        """The records skipped as unreadable since the last call (the latest 100 at most), oldest first."""
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
        key = item.get("pk", {}).get("S", "")
        job_id = key.removeprefix("JOB#")
        quarantined = self.quarantine and partition != "scan" and self._quarantine(item, partition, reason)
        self._unreadable.append(
            UnreadableRecord(job_id=job_id, partition=partition, error=reason, quarantined=quarantined, key=key)
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

    def quarantined_jobs(self) -> list[QuarantinedJob]:
        """The job records in the QUARANTINED partition, by job id."""
        found: list[QuarantinedJob] = []
        for item in self._query_index(QUARANTINED):
            try:
                _whole_job(item)
                reads_back = True
            except ValidationError:
                reads_back = False
            found.append(
                QuarantinedJob(
                    job_id=item.get("pk", {}).get("S", "").removeprefix("JOB#"),
                    reason=item.get("quarantined", {}).get("S", ""),
                    quarantined_at=item.get("quarantined_at", {}).get("S", ""),
                    index=item.get("quarantined_index", {}).get("M", {}).get("gsi1pk", {}).get("S", ""),
                    reads_back=reads_back,
                )
            )
        return found

    def release_quarantined(self, job_id: str) -> Release:
        """Put a quarantined job record back in the index its state belongs to (QUEUED, ACTIVE, or none for
        an ended job), its marks removed, if it reads back now (an operator fixed it by hand); else leave it,
        and say why. Only the record as it was read and checked is moved (ConflictError if it was written
        meanwhile: read it again). NotFoundError if the job has no record."""
        item = self._get(job_key(job_id), "JOB")
        if item is None:
            raise NotFoundError(f"job {job_id}")
        where = item.get("gsi1pk", {}).get("S")
        if where != QUARANTINED:
            now_in = f"in the {where} index" if where else "in no index (it has ended)"
            return Release(job_id, "not-quarantined", where, f"job {job_id} is not quarantined: it is {now_in}")
        try:
            job = _whole_job(item)
        except ValidationError as e:
            why = f"job {job_id} is still quarantined: its record {_unreadable_reason(e)}"
            return Release(job_id, "unreadable", QUARANTINED, why)
        if job.job_id != job_id:
            why = f"job {job_id} is still quarantined: its record names another job ({job.job_id})"
            return Release(job_id, "unreadable", QUARANTINED, why)
        index = _index_of(job)
        values: dict[str, AttributeValueTypeDef] = {
            ":quarantined": _s(QUARANTINED),
            ":record": item["record"],
            ":state": _s(job.state),
        }
        update = "SET #state = :state"
        if index is not None:
            update += ", gsi1pk = :index, gsi1sk = :sort"
            values[":index"], values[":sort"] = _s(index[0]), _s(index[1])
        update += f" REMOVE {', '.join(_QUARANTINE_MARKS)}" + (", gsi1pk, gsi1sk" if index is None else "")
        try:
            self.client.update_item(
                TableName=self.table_name,
                Key={"pk": _s(job_key(job_id)), "sk": _s("JOB")},
                UpdateExpression=update,
                ConditionExpression="gsi1pk = :quarantined AND #record = :record",
                ExpressionAttributeNames={"#state": "state", "#record": "record"},
                ExpressionAttributeValues=values,
            )
        except ClientError as e:
            if _is_condition_failure(e):
                raise ConflictError(f"job {job_id} was written while it was being released") from None
            raise
        logger.info("quarantined job record released", extra={"job_id": job_id, "index": index and index[0]})
        now_in = f"back in the {index[0]} index" if index is not None else f"{job.state}: in no index, as an ended job"
        return Release(job_id, "released", index and index[0], f"job {job_id} released: {now_in}")

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
        blocks: list[BlockedPool] = []
        for item in self._query_index("BLOCKED"):
            try:
                block = BlockedPool.model_validate_json(item["record"]["S"])
            except (KeyError, TypeError, ValueError) as e:
                # Skipped, and so the pool is not blocked: the side that is safe for money. A block only keeps
                # jobs off a pool for a while (it refused a launch, or interrupted one): losing one costs at
                # most a launch refused again there (which blocks the pool anew, readably) or one more
                # interruption. Raising would stop every Place and Launch of every job (each reads the blocks)
                # until someone deleted the item; reading it as blocked would hold jobs off what may be the
                # cheapest pool (or put them on on-demand) for as long as the item lives. It lapses by its TTL.
                self._skip(item, "BLOCKED", _unreadable_reason(e, "BlockedPool"))
                continue
            if block.until > now:
                blocks.append(block)
        return blocks

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
        observed: dict[str, PoolObservation] = {}
        for item in self._query_index("POOLSTATS"):
            try:
                observed[item["gsi1sk"]["S"]] = PoolObservation(
                    interruptions=int(item.get("interruptions", {"N": "0"})["N"]),
                    instance_hours=float(Decimal(item.get("instance_hours", {"N": "0"})["N"])),
                )
            except (KeyError, TypeError, ValueError, ArithmeticError) as e:  # skipped: the prior's rate alone
                self._skip(item, "POOLSTATS", _unreadable_reason(e, "PoolObservation"))
        return observed

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

    # --- reads --------------------------------------------------------------------------------------

    def _skip(self, item: Item, partition: str, reason: str) -> None:
        """Log and remember (`take_unreadable`) a record of no job that a listing skipped."""
        key = item.get("pk", {}).get("S", "")
        self._unreadable.append(
            UnreadableRecord(job_id="", partition=partition, error=reason, quarantined=False, key=key)
        )
        logger.error(
            "record %s does not read back: skipped (%s)",
            key,
            reason,
            extra={"key": key, "partition": partition, "error": reason},
        )

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
