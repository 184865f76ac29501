"""The one definition of time in spotrelay: the `Clock` port, and the system clock that implements it.

Every "now", wait, poll and timeout in the control plane and the worker agent goes through a clock:

- `Clock.now()` is all the control plane needs (a Lambda step reads the time; Step Functions waits);
- `WaitingClock` is what the agent needs besides: `monotonic()` for deadlines and intervals, `sleep()`,
  `event()` (a `threading.Event` whose `wait(timeout)` counts on this clock) and `start_thread()` (a
  thread that may wait on it).

On AWS both are `SystemClock` (the wall clock, real threads). The local runtime passes its
`VirtualClock` (spotrelay.local.clock), which implements the same port on simulated time: there the
agent's loop, its heartbeat and checkpoint threads and the simulated job are processes of the virtual
clock, so a replay runs the real `Agent.run` hours ahead of real time, the same way for a given seed.

What stays on the real clock on purpose: the checkpointer's `time.time_ns()` next to file mtimes (the
kernel stamps mtimes from the real clock, so "was this file written after the scan" must compare with
it), and the job supervisor (`spotrelay.agent.supervise`), which runs beside a real job process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol


class ClockEvent(Protocol):
    """What the agent uses of `threading.Event`; `wait(timeout)` counts the timeout on its clock."""

    def is_set(self) -> bool: ...

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class ClockThread(Protocol):
    """A thread started by a clock: `join(timeout)` waits on that clock; True once the thread ended."""

    @property
    def name(self) -> str: ...

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> bool: ...


class Clock(Protocol):
    """Wall time, for whoever only reads it (the control plane's steps, the store's TTLs)."""

    def now(self) -> datetime: ...


class WaitingClock(Clock, Protocol):
    """Time for whoever also waits on it (the worker agent)."""

    def monotonic(self) -> float:
        """Seconds that only move forward, for deadlines and intervals (not a date)."""
        ...

    def sleep(self, seconds: float) -> None: ...

    def event(self) -> ClockEvent: ...

    def start_thread(self, name: str, target: Callable[[], None]) -> ClockThread:
        """Start `target` on a thread that may wait on this clock (a daemon thread)."""
        ...


class SystemThread:
    def __init__(self, name: str, target: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()

    @property
    def name(self) -> str:
        return self._thread.name

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return not self._thread.is_alive()


class SystemClock:
    """The wall clock and real threads: what runs on AWS."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def event(self) -> ClockEvent:
        return threading.Event()

    def start_thread(self, name: str, target: Callable[[], None]) -> ClockThread:
        return SystemThread(name, target)


SYSTEM_CLOCK = SystemClock()
