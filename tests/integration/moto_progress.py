"""Waiting for what moto's Step Functions threads do: on a condition they signal, never on the clock.

moto runs each execution on threads of its own (`execute_state_machine`). A test that needs what an
execution does next (the task token its Run state sends to SQS, the status it ends in) calls
`eventually(probe, what, on=MOTO_PROGRESS)` (tests/waiting.py), which looks again each time moto has done
something a test may wait for (a tick, hooked into moto by the `aws` fixture), never after so many
milliseconds.
"""

from __future__ import annotations

from typing import Any

import pytest
from waiting import Ticks


class MotoProgress(Ticks):
    """Counts what moto's Step Functions has done: an execution ended, a message sent to SQS."""

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


MOTO_PROGRESS = MotoProgress("moto")
