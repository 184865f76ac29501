"""The in-process Lambdas' environments: a function's variables are seen by its handler, on the thread
that runs it, and by no other thread; nothing in the process's os.environ moves while a handler runs
(botocore iterating it on another thread would raise KeyError if it did)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from spotrelay.local.clock import VirtualClock
from spotrelay.local.lambdas import InProcessLambdas

PROBE = """\
import os


def handler(event, context):
    seen_at_start = dict(os.environ)
    if "running" in event:
        event["running"].set()
        event["may_return"].wait(timeout=60)  # the test sets it; the bound only stops a broken test hanging
    os.environ["WRITTEN_BY_HANDLER"] = context.function_name
    os.environ.pop("PROCESS_VARIABLE", None)
    if "then_invoke" in event:
        runner, function = event["then_invoke"]
        runner.invoke(function, {})
    return {"at_start": seen_at_start, "at_end": dict(os.environ)}
"""

WAIT_SECONDS = 60.0  # a bound on each wait for the handler's thread (never a sleep)


@dataclass
class ProbeFunction:
    """The attributes of moto's LambdaFunction that InProcessLambdas reads."""

    function_name: str
    environment_vars: dict[str, str]
    function_arn: str = ""
    handler: str = "handlers/probe.handler"
    region: str = "eu-west-1"
    memory_size: int = 256
    timeout: int = 30
    version: str = "$LATEST"
    code_sha_256: str = "probe"

    def __post_init__(self) -> None:
        self.function_arn = f"arn:aws:lambda:{self.region}:123456789012:function:{self.function_name}"


@dataclass
class RunningHandler:
    """A handler invoked on its own thread, held inside its invocation until the `with` block ends."""

    running: threading.Event = field(default_factory=threading.Event)
    may_return: threading.Event = field(default_factory=threading.Event)
    answer: list[tuple[str, bool, str]] = field(default_factory=list)

    def seen(self) -> dict[str, dict[str, str]]:
        ((payload, errored, logs),) = self.answer
        assert not errored, logs
        seen: dict[str, dict[str, str]] = json.loads(payload)
        return seen


@pytest.fixture
def lambdas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: VirtualClock) -> InProcessLambdas:
    (tmp_path / "handlers").mkdir()
    (tmp_path / "handlers" / "probe.py").write_text(PROBE)
    # The process's own variables: one any function sees, one that is another function's setting
    monkeypatch.setenv("PROCESS_VARIABLE", "process")
    monkeypatch.setenv("SPOTRELAY_OTHER_FUNCTION_TABLE", "other-table")
    return InProcessLambdas(clock, code_root=tmp_path, overrides={"POWERTOOLS_LOG_LEVEL": "ERROR"})


@contextmanager
def handler_running(lambdas: InProcessLambdas, function: ProbeFunction) -> Iterator[RunningHandler]:
    held = RunningHandler()
    event: dict[str, Any] = {"running": held.running, "may_return": held.may_return}
    thread = threading.Thread(target=lambda: held.answer.append(lambdas.invoke(function, event)))
    thread.start()
    try:
        assert held.running.wait(WAIT_SECONDS), "the handler never started"
        yield held
    finally:
        held.may_return.set()
        thread.join(WAIT_SECONDS)
    assert not thread.is_alive()


PLACE = ProbeFunction("place", {"SPOTRELAY_JOBS_TABLE": "jobs", "GREETING": "hello"})


def test_a_thread_iterating_os_environ_while_a_handler_runs_gets_every_variable_it_started_with(
    lambdas: InProcessLambdas,
) -> None:
    # Given a thread part-way through iterating os.environ (as botocore does when it makes a client)
    before = dict(os.environ)
    items = iter(os.environ.items())
    first = next(items)
    # When a handler starts on another thread, with another function's setting hidden from it
    with handler_running(lambdas, PLACE):
        # Then the iteration carries on over the same variables and values, none missing
        rest = list(items)
    assert dict([first, *rest]) == before


def test_a_handlers_variables_are_seen_on_its_thread_only(lambdas: InProcessLambdas) -> None:
    # Given the process's environment
    before = dict(os.environ)
    # When a handler runs on another thread
    with handler_running(lambdas, PLACE) as held:
        # Then this thread sees the process's environment, unchanged: none of the function's variables,
        # the other function's setting still there
        assert dict(os.environ) == before
        assert os.environ.copy() == before
        assert "SPOTRELAY_JOBS_TABLE" not in os.environ
        assert os.getenv("GREETING") is None
        assert os.environ["SPOTRELAY_OTHER_FUNCTION_TABLE"] == "other-table"
        assert os.environ.get("AWS_LAMBDA_FUNCTION_NAME") is None
    # And the handler saw its own variables and the process's, but not the other function's setting
    seen = held.seen()["at_start"]
    assert (seen["SPOTRELAY_JOBS_TABLE"], seen["GREETING"]) == ("jobs", "hello")
    assert (seen["AWS_LAMBDA_FUNCTION_NAME"], seen["AWS_REGION"], seen["AWS_MAX_ATTEMPTS"]) == (
        "place",
        "eu-west-1",
        "1",
    )
    assert seen["POWERTOOLS_LOG_LEVEL"] == "ERROR"
    assert seen["PROCESS_VARIABLE"] == "process"
    assert "SPOTRELAY_OTHER_FUNCTION_TABLE" not in seen


def test_what_a_handler_writes_to_os_environ_stays_in_its_invocation(lambdas: InProcessLambdas) -> None:
    # Given the process's environment
    before = dict(os.environ)
    # When a handler sets a variable and deletes one of the process's, on another thread
    with handler_running(lambdas, PLACE) as held:
        pass
    # Then the handler saw its own writes
    seen = held.seen()["at_end"]
    assert seen["WRITTEN_BY_HANDLER"] == "place"
    assert "PROCESS_VARIABLE" not in seen
    # And the process's environment is as it was, during and after the invocation
    assert dict(os.environ) == before
    # And the next invocation starts from the process's environment again
    lambdas.invoke(PLACE, {})
    again = lambdas.invocations[-1].result["at_start"]
    assert "WRITTEN_BY_HANDLER" not in again
    assert again["PROCESS_VARIABLE"] == "process"


def test_a_nested_invocation_sees_its_own_environment_and_its_caller_gets_its_own_back(
    lambdas: InProcessLambdas,
) -> None:
    # Given a function that invokes another while it runs (as finalize wakes the dispatcher)
    dispatcher = ProbeFunction("dispatcher", {"SPOTRELAY_QUEUE_URL": "queue"})
    before = dict(os.environ)
    # When the first is invoked
    lambdas.invoke(PLACE, {"then_invoke": (lambdas, dispatcher)})
    # Then the nested one saw its own variables and none of its caller's settings
    outer, inner = lambdas.invocations
    assert (outer.function_name, inner.function_name) == ("place", "dispatcher")
    inner_seen = inner.result["at_start"]
    assert (inner_seen["SPOTRELAY_QUEUE_URL"], inner_seen["AWS_LAMBDA_FUNCTION_NAME"]) == ("queue", "dispatcher")
    assert "SPOTRELAY_JOBS_TABLE" not in inner_seen
    assert "SPOTRELAY_OTHER_FUNCTION_TABLE" not in inner_seen
    # And the caller, after it, saw its own variables again, and not the nested one's
    outer_seen = outer.result["at_end"]
    assert (outer_seen["SPOTRELAY_JOBS_TABLE"], outer_seen["AWS_LAMBDA_FUNCTION_NAME"]) == ("jobs", "place")
    assert "SPOTRELAY_QUEUE_URL" not in outer_seen
    assert outer_seen["WRITTEN_BY_HANDLER"] == "place"  # what the nested one wrote stayed in its invocation
    # And the caller's thread is back to the process's environment
    assert dict(os.environ) == before


COUNTING = """\
from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

metrics = Metrics(namespace="spotrelay-test")


@metrics.log_metrics
def handler(event, context):
    metrics.add_metric(name="Counted", unit=MetricUnit.Count, value=1)
    return {}
"""


def test_quiet_in_process_metrics_never_reach_the_callers_stdout(
    tmp_path: Path, clock: VirtualClock, capfd: pytest.CaptureFixture[str]
) -> None:
    # Given a function that adds one metric per invocation, run quiet (metrics disabled), as the replay runs it
    (tmp_path / "handlers").mkdir()
    (tmp_path / "handlers" / "counting.py").write_text(COUNTING)
    lambdas = InProcessLambdas(clock, code_root=tmp_path, overrides={"POWERTOOLS_METRICS_DISABLED": "true"})
    function = ProbeFunction("counting", {}, handler="handlers/counting.handler")
    capfd.readouterr()
    # When it is invoked more times than an EMF metric set holds values (100)
    answers = [lambdas.invoke(function, {}) for _ in range(150)]
    # Then every invocation succeeded and nothing was printed: each invocation's metric set ended with it
    assert all(not errored for _, errored, _ in answers)
    assert capfd.readouterr().out == ""
