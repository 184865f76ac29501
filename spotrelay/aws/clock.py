"""The wall clock, for the Lambda functions (the local runtime swaps in its virtual clock)."""

from __future__ import annotations

from datetime import UTC, datetime


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)
