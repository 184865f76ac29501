"""Waiting for what another thread or process does: on an event it signals, or over a bounded number of
polls, never until a wall-clock deadline (a loaded runner makes a test slow, not wrong).

`eventually(probe, what, on=...)` asks `probe()` until it answers, and between two asks waits on `on`:

- `Ticks`, counted by a hook or a fake each time it has done something a test may wait for (moto's Step
  Functions threads: `tests/integration/moto_progress.py`): asked again after each tick. A guard against a
  hang fails the wait if nothing at all happens for HANG_GUARD_SECONDS; no wait is expected to come near it.
- `Polls` (`POLLING`), for what signals nothing a test can wait on (a real process's file or exit, a thread
  no hook reaches): asked at most `count` times, `interval_seconds` apart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import pytest

T = TypeVar("T")

# Against a hang only (the threads' GIL share on a loaded 2-core runner is no reason to fail): a wait that
# reaches it has failed, whatever the machine.
HANG_GUARD_SECONDS = 120.0


class Progress(Protocol):
    def mark(self) -> int:
        """Where things are, read before a probe."""

    def wait_past(self, mark: int, asked: int) -> str | None:
        """Return once something may have changed since `mark` (`asked` probes so far); or why nothing will:
        the wait has failed."""


def eventually(probe: Callable[[], T | None], what: str, *, on: Progress) -> T:
    """`probe()` once it answers (anything but None or False), asked again each time `on` says something may
    have changed; fail saying `what` never happened, and why the wait ended."""
    asked = 0
    while True:
        mark = on.mark()  # read before the probe: a change during it makes the wait return at once
        value = probe()
        asked += 1
        if value is not None and value is not False:
            return value
        if (gave_up := on.wait_past(mark, asked)) is not None:
            pytest.fail(f"{what}: {gave_up}")


class Ticks:
    """Counts what `source` has done that a test may wait for: its hook calls `tick()`."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._changed = threading.Condition()
        self._ticks = 0

    def tick(self) -> None:
        with self._changed:
            self._ticks += 1
            self._changed.notify_all()

    def mark(self) -> int:
        with self._changed:
            return self._ticks

    def wait_past(self, mark: int, asked: int) -> str | None:
        with self._changed:
            if self._changed.wait_for(lambda: self._ticks != mark, timeout=HANG_GUARD_SECONDS):
                return None
        return f"{self.source} did nothing more in {HANG_GUARD_SECONDS:.0f} s ({asked} probes)"


@dataclass(frozen=True)
class Polls:
    """Look again `interval_seconds` apart, at most `count` times: for what signals nothing (another process)."""

    count: int
    interval_seconds: float

    def mark(self) -> int:
        return 0

    def wait_past(self, mark: int, asked: int) -> str | None:
        if asked >= self.count:
            return f"not after {self.count} polls, {self.interval_seconds:g} s apart"
        time.sleep(self.interval_seconds)  # the poll interval: the other process has nothing to wait on
        return None


# How a test waits for what signals nothing (a real process's file or exit, a thread no hook reaches): look
# every 20 ms; 3,000 looks (about a minute on an idle machine) only guard against a hang
POLLING = Polls(count=3_000, interval_seconds=0.02)
