"""Waiting for what moto's Step Functions threads do: on a condition they signal, never on the clock.

moto runs each execution on threads of its own (`execute_state_machine`). A test that needs what an
execution does next (the task token its Run state sends to SQS, the status it ends in) calls
`MOTO_PROGRESS.until(probe, what)`, which looks again each time moto has done something a test may wait
for (`MotoProgress.tick`, hooked into moto by the `aws` fixture), never after so many milliseconds, and
needs no deadline but a guard against a hang.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

# Against a hang only (the threads' GIL share on a loaded 2-core runner is no reason to fail): a wait that
# reaches it has failed, whatever the machine.
HANG_GUARD_SECONDS = 120.0


class MotoProgress:
    """Counts what moto's Step Functions has done: an execution ended, a message sent to SQS."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._ticks = 0

    def tick(self) -> None:
        with self._changed:
            self._ticks += 1
            self._changed.notify_all()

    def until(self, probe: Callable[[], T | None], what: str) -> T:
        """`probe()` once it answers, asked again after each tick; fail saying what never happened."""
        while True:
            with self._changed:
                seen = self._ticks  # read before the probe: a tick during it makes the wait return at once
            value = probe()
            if value is not None:
                return value
            if not self._wait_past(seen):
                pytest.fail(f"{what}: moto did nothing more in {HANG_GUARD_SECONDS:.0f} s")

    def _wait_past(self, seen: int) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self._ticks != seen, timeout=HANG_GUARD_SECONDS)

    def hook_into_moto(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Tick when an execution has ended (moto has set its status) and when a message is in an SQS queue
        (the Run state's task token); undone with `monkeypatch`."""
        from moto.sqs.models import SQSBackend
        from moto.stepfunctions.parser.backend.execution import BaseExecutionWorkerCommunication

        terminated = BaseExecutionWorkerCommunication.terminated
        send_message = SQSBackend.send_message

        def terminated_then_tick(communication: Any) -> None:
            try:
                terminated(communication)
            finally:
                self.tick()

        def send_message_then_tick(backend: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return send_message(backend, *args, **kwargs)
            finally:
                self.tick()

        monkeypatch.setattr(BaseExecutionWorkerCommunication, "terminated", terminated_then_tick)
        monkeypatch.setattr(SQSBackend, "send_message", send_message_then_tick)


MOTO_PROGRESS = MotoProgress()
