"""The table's item scheme: keys, how a model is written into an item and read back from one, and the
constants every part of the store shares (the table layout is in spotrelay.aws.store's docstring).

Pure functions, no I/O: `job_key`, `attempt_sort_key`, `queued_sort_key` and `block_key` (the keys),
`epoch_seconds` (a DynamoDB number of a moment), `_s`/`_n` (attribute values), `_read`/`_version`/
`_whole_job` (a record read back, or UnreadableRecordError naming it), `_index_of` (a job's gsi1 entry),
`_unreadable_reason` (why a record was set aside, bounded). Siblings: table (the table's access and what
its readers set aside), indexes (the job indexes and quarantine), pools (blocked pools, pool statistics).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, TypeVar

from botocore.exceptions import ClientError
from pydantic import BaseModel, ValidationError

from spotrelay.aws.queue import attribute_text
from spotrelay.control.ports import UnreadableRecordError
from spotrelay.field_problems import field_problems
from spotrelay.models import Job, JobState, Pool

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

    Item = dict[str, AttributeValueTypeDef]

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
