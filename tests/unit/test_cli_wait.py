"""`spotrelay wait`'s polling against a scripted job table: what it survives, when it gives up. Time is the
test's: the clock's sleep moves its monotonic time and lets the table change."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from spotrelay.aws.deployed_stack import UNAVAILABLE, StackError
from spotrelay.cli import app, job_submit, job_wait
from spotrelay.clock import ClockEvent, ClockThread
from spotrelay.models import Job, JobState, parse_job_spec

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
SPEC = parse_job_spec({"name": "train", "run": {"command": "python train.py"}, "resources": {"gpus": 1}})
JOB_ID = "train-0123456789ab"
THROTTLED = StackError(f"cannot read job {JOB_ID}: ThrottlingException: Rate exceeded", UNAVAILABLE)


def job(state: JobState) -> Job:
    return Job(job_id=JOB_ID, spec=SPEC, state=state, submitted_at=NOW, updated_at=NOW)


class ScriptedClock:
    """Monotonic seconds that move only when the command sleeps."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.slept: list[float] = []

    def now(self) -> datetime:
        return NOW

    def monotonic(self) -> float:
        return self.seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.seconds += seconds

    def event(self) -> ClockEvent:
        raise NotImplementedError

    def start_thread(self, name: str, target: Callable[[], None]) -> ClockThread:
        raise NotImplementedError


class ScriptedTable:
    """Read k answers reads[k] (the last one from then on): a state, or an error raised."""

    def __init__(self, *reads: JobState | StackError) -> None:
        self.reads = list(reads)
        self.count = 0

    def job(self, job_id: str) -> Job:
        answer = self.reads[min(self.count, len(self.reads) - 1)]
        self.count += 1
        if isinstance(answer, StackError):
            raise answer
        return job(answer)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> ScriptedClock:
    scripted = ScriptedClock()
    monkeypatch.setattr(job_wait, "command_clock", lambda: scripted)
    return scripted


def wait(monkeypatch: pytest.MonkeyPatch, table: ScriptedTable, *args: str) -> Any:
    monkeypatch.setattr(job_wait, "connect", lambda *a: table)
    return CliRunner().invoke(app, ["wait", JOB_ID, *args])


def test_a_wait_outlives_a_throttle_and_sees_the_job_end(monkeypatch: pytest.MonkeyPatch, clock: ScriptedClock) -> None:
    # Given a job table that throttles twice while the job runs, then answers that it succeeded
    table = ScriptedTable(JobState.RUNNING, THROTTLED, THROTTLED, JobState.SUCCEEDED)
    # When the user waits for it
    result = wait(monkeypatch, table)
    # Then the throttled reads are tried again at the next poll, and the job's end is the one line: exit 0
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [f"{JOB_ID} SUCCEEDED"]
    assert clock.slept == [5.0, 5.0, 5.0]


def test_a_wait_gives_up_after_reads_failed_five_times_in_a_row(
    monkeypatch: pytest.MonkeyPatch, clock: ScriptedClock
) -> None:
    table = ScriptedTable(JobState.RUNNING, THROTTLED)
    result = wait(monkeypatch, table, "--poll-seconds", "30")
    # Then the error is AWS's, one line, exit 1, after five failed polls 30 s apart
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[-1] == f"error: {THROTTLED}"
    assert table.count == 1 + job_wait.WAIT_MAX_FAILURES
    assert clock.slept == [30.0] * job_wait.WAIT_MAX_FAILURES


def test_a_wait_reads_once_more_at_its_deadline(monkeypatch: pytest.MonkeyPatch, clock: ScriptedClock) -> None:
    # Given a job that ends just as the timeout runs out (the fourth read, 12 s in)
    table = ScriptedTable(JobState.RUNNING, JobState.RUNNING, JobState.RUNNING, JobState.CANCELLED)
    result = wait(monkeypatch, table, "--timeout", "12s")
    # Then the last sleep is cut to the deadline and the read there sees it end: its line, not a timeout's
    assert clock.slept == [5.0, 5.0, 2.0]
    assert result.stdout.splitlines() == [f"{JOB_ID} CANCELLED"]
    assert result.exit_code == 1  # it did not succeed


def test_submit_refuses_a_timeout_without_wait_and_sends_nothing(
    monkeypatch: pytest.MonkeyPatch, events_dir: Path
) -> None:
    monkeypatch.setattr(job_submit, "connect", lambda *a: pytest.fail("nothing may be sent"))
    result = CliRunner().invoke(app, ["submit", str(events_dir / "jobs" / "resnet50.yaml"), "--timeout", "1h"])
    assert result.exit_code == 2
    assert result.stderr == "error: --timeout: a limit on --wait; give --wait too\n"
