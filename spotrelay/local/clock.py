"""Time for the local runtime: a deterministic virtual clock that the replay drives, and a scaled
wall clock for `spotrelay local up`.

The model (VirtualClock)
------------------------
Every Step Functions execution moto runs is a *process* of the clock, and so is every thread started
with `start_thread` (each simulated instance's agent, its heartbeat and checkpoint threads, its job).
A process holds the clock's single *baton* while it runs; at most one process runs at a time. A
process gives the baton back only when it blocks on the clock:

- `sleep_until(t)` / `sleep(seconds)`: a Wait state, a Retry interval;
- `ClockEvent.wait(timeout)`: a task token (`.waitForTaskToken`), its HeartbeatSeconds or TimeoutSeconds;

or when it ends. The baton then goes to the next *ready* process, in a fixed order: processes are
queued when they are started (in start order), when their event fires (in the order they began
waiting), or when virtual time reaches their deadline (by deadline, then by the order they began
waiting). So for a given sequence of driver actions the interleaving is always the same.

Virtual time moves only when the driver says so, and only when the system is *quiescent*: no process
holds the baton (every one is blocked on the clock, or done). `advance_to(t)` visits every wake-up
time up to `t` in order, sets `now()` to it, lets the processes due then run until quiescent, and
finally stops at `t`. So a sleeper never sees a later `now()` than its deadline.

The driver (the replay, a test) works between quiescent points: `wait_quiescent()` returns once
nothing runs any more (a bounded, real-time wait on a Condition: `ClockStalled` if a process neither
blocks nor ends in time), `exclusive()` holds the baton while the driver injects something (what it
wakes queues up and runs when the driver lets go), `next_wakeup()` / `advance_to_next_wakeup()`.

Limits
------
- Only the clock's processes may block on it: the executions' threads (the patches make sure moto's
  do) and threads of `start_thread`. The driver and other threads must never call `sleep_until` or
  wait on a ClockEvent. It implements spotrelay.clock.WaitingClock (`monotonic()` counts virtual
  seconds since the epoch), so the worker agent runs on it unchanged.
- A process that blocks on anything else (a lock, a real sleep, a socket) keeps the baton: the
  clock cannot move until it returns (`wait_quiescent` says which process, after its timeout).
- Inside one execution, moto runs each state on helper threads that join each other; the baton
  belongs to the execution, not to a thread, so this is safe as long as one execution never runs
  two branches at once: Parallel and Map states are not supported on the virtual clock.
- Lambda invocations (in-process, synchronous) run under the baton of the execution that makes them,
  or in the driver's thread; an asynchronous (`Event`) invocation runs synchronously too (moto does so).
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Protocol

from spotrelay.clock import ClockEvent, SystemThread

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CLOSE_JOIN_SECONDS = 30.0  # real seconds close() waits for each process thread to end (a hang guard)
DEFAULT_STALL_SECONDS = 180.0
"""How long (real seconds) the driver waits for quiescence before it reports a stall: a deadlock
detector, generous because a step of a big replay on a loaded 2-core machine (the full test suite on
two workers) has taken over 30 s."""


class ClockStalled(RuntimeError):
    """A process kept the baton longer than the driver's bound: it is blocked outside the clock."""


class ClockClosed(RuntimeError):
    """The clock was closed: nothing runs on it any more."""


class ProcessEnded(BaseException):
    """Raised in a `start_thread` process blocked on a clock that is closed, so that its thread ends
    (a BaseException: the process's own `except Exception` must not take it for an error of its own)."""


def _span(seconds: float) -> timedelta:
    """A wait of `seconds`, rounded up to the clock's microsecond: a wait of a fraction of one is one,
    never none (a waiter that computed a tiny remainder from monotonic() would otherwise spin)."""
    value = max(0.0, float(seconds))
    return timedelta(microseconds=math.ceil(value * 1e6)) if value > 0 else timedelta(0)


def _aware(when: datetime) -> datetime:
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"an aware datetime is needed, got {when.isoformat()}")
    return when.astimezone(UTC)


# ------------------------------------------------------------------------------------------- contract


class SimulationClock(Protocol):
    """What the moto patches and the in-process Lambda functions need of a clock."""

    def now(self) -> datetime: ...

    def sleep(self, seconds: float) -> None: ...

    def sleep_until(self, when: datetime, *, interrupt: ClockEvent | None = None) -> bool: ...

    def event(self) -> ClockEvent: ...

    def spawn(self, name: str) -> object: ...

    def begin(self, process: object) -> None: ...

    def end(self, process: object) -> None: ...


# ------------------------------------------------------------------------------------- virtual clock

_SLEEPING, _READY, _RUNNING, _DONE = "sleeping", "ready", "running", "done"


class _Turn:
    """One claim on the baton: a process waiting to start, or blocked in one wait."""

    __slots__ = ("closable", "deadline", "event", "fired", "name", "seq", "state", "wakeup")

    def __init__(self, seq: int, name: str, state: str, deadline: datetime | None = None) -> None:
        self.wakeup: threading.Condition | None = None  # its thread waits on this for the baton
        self.closable = False  # a start_thread process: its thread ends when the clock closes
        self.seq = seq
        self.name = name
        self.state = state
        self.deadline = deadline
        self.fired = False
        self.event: VirtualEvent | None = None

    def __repr__(self) -> str:
        until = f" until {self.deadline.isoformat()}" if self.deadline is not None else ""
        return f"<{self.name} #{self.seq} {self.state}{until}>"


class VirtualEvent:
    """`threading.Event` on a VirtualClock: `wait(timeout)` counts the timeout in virtual seconds and
    gives the baton back while it waits; `set()` makes the waiters ready (they run in waiting order)."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._flag = False
        self._waiters: list[_Turn] = []

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._clock._fire(self)

    def clear(self) -> None:
        with self._clock._cond:
            self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else self._clock.now() + _span(timeout)
        return self._clock._block(name="event", deadline=deadline, event=self)


class VirtualClock:
    """A deterministic virtual clock (see the module docstring for the model and its limits)."""

    def __init__(self, start: datetime, *, stall_seconds: float = DEFAULT_STALL_SECONDS) -> None:
        self._now = _aware(start)
        self.stall_seconds = stall_seconds
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # the driver waits on it for quiescence
        self._seq = itertools.count()
        self._sleepers: list[tuple[datetime, int, _Turn]] = []  # heap by (deadline, seq)
        self._ready: deque[_Turn] = deque()
        self._holder: _Turn | None = None
        self._driver = _Turn(-1, "driver", _RUNNING)
        self._closed = False
        self._parked: set[_Turn] = set()  # turns whose threads wait for the baton
        self._threads: list[threading.Thread] = []  # the start_thread processes' threads
        self._closable_threads: set[int] = set()  # their idents, while they run (ProcessEnded at close)
        self.wakeups = 0  # turns granted so far (a measure of work, for benchmarks)

    # --- reading -----------------------------------------------------------------------------------

    def now(self) -> datetime:
        return self._now

    def event(self) -> VirtualEvent:
        return VirtualEvent(self)

    def monotonic(self) -> float:
        """Virtual seconds since the epoch: they move only as the clock does (spotrelay.clock.WaitingClock)."""
        return (self._now - _EPOCH).total_seconds()

    def start_thread(self, name: str, target: Callable[[], None]) -> ClockProcessThread:
        """Run `target` on a new thread that is a process of this clock: it starts when it is given the
        baton (in start order) and may wait on the clock like an execution. Called by a process that
        holds the baton, or by the driver inside `exclusive()`."""
        return ClockProcessThread(self, name, target)

    # --- processes (the moto patches call these) ---------------------------------------------------

    def spawn(self, name: str, *, closable: bool = False) -> _Turn:
        """Queue a new process (called by whoever starts it, before its thread starts). A `closable`
        one's thread ends (ProcessEnded) when the clock closes, instead of staying parked."""
        with self._cond:
            turn = _Turn(next(self._seq), name, _READY)
            turn.closable = closable
            self._ready.append(turn)
            self._grant()
            return turn

    def begin(self, process: object) -> None:
        """Block the process's thread until it holds the baton."""
        assert isinstance(process, _Turn)
        with self._cond:
            self._await_turn(process)

    def end(self, process: object) -> None:
        """The process is done (called by its own thread, the one running): the baton goes to the next.
        A process that never began (its thread failed to start) is just dropped from the queue."""
        assert isinstance(process, _Turn)
        with self._cond:
            began = process.state == _RUNNING
            process.state = _DONE
            if self._holder is process or (began and self._holder is not self._driver):
                self._holder = None  # a process that began holds the baton through its latest turn
            self._grant()

    def sleep(self, seconds: float) -> None:
        self.sleep_until(self.now() + _span(seconds))

    def sleep_until(self, when: datetime, *, interrupt: ClockEvent | None = None) -> bool:
        """Block until virtual time reaches `when`, or `interrupt` (a VirtualEvent of this clock) is set.
        Returns True if it was interrupted."""
        event = interrupt if isinstance(interrupt, VirtualEvent) else None
        if interrupt is not None and event is None:
            raise TypeError("interrupt must be an event of this clock")
        return self._block(name="sleep", deadline=_aware(when), event=event)

    # --- driver ------------------------------------------------------------------------------------

    @property
    def quiescent(self) -> bool:
        with self._cond:
            return self._holder is None

    def wait_quiescent(self, timeout: float | None = None) -> None:
        """Return once no process runs (all are blocked on the clock or done); ClockStalled after
        `timeout` real seconds (default `stall_seconds`)."""
        bound = self.stall_seconds if timeout is None else timeout
        with self._cond:
            if not self._cond.wait_for(lambda: self._holder is None or self._closed, timeout=bound):
                raise ClockStalled(
                    f"{self._holder!r} still runs after {bound:g} s at {self._now.isoformat()}: it is blocked "
                    f"outside the clock (a lock, a real sleep, a Parallel/Map state?); ready: {list(self._ready)}"
                )
            if self._closed:
                raise ClockClosed("the clock is closed")

    run_until_idle = wait_quiescent

    def next_wakeup(self) -> datetime | None:
        """The earliest deadline of a blocked process (None if none has one)."""
        with self._cond:
            self._drop_stale_sleepers()
            return self._sleepers[0][0] if self._sleepers else None

    def pending(self) -> list[str]:
        """The blocked processes, for diagnostics: `<name #seq state until ...>`."""
        with self._cond:
            return [repr(turn) for _, _, turn in sorted(self._sleepers) if turn.state == _SLEEPING]

    def advance_to(self, when: datetime, *, timeout: float | None = None) -> None:
        """Run the system up to `when`: visit every wake-up time <= `when` in order (now() = that time,
        the processes due then run until quiescent), then set now() to `when`."""
        target = _aware(when)
        if target < self._now:
            raise ValueError(f"time cannot go back: now {self._now.isoformat()}, asked {target.isoformat()}")
        self.wait_quiescent(timeout)
        while True:
            with self._cond:
                self._drop_stale_sleepers()
                if not self._sleepers or self._sleepers[0][0] > target:
                    self._now = target
                    return
                due = self._sleepers[0][0]
                self._now = max(self._now, due)
                while self._sleepers and self._sleepers[0][0] <= due:
                    _, _, turn = heapq.heappop(self._sleepers)
                    if turn.state == _SLEEPING:
                        self._make_ready(turn)
                self._grant()
            self.wait_quiescent(timeout)

    def advance_by(self, delta: timedelta | float, *, timeout: float | None = None) -> None:
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=float(delta))
        self.advance_to(self._now + step, timeout=timeout)

    def advance_to_next_wakeup(self, *, limit: datetime | None = None, timeout: float | None = None) -> datetime | None:
        """Advance to the next deadline (not beyond `limit`) and run what is due; returns the new now,
        or None if nothing is scheduled (before `limit`)."""
        self.wait_quiescent(timeout)
        nxt = self.next_wakeup()
        if nxt is None or (limit is not None and nxt > _aware(limit)):
            return None
        self.advance_to(nxt, timeout=timeout)
        return nxt

    @contextmanager
    def exclusive(self, timeout: float | None = None) -> Iterator[None]:
        """Hold the baton while the driver acts (once quiescent): whatever it wakes runs afterwards,
        in order, instead of racing with it."""
        self.wait_quiescent(timeout)
        with self._cond:
            self._holder = self._driver
        try:
            yield
        finally:
            with self._cond:
                if self._holder is self._driver:
                    self._holder = None
                self._grant()

    def close(self) -> None:
        """Stop the simulation: no blocked process is ever woken again. The threads of executions stay
        parked; those of `start_thread` end (ProcessEnded), so that replays leave no threads behind."""
        with self._cond:
            self._closed = True
            for turn in list(self._parked):
                if turn.closable and turn.wakeup is not None:
                    turn.wakeup.notify()
            self._cond.notify_all()
            threads, self._threads = self._threads, []
        for thread in threads:  # they end at once; the bound only guards against a thread stuck elsewhere
            if thread is not threading.current_thread():
                thread.join(CLOSE_JOIN_SECONDS)

    # --- internals (called with or without the lock as noted) --------------------------------------

    def _block(self, *, name: str, deadline: datetime | None, event: VirtualEvent | None) -> bool:
        """The calling process gives the baton back until `deadline` or `event`; True if the event fired."""
        with self._cond:
            # A start_thread process ends at any wait once the clock is closed, the waits of the cleanup
            # it runs as it ends included (a `finally` that joins its other threads): such a wait would
            # otherwise park for good, and `close` would wait out its join bound for the thread
            closable = threading.get_ident() in self._closable_threads
            if self._closed and closable:
                raise ProcessEnded
            if event is not None and event._flag:
                return True
            if deadline is not None and deadline <= self._now:
                return False
            turn = _Turn(next(self._seq), name, _SLEEPING, deadline)
            turn.closable = closable
            if event is not None:
                turn.event = event
                event._waiters.append(turn)
            if deadline is not None:
                heapq.heappush(self._sleepers, (deadline, turn.seq, turn))
            # The caller is the running process: its baton goes to the next ready one.
            self._holder = None
            self._grant()
            self._await_turn(turn)
            if event is not None and turn in event._waiters:
                event._waiters.remove(turn)
            return turn.fired

    def _await_turn(self, turn: _Turn) -> None:
        # Called with the lock held. A closed clock never grants: the thread stays parked. Each turn
        # waits on a condition of its own (on the clock's lock): a grant wakes the one thread it is for,
        # not every parked one.
        if self._holder is not turn:
            turn.wakeup = threading.Condition(self._lock)
            self._parked.add(turn)
            try:
                while self._holder is not turn:
                    if self._closed and turn.closable:
                        raise ProcessEnded
                    turn.wakeup.wait()
            finally:
                self._parked.discard(turn)
        turn.state = _RUNNING

    def _fire(self, event: VirtualEvent) -> None:
        with self._cond:
            event._flag = True
            waiters, event._waiters = event._waiters, []
            for turn in sorted(waiters, key=lambda t: t.seq):
                if turn.state == _SLEEPING:
                    turn.fired = True
                    self._make_ready(turn)
            self._grant()

    def _make_ready(self, turn: _Turn) -> None:
        turn.state = _READY
        self._ready.append(turn)

    def _grant(self) -> None:
        # Called with the lock held: the baton to the next ready turn (its thread alone is woken), or,
        # with none ready, the driver is told the clock is quiescent.
        if self._holder is None and not self._closed:
            while self._ready:
                turn = self._ready.popleft()
                if turn.state == _READY:
                    self._holder = turn
                    self.wakeups += 1
                    if turn.wakeup is not None:
                        turn.wakeup.notify()
                    break
        if self._holder is None or self._closed:
            self._cond.notify_all()

    def _drop_stale_sleepers(self) -> None:
        while self._sleepers and self._sleepers[0][2].state != _SLEEPING:
            heapq.heappop(self._sleepers)


class ClockProcessThread:
    """A thread that runs as a process of a VirtualClock (`VirtualClock.start_thread`). `join(timeout)`
    waits on the clock, so only another process of the clock may join it."""

    def __init__(self, clock: VirtualClock, name: str, target: Callable[[], None]) -> None:
        self._done = clock.event()
        self._name = name
        turn = clock.spawn(name, closable=True)

        def run() -> None:
            ident = threading.get_ident()
            with clock._cond:
                clock._closable_threads.add(ident)
            try:
                clock.begin(turn)
                try:
                    target()
                finally:
                    self._done.set()
                    clock.end(turn)
            except ProcessEnded:
                pass  # the clock closed while it waited: the simulation is over
            finally:
                with clock._cond:
                    clock._closable_threads.discard(ident)

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        with clock._cond:
            clock._threads = [t for t in clock._threads if t.is_alive()] + [self._thread]
        self._thread.start()

    @property
    def name(self) -> str:
        return self._name

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is threading.current_thread():
            return False  # a thread never waits for itself
        return self._done.wait(timeout)


# ---------------------------------------------------------------------------------- scaled wall clock


class WallEvent:
    """`threading.Event` whose timeouts are in simulated seconds of a WallClock."""

    def __init__(self, clock: WallClock) -> None:
        self._clock = clock
        self._event = threading.Event()

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def wait(self, timeout: float | None = None) -> bool:
        fired = self._event.wait(None if timeout is None else max(0.0, float(timeout)) / self._clock.speed)
        self._clock._park_if_closed()
        return fired


class WallClock:
    """Simulated time that follows the wall clock, `speed` times faster, from `start` (default: now).
    For a long-running local stack (`spotrelay local up`): nothing drives it, waits are real waits."""

    def __init__(self, start: datetime | None = None, *, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self._start = _aware(start) if start is not None else datetime.now(UTC)
        self._t0 = time.monotonic()
        self.speed = speed
        self._closed = threading.Event()
        self._never = threading.Event()

    def now(self) -> datetime:
        return self._start + timedelta(seconds=(time.monotonic() - self._t0) * self.speed)

    def event(self) -> WallEvent:
        return WallEvent(self)

    def monotonic(self) -> float:
        return (self.now() - _EPOCH).total_seconds()

    def start_thread(self, name: str, target: Callable[[], None]) -> SystemThread:
        return SystemThread(name, target)

    def sleep(self, seconds: float) -> None:
        self.sleep_until(self.now() + timedelta(seconds=max(0.0, float(seconds))))

    def sleep_until(self, when: datetime, *, interrupt: ClockEvent | None = None) -> bool:
        deadline = _aware(when)
        while (remaining := (deadline - self.now()).total_seconds()) > 0:
            if interrupt is not None:
                if interrupt.wait(remaining):
                    return True
            else:
                self._closed.wait(remaining / self.speed)
                self._park_if_closed()
        return bool(interrupt is not None and interrupt.is_set())

    def close(self) -> None:
        """Stop the simulation: a thread that wakes from a wait from now on stays parked."""
        self._closed.set()

    def _park_if_closed(self) -> None:
        if self._closed.is_set():
            self._never.wait()

    def spawn(self, name: str) -> object:
        return name

    def begin(self, process: object) -> None:
        return None

    def end(self, process: object) -> None:
        return None
