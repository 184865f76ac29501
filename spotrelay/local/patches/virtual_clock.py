"""The virtual clock in moto's Step Functions (see `spotrelay.local.clock`): an execution is a process of the
clock, and its Wait states, Retry intervals, task tokens' heartbeats and timeouts wait on the clock.
Siblings: `sqs_clock` puts SQS on the same clock; `installation` runs the patches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, timedelta
from types import ModuleType
from typing import Any

from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import FailureEventException
from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
from moto.stepfunctions.parser.asl.component.state.wait.wait_function.timestamp import Timestamp
from moto.stepfunctions.parser.asl.component.state.wait.wait_function.wait_function import WaitFunction
from moto.stepfunctions.parser.asl.eval import environment as sfn_environment
from moto.stepfunctions.parser.asl.eval.callback import callback
from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker

from spotrelay.local.clock import SimulationClock
from spotrelay.local.patches.canaries import Expected
from spotrelay.local.patches.installation import _Patcher

_SFN_ENV = "moto.stepfunctions.parser.asl.eval.environment.Environment"


# (EXPECTED, which the package assembles, lists the canaries of every module in the order they were written:
# this module's are in two groups only to keep that order)

EXPECTED_EXECUTIONS: tuple[Expected, ...] = (
    Expected(
        ExecutionWorker,
        "start",
        "(self)",
        ("execution_logic_thread = Thread(target=self._execution_logic, daemon=True)",),
    ),
    Expected(ExecutionWorker, "_execution_logic", "(self)"),
)

EXPECTED_WAITS: tuple[Expected, ...] = (
    Expected(
        WaitFunction,
        "_wait_interval",
        f"(self, env: {_SFN_ENV}, wait_seconds: int) -> None",
        ("env.program_state_event.wait(wait_seconds)",),
    ),
    Expected(
        Timestamp,
        "_get_wait_seconds",
        f"(self, env: {_SFN_ENV}) -> int",
        ("delta = timestamp - datetime.datetime.now()",),
    ),
    Expected(
        retrier_decl.RetrierDecl,
        "_eval_body",
        "(self, env: 'Environment') -> 'None'",
        ("time.sleep(interval_seconds)",),
    ),
    Expected(retrier_decl, "time", None),
    Expected(
        callback.HeartbeatEndpoint,
        "clear_and_wait",
        "(self) -> bool",
        ("return self._next_heartbeat_event.wait(timeout=self._heartbeat_seconds)",),
    ),
    Expected(
        callback.CallbackEndpoint,
        "wait",
        "(self, timeout: float | None = None) -> "
        "moto.stepfunctions.parser.asl.eval.callback.callback.CallbackOutcome | None",
        ("self._notify_event.wait(timeout=timeout)",),
    ),
    Expected(callback.CallbackEndpoint, "__init__", "(self, callback_id: str)", ("self._notify_event = Event()",)),
    Expected(
        callback.HeartbeatEndpoint,
        "__init__",
        "(self, heartbeat_seconds: int)",
        ("self._next_heartbeat_event = Event()",),
    ),
    Expected(callback, "Event", None),
    Expected(
        sfn_environment.Environment,
        "__init__",
        "(self, aws_execution_details: 'AWSExecutionDetails', execution_type: 'StateMachineType', "
        "context: 'ContextObjectData', event_history_context: 'EventHistoryContext', "
        "cloud_watch_logging_session: 'CloudWatchLoggingSession | None', activity_store: 'dict[Arn, Activity]', "
        "variable_store: 'VariableStore | None' = None, mock_test_case: 'MockTestCase | None' = None)",
        ("self.program_state_event = threading.Event()",),
    ),
)


# --- the virtual clock ---------------------------------------------------------------------------------


def _patch_clock(patcher: _Patcher, clock: SimulationClock) -> None:
    original_start: Callable[[ExecutionWorker], None] = patcher.original(ExecutionWorker, "start")

    def start(self: ExecutionWorker) -> None:
        name = self._evaluation_details.execution_details.arn
        process = clock.spawn(str(name))
        logic: Callable[[], None] = self._execution_logic

        def run_on_clock() -> None:
            clock.begin(process)
            try:
                logic()
            finally:
                clock.end(process)

        self._execution_logic = run_on_clock  # type: ignore[method-assign]
        try:
            original_start(self)
        except BaseException:
            clock.end(process)
            raise

    patcher.replace(ExecutionWorker, "start", start)

    def _is_clock_event(value: Any) -> bool:
        return not isinstance(value, threading.Event)

    def _wait_interval(self: WaitFunction, env: Any, wait_seconds: int) -> None:
        if wait_seconds <= 0:
            return
        deadline = clock.now() + timedelta(seconds=wait_seconds)
        interrupt = env.program_state_event if _is_clock_event(env.program_state_event) else None
        while env.is_running() and clock.now() < deadline:
            clock.sleep_until(deadline, interrupt=interrupt)

    patcher.replace(WaitFunction, "_wait_interval", _wait_interval)

    def _get_wait_seconds(self: Timestamp, env: Any) -> int:
        self.string.eval(env=env)
        timestamp_str: str = env.stack.pop()
        timestamp = self._from_timestamp_string(timestamp=timestamp_str)
        if timestamp is None:
            raise FailureEventException(self._create_failure_event(env, timestamp_str))
        return int((timestamp.replace(tzinfo=UTC) - clock.now()).total_seconds())

    patcher.replace(Timestamp, "_get_wait_seconds", _get_wait_seconds)

    patcher.replace(retrier_decl, "time", _ClockTime(time, clock))

    def make_event() -> Any:
        return clock.event()

    patcher.replace(callback, "Event", make_event)

    original_init: Callable[..., None] = patcher.original(sfn_environment.Environment, "__init__")

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.program_state_event = clock.event()

    patcher.replace(sfn_environment.Environment, "__init__", __init__)


class _ClockTime:
    """Stands in for the `time` module in retrier_decl: `sleep` sleeps on the clock."""

    def __init__(self, real: ModuleType, clock: SimulationClock) -> None:
        self._real = real
        self._clock = clock

    def sleep(self, seconds: float) -> None:
        self._clock.sleep(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)
