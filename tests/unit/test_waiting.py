"""`eventually`: waits on what another thread signals, or over a bounded number of polls."""

from __future__ import annotations

import threading

import pytest
from waiting import Polls, Ticks, eventually


def test_it_answers_what_the_probe_answers_once_it_answers() -> None:
    # Given a probe that answers on its third ask (None and False are "not yet"; 0 is an answer)
    answers = iter([None, False, 0])

    # When / Then
    assert eventually(lambda: next(answers), "the answer", on=Polls(count=3, interval_seconds=0)) == 0


def test_polls_are_bounded_by_their_count_and_the_failure_says_what_never_happened() -> None:
    asked: list[int] = []

    def never() -> None:
        asked.append(1)

    with pytest.raises(pytest.fail.Exception, match=r"^the file: not after 5 polls, 0 s apart$"):
        eventually(never, "the file", on=Polls(count=5, interval_seconds=0))
    assert len(asked) == 5


def test_ticks_wake_the_wait_when_another_thread_has_done_something() -> None:
    # Given a thread that does its work once the test is waiting, and ticks
    ticks = Ticks("the worker")
    done = threading.Event()
    probed = threading.Event()

    def work() -> None:
        probed.wait()
        done.set()
        ticks.tick()

    worker = threading.Thread(target=work)
    worker.start()

    def finished() -> bool:
        probed.set()
        return done.is_set()

    # When the test waits on the ticks, Then it sees the work once the tick comes
    assert eventually(finished, "the work", on=ticks) is True
    worker.join()


def test_a_tick_during_the_probe_is_not_missed() -> None:
    # Given a probe during which the other thread ticks (after the probe looked)
    ticks = Ticks("the worker")
    answers = iter([None, "done"])

    def probe() -> str | None:
        answer = next(answers)
        ticks.tick()
        return answer

    # Then the wait returns at once and the probe is asked again
    assert eventually(probe, "the work", on=ticks) == "done"
