"""`spotrelay logs --follow` against a scripted stack: when it stops, what it prints, what it survives.
Time is the test's: sleeps return at once and the monotonic clock moves by the poll interval."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from spotrelay.aws.deployed_stack import UNAVAILABLE, LogLine, StackError
from spotrelay.cli import app, job_logs
from spotrelay.models import JobState

STREAM_1, STREAM_2 = "train-1/00001", "train-1/00002"


def line(n: int, stream: str, message: str, **extra: Any) -> LogLine:
    record = {"time": f"2026-11-30T12:00:{n:02d}.000Z", "message": message, "attempt": int(stream[-1]), **extra}
    return LogLine(event_id=f"e{n}", timestamp_ms=1_000 * n, stream=stream, record=record)


def output(n: int, stream: str, text: str) -> LogLine:
    return line(n, stream, "job output", line=text)


@dataclass
class Job:
    state: JobState

    @property
    def job(self) -> Job:
        return self


@dataclass
class ScriptedStack:
    """Poll k sees states[k] and the lines shipped by then (CloudWatch returns everything since `since_ms`)."""

    states: list[JobState]
    shipped: list[list[LogLine]]
    errors: dict[int, StackError] = field(default_factory=dict)
    polls: int = 0

    def status(self, job_id: str) -> Job:
        k = min(self.polls, len(self.states) - 1)
        if k in self.errors:
            self.polls += 1
            raise self.errors.pop(k)
        return Job(self.states[k])

    def log_lines(self, job_id: str, *, attempt: int | None = None, since_ms: int | None = None) -> list[LogLine]:
        k = min(self.polls, len(self.shipped) - 1)
        self.polls += 1
        return [x for batch in self.shipped[: k + 1] for x in batch if since_ms is None or x.timestamp_ms >= since_ms]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The command's clock (`command_clock()`), moved on by its own sleeps only."""
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    scripted = SimpleNamespace(sleep=sleep, monotonic=lambda: now[0])
    monkeypatch.setattr(job_logs, "command_clock", lambda: scripted)
    return now


def follow(monkeypatch: pytest.MonkeyPatch, stack: ScriptedStack, *args: str) -> Any:
    monkeypatch.setattr(job_logs, "connect", lambda *a: stack)
    return CliRunner().invoke(app, ["logs", "train-1", "--follow", *args])


def test_a_job_that_ends_while_followed_is_followed_to_its_agents_last_line(
    monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    # Given a running job whose output comes in batches; it ends, and its agent's last batch comes after
    running, done = JobState.RUNNING, JobState.SUCCEEDED
    stack = ScriptedStack(
        states=[running, running, done, done, done],
        shipped=[
            [output(1, STREAM_1, "epoch 1")],
            [output(2, STREAM_1, "epoch 2")],
            [],
            [output(3, STREAM_1, "epoch 3 (the last)"), line(4, STREAM_1, "agent done")],
            [output(5, STREAM_1, "never asked for")],
        ],
    )
    result = follow(monkeypatch, stack, "--job-output")
    # Then every line is printed once, in order, and it stops at "agent done"
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["epoch 1", "epoch 2", "epoch 3 (the last)"]
    assert stack.polls == 4


def test_a_job_cancelled_under_its_agent_is_followed_for_a_while_then_left(
    monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    # Given a job cancelled while followed: its instance went, its agent never says "agent done"
    stack = ScriptedStack(states=[JobState.RUNNING, JobState.CANCELLED], shipped=[[output(1, STREAM_2, "epoch 7")]])
    result = follow(monkeypatch, stack)
    # Then it gives up FOLLOW_END_WAIT_SECONDS after the end, not before and not never
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["epoch 7"]
    waited = clock[0] - job_logs.FOLLOW_POLL_SECONDS  # the first poll saw it running
    end_wait, poll = job_logs.FOLLOW_END_WAIT_SECONDS, job_logs.FOLLOW_POLL_SECONDS
    assert end_wait < waited <= end_wait + 2 * poll


def test_a_follow_survives_a_throttle_and_prints_nothing_twice(
    monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    running, done = JobState.RUNNING, JobState.SUCCEEDED
    stack = ScriptedStack(
        states=[running, running, running, done],
        shipped=[
            [output(1, STREAM_1, "epoch 1")],
            [output(1, STREAM_1, "epoch 1"), output(2, STREAM_1, "epoch 2")],
            [output(2, STREAM_1, "epoch 2")],
            [line(3, STREAM_1, "agent done", outcome="succeeded")],
        ],
        errors={1: StackError("cannot read job train-1: ThrottlingException: Rate exceeded", UNAVAILABLE)},
    )
    result = follow(monkeypatch, stack, "--json")
    assert result.exit_code == 0, result.output
    printed = [json.loads(text) for text in result.stdout.splitlines()]
    assert [p.get("line", p["message"]) for p in printed] == ["epoch 1", "epoch 2", "agent done"]


def test_a_follow_gives_up_after_failures_in_a_row(monkeypatch: pytest.MonkeyPatch, clock: list[float]) -> None:
    refused = StackError("cannot read job train-1: AccessDeniedException: no", UNAVAILABLE)
    stack = ScriptedStack(
        states=[JobState.RUNNING] * (job_logs.FOLLOW_MAX_FAILURES + 1),
        shipped=[[]],
        errors=dict.fromkeys(range(job_logs.FOLLOW_MAX_FAILURES), refused),
    )
    result = follow(monkeypatch, stack)
    assert result.exit_code == UNAVAILABLE
    assert result.stderr.strip() == "error: cannot read job train-1: AccessDeniedException: no"
    assert stack.polls == job_logs.FOLLOW_MAX_FAILURES


def test_an_agent_restarted_during_the_attempt_does_not_end_the_follow_early(
    monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    # Given an attempt whose first agent was stopped by systemd (its "agent done" says detached) and whose
    # next agent is still to send the job's last lines when the job ends
    running, done = JobState.RUNNING, JobState.SUCCEEDED
    stack = ScriptedStack(
        states=[running, done, done, done],
        shipped=[
            [output(1, STREAM_1, "epoch 1"), line(2, STREAM_1, "agent done", outcome="detached")],
            [output(3, STREAM_1, "epoch 2")],
            [output(4, STREAM_1, "epoch 3 (the last)"), line(5, STREAM_1, "agent done", outcome="succeeded")],
            [],
        ],
    )
    result = follow(monkeypatch, stack, "--job-output")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["epoch 1", "epoch 2", "epoch 3 (the last)"]


def test_since_asks_only_for_the_lines_of_that_last_stretch(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = ScriptedStack(
        states=[JobState.SUCCEEDED],
        shipped=[[output(1, STREAM_1, "epoch 1"), output(6, STREAM_1, "epoch 6"), output(9, STREAM_1, "epoch 9")]],
    )
    monkeypatch.setattr(job_logs, "connect", lambda *a: stack)
    monkeypatch.setattr(job_logs, "utc_now", lambda: datetime.fromtimestamp(10, UTC))  # the lines' clock
    result = CliRunner().invoke(app, ["logs", "train-1", "--since", "5s"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["epoch 6", "epoch 9"]
    wrong = CliRunner().invoke(app, ["logs", "train-1", "--since", "yesterday"])
    assert wrong.exit_code == 2
    assert wrong.stderr.startswith("error: --since: 'yesterday' is not a duration")


def test_a_follow_says_what_it_waits_for_and_how_the_job_ended(
    monkeypatch: pytest.MonkeyPatch, clock: list[float]
) -> None:
    # Given a job followed from before its instance runs: no lines at first, then its output, then the end
    running, done = JobState.LAUNCHING, JobState.SUCCEEDED
    stack = ScriptedStack(
        states=[running, running, done],
        shipped=[[], [output(1, STREAM_1, "epoch 1")], [line(2, STREAM_1, "agent done")]],
    )
    result = follow(monkeypatch, stack, "--job-output")
    # Then it says once, on stderr, that it waits for the first lines, and at the end how the job ended
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["epoch 1"]
    notes = result.stderr.splitlines()
    assert len(notes) == 2
    assert notes[0].startswith("waiting for the first lines of train-1 (LAUNCHING)")
    assert notes[1] == "train-1 ended SUCCEEDED"


def test_logs_of_a_job_that_ended_without_lines_do_not_say_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a job cancelled while it waited for capacity: no instance ran it
    stack = ScriptedStack(states=[JobState.CANCELLED], shipped=[[]])
    monkeypatch.setattr(job_logs, "connect", lambda *a: stack)
    result = CliRunner().invoke(app, ["logs", "train-1"])
    # Then it says the job ended without lines, not that they are still to come
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == "no log lines for train-1: it ended CANCELLED before an agent shipped any"
