"""The wall clock, for the Lambda functions (the local runtime swaps in its virtual clock): the one
`SystemClock` of spotrelay.clock."""

from __future__ import annotations

from spotrelay.clock import SystemClock

__all__ = ["SystemClock"]
