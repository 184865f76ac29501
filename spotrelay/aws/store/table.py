"""The table itself, for the store's parts to share: `StoreTable` holds the table's name, its client
(made on first use), the clock, and the records its readers set aside as unreadable (`take_unreadable`,
`UnreadableRecord`), and reads one item (`_get`) or one gsi1 partition (`_query_index`).

spotrelay.aws.store's `DynamoJobStore` is this with the job records (there), the job indexes and their
quarantine (indexes) and the pool records (pools); the item scheme is in items.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import boto3

from spotrelay.aws.store.items import GSI1, MAX_UNREADABLE_REMEMBERED, _s
from spotrelay.clock import SYSTEM_CLOCK
from spotrelay.control.ports import Clock

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

    from spotrelay.aws.store.items import Item

# The store's logger, named as it was when the store was one module (spotrelay.aws.store): its records' name
logger = logging.getLogger("spotrelay.aws.store")


@dataclass(frozen=True)
class UnreadableRecord:
    """A record a reader skipped because it does not read back."""

    job_id: str  # "" for a record of no job (a blocked pool, a pool's statistics)
    partition: str  # where it was read: the gsi1 partition (QUEUED, ACTIVE, BLOCKED, POOLSTATS), or "scan"
    error: str  # what is wrong with it, short
    quarantined: bool  # marked and moved to the QUARANTINED partition by this read
    key: str = ""  # its pk: `JOB#<job_id>`, `BLOCK#<type>:<az>:<market>`, ...


class StoreTable:
    """The table the store's parts read and write (see spotrelay.aws.store for the layout)."""

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

    def take_unreadable(self) -> list[UnreadableRecord]:
        """The records skipped as unreadable since the last call (the latest 100 at most), oldest first."""
        taken = list(self._unreadable)
        self._unreadable.clear()
        return taken

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
