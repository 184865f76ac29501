"""The job indexes' readers (`queued_jobs`, `active_jobs`, and the scan `all_jobs`) and the quarantine of
a job record that does not read back: skipped, logged and remembered (`take_unreadable`), and with
`quarantine=True` marked and moved to the QUARANTINED partition; `quarantined_jobs` lists them and
`release_quarantined` puts one back once it has been fixed by hand (spotrelay.aws.store says why).

Siblings: items (the item scheme), table (`StoreTable`, which this extends), pools.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC
from typing import TYPE_CHECKING, Literal

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from spotrelay.aws.store.items import (
    _QUARANTINE_MARKS,
    QUARANTINED,
    _index_of,
    _is_condition_failure,
    _s,
    _unreadable_reason,
    _whole_job,
    job_key,
)
from spotrelay.aws.store.table import StoreTable, UnreadableRecord, logger
from spotrelay.control.ports import ConflictError, NotFoundError
from spotrelay.models import Job, JobState

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

    from spotrelay.aws.store.items import Item


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


class JobIndexes(StoreTable):
    """The QUEUED and ACTIVE indexes of job records, and the QUARANTINED partition of those that do not read
    back."""

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
