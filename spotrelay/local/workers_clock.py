"""The instances of a replay (spotrelay.local.workers): the instance's clock.

The virtual clock, until the instance (or its agent) is gone: `MortalClock` is the virtual clock as one
process group on an instance sees it; once any of its `Life`s ends, its next wait raises `Gone`, which ends
the thread. Siblings: spotrelay.local.workers_logbook (what the agent did), spotrelay.local.workers (the
instance worker, and the overview).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from spotrelay.clock import ClockEvent, ClockThread
from spotrelay.local.clock import VirtualClock


class Gone(BaseException):
    """The instance (or the agent process) is gone: its threads end at their next wait.
    A BaseException, so that the agent's `except Exception` never takes it for an error of its own."""


@dataclass
class Life:
    """One life of a process group on an instance (the instance's, or one agent process's)."""

    alive: bool = True


class _MortalEvent:
    def __init__(self, inner: ClockEvent, clock: MortalClock) -> None:
        self._inner = inner
        self._clock = clock

    def is_set(self) -> bool:
        return self._inner.is_set()

    def set(self) -> None:
        self._inner.set()

    def clear(self) -> None:
        self._inner.clear()

    def wait(self, timeout: float | None = None) -> bool:
        self._clock.check()
        fired = self._inner.wait(timeout)
        self._clock.check()
        return fired


class MortalClock:
    """The virtual clock as one process group on an instance sees it (spotrelay.clock.WaitingClock):
    once any of its lives ends (the instance, the agent process), a wait raises Gone."""

    def __init__(self, clock: VirtualClock, *lives: Life) -> None:
        self._clock = clock
        self._lives = lives

    def check(self) -> None:
        if not all(life.alive for life in self._lives):
            raise Gone

    def now(self) -> datetime:
        return self._clock.now()

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def sleep(self, seconds: float) -> None:
        self.check()
        self._clock.sleep(seconds)
        self.check()

    def event(self) -> ClockEvent:
        return _MortalEvent(self._clock.event(), self)

    def start_thread(self, name: str, target: Callable[[], None]) -> ClockThread:
        def run() -> None:
            with contextlib.suppress(Gone):
                target()

        return self._clock.start_thread(name, run)


__all__ = ["Gone", "Life", "MortalClock"]
