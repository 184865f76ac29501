"""SQS on the virtual clock: message visibility, delays, receive timestamps and retention read
`spotrelay.local.clock` (long polls keep moto's real time). Siblings: `virtual_clock` (Step Functions on the same
clock), `installation` (runs the patches).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from moto.sqs import models as moto_sqs_models

from spotrelay.local.clock import SimulationClock
from spotrelay.local.patches.canaries import Expected
from spotrelay.local.patches.installation import _Patcher

# SQS message visibility and delays on the virtual clock (every other use of time in moto.sqs stays real)
EXPECTED: tuple[Expected, ...] = (
    Expected(moto_sqs_models, "unix_time_millis", "(dt: 'datetime.datetime | None' = None) -> 'float'"),
    Expected(
        moto_sqs_models.Message,
        "change_visibility",
        "(self, visibility_timeout: int) -> None",
        ("self.visible_at = unix_time_millis() + visibility_timeout_msec",),
    ),
    Expected(
        moto_sqs_models.SQSBackend,
        "is_message_valid_based_on_retention_period",
        "(self, queue_name: str, message: moto.sqs.models.Message) -> bool",
        ("retain_until = retention_period + message.sent_timestamp / 1000  # type: ignore",),
    ),
)


# --- SQS on the virtual clock ------------------------------------------------------------------------


def _patch_sqs_clock(patcher: _Patcher, clock: SimulationClock) -> None:
    """SQS's message visibility, delays and receive timestamps read the virtual clock. moto reads them from
    the wall clock: a message the dispatcher left on the queue (a throttled write, a crash) came back after
    its visibility timeout of wall time, that is never within a replay of hours in seconds, and the job was
    lost to the replay (chaos seed 32 of happy-path). Long polls and retention keep moto's real time
    (`unix_time`): a poll must end however the virtual clock stands."""
    original: Callable[..., float] = patcher.original(moto_sqs_models, "unix_time_millis")

    def unix_time_millis(dt: datetime | None = None) -> float:
        if dt is not None:
            return original(dt)
        return clock.now().timestamp() * 1000.0

    patcher.replace(moto_sqs_models, "unix_time_millis", unix_time_millis)

    # ... and so a message's retention, which counts from its (now virtual) sent time
    def is_message_valid_based_on_retention_period(self: Any, queue_name: str, message: Any) -> bool:
        retention = self.get_queue_attributes(queue_name, ["MessageRetentionPeriod"])["MessageRetentionPeriod"]
        return bool(float(retention) + message.sent_timestamp / 1000 > clock.now().timestamp())

    patcher.replace(
        moto_sqs_models.SQSBackend,
        "is_message_valid_based_on_retention_period",
        is_message_valid_based_on_retention_period,
    )
