"""The virtual clock, on plain threads standing in for executions: order, causality, events, stalls."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest

from spotrelay.local.clock import ClockStalled, VirtualClock, WallClock

from .conftest import START

Trace = list[tuple[str, float]]


def process(clock: VirtualClock, name: str, body: Callable[[], None]) -> threading.Thread:
    """A process of the clock, started the way the patched ExecutionWorker.start starts one."""
    turn = clock.spawn(name)

    def run() -> None:
        clock.begin(turn)
        try:
            body()
        finally:
            clock.end(turn)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def seconds(clock: VirtualClock) -> float:
    return (clock.now() - START).total_seconds()


def sleeper(clock: VirtualClock, trace: Trace, name: str, *delays: float) -> Callable[[], None]:
    def body() -> None:
        for delay in delays:
            clock.sleep(delay)
            trace.append((name, seconds(clock)))

    return body


def test_wakeups_run_in_time_order_and_in_waiting_order_at_equal_times() -> None:
    # Given three processes sleeping until 10 s, 5 s and 10 s (started in that order)
    clock = VirtualClock(START)
    trace: Trace = []
    for name, delay in (("a", 10), ("b", 5), ("c", 10)):
        process(clock, name, sleeper(clock, trace, name, delay))
    clock.wait_quiescent()
    assert trace == []  # nothing moves until the driver advances time
    # When time advances to 20 s
    clock.advance_to(START + timedelta(seconds=20))
    # Then each ran at its own deadline (never later), the two at 10 s in the order they began waiting
    assert trace == [("b", 5.0), ("a", 10.0), ("c", 10.0)]
    assert clock.now() == START + timedelta(seconds=20)
    assert clock.next_wakeup() is None


def test_the_same_program_gives_the_same_trace() -> None:
    def run() -> Trace:
        clock = VirtualClock(START)
        trace: Trace = []
        for i in range(8):
            process(clock, f"p{i}", sleeper(clock, trace, f"p{i}", (i * 7) % 5, 3, (i * 3) % 4))
        clock.wait_quiescent()
        while clock.advance_to_next_wakeup() is not None:
            pass
        return trace

    first = run()
    assert len(first) == 24
    assert [run() for _ in range(3)] == [first] * 3


def test_advance_to_next_wakeup_stops_at_each_deadline() -> None:
    clock = VirtualClock(START)
    trace: Trace = []
    process(clock, "a", sleeper(clock, trace, "a", 30, 30))
    clock.wait_quiescent()
    assert clock.advance_to_next_wakeup() == START + timedelta(seconds=30)
    assert trace == [("a", 30.0)]
    assert clock.advance_to_next_wakeup(limit=START + timedelta(seconds=45)) is None  # 60 s is beyond the limit
    assert clock.advance_to_next_wakeup() == START + timedelta(seconds=60)
    assert clock.advance_to_next_wakeup() is None


def test_an_event_wakes_its_waiters_in_waiting_order_and_a_timeout_is_virtual() -> None:
    clock = VirtualClock(START)
    event = clock.event()
    outcomes: list[tuple[str, bool, float]] = []

    def waiter(name: str, timeout: float | None) -> Callable[[], None]:
        def body() -> None:
            fired = event.wait(timeout)
            outcomes.append((name, fired, seconds(clock)))

        return body

    process(clock, "first", waiter("first", None))
    process(clock, "second", waiter("second", 60))
    process(clock, "third", waiter("third", 5))
    clock.wait_quiescent()
    # When 5 s pass, Then only the waiter with the 5 s timeout returns (False: it timed out)
    clock.advance_to(START + timedelta(seconds=10))
    assert outcomes == [("third", False, 5.0)]
    # When the driver sets the event, Then the others return True, in the order they began waiting
    event.set()
    clock.wait_quiescent()
    assert outcomes[1:] == [("first", True, 10.0), ("second", True, 10.0)]
    assert event.wait(0) is True  # set: no wait


def test_what_the_driver_wakes_inside_exclusive_runs_after_it() -> None:
    clock = VirtualClock(START)
    event = clock.event()
    trace: list[str] = []

    def waiter() -> None:
        event.wait()
        trace.append("woke")

    process(clock, "waiter", waiter)
    clock.wait_quiescent()
    with clock.exclusive():
        event.set()
        trace.append("driver done")
        assert not clock.quiescent  # the driver holds the baton
    clock.wait_quiescent()
    assert trace == ["driver done", "woke"]


def test_a_process_blocked_outside_the_clock_is_reported_not_waited_for_forever() -> None:
    clock = VirtualClock(START)
    outside = threading.Event()

    def stuck() -> None:
        outside.wait()  # blocks on something the clock does not know

    process(clock, "stuck", stuck)
    with pytest.raises(ClockStalled, match="stuck"):
        clock.wait_quiescent(timeout=0.05)
    with pytest.raises(ClockStalled):
        clock.advance_to(START + timedelta(seconds=1), timeout=0.05)
    outside.set()
    clock.wait_quiescent()
    assert clock.quiescent


def test_time_does_not_go_back() -> None:
    clock = VirtualClock(START)
    clock.advance_to(START + timedelta(hours=1))
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance_to(START)


def test_a_closed_clock_wakes_nobody() -> None:
    clock = VirtualClock(START)
    trace: Trace = []
    process(clock, "a", sleeper(clock, trace, "a", 1))
    clock.wait_quiescent()
    clock.close()
    event = clock.event()
    event.set()  # nothing to wake, nothing runs
    assert trace == []


def test_a_thread_process_whose_cleanup_waits_on_the_clock_ends_when_the_clock_closes() -> None:
    # Given a start_thread process (an agent) that, as it ends, waits on the clock once more: the join of
    # its heartbeat thread in its `finally`, on an event nobody will set
    clock = VirtualClock(START)
    cleanup_began = threading.Event()
    never = clock.event()

    def agent() -> None:
        try:
            clock.sleep(60)
        finally:
            cleanup_began.set()
            never.wait(timeout=30)

    with clock.exclusive():
        process_thread = clock.start_thread("agent", agent)
    clock.advance_by(10)
    # When the clock closes while it sleeps
    clock.close()
    # Then its cleanup ran and its thread ended: its last wait did not park it for a baton nobody gives
    # (close would have waited out its join bound, and left the thread behind)
    assert cleanup_began.is_set()
    assert not process_thread._thread.is_alive()


def test_the_wall_clock_runs_at_its_speed() -> None:
    clock = WallClock(START, speed=1000.0)
    event = clock.event()
    event.set()
    assert clock.sleep_until(START + timedelta(hours=1), interrupt=event) is True  # interrupted at once
    before = clock.now()
    clock.sleep(5)  # 5 simulated seconds: 5 ms
    assert clock.now() - before >= timedelta(seconds=5)
    assert clock.now() < START + timedelta(hours=1)
