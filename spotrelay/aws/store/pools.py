"""The pool records: blocked pools (`block_pool`, `blocked_pools`: an unreadable block is skipped, and so
the pool is not blocked) and each pool's interruption record (`record_pool_usage`, `pool_observations`).

Siblings: items (the item scheme), table (`StoreTable`, which this extends), indexes.
"""

from __future__ import annotations

from datetime import datetime
from decimal import ROUND_CEILING, Decimal

from botocore.exceptions import ClientError

from spotrelay.aws.store.items import _is_condition_failure, _n, _s, _unreadable_reason, block_key, epoch_seconds
from spotrelay.aws.store.table import StoreTable
from spotrelay.models import Pool
from spotrelay.policy import BlockedPool, PoolObservation


class PoolRecords(StoreTable):
    """Which pools are blocked, until when, and how often each has interrupted."""

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
