"""DynamoDB faults: a chaos seed's faults (`StoreFaults`, spotrelay.local.chaos) are injected as moto handles
a PutItem or UpdateItem: a throttled write (STORE_THROTTLED) or a concurrent writer (STORE_CONFLICT, which moves
the item's version on: `versioned_attribute`). Siblings: `installation` holds the installed hook read here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from moto.dynamodb.exceptions import ERROR_TYPE_PREFIX as DYNAMODB_ERROR_PREFIX
from moto.dynamodb.exceptions import DynamodbException
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.responses import DynamoHandler

from spotrelay.local.patches import installation
from spotrelay.local.patches.canaries import Expected
from spotrelay.local.patches.installation import _Patcher

# a chaos seed's DynamoDB faults are injected as moto handles a write (StoreFaults)
EXPECTED: tuple[Expected, ...] = (
    Expected(
        DynamoHandler, "put_item", "(self) -> moto.core.responses.ActionResult", ('name = self.body["TableName"]',)
    ),
    Expected(DynamoHandler, "update_item", "(self) -> moto.core.responses.ActionResult", ('key = self.body["Key"]',)),
)

STORE_THROTTLED = "throttled"
STORE_CONFLICT = "conflict"


class StoreFaults(Protocol):
    """Whether one DynamoDB write (PutItem, UpdateItem: `request` is its JSON body) meets a fault as moto
    is about to handle it (spotrelay.local.chaos): STORE_THROTTLED, answered with
    ProvisionedThroughputExceededException (which an SDK with retries retries, with backoff); STORE_CONFLICT, a
    concurrent writer that got there first: the item's version moves on, so a write conditioned on the
    version it read fails its condition for real and the writer reads again; None, no fault."""

    def store_fault(self, operation: str, request: Mapping[str, Any]) -> str | None: ...


# --- DynamoDB faults -----------------------------------------------------------------------------------


class _Throttled(DynamodbException):
    error_type = DYNAMODB_ERROR_PREFIX + "ProvisionedThroughputExceededException"

    def __init__(self) -> None:
        super().__init__(
            self.error_type,
            "The level of configured provisioned throughput for the table was exceeded. Consider increasing "
            "your provisioning level with the UpdateTable API.",
        )


def versioned_attribute(request: Mapping[str, Any]) -> str | None:
    """The attribute a write is conditioned on being at the version its writer read (`version = :expected`,
    the store's optimistic concurrency), or None for any other write."""
    match = re.fullmatch(r"\s*(#?\w+)\s*=\s*:expected\s*", str(request.get("ConditionExpression") or ""))
    if match is None:
        return None
    names = request.get("ExpressionAttributeNames") or {}
    return str(names.get(match.group(1), match.group(1)))


def _bump_version(handler: DynamoHandler, attribute: str) -> bool:
    """The concurrent writer: the item the request names, its `attribute` one version on (nothing else
    changed). False if there is no such item or number."""
    body = handler.body
    table = handler.dynamodb_backend.get_table(body["TableName"])
    key = body.get("Key") or body.get("Item") or {}
    hash_value = key.get(table.hash_key_attr)
    range_value = key.get(table.range_key_attr) if table.range_key_attr else None
    if hash_value is None:
        return False
    item = table.get_item(DynamoType(hash_value), DynamoType(range_value) if range_value is not None else None)
    current = item.attrs.get(attribute) if item is not None else None
    if item is None or current is None or current.type != "N":
        return False
    item.attrs[attribute] = DynamoType({"N": str(int(current.value) + 1)})
    return True


def _patch_dynamodb_faults(patcher: _Patcher) -> None:
    for operation, name in (("PutItem", "put_item"), ("UpdateItem", "update_item")):
        original: Callable[[DynamoHandler], Any] = patcher.original(DynamoHandler, name)

        def write(self: DynamoHandler, original: Callable[[DynamoHandler], Any] = original, op: str = operation) -> Any:
            current = installation._installed
            faults = current.store_faults if current is not None else None
            fault = faults.store_fault(op, self.body) if faults is not None else None
            if fault == STORE_THROTTLED:
                raise _Throttled()
            if fault == STORE_CONFLICT:
                attribute = versioned_attribute(self.body)
                if attribute is not None:
                    _bump_version(self, attribute)
            return original(self)

        patcher.replace(DynamoHandler, name, write)
